import os

import pytest
import torch
from helpers import count_calls, optional_module
from hypothesis import HealthCheck, Phase, settings
from paths import CAPABILITIES, Path, resolve

from speechkernels._backend import triton_interpreting

# Triton is optional (the PyTorch paths serve every call without it): kernel tests skip where it is missing
HAVE_TRITON = optional_module("triton") is not None

# Hypothesis profiles: "ci" (the default: few examples, the same ones every run, so that CI is reproducible),
# "dev" (more, fresh ones each run) and "gpu" (many, fresh: chosen by `-m gpu`; a failure is reported as found,
# not shrunk, as each shrinking step may compile kernels). HYPOTHESIS_PROFILE overrides.
_common = dict(
    deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
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


@pytest.fixture
def gpu() -> torch.device:
    return torch.device("cuda")


@pytest.fixture(autouse=True)
def poison_kernel_outputs(monkeypatch):
    """Every buffer a kernel writes starts as NaN (floats) or garbage (integers): unwritten elements show."""
    from speechkernels import _outputs

    monkeypatch.setattr(_outputs, "POISON_OUTPUTS", True)


def pytest_generate_tests(metafunc):
    """``path``: every test that takes it runs on the PyTorch path, the interpreter and the GPU; a test marked
    ``kernels`` (it tests the kernels themselves) on the last two only."""
    if "path" in metafunc.fixturenames:
        kernels_only = metafunc.definition.get_closest_marker("kernels") is not None
        gpu = pytest.param("cuda", marks=pytest.mark.gpu)
        metafunc.parametrize("path", (["triton"] if kernels_only else ["torch", "triton"]) + [gpu], indirect=True)


@pytest.fixture
def path(request, monkeypatch) -> Path:
    """Where the test runs (``paths.Path``), for every capability of ``paths.CAPABILITIES``: on the PyTorch path
    their kernels are switched off; on the others the kernels' launches are recorded in ``path.launches``. The
    interpreter's runs skip without TRITON_INTERPRET=1, the kernels' without Triton."""
    if request.param != "torch" and not HAVE_TRITON:
        pytest.skip("needs Triton")
    if request.param == "triton" and not triton_interpreting():
        pytest.skip("set TRITON_INTERPRET=1 to run the Triton kernels on the CPU")
    path = Path(request.param)
    for capability in CAPABILITIES.values():
        if request.param == "torch":
            for spec in capability.switches:
                monkeypatch.setattr(*resolve(spec), None)
        elif HAVE_TRITON:
            for spec in capability.launchers:
                count_calls(monkeypatch, *resolve(spec), path.launches)
    return path
