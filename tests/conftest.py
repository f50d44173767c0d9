import math

import pytest
import torch

from speechkernels._utils import triton_interpreting


@pytest.fixture(autouse=True)
def _skip_gpu_tests_without_cuda(request):
    # queried when a test runs, never at import or collection
    if request.node.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.fixture
def kernel_device() -> torch.device:
    """Where the Triton kernels run in CPU tests: the CPU under TRITON_INTERPRET=1 (skips otherwise)."""
    if not triton_interpreting():
        pytest.skip("set TRITON_INTERPRET=1 to run the Triton kernels on the CPU")
    return torch.device("cpu")


@pytest.fixture
def gpu() -> torch.device:
    return torch.device("cuda")


@pytest.fixture(autouse=True)
def poison_kernel_outputs(monkeypatch):
    """Every buffer a kernel writes starts as NaN (floats) or garbage (integers): unwritten elements show."""
    from speechkernels.ctc import kernels
    from speechkernels.rnnt import kernels as rnnt_kernels

    def empty(*shape, dtype, device):
        t = torch.empty(*shape, dtype=dtype, device=device)
        return t.fill_(math.nan) if dtype.is_floating_point else t.fill_(-123456789)

    def empty_like(x):
        return torch.empty_like(x).fill_(math.nan)

    for module in (kernels, rnnt_kernels):
        monkeypatch.setattr(module, "_empty", empty)
        monkeypatch.setattr(module, "_empty_like", empty_like)
