"""Where a test runs, for every capability alike: the PyTorch path (kernels switched off), the Triton kernels under
the interpreter (the CPU, TRITON_INTERPRET=1) or the GPU; the ``path`` fixture (conftest.py) gives a ``Path``.

``CAPABILITIES`` is the registry the fixture reads, one entry per capability: the attributes of its public
modules that hold kernels modules (set to None, the PyTorch path serves every call) and the launchers whose calls
tell that its kernels ran. A new capability adds its entry here; the fixture lists nothing itself.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

import torch


class Capability(NamedTuple):
    switches: tuple[str, ...]  # "module:attribute" holding a kernels module (None: the PyTorch path)
    launchers: tuple[str, ...]  # "module:function": its calls are the kernels' launches


CAPABILITIES = {
    "ctc": Capability(("speechkernels.ctc.api:kernels",), ("speechkernels.ctc.kernels:ctc_forward",)),
    "rnnt": Capability(("speechkernels.rnnt.api:kernels",), ("speechkernels.rnnt.kernels:rnnt_forward",)),
    "rnnt joint": Capability(
        ("speechkernels.rnnt.joint:joint_kernels",),
        ("speechkernels.rnnt.kernels:joint_forward", "speechkernels._transducer.joint_kernels:joint_lattice"),
    ),
    "tdt": Capability(("speechkernels.tdt.api:kernels",), ("speechkernels.tdt.kernels:tdt_forward",)),
    "tdt joint": Capability(("speechkernels.tdt.joint:joint_kernels",), ()),  # launches: joint_lattice above
    "align": Capability(("speechkernels.align.api:kernels",), ("speechkernels.align.kernels:ctc_align",)),
    "decode": Capability(
        (
            "speechkernels.decode.api:kernels",
            "speechkernels.decode.api:transducer_kernels",
            "speechkernels.decode.api:beam_kernels",
            "speechkernels.decode.api:transducer_beam_kernels",
        ),
        (
            "speechkernels.decode.kernels:ctc_greedy",
            "speechkernels.decode.transducer_kernels:transducer_greedy",
            "speechkernels.decode.beam_kernels:ctc_beam",
            "speechkernels.decode.transducer_beam_kernels:malsd_search",
            "speechkernels.decode.transducer_beam_kernels:modified_search",
            "speechkernels.decode.transducer_beam_kernels:greedy_search",
        ),
    ),
    "wavenet": Capability(
        ("speechkernels.wavenet.generation:triton_vocoder",),
        (
            "speechkernels.wavenet.triton_vocoder:wavenet_generate",
            "speechkernels.wavenet.cluster_vocoder:wavenet_generate_cluster",
            "speechkernels.wavenet.cluster_vocoder:wavenet_generate_cluster_batch",
            "speechkernels.wavenet.generation:wavenet_generate_cluster",
            "speechkernels.wavenet.generation:wavenet_generate_cluster_batch",
            "speechkernels.wavenet.server:wavenet_generate_cluster_batch",
        ),
    ),
}


def resolve(spec: str) -> tuple[object, str]:
    """The module and the attribute name of a "module:attribute" entry."""
    module, attribute = spec.split(":")
    return importlib.import_module(module), attribute


class Path:
    """Where a test runs: ``name`` "torch" (the PyTorch path on the CPU), "triton" (the kernels under the
    interpreter) or "cuda"; ``launches`` records the kernels' launches (every capability's registered launchers),
    so a test can tell which ran."""

    def __init__(self, name: str) -> None:
        self.name, self.launches = name, []
        self.device = torch.device("cuda" if name == "cuda" else "cpu")

    @property
    def kernels(self) -> bool:
        return self.name != "torch"

    @property
    def wavenet_kernel(self) -> str:
        """WaveNet's ``kernel`` argument on this path: "torch", "triton" (the interpreter) or "auto" (the GPU: the
        cluster kernels where they run, else the Triton kernel)."""
        return {"torch": "torch", "triton": "triton"}.get(self.name, "auto")

    def reset(self) -> None:
        """Forget earlier launches (the fixture lives across a hypothesis test's examples)."""
        self.launches.clear()

    def check_ran(self, expected: bool = True) -> None:
        """The kernels ran if this path has them (and the problem is not empty), else the PyTorch path did."""
        assert bool(self.launches) == (self.kernels and expected), (self.name, len(self.launches))
