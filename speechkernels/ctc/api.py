"""Public CTC loss: argument checks, dispatch to the Triton kernels or the PyTorch reference, autograd."""

from __future__ import annotations

import torch

from .._args import as_bool, as_choice, as_int, check_float_input
from .._backend import kernel_layout, triton_missing, use_triton
from .._loss_inputs import (
    REDUCTIONS,
    Lengths,
    batch_lengths,
    check_label_contents,
    check_targets,
    labels_on,
    padded_labels,
    refuse_flagged,
    targets_padded,
)
from .._op import LossModule, LossOp, pytorch_path_op
from .reference import ctc_forward_backward_scaled, reduce_loss

try:  # the Triton kernels; without Triton (error names it) the PyTorch path serves every call
    from . import kernels
except ImportError as error:
    kernels = triton_missing(error)


# ---------------------------------------------------------------------------------------------------------------
# Triton path, registered with torch.library so that torch.compile treats it as one opaque op


_INPUTS = (
    "Tensor x, Tensor targets, Tensor input_lengths, Tensor target_lengths, int blank, bool padded, bool logits, "
    "bool need_grad, bool validate, bool zero_infinity, str reduction"
)


def _forward(
    x, targets, input_lengths, target_lengths, blank, padded, logits, need_grad, validate, zero_infinity, reduction
):
    """Runs the forward kernels; returns the output and what the backward needs (weights, logp, lse, table, meta,
    sorted labels)."""
    out, state, errors = kernels.ctc_forward(
        x, targets, input_lengths, target_lengths, blank, padded, logits, need_grad, validate, zero_infinity, reduction
    )
    if errors is not None:  # the host-side checks name what the device found, in the PyTorch path's words
        T, _, C = x.shape
        check_label_contents(T, C, targets, input_lengths, target_lengths, blank, padded)
        S = f"targets.shape[1]={targets.shape[1]}" if padded else f"{targets.numel()} (the concatenated targets)"
        refuse_flagged(
            errors, ("input_lengths", input_lengths, f"T={T}"), ("target_lengths", target_lengths, S), C, "C", blank
        )
    return out, state


def _forward_fake(
    x, targets, input_lengths, target_lengths, blank, padded, logits, need_grad, validate, zero_infinity, reduction
):
    T, N, _ = x.shape
    lp_size, _ = kernels.table_sizes(T, N, targets, padded)
    f32 = dict(dtype=torch.float32, device=x.device)
    return (
        x.new_empty(N if reduction == "none" else (), **f32),
        x.new_empty(N, **f32),
        x.new_empty(N, dtype=torch.float64),
        x.new_empty((N, T) if logits else (0,), **f32),
        x.new_empty(lp_size, **f32),
        x.new_empty(kernels.META_ROWS * N + 1, dtype=torch.int64),
        x.new_empty(targets.numel(), dtype=torch.int64),
    )


# state: weights, logp, lse, table, meta, sorted labels
CTC_LOSS_OP = None
if kernels is not None:
    CTC_LOSS_OP = LossOp(
        "speechkernels::ctc_loss", _INPUTS, _forward, _forward_fake, kernels.ctc_backward, n_state=6, grads="x"
    )


# ---------------------------------------------------------------------------------------------------------------
# public API


def ctc_loss(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: Lengths,
    target_lengths: Lengths,
    blank: int = 0,
    reduction: str = "mean",
    zero_infinity: bool = False,
    *,
    batch_first: bool = False,
    logits: bool = False,
    validate: bool = True,
) -> torch.Tensor:
    """Connectionist Temporal Classification loss, a drop-in for ``torch.nn.functional.ctc_loss``.

    Args:
        log_probs: [T, N, C] (or [N, T, C] with ``batch_first``, or [T, C] unbatched) float32/float16/bfloat16
            on the GPU, any float dtype on the CPU. Log-probabilities, or with ``logits=True`` unnormalised
            scores whose log_softmax is fused into the kernels.
        targets: [N, S] padded or 1-D concatenated labels, int32 or int64, on any device. Labels lie in
            [0, C) and differ from ``blank``; padded entries past ``target_lengths`` are ignored.
        input_lengths: [N] frames per sample, each in [0, T]: an integer tensor on any device, an integer numpy
            array or a sequence of integers (floats are refused, as torch refuses them).
        target_lengths: [N] labels per sample, in the same forms.
        blank: index of the blank class (an integer: int, numpy integer or 0-d integer tensor).
        reduction: "none" (per-sample losses), "sum", or "mean" (each loss divided by its target length,
            clamped to at least 1, then averaged over the batch).
        zero_infinity: replace infinite losses (no valid alignment) by zero. Their gradient is zero either way.
        batch_first: ``log_probs`` is [N, T, C].
        logits: ``log_probs`` holds unnormalised scores; the gradient is with respect to them (softmax - occupancy).
            With ``logits=False`` the gradient is the exact derivative with respect to ``log_probs`` (-occupancy),
            so unnormalised or prior-scaled scores get correct gradients.
        validate: check lengths and labels against the tensors' contents. On the GPU this reads device memory
            (one synchronisation); pass False inside CUDA graphs or to skip it. Unchecked bad values cannot
            cause a memory fault or an error: every path clamps lengths to the tensors and labels to [0, C)
            alike, and computes on what that leaves (a label equal to the blank gives meaningless numbers).

    Returns:
        The loss: a scalar, or [N] with ``reduction="none"``. float64 for float64 input, else float32.
        A NaN among the scores a sample reads (any class with ``logits=True``; its labels' and the blank's
        otherwise) at a frame before its input length makes that sample's loss and the gradient of those scores
        NaN, and only that sample's; the gradient of frames past a sample's input length is zero, whatever they
        hold. -inf log-probabilities are zero probabilities. An empty batch (N = 0) gives an empty loss
        ("none") or 0 ("sum"); "mean" raises, as its value is undefined.

    Raises:
        ValueError: an argument of the wrong type, shape or value, naming it (and the offending element).

    Example:
        >>> x = torch.randn(50, 4, 20, requires_grad=True)
        >>> targets = torch.randint(1, 20, (4, 10))
        >>> loss = ctc_loss(x, targets, [50] * 4, [10, 8, 9, 5], logits=True)
        >>> loss.backward()
    """
    check_float_input(log_probs, "log_probs")
    reduction = as_choice(reduction, "reduction", REDUCTIONS)
    blank = as_int(blank, "blank")
    zero_infinity = as_bool(zero_infinity, "zero_infinity")
    batch_first, logits = as_bool(batch_first, "batch_first"), as_bool(logits, "logits")
    validate = as_bool(validate, "validate")
    if log_probs.dim() not in (2, 3):
        shape = tuple(log_probs.shape)
        raise ValueError(f"log_probs must have 3 dimensions [T, N, C] (or 2 unbatched), got shape {shape}")
    check_targets(targets)
    if kernels is not None and use_triton(log_probs):
        log_probs = kernel_layout(log_probs)
    unbatched = log_probs.dim() == 2
    if unbatched:
        x = log_probs.unsqueeze(1)
        if targets.dim() != 1:
            raise ValueError(f"unbatched targets must have 1 dimension, got shape {tuple(targets.shape)}")
        targets = targets.unsqueeze(0)
    else:
        x = log_probs.transpose(0, 1) if batch_first else log_probs
    T, N, C = x.shape
    if not 0 <= blank < C:
        raise ValueError(f"blank={blank} is outside [0, C={C})")
    dev = x.device
    il, tl = batch_lengths(N, dev, reduction, input_lengths=input_lengths, target_lengths=target_lengths)
    padded = targets_padded(targets, N)
    targets = labels_on(targets, dev)

    if kernels is not None and use_triton(x) and N > 0 and T > 0:
        need_grad = torch.is_grad_enabled() and x.requires_grad
        # the kernels zero infinite losses and reduce over the batch themselves
        args = (x, targets, il, tl, blank, padded, logits, need_grad, validate, zero_infinity, reduction)
        out = CTC_LOSS_OP.apply(*args)
    else:
        need_grad = torch.is_grad_enabled() and x.requires_grad
        loss = CTC_PYTORCH_OP.apply(x, targets, il, tl, blank, padded, logits, need_grad, validate)
        out = reduce_loss(loss, tl, reduction, zero_infinity)
    return out.squeeze(0) if unbatched and reduction == "none" else out


def _pytorch_losses(x, targets, il, tl, blank, padded, logits, need_grad, validate):
    """The PyTorch path: the contents checked, lengths clamped as the kernels clamp them, and labels in the
    reference (so that unchecked input gives the kernels' numbers), targets padded; with logits, the scores of
    frames past each input length are not read (a NaN there reaches neither the loss nor the gradient)."""
    T, N, C = x.shape
    if validate:
        check_label_contents(T, C, targets, il, tl, blank, padded)
    targets, lt = padded_labels(targets, tl, padded)
    return ctc_forward_backward_scaled(x, targets, il.clamp(0, T), lt, blank, need_grad=need_grad, logits=logits)


CTC_PYTORCH_OP = pytorch_path_op(
    "speechkernels::ctc_loss_pytorch",
    "Tensor x, Tensor targets, Tensor il, Tensor tl, int blank, bool padded, bool logits, bool need_grad, "
    "bool validate",
    _pytorch_losses,
    batch_dim=1,
)


class CTCLoss(LossModule, loss=ctc_loss):
    """Module form of :func:`ctc_loss`: the constructor takes its options (``blank``, ``reduction``,
    ``zero_infinity``, keyword ``batch_first``, ``logits``, ``validate``) with the same defaults; ``forward`` its
    tensors.

    Example:
        >>> criterion = CTCLoss(blank=0, logits=True)
        >>> loss = criterion(x, targets, input_lengths, target_lengths)
    """
