"""The results files under benchmarks/results: none named by a date (each file's date lives inside it, so a new
run replaces the file and no citation goes stale), and every one that the README, the notes, the code or the
examples cite exists; so does every notes file they cite (benchmarks/notes/, one per capability)."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CITED = re.compile(r"results/([\w-]+\.(?:jsonl|json|png|txt))(?!\w)")


NOTES = re.compile(r"benchmarks/notes/([\w-]+\.md)")


def citing_files() -> list[pathlib.Path]:
    return [
        ROOT / "README.md",
        ROOT / "benchmarks" / "NOTES.md",
        *sorted((ROOT / "benchmarks" / "notes").glob("*.md")),
        *sorted((ROOT / "speechkernels").rglob("*.py")),
        *sorted((ROOT / "speechkernels").rglob("*.cu")),
        *sorted((ROOT / "examples").glob("*.py")),
        *sorted((ROOT / "benchmarks").glob("*.py")),
    ]


def test_no_results_file_is_named_by_date():
    names = [p.name for p in RESULTS.iterdir()]
    assert names, "no results files"
    dated = [n for n in names if re.search(r"\d{4}-\d{2}-\d{2}", n)]
    assert not dated, f"results files named by date: {dated}"


def test_every_cited_results_file_exists():
    cited = {
        (path.relative_to(ROOT).as_posix(), name) for path in citing_files() for name in CITED.findall(path.read_text())
    }
    assert len(cited) >= 10  # the README and the notes cite the benchmarks' results
    missing = sorted(f"{where} cites results/{name}" for where, name in cited if not (RESULTS / name).is_file())
    assert not missing, "\n".join(missing)


def test_every_cited_notes_file_exists():
    cited = {
        (path.relative_to(ROOT).as_posix(), name) for path in citing_files() for name in NOTES.findall(path.read_text())
    }
    assert len(cited) >= 10  # the code and the README cite the notes of their capability
    missing = sorted(
        f"{where} cites benchmarks/notes/{name}"
        for where, name in cited
        if not (ROOT / "benchmarks" / "notes" / name).is_file()
    )
    assert not missing, "\n".join(missing)
