"""The batch reduction of per-sample losses, in PyTorch (the losses' PyTorch paths and the kernels' callers)."""

from __future__ import annotations

import torch


def reduce_loss(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.mean()
