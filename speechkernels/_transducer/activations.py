"""The joint network's activations (their order is the kernels' ``ACT`` code) and its dropout's hash bits, shared by
the fused joint kernels, their PyTorch reference and the decoder."""

from __future__ import annotations

import torch

ACTIVATIONS = ("relu", "tanh", "sigmoid")


DROP_BITS = 24  # a hash's top 24 bits against the drop probability: p is rounded to a multiple of 2^-24


def activation_fn(name: str):
    return {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}[name]


def drop_threshold(dropout: float) -> int:
    """The integer the hash's top bits are compared with: an element is dropped when they are below it."""
    return min(round(dropout * (1 << DROP_BITS)), (1 << DROP_BITS) - 1)
