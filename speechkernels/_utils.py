"""Small helpers shared by the capabilities: backend choice, argument checks, dtype handling."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)


def triton_interpreting() -> bool:
    """True when Triton kernels run on the CPU through the interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(x: torch.Tensor) -> bool:
    """Whether the Triton kernels handle ``x``: CUDA tensors of a kernel dtype, or, under the interpreter,
    CPU float32/float16 tensors (the interpreter has no bfloat16; float64 always takes the PyTorch path)."""
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False
    if x.is_cuda:
        return True
    return triton_interpreting() and x.device.type == "cpu" and x.dtype != torch.bfloat16


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def as_index_tensor(value: torch.Tensor | Sequence[int] | int, name: str, device: torch.device) -> torch.Tensor:
    """Lengths given as a tensor (any device, integer dtype), a list or a scalar, as an int64 tensor on ``device``."""
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise ValueError(f"{name} must hold integers, got dtype {value.dtype}")
        return value.to(device=device, dtype=torch.int64, non_blocking=True).reshape(-1)
    if isinstance(value, int):
        value = [value]
    try:
        return torch.as_tensor(list(value), dtype=torch.int64).to(device, non_blocking=True)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a tensor or a sequence of integers") from err


def check_float_input(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float16, bfloat16, float32 or float64, got {x.dtype}")


def first_index(mask: torch.Tensor) -> int:
    """Index of the first True in a 1-D bool tensor (error paths only: it synchronises)."""
    return int(mask.nonzero()[0, 0].item())


class KernelLauncher:
    """Launches a ``@triton.jit`` kernel, reusing its compiled handle once the specialisation is known.

    ``kernel[grid](...)`` re-derives the specialisation of every argument in Python on each call, 40-60 us of
    host time per launch with Triton 3.6 (benchmarks/NOTES.md); for small inputs that is most of a CTC step.
    Here the first launch of a specialisation goes through Triton, which compiles it and returns the compiled
    kernel; later launches with the same key call its launcher directly. The key holds everything Triton
    specialises on: tensor dtypes and 16-byte alignment, integer width, ==1 and divisibility by 16, the
    constexpr values and options, and the device. Under the interpreter every launch goes through Triton.

    Usage: ``launch = KernelLauncher(kernel); launch(grid, *args, CONST=..., num_warps=...)``, with the
    constexpr parameters last in the kernel's signature and passed by name.
    """

    _OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.cache: dict = {}
        self.direct = True  # cleared for good if this Triton's launcher takes other arguments

    @staticmethod
    def _spec(a):
        if isinstance(a, torch.Tensor):
            return (a.dtype, a.data_ptr() % 16 == 0)
        if isinstance(a, bool):
            return ("b", a)
        if isinstance(a, int):
            return ("i", a == 1, a % 16 == 0, -(2**31) <= a < 2**31, a < 2**63)
        return (type(a), a)

    def __call__(self, grid: tuple, *args, **kwargs):
        if triton_interpreting() or not self.direct:
            self.kernel[grid](*args, **kwargs)
            return
        device = torch.cuda.current_device()
        key = (device, tuple(self._spec(a) for a in args), tuple(kwargs.items()))
        compiled = self.cache.get(key)
        if compiled is None:
            compiled = self.kernel[grid](*args, **kwargs)
            if all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata")):
                self.cache[key] = compiled
            else:
                self.direct = False
            return
        # the launcher takes every parameter in signature order, constexprs included
        constexprs = [kwargs[name] for name in self.kernel.arg_names[len(args) :]]
        stream = torch.cuda.current_stream(device).cuda_stream
        g = tuple(grid) + (1, 1)
        try:
            compiled.run(g[0], g[1], g[2], stream, compiled.function, compiled.packed_metadata,
                         None, None, None, *args, *constexprs)  # fmt: skip
        except (TypeError, AttributeError):  # another launcher signature: go through Triton from now on
            self.direct = False
            self.kernel[grid](*args, **kwargs)
