"""Public RNN-Transducer loss: argument checks, dispatch to the Triton kernels or the PyTorch reference,
autograd."""

from __future__ import annotations

import torch

from .._args import as_bool, check_float_input
from .._backend import kernel_layout, triton_missing, use_triton
from .._loss_inputs import Lengths
from .._op import LossModule, pytorch_path_op
from .._transducer.checks import check_contents, check_loss_arguments, state_fake, validate_on_device
from .._transducer.options import TransducerOptions, transducer_loss_op, transducer_options
from .._transducer.reference import reduce_loss
from .reference import rnnt_forward_backward_scaled

try:  # the Triton kernels; without Triton (error names it) the PyTorch path serves every call
    from . import kernels
except ImportError as error:
    kernels = triton_missing(error)


_INPUTS = "Tensor x, Tensor targets, Tensor il, Tensor tl, bool need_grad, bool reuse_logits"


def _forward(x, targets, il, tl, need_grad, reuse_logits, opts: TransducerOptions):
    """The forward kernels (the loss with its batch reduction), after the device-side check of lengths and
    labels. Consuming the logits, the backward computes the log-sum-exps again rather than keep them (memory)."""
    N, T, U1, V = x.shape
    if opts.validate:
        validate_on_device(T, U1 - 1, V, targets, il, tl, opts.blank)
    return kernels.rnnt_forward(x, targets, il, tl, opts, need_grad, not reuse_logits)


def _forward_fake(x, targets, il, tl, need_grad, reuse_logits, opts: TransducerOptions):
    N, T, U1, _ = x.shape
    cells = N * T * U1
    return state_fake(x, N, opts.reduction, cells if opts.fused_log_softmax and not reuse_logits else 0, 2 * cells)


def _backward(grad_loss, x, targets, il, tl, lse, occ, logp, reuse_logits, opts: TransducerOptions):
    """The gradient from the stored edge occupancies; with ``reuse_logits`` (eager mode only) written over the
    logits."""
    if not reuse_logits:
        return kernels.rnnt_backward(grad_loss, x, targets, il, tl, (lse, occ, logp), opts)
    # each cell's logits are read before its gradient is written over them; then the logits' version counter
    # moves on, so that any later reader of them (the backward of the op that made them, of another op that
    # saved them, a second backward through this one) fails with autograd's in-place error instead of reading
    # the gradient as logits
    grad = x.detach()
    kernels.rnnt_backward(grad_loss, x, targets, il, tl, (lse, occ, logp), opts, out=grad, recompute_lse=True)
    torch.autograd.graph.increment_version(grad)
    return grad


# state: log-sum-exps, edge occupancies, log p per sample
RNNT_LOSS_OP = None
if kernels is not None:
    RNNT_LOSS_OP = transducer_loss_op("speechkernels::rnnt_loss", _INPUTS, _forward, _forward_fake, _backward)


def _overlaps_itself(x: torch.Tensor) -> bool:
    """Whether two elements of ``x`` share memory (an expanded tensor, or strides that interleave). Dimensions
    sorted by stride: no overlap if each stride passes the extent of the smaller ones (a sufficient condition,
    exact for the layouts views produce)."""
    dims = sorted((st, sz) for st, sz in zip(x.stride(), x.shape, strict=True) if sz > 1)
    extent = 0
    for st, sz in dims:
        if st <= extent:
            return True
        extent += st * (sz - 1)
    return False


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
    fastemit_loss_scale: bool = True,
    rnnt_type: str = "rnnt",
    validate: bool = True,
    reuse_logits_for_grad: bool = False,
) -> torch.Tensor:
    """RNN-Transducer loss with torchaudio.functional.rnnt_loss's signature and semantics.

    Args:
        logits: [N, T, U+1, V] float: the joint network's scores (``fused_log_softmax=True``) or
            log-probabilities (``fused_log_softmax=False``; the gradient is then with respect to them).
        targets: [N, U] int32/int64 labels; entries past ``target_lengths`` are ignored.
        logit_lengths: [N] frames per sample, in [0, T]: an integer tensor on any device, an integer numpy
            array or a sequence of integers (floats are refused).
        target_lengths: [N] labels per sample, in [0, U], in the same forms.
        blank: blank index; negative counts from the end (-1: the last class).
        clamp: when > 0, every element of the loss's gradient is clamped to [-clamp, clamp] before the upstream
            gradient scales it: torchaudio's documented semantics (its released kernels bound only negative
            gradients, README), and NeMo's.
        reduction: "none" ([N] losses), "sum", or "mean" (over the batch).
        fused_log_softmax: see ``logits``.
        fastemit_lambda: FastEmit regularisation (Yu et al. 2021): the label transitions' gradient is scaled by
            1 + lambda, as warp-rnnt and NeMo do.
        fastemit_loss_scale: the reported loss with FastEmit: True (NeMo's convention) multiplies it by
            1 + lambda; False (warp-rnnt's) leaves it the plain negative log-likelihood. The gradient is the same
            either way.
        rnnt_type: "rnnt" (Graves' transducer) or "rna" (Recurrent Neural Aligner: at most one label per frame,
            and emitting it consumes the frame).
        validate: check lengths and labels against the tensors' contents (on the GPU this reads device memory,
            one synchronisation); pass False inside CUDA graphs. Unchecked bad values cannot cause a memory
            fault or an error: every path clamps lengths to the tensors and labels to [0, V) alike.
        reuse_logits_for_grad: the backward writes the gradient into the logits' own storage (GPU kernels, eager
            mode): the logits are consumed, so nothing may read them after ``backward()``. Saves a tensor the size
            of the logits. Logits whose elements share memory (e.g. expanded) are refused; after the backward
            the logits count as modified in place, so an op whose backward still needs them (the log_softmax or
            activation that produced them, another op that saved them) raises autograd's in-place error rather
            than compute with the gradient's values. The PyTorch path (the CPU without Triton's interpreter,
            float64) keeps its gradient apart and leaves the logits as they are: there the option changes nothing.

    Returns:
        The loss: [N] with ``reduction="none"``, else a scalar; float64 for float64 logits, else float32. +inf
        for a sample with no path through its lattice (no frames but some labels; more labels than frames with
        "rna"); its gradient is zero. A NaN among the scores a sample reads (every class of a cell with edges
        with ``fused_log_softmax``; its blank and next label otherwise) makes that sample's loss and gradient
        NaN, and only that sample's; the gradient is zero outside the cells a sample reads. An empty batch
        (N = 0) gives an empty loss ("none") or 0 ("sum"); "mean" raises.

    Raises:
        ValueError: an argument of the wrong type, shape or value, naming it (and the offending element).

    Example:
        >>> logits = torch.randn(2, 10, 4, 6, requires_grad=True)
        >>> targets = torch.randint(0, 5, (2, 3))
        >>> loss = rnnt_loss(logits, targets, torch.tensor([10, 8]), torch.tensor([3, 2]))
        >>> loss.backward()
    """
    check_float_input(logits, "logits")
    opts = transducer_options(
        blank, 0.0, reduction, clamp, fastemit_lambda, fastemit_loss_scale, fused_log_softmax, validate, rnnt_type
    )
    reuse_logits_for_grad = as_bool(reuse_logits_for_grad, "reuse_logits_for_grad")
    if logits.dim() != 4:
        raise ValueError(f"logits must have 4 dimensions [N, T, U+1, V], got shape {tuple(logits.shape)}")
    N, T, U1, V = logits.shape
    dev = logits.device
    targets, il, tl, blank = check_loss_arguments(
        targets, logit_lengths, target_lengths, opts.blank, opts.reduction, N, U1, V, dev, "logits", "logits.shape[2]"
    )
    opts = opts._replace(blank=blank)
    if reuse_logits_for_grad and logits.requires_grad and _overlaps_itself(logits):
        raise ValueError(
            "reuse_logits_for_grad=True needs logits whose elements do not share memory (the gradient is written "
            f"over them), got strides {logits.stride()} for shape {tuple(logits.shape)}: pass .contiguous() logits"
        )
    need_grad = torch.is_grad_enabled() and logits.requires_grad
    if kernels is not None and use_triton(logits) and N > 0 and T > 0:
        if reuse_logits_for_grad and torch.compiler.is_compiling():
            raise ValueError("reuse_logits_for_grad=True is not supported under torch.compile")
        return RNNT_LOSS_OP.apply(kernel_layout(logits), targets, il, tl, need_grad, reuse_logits_for_grad, opts)
    loss = RNNT_PYTORCH_OP.apply(logits, targets, il.long(), tl.long(), need_grad, opts)
    return reduce_loss(loss, opts.reduction)


def _pytorch_losses(x, targets, il, tl, need_grad, opts: TransducerOptions):
    """The PyTorch path: the contents checked, then the losses and their gradient by
    ``rnnt_forward_backward_scaled``."""
    N, T, U1, V = x.shape
    if opts.validate:
        check_contents(T, U1 - 1, V, targets, il, tl, opts.blank)
    return rnnt_forward_backward_scaled(x, targets, il, tl, opts, need_grad)


RNNT_PYTORCH_OP = pytorch_path_op(
    "speechkernels::rnnt_loss_pytorch",
    "Tensor x, Tensor targets, Tensor il, Tensor tl, bool need_grad",
    _pytorch_losses,
    batch_dim=0,
    options={"opts": TransducerOptions},
)


class RNNTLoss(LossModule, loss=rnnt_loss):
    """Module form of :func:`rnnt_loss`: the constructor takes its options (``blank``, ``clamp``, ``reduction``,
    ``fused_log_softmax``, keyword ``fastemit_lambda``, ``fastemit_loss_scale``, ``rnnt_type``, ``validate``,
    ``reuse_logits_for_grad``) with the same defaults; ``forward`` its tensors.

    Example:
        >>> criterion = RNNTLoss(blank=0, reduction="sum")
        >>> loss = criterion(logits, targets, logit_lengths, target_lengths)
    """
