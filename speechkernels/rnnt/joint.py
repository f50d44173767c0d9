"""The joint network fused with the RNN-T loss: argument checks, autocast, dispatch to the fused Triton kernels
or the PyTorch reference, autograd; and the module owning the joint's three linear layers."""

from __future__ import annotations

import torch

from .._args import as_choice, as_generator
from .._backend import triton_missing, use_triton
from .._loss_inputs import Lengths
from .._transducer.activations import ACTIVATIONS
from .._transducer.checks import check_contents, state_fake, validate_on_device
from .._transducer.joint import JointLossModule, as_dropout, draw_seed, joint_inputs, joint_loss_op
from .._transducer.options import JointNetworkOptions, transducer_options
from .._transducer.reference import reduce_loss
from .joint_reference import RNNTJointLossReferenceFunction

try:  # the Triton kernels; without Triton (error names it) the PyTorch path serves every call
    from .._transducer import joint_kernels
    from . import kernels
except ImportError as error:
    joint_kernels = triton_missing(error)
    kernels = None


_INPUTS = "Tensor enc, Tensor pred, Tensor weight, Tensor? bias, Tensor targets, Tensor il, Tensor tl, bool need_grad"


def _forward(enc, pred, weight, bias, targets, il, tl, need_grad, opts, net):
    """The fused kernels' forward: the loss (reduced by the kernels) and the backward's state (log-sum-exps,
    edge occupancies, log p)."""
    if opts.validate:
        validate_on_device(enc.shape[1], pred.shape[1] - 1, weight.shape[0], targets, il, tl, opts.blank)
    joint = joint_kernels.JointNetwork(enc, pred, weight, bias, net.activation, net.dropout, net.seed)
    return kernels.joint_forward(joint, targets, il, tl, opts, need_grad)


def _forward_fake(enc, pred, weight, bias, targets, il, tl, need_grad, opts, net):
    cells = enc.shape[0] * enc.shape[1] * pred.shape[1]
    return state_fake(enc, enc.shape[0], opts.reduction, cells, 2 * cells)


def _backward(grad_loss, enc, pred, weight, bias, targets, il, tl, lse, occ, logp, opts, net):
    """Gradients for enc, pred, weight and bias (None without a bias)."""
    joint = joint_kernels.JointNetwork(enc, pred, weight, bias, net.activation, net.dropout, net.seed)
    return joint_kernels.joint_backward(grad_loss, joint, targets, il, tl, (lse, occ, logp), opts)


JOINT_LOSS_OP = None
if joint_kernels is not None:
    JOINT_LOSS_OP = joint_loss_op("speechkernels::rnnt_joint_loss", _INPUTS, _forward, _forward_fake, _backward)


def rnnt_joint_loss(
    enc: torch.Tensor,
    pred: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    logit_lengths: Lengths,
    target_lengths: Lengths,
    *,
    activation: str = "relu",
    dropout: float = 0.0,
    blank: int = -1,
    reduction: str = "mean",
    clamp: float = -1.0,
    fastemit_lambda: float = 0.0,
    fastemit_loss_scale: bool = True,
    rnnt_type: str = "rnnt",
    validate: bool = True,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The RNN-T loss of the joint network ``logits = weight @ dropout(act(enc_t + pred_u)) + bias``, without
    materialising the [N, T, U+1, V] logits (on the GPU; the CPU path makes them a chunk of frames at a time).

    Equal to ``rnnt_loss(F.linear(dropout(act(enc[:, :, None] + pred[:, None])), weight, bias), ...)`` with the
    same loss arguments, and differentiable with respect to enc, pred, weight and bias.

    Args:
        enc: [N, T, H] float: the encoder's output projected to the joint width H.
        pred: [N, U+1, H] float: the prediction network's output projected to H.
        weight: [V, H] the output layer's weight; bias: [V] or None.
        targets: [N, U] int32/int64 labels; entries past ``target_lengths`` are ignored.
        logit_lengths: [N] frames per sample, in [0, T] (an integer tensor, numpy array or sequence).
        target_lengths: [N] labels per sample, in [0, U].
        activation: "relu", "tanh" or "sigmoid", applied to enc_t + pred_u.
        dropout: drop probability in [0, 1) of the hidden vectors' elements (after the activation, as NeMo's
            joint applies it). The mask is a hash of (seed, cell, feature), made again in the backward and never
            stored; the seed is drawn from ``generator``. Pass 0 in evaluation (the module does).
        blank, reduction, clamp, fastemit_lambda, fastemit_loss_scale, rnnt_type, validate: as in ``rnnt_loss``.
        generator: the torch.Generator dropout's seed is drawn from (default: torch's CPU generator, so that
            ``torch.manual_seed`` makes runs repeat; a CUDA generator costs a synchronisation).

    All of enc, pred, weight and bias share one dtype (float32, float16, bfloat16; float64 takes the PyTorch path)
    unless autocast is on, which casts them to its dtype as a linear layer's inputs would be. The products run
    on tensor cores with float32 sums: in the inputs' dtype for 16-bit inputs; for float32 inputs each operand is
    split into bfloat16 hi + lo (hi = x rounded, lo = the rest rounded) and hi·hi + hi·lo + lo·hi summed, about
    2^-17 relative per product (the loss within about 1e-6 and the gradients within 1e-5 of float64 on the GPU
    tests' sizes; the PyTorch path's float32 products are exact).

    Returns:
        The loss: [N] with ``reduction="none"``, else a scalar; float64 for float64 inputs, else float32. Infinite
        and NaN losses follow ``rnnt_loss``'s rules (a NaN in a sample's encoder or predictor rows stays in that
        sample's loss; the weight's and bias's gradients are shared by all samples).

    Raises:
        ValueError: an argument of the wrong type, shape or value, naming it.

    Example:
        >>> enc = torch.randn(2, 50, 64, requires_grad=True)
        >>> pred = torch.randn(2, 6, 64, requires_grad=True)
        >>> out = torch.nn.Linear(64, 30)
        >>> targets = torch.randint(1, 30, (2, 5))
        >>> loss = rnnt_joint_loss(enc, pred, out.weight, out.bias, targets, [50, 40], [5, 3], blank=0)
        >>> loss.backward()
    """
    activation = as_choice(activation, "activation", ACTIVATIONS)
    dropout = as_dropout(dropout)
    opts = transducer_options(
        blank, 0.0, reduction, clamp, fastemit_lambda, fastemit_loss_scale, True, validate, rnnt_type
    )
    generator = as_generator(generator)
    enc, pred, weight, bias, targets, il, tl, blank = joint_inputs(
        enc, pred, weight, bias, targets, logit_lengths, target_lengths, opts.blank, opts.reduction
    )
    opts = opts._replace(blank=blank)
    N, T, H = enc.shape
    U1, V = pred.shape[1], weight.shape[0]
    dev = enc.device
    net = JointNetworkOptions(activation, dropout, *(draw_seed(generator) if dropout > 0 else (0, 0)))
    with torch.autocast(dev.type, enabled=False):
        if joint_kernels is not None and use_triton(enc) and N > 0 and T > 0:
            need_grad = torch.is_grad_enabled() and any(
                x is not None and x.requires_grad for x in (enc, pred, weight, bias)
            )
            return JOINT_LOSS_OP.apply(enc, pred, weight, bias, targets, il, tl, need_grad, opts, net)
        il, tl = il.long(), tl.long()
        if opts.validate:
            check_contents(T, U1 - 1, V, targets, il, tl, blank)
        compute = torch.float64 if enc.dtype == torch.float64 else torch.float32
        loss = RNNTJointLossReferenceFunction.apply(enc, pred, weight, bias, targets, il, tl, opts, net, compute)
        return reduce_loss(loss, opts.reduction)


class RNNTJointLoss(JointLossModule, loss=rnnt_joint_loss):
    """A transducer's joint network and its RNN-T loss in one module: the encoder and predictor projections to the
    joint width, the activation, dropout and the output layer, with the loss computed by :func:`rnnt_joint_loss`
    (the [N, T, U+1, V] logits never exist on the GPU).

    Args:
        enc_dim, pred_dim: widths of the encoder's and the prediction network's outputs.
        joint_dim: the joint width H.
        vocab_size: V, the classes with the blank.
        activation, dropout: as in :func:`rnnt_joint_loss` (dropout applies in training mode only).
        device, dtype: the layers' (as ``torch.nn.Linear``'s).
        **loss_options: the loss's keyword options (``blank``, ``reduction``, ``clamp``, ``fastemit_lambda``,
            ``fastemit_loss_scale``, ``rnnt_type``, ``validate``) as :func:`rnnt_joint_loss` takes them, with its
            defaults.

    The layers are ``enc`` (enc_dim -> H), ``pred`` (pred_dim -> H) and ``out`` (H -> V), ``torch.nn.Linear``
    each. ``joint(...)`` gives the logits themselves (for decoding).

    Example:
        >>> joint = RNNTJointLoss(512, 640, 640, 1025, blank=1024)
        >>> with torch.autocast("cuda", dtype=torch.bfloat16):
        ...     loss = joint(encoder_out, predictor_out, targets, frames, labels)  # [N, T, 512], [N, U+1, 640]
        >>> loss.backward()
    """


__all__ = ["RNNTJointLoss", "rnnt_joint_loss"]
