"""README.md's Python snippets run as written, in order, on whatever device there is (on a CPU as a user runs
them: Triton's interpreter switched off). Snippets that start with "# needs a CUDA GPU" run only there."""

from __future__ import annotations

import pathlib
import re

import torch

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_snippets():
    assert len(snippets()) >= 6


def test_readme_snippets_run(monkeypatch, tmp_path):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.chdir(tmp_path)  # snippets write files (out.wav)
    namespace: dict = {}
    ran = 0
    for code in snippets():
        if code.startswith("# needs a CUDA GPU"):
            continue
        exec(compile(code, str(README), "exec"), namespace)  # noqa: S102
        ran += 1
    assert ran >= 5
    assert torch.isfinite(namespace["loss"]).all()
    assert (tmp_path / "out.wav").stat().st_size > 1000


def test_readme_snippets_pick_their_device():
    """Every snippet but the GPU-only ones runs on the GPU where there is one and on the CPU otherwise."""
    for code in snippets():
        if not code.startswith("# needs a CUDA GPU"):
            assert 'device="cuda"' not in code and ".cuda()" not in code, code
