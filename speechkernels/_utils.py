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


def as_index_tensor(
    value: torch.Tensor | Sequence[int] | int,
    name: str,
    device: torch.device,
    keep: tuple[torch.dtype, ...] = (torch.int64,),
) -> torch.Tensor:
    """Lengths given as a tensor (any device, integer dtype), a list or a scalar, as a 1-D tensor on ``device``:
    of its own dtype if that is in ``keep`` (no conversion launch), else int64."""
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise ValueError(f"{name} must hold integers, got dtype {value.dtype}")
        dtype = value.dtype if value.dtype in keep else torch.int64
        return value.to(device=device, dtype=dtype, non_blocking=True).reshape(-1)
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
