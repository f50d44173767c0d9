"""The joint network's hidden vectors in PyTorch, dropout's counter-based mask included (the fused joint kernels
compute the same mask from the same seed, so that nothing is stored between a forward and its backward): what the
RNN-T and TDT joint losses' PyTorch paths share."""

from __future__ import annotations

import torch

from .activations import DROP_BITS, activation_fn, drop_threshold

_M32 = 0xFFFFFFFF


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser on int64 tensors holding 32-bit values (a product past int64 wraps; its
    low 32 bits are still right)."""
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _M32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _M32
    return x ^ (x >> 16)


def dropout_keep(cells: torch.Tensor, H: int, seed: tuple[int, int], threshold: int) -> torch.Tensor:
    """Which elements of the cells' hidden vectors dropout keeps: [*cells.shape, H] bool.

    Args:
        cells: int64 cell indices (n * T + t) * (U + 1) + u.
        seed: two integers in [0, 2^31).
        threshold: ``drop_threshold(p)``.
    """
    c32 = (cells ^ (cells >> 32)) & _M32
    a = _fmix32(c32 ^ seed[0])[..., None]
    k = torch.arange(H, device=cells.device, dtype=torch.int64)
    x = _fmix32(a ^ ((k * 0x9E3779B9 + seed[1]) & _M32))
    return (x >> (32 - DROP_BITS)) >= threshold


def joint_hidden(
    enc: torch.Tensor,
    pred: torch.Tensor,
    t0: int,
    T: int,
    activation: str,
    dropout: float,
    seed: tuple[int, int],
) -> torch.Tensor:
    """Hidden vectors of frames t0 .. t0 + enc.shape[1] - 1 of a [N, T, U+1] lattice: [N, tc, U+1, H]."""
    N, tc, H = enc.shape
    U1 = pred.shape[1]
    h = activation_fn(activation)(enc[:, :, None, :] + pred[:, None, :, :])
    if dropout > 0:
        n = torch.arange(N, device=enc.device)[:, None, None]
        t = torch.arange(t0, t0 + tc, device=enc.device)[None, :, None]
        u = torch.arange(U1, device=enc.device)[None, None, :]
        keep = dropout_keep((n * T + t) * U1 + u, H, seed, drop_threshold(dropout))
        h = torch.where(keep, h / (1.0 - dropout), 0.0)
    return h
