"""Public RNN-Transducer loss: argument checks, dispatch to the Triton kernels or the PyTorch reference,
autograd."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._utils import INDEX_DTYPES, as_index_tensor, check_float_input, first_index, use_triton
from .reference import RNNT_TYPES, RNNTLossReferenceFunction, reduce_loss

try:
    from . import kernels
except ImportError:  # no Triton: the PyTorch path serves every call
    kernels = None

Lengths = torch.Tensor | Sequence[int]


def _check_contents(
    T: int, U: int, V: int, targets: torch.Tensor, il: torch.Tensor, tl: torch.Tensor, blank: int
) -> None:
    il = il.cpu()
    tl = tl.cpu()
    bad = (il < 0) | (il > T)
    if bad.any():
        n = first_index(bad)
        raise ValueError(f"logit_lengths[{n}]={int(il[n])} is outside [0, T={T}]")
    bad = (tl < 0) | (tl > U)
    if bad.any():
        n = first_index(bad)
        raise ValueError(f"target_lengths[{n}]={int(tl[n])} is outside [0, U={U}] (targets.shape[1])")
    tg = targets.cpu().long()
    valid = torch.arange(U)[None, :] < tl[:, None]
    for cond, what in (((tg < 0) | (tg >= V), f"is outside [0, V={V})"), (tg == blank, f"equals blank={blank}")):
        cond = cond & valid
        if cond.any():
            n, j = divmod(first_index(cond.reshape(-1)), U)
            raise ValueError(f"targets[{n}, {j}]={int(tg[n, j])} {what}")


class RNNTLossFunction(torch.autograd.Function):
    """The Triton path: per-sample losses, gradient from the stored edge occupancies."""

    @staticmethod
    def forward(ctx, x, targets, il, tl, blank, fused, fastemit_lambda, clamp, rna, need_grad):
        loss, state = kernels.rnnt_forward(x, targets, il, tl, blank, fused, fastemit_lambda, rna, need_grad)
        ctx.save_for_backward(x, targets, il, tl, *state)
        ctx.args = (blank, fused, fastemit_lambda, clamp)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        x, targets, il, tl, lse, occ, logp = ctx.saved_tensors
        blank, fused, fastemit_lambda, clamp = ctx.args
        grad = kernels.rnnt_backward(
            grad_loss, x, targets, il, tl, lse, occ, logp, blank, fused, fastemit_lambda, clamp, "none"
        )
        return (grad,) + (None,) * 9


def rnnt_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: Lengths,
    target_lengths: Lengths,
    blank: int = -1,
    clamp: float = -1.0,
    reduction: str = "mean",
    fused_log_softmax: bool = True,
    *,
    fastemit_lambda: float = 0.0,
    rnnt_type: str = "rnnt",
    validate: bool = True,
) -> torch.Tensor:
    """RNN-Transducer loss with torchaudio.functional.rnnt_loss's signature and semantics.

    Args:
        logits: [N, T, U+1, V] float: the joint network's scores (``fused_log_softmax=True``) or
            log-probabilities (``fused_log_softmax=False``; the gradient is then with respect to them).
        targets: [N, U] int32/int64 labels; entries past ``target_lengths`` are ignored.
        logit_lengths: [N] frames per sample, in [0, T]: a tensor on any device or a list.
        target_lengths: [N] labels per sample, in [0, U]: a tensor on any device or a list.
        blank: blank index; negative counts from the end (-1: the last class).
        clamp: when > 0, the gradient is clamped to [-clamp, clamp].
        reduction: "none" ([N] losses), "sum", or "mean" (over the batch).
        fused_log_softmax: see ``logits``.
        fastemit_lambda: FastEmit regularisation (warp-rnnt's and NeMo's definition): the label transitions'
            gradient is scaled by 1 + lambda, and so is the loss.
        rnnt_type: "rnnt" (Graves' transducer) or "rna" (Recurrent Neural Aligner: at most one label per frame,
            and emitting it consumes the frame).
        validate: check lengths and labels against the tensors' contents (on the GPU this reads device memory,
            one synchronisation); pass False inside CUDA graphs. Unchecked bad values cannot cause a memory
            fault (the kernels clamp them) but give meaningless numbers.

    Returns:
        The loss: [N] with ``reduction="none"``, else a scalar. +inf for a sample with no path through its
        lattice (no frames but some labels; more labels than frames with "rna"); its gradient is zero. A NaN
        among the scores a sample reads makes that sample's loss and gradient NaN, and only that sample's.

    Example:
        >>> logits = torch.randn(2, 10, 4, 6, requires_grad=True)
        >>> targets = torch.randint(0, 5, (2, 3))
        >>> loss = rnnt_loss(logits, targets, torch.tensor([10, 8]), torch.tensor([3, 2]))
        >>> loss.backward()
    """
    check_float_input(logits, "logits")
    if logits.dim() != 4:
        raise ValueError(f"logits must have 4 dimensions [N, T, U+1, V], got shape {tuple(logits.shape)}")
    if not isinstance(targets, torch.Tensor):
        raise ValueError(f"targets must be a torch.Tensor, got {type(targets).__name__}")
    if targets.dtype not in INDEX_DTYPES:
        raise ValueError(f"targets must be int32 or int64, got {targets.dtype}")
    if targets.dim() != 2:
        raise ValueError(f"targets must be [N, U], got shape {tuple(targets.shape)}")
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    if rnnt_type not in RNNT_TYPES:
        raise ValueError(f"rnnt_type must be one of {RNNT_TYPES}, got {rnnt_type!r}")
    N, T, U1, V = logits.shape
    if targets.shape[0] != N:
        raise ValueError(f"targets has {targets.shape[0]} rows but logits' batch size is {N}")
    if targets.shape[1] + 1 != U1:
        raise ValueError(f"logits.shape[2]={U1} must be targets.shape[1] + 1 = {targets.shape[1] + 1}")
    if not isinstance(blank, int) or not -V <= blank < V:
        raise ValueError(f"blank={blank} is outside [-V, V) for V={V}")
    blank = blank + V if blank < 0 else blank
    if not fastemit_lambda >= 0.0:
        raise ValueError(f"fastemit_lambda must be >= 0, got {fastemit_lambda}")
    dev = logits.device
    il = as_index_tensor(logit_lengths, "logit_lengths", dev)
    tl = as_index_tensor(target_lengths, "target_lengths", dev)
    if il.numel() != N:
        raise ValueError(f"logit_lengths has {il.numel()} entries but the batch size is {N}")
    if tl.numel() != N:
        raise ValueError(f"target_lengths has {tl.numel()} entries but the batch size is {N}")
    targets = targets.to(dev)
    if validate:
        _check_contents(T, U1 - 1, V, targets, il, tl, blank)
    if kernels is not None and use_triton(logits) and N > 0 and T > 0:
        need_grad = torch.is_grad_enabled() and logits.requires_grad
        loss = RNNTLossFunction.apply(
            logits, targets.contiguous(), il, tl, blank, fused_log_softmax, float(fastemit_lambda), float(clamp),
            rnnt_type == "rna", need_grad,
        )  # fmt: skip
    else:
        loss = RNNTLossReferenceFunction.apply(
            logits, targets, il, tl, blank, fused_log_softmax, float(fastemit_lambda), float(clamp), rnnt_type
        )
    return reduce_loss(loss, reduction)


class RNNTLoss(torch.nn.Module):
    """Module form of :func:`rnnt_loss`, with the same arguments.

    Example:
        >>> criterion = RNNTLoss(blank=0, reduction="sum")
        >>> loss = criterion(logits, targets, logit_lengths, target_lengths)
    """

    def __init__(
        self,
        blank: int = -1,
        clamp: float = -1.0,
        reduction: str = "mean",
        fused_log_softmax: bool = True,
        *,
        fastemit_lambda: float = 0.0,
        rnnt_type: str = "rnnt",
        validate: bool = True,
    ) -> None:
        super().__init__()
        self.blank = blank
        self.clamp = clamp
        self.reduction = reduction
        self.fused_log_softmax = fused_log_softmax
        self.fastemit_lambda = fastemit_lambda
        self.rnnt_type = rnnt_type
        self.validate = validate

    def forward(self, logits, targets, logit_lengths, target_lengths) -> torch.Tensor:
        return rnnt_loss(
            logits, targets, logit_lengths, target_lengths, self.blank, self.clamp, self.reduction,
            self.fused_log_softmax, fastemit_lambda=self.fastemit_lambda, rnnt_type=self.rnnt_type,
            validate=self.validate,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return f"blank={self.blank}, reduction={self.reduction!r}, rnnt_type={self.rnnt_type!r}"
