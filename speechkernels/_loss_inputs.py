"""The inputs every loss shares: the batch reduction, labels and per-sample lengths, with the checks made of
them (each raises a ValueError naming the argument and, for a tensor's contents, the offending element)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._utils import INDEX_DTYPES, as_index_tensor

REDUCTIONS = ("none", "mean", "sum")
Lengths = torch.Tensor | Sequence[int]  # per-sample lengths: an integer tensor on any device, or integers


def check_targets(targets) -> None:
    """``targets`` is an int32 or int64 tensor."""
    if not isinstance(targets, torch.Tensor):
        raise ValueError(f"targets must be a torch.Tensor, got {type(targets).__name__}")
    if targets.dtype not in INDEX_DTYPES:
        raise ValueError(f"targets must be int32 or int64, got {targets.dtype}")


def batch_lengths(
    N: int, device, reduction: str, keep: tuple[torch.dtype, ...] = (torch.int64,), **lengths
) -> list[torch.Tensor]:
    """Each of the per-sample ``lengths`` (by name) as an index tensor on ``device`` with N entries (``keep``: as
    ``as_index_tensor``), for a batch of N samples reduced by ``reduction`` (a mean over an empty batch is
    undefined)."""
    if N == 0 and reduction == "mean":
        raise ValueError("reduction='mean' over an empty batch (N=0) is undefined: use 'sum' or 'none'")
    out = []
    for name, value in lengths.items():
        t = as_index_tensor(value, name, device, keep=keep)
        if t.numel() != N:
            raise ValueError(f"{name} has {t.numel()} entries but the batch size is {N}")
        out.append(t)
    return out


def check_lengths(lengths: torch.Tensor, name: str, high: int, bound: str) -> None:
    """Raises ValueError naming the first of the per-sample ``lengths`` outside [0, high] (``bound`` spells
    ``high``). Error paths only: it synchronises."""
    bad = (lengths < 0) | (lengths > high)
    if bad.any():
        n = first_index(bad)
        raise ValueError(f"{name}[{n}]={int(lengths[n])} is outside [0, {bound}]")


def check_labels(labels: torch.Tensor, valid: torch.Tensor, C: int, classes: str, blank: int, describe) -> None:
    """Raises ValueError naming the first label (where ``valid``) outside [0, C) (``classes`` names C) or equal
    to the blank; ``describe(flat_index, value)`` says which label it is. Error paths only: it synchronises."""
    for cond, what in (((labels < 0) | (labels >= C), f"is outside [0, {classes}={C})"),
                       (labels == blank, f"equals blank={blank}")):  # fmt: skip
        cond = cond & valid
        if cond.any():
            flat = first_index(cond.reshape(-1))
            raise ValueError(f"{describe(flat, int(labels.reshape(-1)[flat]))} {what}")


def first_index(mask: torch.Tensor) -> int:
    """Index of the first True in a 1-D bool tensor (error paths only: it synchronises)."""
    return int(mask.nonzero()[0, 0].item())
