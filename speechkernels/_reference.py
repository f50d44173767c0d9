"""What the float64 references share: per-sample losses computed together with their gradient."""

from __future__ import annotations

from collections.abc import Callable

import torch


class LossWithGradient(torch.autograd.Function):
    """Per-sample losses whose gradient is computed with them: ``apply(x, compute, batch_dim)`` runs
    ``compute(x) -> (loss [N], gradient of loss.sum() with x's shape)`` and returns the loss in float32 (float64
    for float64 x); the backward scales the kept gradient by the upstream one along x's dimension ``batch_dim``
    and returns it in x's dtype. A view of x is computed as its contiguous copy: the reductions' rounding depends
    on the layout they run over, and a view must give the bits of the same values contiguous."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, compute: Callable, batch_dim: int) -> torch.Tensor:
        if not x.is_contiguous():
            x = x.contiguous().requires_grad_(x.requires_grad)
        loss, grad = compute(x)
        ctx.save_for_backward(grad)
        ctx.dtype, ctx.batch_dim = x.dtype, batch_dim
        return loss.to(torch.float64 if x.dtype == torch.float64 else torch.float32)

    @staticmethod
    def backward(ctx, grad_loss):
        (grad,) = ctx.saved_tensors
        shape = [1] * grad.dim()
        shape[ctx.batch_dim] = -1
        return (grad * grad_loss.to(grad.dtype).view(shape)).to(ctx.dtype), None, None
