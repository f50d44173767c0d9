"""The allocation of every kernel output, poisoned in the tests (``POISON_OUTPUTS``) so that an element a kernel
leaves unwritten shows."""

from __future__ import annotations

import math

import torch

POISON_OUTPUTS = False  # tests: kernel outputs start as NaN (floats) or -123456789 (integers)


def kernel_output(*shape, dtype: torch.dtype, device) -> torch.Tensor:
    """Allocation of every kernel output; under ``POISON_OUTPUTS`` (the tests) filled with NaN (floats) or
    -123456789 (integers), so that an element a kernel leaves unwritten shows."""
    return _poison(torch.empty(*shape, dtype=dtype, device=device))


def kernel_output_like(x: torch.Tensor) -> torch.Tensor:
    return _poison(torch.empty_like(x))


def _poison(t: torch.Tensor) -> torch.Tensor:
    if POISON_OUTPUTS:
        t.fill_(math.nan if t.dtype.is_floating_point else -123456789)
    return t
