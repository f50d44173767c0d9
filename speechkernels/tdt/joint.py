"""The joint network fused with the TDT and multi-blank losses: the logits never exist on the GPU. Argument checks,
dispatch to the fused kernels (the RNN-T joint's chunked products, with the duration head's rows or the big blanks
in the narrow chunk of gathered weight rows, then the TDT recursions) or to the PyTorch path (logits made, then
``tdt_loss`` / ``multiblank_rnnt_loss``), autograd; and the modules owning the joint's layers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from .._args import as_choice, as_float, as_generator
from .._backend import triton_missing, use_triton
from .._loss_inputs import Lengths
from .._transducer.activations import ACTIVATIONS
from .._transducer.checks import state_fake, validate_on_device
from .._transducer.joint import JointLossModule, as_dropout, draw_seed, joint_inputs, joint_loss_op
from .._transducer.joint_reference import joint_hidden
from .._transducer.options import JointNetworkOptions, TransducerOptions, as_keywords, keywords_of, transducer_options
from .._transducer.reference import reduce_loss
from ..rnnt import rnnt_joint_loss
from .api import (
    big_blanks_of,
    check_big_blank_room,
    check_no_big_blank_label,
    durations_of,
    multiblank_rnnt_loss,
    tdt_loss,
)

try:  # the Triton kernels; without Triton (error names it) the PyTorch path serves every call
    from .._transducer import joint_kernels
    from . import kernels as tdt_kernels
except ImportError as error:
    joint_kernels = triton_missing(error)
    tdt_kernels = None

# the losses a joint loss hands its work to (omega's RNN-T fallback; the PyTorch path's materialised logits), and
# the options each takes
_RNNT_JOINT_LOSS_OPTIONS = keywords_of(rnnt_joint_loss)
_TDT_LOSS_OPTIONS = keywords_of(tdt_loss)
_MULTIBLANK_LOSS_OPTIONS = keywords_of(multiblank_rnnt_loss)

_INPUTS = (
    "Tensor enc, Tensor pred, Tensor weight, Tensor? bias, Tensor targets, Tensor il, Tensor tl, str kind, "
    "int[] durations, bool need_grad"
)


def _forward(enc, pred, weight, bias, targets, il, tl, kind, durations, need_grad, opts, net):
    """The lattice from the fused joint kernels, the TDT recursions; the loss reduced and the backward's state
    (log-sum-exps, the entries' coefficients, log2 p). The joint's outputs are scores (``opts.fused_log_softmax``)."""
    N, T, _ = enc.shape
    U1, X, multi = pred.shape[1], len(durations), kind == "multiblank"
    if opts.validate:
        validate_on_device(T, U1 - 1, weight.shape[0] - (0 if multi else X), targets, il, tl, opts.blank)
    joint = joint_kernels.JointNetwork(enc, pred, weight, bias, net.activation, net.dropout, net.seed)
    lse, lat, nan = joint_kernels.joint_lattice(joint, targets, il, tl, opts.blank, False, X, opts.sigma, multi)
    loss, logp = tdt_kernels.tdt_recursions(lat, nan, il, tl, kind, tuple(durations), T, U1, opts, need_grad)
    return reduce_loss(loss, opts.reduction), (lse, lat, logp)


def _forward_fake(enc, pred, weight, bias, targets, il, tl, kind, durations, need_grad, opts, net):
    cells = enc.shape[0] * enc.shape[1] * pred.shape[1]
    return state_fake(enc, enc.shape[0], opts.reduction, cells, cells * (2 + len(durations)))


def _backward(grad_loss, enc, pred, weight, bias, targets, il, tl, lse, occ, logp, kind, durations, opts, net):
    """Gradients for enc, pred, weight and bias (None without a bias)."""
    joint = joint_kernels.JointNetwork(enc, pred, weight, bias, net.activation, net.dropout, net.seed)
    return joint_kernels.joint_backward(
        grad_loss, joint, targets, il, tl, (lse, occ, logp), opts, len(durations), kind == "multiblank"
    )


TDT_JOINT_LOSS_OP = None
if joint_kernels is not None and tdt_kernels is not None:
    TDT_JOINT_LOSS_OP = joint_loss_op("speechkernels::tdt_joint_loss", _INPUTS, _forward, _forward_fake, _backward)


class JointOptions(NamedTuple):
    """The checked options of a fused TDT or multi-blank joint loss (``joint_options``): the joint's activation,
    dropout and generator, and the loss's (``transducer_options``; the logits are scores)."""

    activation: str
    dropout: float
    generator: torch.Generator | None
    loss: TransducerOptions


def joint_options(
    activation: str, dropout: float, generator: torch.Generator | None, loss: TransducerOptions
) -> JointOptions:
    """The checked options of a fused loss: the joint's, and the loss's (``transducer_options``;
    ``fused_log_softmax`` is not one: the joint's outputs are scores)."""
    return JointOptions(
        as_choice(activation, "activation", ACTIVATIONS), as_dropout(dropout), as_generator(generator), loss
    )


def tdt_joint_loss(
    enc: torch.Tensor,
    pred: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,  # the joint network
    targets: torch.Tensor,
    logit_lengths: Lengths,
    target_lengths: Lengths,  # the labels
    durations: Sequence[int],
    *,
    omega: float = 0.0,
    activation: str = "relu",
    dropout: float = 0.0,
    generator: torch.Generator | None = None,
    blank: int = -1,
    sigma: float = 0.0,
    reduction: str = "mean",
    clamp: float = -1.0,
    fastemit_lambda: float = 0.0,
    fastemit_loss_scale: bool = True,
    validate: bool = True,
) -> torch.Tensor:
    """The TDT loss of the joint network ``logits = weight @ dropout(act(enc_t + pred_u)) + bias`` whose last
    ``len(durations)`` outputs are the duration head (NeMo's TDT joint layout: one output layer of V + D rows, the
    V token rows then the D duration rows), without materialising the [N, T, U+1, V + D] logits (on the GPU; the
    PyTorch path makes them).

    Equal to ``tdt_loss(F.linear(dropout(act(enc[:, :, None] + pred[:, None])), weight, bias), targets,
    logit_lengths, target_lengths, durations, ...)`` with the same loss arguments, and differentiable with
    respect to enc, pred, weight and bias.

    Args:
        enc, pred, activation, dropout, generator: as ``rnnt_joint_loss``'s (the generator also draws omega's
            choice, before dropout's seed).
        weight: [V + D, H]: the token rows (the blank among them), then the D duration rows; bias: [V + D] or None.
        targets, logit_lengths, target_lengths: as ``tdt_loss``'s.
        durations, blank, sigma, omega, reduction, clamp, fastemit_lambda, fastemit_loss_scale, validate: as
            ``tdt_loss``'s (omega's RNN-T loss is ``rnnt_joint_loss`` of the token rows).

    All of enc, pred, weight and bias share one dtype unless autocast is on (as ``rnnt_joint_loss``); the
    products' precision is that function's.

    Returns:
        The loss: [N] with ``reduction="none"``, else a scalar; float64 for float64 inputs, else float32.

    Raises:
        ValueError: an argument of the wrong type, shape or value, naming it.

    Example:
        >>> enc = torch.randn(2, 50, 64, requires_grad=True)
        >>> pred = torch.randn(2, 6, 64, requires_grad=True)
        >>> out = torch.nn.Linear(64, 30 + 5)  # 30 tokens (blank last), durations 0 to 4
        >>> targets = torch.randint(0, 29, (2, 5))
        >>> loss = tdt_joint_loss(enc, pred, out.weight, out.bias, targets, [50, 40], [5, 3], [0, 1, 2, 3, 4])
        >>> loss.backward()
    """
    durations = durations_of(durations)
    opts = joint_options(
        activation,
        dropout,
        generator,
        transducer_options(blank, sigma, reduction, clamp, fastemit_lambda, fastemit_loss_scale, True, validate),
    )
    omega = as_float(omega, "omega", minimum=0.0)
    if omega > 1.0:
        raise ValueError(f"omega must be a probability in [0, 1], got {omega}")
    X, lo = len(durations), opts.loss
    enc, pred, weight, bias, targets, il, tl, blank_v = joint_inputs(
        enc, pred, weight, bias, targets, logit_lengths, target_lengths, lo.blank, lo.reduction, X, "durations"
    )
    V = weight.shape[0] - X
    if omega > 0.0:
        dev = opts.generator.device if opts.generator is not None else "cpu"
        if torch.rand((), generator=opts.generator, device=dev).item() < omega:
            return rnnt_joint_loss(
                enc,
                pred,
                weight[:V],
                None if bias is None else bias[:V],
                targets,
                il,
                tl,
                activation=opts.activation,
                dropout=opts.dropout,
                generator=opts.generator,
                **as_keywords(lo, _RNNT_JOINT_LOSS_OPTIONS),
            )
    return _joint_loss("tdt", enc, pred, weight, bias, targets, il, tl, durations, blank_v, opts)


def _joint_loss(kind, enc, pred, weight, bias, targets, il, tl, durations, blank, opts: JointOptions):
    """The loss of checked inputs: the fused kernels where they take them, else the logits made and the unfused
    loss (``tdt_loss`` or ``multiblank_rnnt_loss``)."""
    N, T, _ = enc.shape
    dev = enc.device
    lo = opts.loss
    seed = draw_seed(opts.generator) if opts.dropout > 0 else (0, 0)
    net = JointNetworkOptions(opts.activation, opts.dropout, *seed)
    with torch.autocast(dev.type, enabled=False):
        if joint_kernels is not None and tdt_kernels is not None and use_triton(enc) and N > 0 and T > 0:
            need_grad = torch.is_grad_enabled() and any(
                x is not None and x.requires_grad for x in (enc, pred, weight, bias)
            )
            return TDT_JOINT_LOSS_OP.apply(
                enc,
                pred,
                weight,
                bias,
                targets,
                il,
                tl,
                kind,
                list(durations),
                need_grad,
                lo._replace(blank=blank),
                net,
            )
        h = joint_hidden(enc, pred, 0, T, net.activation, net.dropout, net.seed)
        loss = tdt_loss if kind == "tdt" else multiblank_rnnt_loss
        return loss(
            torch.nn.functional.linear(h, weight, bias),
            targets,
            il,
            tl,
            durations,
            **as_keywords(lo._replace(blank=blank), _TDT_LOSS_OPTIONS if kind == "tdt" else _MULTIBLANK_LOSS_OPTIONS),
        )


def multiblank_joint_loss(
    enc: torch.Tensor,
    pred: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,  # the joint network
    targets: torch.Tensor,
    logit_lengths: Lengths,
    target_lengths: Lengths,  # the labels
    big_blank_durations: Sequence[int],
    *,
    activation: str = "relu",
    dropout: float = 0.0,
    generator: torch.Generator | None = None,
    blank: int = -1,
    sigma: float = 0.0,
    reduction: str = "mean",
    clamp: float = -1.0,
    fastemit_lambda: float = 0.0,
    fastemit_loss_scale: bool = True,
    validate: bool = True,
) -> torch.Tensor:
    """The multi-blank transducer loss of the joint network ``logits = weight @ dropout(act(enc_t + pred_u)) +
    bias`` (weight [V, H]: one softmax over the V classes, big blank i at class ``blank - 1 - i`` as
    ``multiblank_rnnt_loss`` lays them out), without materialising the [N, T, U+1, V] logits (on the GPU).

    Equal to ``multiblank_rnnt_loss(F.linear(dropout(act(enc[:, :, None] + pred[:, None])), weight, bias), ...)``
    with the same loss arguments; enc, pred, activation, dropout and generator as ``rnnt_joint_loss``'s, the rest
    as ``multiblank_rnnt_loss``'s.

    Example:
        >>> out = torch.nn.Linear(64, 30)  # 26 labels, big blanks 8, 4, 2, the blank
        >>> loss = multiblank_joint_loss(enc, pred, out.weight, out.bias, targets, [50, 40], [5, 3], [2, 4, 8])
    """
    big = big_blanks_of(big_blank_durations)
    opts = joint_options(
        activation,
        dropout,
        generator,
        transducer_options(blank, sigma, reduction, clamp, fastemit_lambda, fastemit_loss_scale, True, validate),
    )
    enc, pred, weight, bias, targets, il, tl, blank = joint_inputs(
        enc, pred, weight, bias, targets, logit_lengths, target_lengths, opts.loss.blank, opts.loss.reduction
    )
    check_big_blank_room(opts.loss.blank, weight.shape[0], len(big))
    if opts.loss.validate:
        check_no_big_blank_label(targets, tl, blank, len(big))
    return _joint_loss("multiblank", enc, pred, weight, bias, targets, il, tl, big, blank, opts)


class TDTJointLoss(JointLossModule, loss=tdt_joint_loss, extra="durations"):
    """A TDT model's joint network and its loss in one module: the encoder and predictor projections to the joint
    width, the activation, dropout and one output layer of V + D rows (tokens, then durations), the loss computed
    by :func:`tdt_joint_loss` (the logits never exist on the GPU).

    Args:
        enc_dim, pred_dim: widths of the encoder's and the prediction network's outputs.
        joint_dim: the joint width H.
        vocab_size: V, the token classes with the blank.
        durations: the D durations (e.g. [0, 1, 2, 3, 4]).
        activation, dropout: as in :func:`tdt_joint_loss` (dropout applies in training mode only).
        device, dtype: the layers' (as ``torch.nn.Linear``'s).
        **loss_options: the loss's keyword options (``blank``, ``sigma``, ``omega``, ``reduction``, ``clamp``,
            ``fastemit_lambda``, ``fastemit_loss_scale``, ``validate``) with its defaults.

    The layers are ``enc`` (enc_dim -> H), ``pred`` (pred_dim -> H) and ``out`` (H -> V + D). ``joint(...)``
    gives the logits themselves (for decoding: tokens ``[..., :V]``, durations ``[..., V:]``).

    Example:
        >>> joint = TDTJointLoss(512, 640, 640, 1025, durations=[0, 1, 2, 3, 4], sigma=0.05)
        >>> with torch.autocast("cuda", dtype=torch.bfloat16):
        ...     loss = joint(encoder_out, predictor_out, targets, frames, labels)
        >>> loss.backward()
    """

    @staticmethod
    def _check_extra(value):
        return durations_of(value)

    @staticmethod
    def _extra_rows(value) -> int:
        return len(value)


class MultiblankJointLoss(JointLossModule, loss=multiblank_joint_loss, extra="big_blank_durations"):
    """A multi-blank transducer's joint network and its loss in one module (layers as :class:`RNNTJointLoss`'s,
    the output layer's V rows holding the big blanks before the blank), the loss computed by
    :func:`multiblank_joint_loss`.

    Example:
        >>> joint = MultiblankJointLoss(512, 640, 640, 1028, big_blank_durations=[2, 4, 8])
        >>> loss = joint(encoder_out, predictor_out, targets, frames, labels)
    """

    @staticmethod
    def _check_extra(value):
        return big_blanks_of(value)
