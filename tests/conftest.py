import os

import pytest
import torch
from helpers import count_calls, optional_module
from hypothesis import HealthCheck, Phase, settings

from speechkernels._backend import triton_interpreting

# Triton is optional (the PyTorch paths serve every call without it): kernel tests skip where it is missing
HAVE_TRITON = optional_module("triton") is not None

# Hypothesis profiles: "ci" (the default: few examples, the same ones every run, so that CI is reproducible),
# "dev" (more, fresh ones each run) and "gpu" (many, fresh: chosen by `-m gpu`; a failure is reported as found,
# not shrunk, as each shrinking step may compile kernels). HYPOTHESIS_PROFILE overrides.
_common = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip
settings.register_profile("ci", max_examples=30, derandomize=True, **_common)
settings.register_profile("dev", max_examples=60, **_common)
settings.register_profile("gpu", max_examples=300, phases=[Phase.explicit, Phase.generate], **_common)


def pytest_configure(config):
    gpu = "gpu" in (config.getoption("markexpr", "") or "")
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("gpu" if gpu else "ci"))


@pytest.fixture(autouse=True)
def _skip_gpu_tests_without_cuda(request):
    # queried when a test runs, never at import or collection
    if request.node.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.fixture
def interpreter() -> torch.device:
    """The CPU, where the Triton kernels run under TRITON_INTERPRET=1 (the test is skipped otherwise)."""
    if not HAVE_TRITON:
        pytest.skip("needs Triton")
    if not triton_interpreting():
        pytest.skip("set TRITON_INTERPRET=1 to run the Triton kernels on the CPU")
    return torch.device("cpu")


@pytest.fixture(params=["interpreter", pytest.param("cuda", marks=pytest.mark.gpu)])
def kernel_device(request) -> torch.device:
    """Where a kernel test runs: the CPU under TRITON_INTERPRET=1 (skipped otherwise), and the GPU (marked gpu).
    One test body for both; a test that needs other sizes on the GPU says so from ``device.type``."""
    return torch.device("cuda") if request.param == "cuda" else request.getfixturevalue("interpreter")


@pytest.fixture
def gpu() -> torch.device:
    return torch.device("cuda")


@pytest.fixture(autouse=True)
def poison_kernel_outputs(monkeypatch):
    """Every buffer a kernel writes starts as NaN (floats) or garbage (integers): unwritten elements show."""
    from speechkernels import _outputs

    monkeypatch.setattr(_outputs, "POISON_OUTPUTS", True)


class LossPath:
    """Where a loss test runs: "torch" (the PyTorch path on the CPU), "triton" (the kernels under the
    interpreter) or "cuda". ``launches`` counts the kernels' forward launches, so a test can tell which ran."""

    def __init__(self, name: str, device: torch.device) -> None:
        self.name, self.device, self.launches = name, device, []

    @property
    def kernels(self) -> bool:
        return self.name != "torch"

    def reset(self) -> None:
        """Forget earlier launches (the fixture lives across a hypothesis test's examples)."""
        self.launches.clear()

    def check_ran(self, expected: bool = True) -> None:
        """The kernels ran if this path has them (and the problem is not empty), else the PyTorch path did."""
        assert bool(self.launches) == (self.kernels and expected), (self.name, len(self.launches))


@pytest.fixture(params=["torch", "triton", pytest.param("cuda", marks=pytest.mark.gpu)])
def loss_path(request, monkeypatch) -> LossPath:
    """Each loss test once per path: the PyTorch path (kernels switched off), the Triton kernels under the
    interpreter (skipped without TRITON_INTERPRET=1), and the GPU (tests marked gpu). The aligner's kernels are
    switched and counted with the losses'."""
    from speechkernels.align import api as align_api
    from speechkernels.ctc import api as ctc_api
    from speechkernels.rnnt import api as rnnt_api
    from speechkernels.rnnt import joint as joint_api
    from speechkernels.tdt import api as tdt_api
    from speechkernels.tdt import joint as tdt_joint_api

    if request.param != "torch" and not HAVE_TRITON:
        pytest.skip("needs Triton")
    if request.param == "triton" and not triton_interpreting():
        pytest.skip("set TRITON_INTERPRET=1 to run the Triton kernels on the CPU")
    path = LossPath(request.param, torch.device("cuda" if request.param == "cuda" else "cpu"))
    if request.param == "torch":
        monkeypatch.setattr(ctc_api, "kernels", None)
        monkeypatch.setattr(rnnt_api, "kernels", None)
        monkeypatch.setattr(joint_api, "joint_kernels", None)
        monkeypatch.setattr(tdt_api, "kernels", None)
        monkeypatch.setattr(tdt_joint_api, "joint_kernels", None)
        monkeypatch.setattr(align_api, "kernels", None)
    if not HAVE_TRITON:
        return path
    from speechkernels._transducer import joint_kernels
    from speechkernels.align import kernels as align_kernels
    from speechkernels.ctc import kernels as ctc_kernels
    from speechkernels.rnnt import kernels as rnnt_kernels
    from speechkernels.tdt import kernels as tdt_kernels

    for module, name in ((ctc_kernels, "ctc_forward"), (rnnt_kernels, "rnnt_forward"),
                         (rnnt_kernels, "joint_forward"), (joint_kernels, "joint_lattice"),
                         (tdt_kernels, "tdt_forward"), (align_kernels, "ctc_align")):  # fmt: skip
        count_calls(monkeypatch, module, name, path.launches)
    return path
