"""Which backend serves a call: the Triton kernels (on the GPU, or on the CPU under the interpreter) or the PyTorch
path; the layout the kernels read; the threads of the CPU path's small sequential loops."""

from __future__ import annotations

import contextlib
import os

import torch


def triton_missing(error: ImportError) -> None:
    """For the ``except ImportError as error`` around a kernels module's import: None where Triton itself is what
    is missing (the PyTorch path then serves every call); any other import error propagates."""
    if (error.name or "").split(".")[0] != "triton":
        raise error
    return None


def triton_interpreting() -> bool:
    """True when Triton kernels run on the CPU through the interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# PyTorch's CPU kernels split an operation over threads from about this many elements (at::internal::GRAIN_SIZE)
GRAIN_SIZE = 32768


@contextlib.contextmanager
def loop_threads(device: torch.device, elements_per_step: int, below: int = GRAIN_SIZE):
    """The threads for a loop of small sequential steps (a recursion over frames, a sample at a time): on the CPU,
    one where each step touches fewer than GRAIN_SIZE elements, else torch's setting. Steps that small gain
    nothing from more threads and, where another process shares the cores, wait at each parallel operation for
    the thread left on a busy core (WaveNet.generate 2 x 400 on two cores with one busy neighbour: 2.0-2.5x its
    idle time with two threads, 1.0x with one; benchmarks/notes/package.md). The large operations before and after the
    loop keep ``torch.get_num_threads()``; the setting is this thread's own and is restored on exit. ``below``:
    the threshold for other work of small operations."""
    n = torch.get_num_threads()
    if device.type != "cpu" or n == 1 or elements_per_step >= below or torch.compiler.is_compiling():
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def use_triton(x: torch.Tensor) -> bool:
    """Whether the Triton kernels handle ``x``: CUDA tensors of a kernel dtype, or, under the interpreter,
    CPU float32/float16 tensors (the interpreter has no bfloat16; float64 always takes the PyTorch path)."""
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False
    if x.is_cuda:
        return True
    return triton_interpreting() and x.device.type == "cpu" and x.dtype != torch.bfloat16


def kernel_layout(x: torch.Tensor) -> torch.Tensor:
    """``x`` as the kernels read scores, so that their results depend on its values only: itself when contiguous
    and 16-byte aligned (no copy), else a contiguous copy. Triton compiles a kernel per layout (a unit stride and a
    16-byte alignment are compile-time facts that choose vector widths and register layouts), and the reductions
    of two such kernels round differently: a view (transposed, strided, at an odd offset) must give the bits of its
    contiguous copy. Under torch.compile (no addresses while tracing) contiguous only."""
    if torch.compiler.is_compiling():
        return x.contiguous()
    if x.is_contiguous() and x.data_ptr() % 16 == 0:
        return x
    return x.clone(memory_format=torch.contiguous_format)
