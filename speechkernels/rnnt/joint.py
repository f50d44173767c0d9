"""The joint network fused with the RNN-T loss: argument checks, autocast, dispatch to the fused Triton kernels
or the PyTorch reference, autograd; and the module owning the joint's three linear layers."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import torch

from .._args import as_bool, as_choice, as_float, as_generator, as_int, check_float_input
from .._backend import triton_missing, use_triton
from .._loss_inputs import REDUCTIONS, Lengths
from .._op import LossOp
from .._transducer.activations import ACTIVATIONS, activation_fn
from .._transducer.checks import check_contents, check_loss_arguments, state_fake, validate_on_device
from .._transducer.reference import reduce_loss
from .joint_reference import RNNTJointLossReferenceFunction, joint_hidden
from .reference import RNNT_TYPES

try:  # the Triton kernels; without Triton (error names it) the PyTorch path serves every call
    from . import joint_kernels
except ImportError as error:
    joint_kernels = triton_missing(error)


_INPUTS = (
    "Tensor enc, Tensor pred, Tensor weight, Tensor? bias, Tensor targets, Tensor il, Tensor tl, int blank, "
    "str activation, float dropout, int seed_lo, int seed_hi, float fastemit_lambda, float loss_scale, "
    "float clamp, bool rna, bool need_grad, bool validate, str reduction"
)


def _forward(enc, pred, weight, bias, targets, il, tl, blank, activation, dropout, seed_lo, seed_hi,
             fastemit_lambda, loss_scale, clamp, rna, need_grad, validate, reduction):  # fmt: skip
    """The fused kernels' forward: the loss (reduced by the kernels) and the backward's state (log-sum-exps,
    edge occupancies, log p; fastemit_lambda and clamp are the backward's)."""
    if validate:
        validate_on_device(enc.shape[1], pred.shape[1] - 1, weight.shape[0], targets, il, tl, blank)
    joint = joint_kernels.JointNetwork(enc, pred, weight, bias, activation, dropout, (seed_lo, seed_hi))
    return joint_kernels.joint_forward(joint, targets, il, tl, blank, loss_scale, rna, need_grad, reduction)


def _forward_fake(enc, pred, weight, bias, targets, il, tl, blank, activation, dropout, seed_lo, seed_hi,
                  fastemit_lambda, loss_scale, clamp, rna, need_grad, validate, reduction):  # fmt: skip
    cells = enc.shape[0] * enc.shape[1] * pred.shape[1]
    return state_fake(enc, enc.shape[0], reduction, cells, 2 * cells)


def _backward(grad_loss, enc, pred, weight, bias, targets, il, tl, lse, occ, logp, blank, activation, dropout,
              seed_lo, seed_hi, fastemit_lambda, clamp, rna, reduction):  # fmt: skip
    """Gradients for enc, pred, weight and bias (None without a bias)."""
    joint = joint_kernels.JointNetwork(enc, pred, weight, bias, activation, dropout, (seed_lo, seed_hi))
    return joint_kernels.joint_backward(grad_loss, joint, targets, il, tl, (lse, occ, logp), blank, fastemit_lambda,
                                        clamp, rna, reduction)  # fmt: skip


JOINT_LOSS_OP = None
if joint_kernels is not None:
    JOINT_LOSS_OP = LossOp("speechkernels::rnnt_joint_loss", _INPUTS, _forward, _forward_fake, _backward, n_state=3,
                           grads="enc pred weight bias")  # fmt: skip


def draw_seed(generator: torch.Generator | None) -> tuple[int, int]:
    """Dropout's two 31-bit seeds from ``generator`` (torch's default CPU generator when None)."""
    device = generator.device if generator is not None else "cpu"
    lo, hi = torch.randint(0, 2**31, (2,), generator=generator, device=device).tolist()
    return lo, hi


def as_dropout(value) -> float:
    dropout = as_float(value, "dropout", minimum=0.0, finite=True)
    if not dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    return dropout


def _check_tensors(enc, pred, weight, bias) -> None:
    for x, name in ((enc, "enc"), (pred, "pred"), (weight, "weight")):
        check_float_input(x, name)
    if bias is not None:
        check_float_input(bias, "bias")
    if enc.dim() != 3:
        raise ValueError(f"enc must be [N, T, H], got shape {tuple(enc.shape)}")
    if pred.dim() != 3:
        raise ValueError(f"pred must be [N, U+1, H], got shape {tuple(pred.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be [V, H], got shape {tuple(weight.shape)}")
    N, T, H = enc.shape
    V = weight.shape[0]
    if pred.shape[0] != N:
        raise ValueError(f"pred has batch size {pred.shape[0]} but enc has {N}")
    if pred.shape[2] != H:
        raise ValueError(f"pred's joint width {pred.shape[2]} differs from enc's {H} (enc [N, T, H], pred [N, U+1, H])")
    if weight.shape[1] != H:
        raise ValueError(f"weight must be [V, H={H}] (enc's joint width), got shape {tuple(weight.shape)}")
    if pred.shape[1] < 1:
        raise ValueError(f"pred must have at least one row (U+1 >= 1), got shape {tuple(pred.shape)}")
    if H < 1:
        raise ValueError(f"the joint width H must be at least 1, got enc shape {tuple(enc.shape)}")
    if V < 1:
        raise ValueError(f"weight must have at least one class (the blank), got shape {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (V,):
        raise ValueError(f"bias must be [V={V}], got shape {tuple(bias.shape)}")
    for x, name in ((pred, "pred"), (weight, "weight"), (bias, "bias")):
        if x is not None and x.device != enc.device:
            raise ValueError(f"{name} is on {x.device} but enc is on {enc.device}")


def joint_inputs(enc, pred, weight, bias, targets, logit_lengths, target_lengths, blank: int, reduction: str,
                 extra: int = 0, what: str = ""):  # fmt: skip
    """A fused joint loss's checked inputs: the joint's tensors (cast to autocast's dtype when it is on, else of
    one dtype) and contiguous, the targets and lengths on enc's device, blank in [0, V) for the V token classes (the
    weight's rows less its last ``extra``, the ``what``). Raises ValueError naming a bad argument.

    Contiguous, because the products' summation order depends on their operands' layouts (cuBLAS's and the CPU's
    alike): a view then gives the bits of its contiguous copy. A view's copy is O(N T H), against the joint's
    O(N T U V H)."""
    _check_tensors(enc, pred, weight, bias)
    N, U1, V = enc.shape[0], pred.shape[1], weight.shape[0] - extra
    if V < 1:
        raise ValueError(f"weight.shape[0]={V + extra} leaves no token class after the {extra} {what}")
    dev = enc.device
    classes_of = f" token classes (weight.shape[0] - {extra} {what})" if extra else " (weight.shape[0])"
    targets, il, tl, blank = check_loss_arguments(
        targets, logit_lengths, target_lengths, blank, reduction, N, U1, V, dev, "enc", "pred.shape[1]", classes_of
    )
    if torch.is_autocast_enabled(dev.type):
        dt = torch.get_autocast_dtype(dev.type)
        enc, pred, weight = enc.to(dt), pred.to(dt), weight.to(dt)
        bias = None if bias is None else bias.to(dt)
    else:
        for x, name in ((pred, "pred"), (weight, "weight"), (bias, "bias")):
            if x is not None and x.dtype != enc.dtype:
                raise ValueError(
                    f"{name} is {x.dtype} but enc is {enc.dtype}: pass one dtype, or run under torch.autocast"
                )
    enc, pred, weight = enc.contiguous(), pred.contiguous(), weight.contiguous()
    bias = None if bias is None else bias.contiguous()
    return enc, pred, weight, bias, targets, il, tl, blank


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
    blank = as_int(blank, "blank")
    clamp = as_float(clamp, "clamp")
    reduction = as_choice(reduction, "reduction", REDUCTIONS)
    fastemit_lambda = as_float(fastemit_lambda, "fastemit_lambda", minimum=0.0, finite=True)
    fastemit_loss_scale = as_bool(fastemit_loss_scale, "fastemit_loss_scale")
    rnnt_type = as_choice(rnnt_type, "rnnt_type", RNNT_TYPES)
    validate = as_bool(validate, "validate")
    generator = as_generator(generator)
    enc, pred, weight, bias, targets, il, tl, blank = joint_inputs(
        enc, pred, weight, bias, targets, logit_lengths, target_lengths, blank, reduction
    )
    N, T, H = enc.shape
    U1, V = pred.shape[1], weight.shape[0]
    dev = enc.device
    seed = draw_seed(generator) if dropout > 0 else (0, 0)
    loss_scale = 1.0 + fastemit_lambda if fastemit_loss_scale else 1.0
    with torch.autocast(dev.type, enabled=False):
        if joint_kernels is not None and use_triton(enc) and N > 0 and T > 0:
            need_grad = torch.is_grad_enabled() and any(
                x is not None and x.requires_grad for x in (enc, pred, weight, bias)
            )
            return JOINT_LOSS_OP.apply(
                enc, pred, weight, bias, targets, il, tl, blank, activation, dropout, *seed,
                fastemit_lambda, loss_scale, clamp, rnnt_type == "rna", need_grad, validate, reduction,
            )  # fmt: skip
        il, tl = il.long(), tl.long()
        if validate:
            check_contents(T, U1 - 1, V, targets, il, tl, blank)
        compute = torch.float64 if enc.dtype == torch.float64 else torch.float32
        loss = RNNTJointLossReferenceFunction.apply(
            enc, pred, weight, bias, targets, il, tl, blank, activation, dropout, seed, fastemit_lambda, clamp,
            rnnt_type, fastemit_loss_scale, compute,
        )  # fmt: skip
        return reduce_loss(loss, reduction)


class JointLossModule(torch.nn.Module):
    """A transducer's joint network and its loss in one module (``class M(JointLossModule, loss=fn)``, fn a fused
    joint loss; ``extra="durations"``: fn's positional argument after the lengths, taken by the constructor after
    ``vocab_size``, checked by the class's ``_check_extra``, adding ``_extra_rows(value)`` rows to the output
    layer): the encoder and predictor projections to the joint width, the activation, dropout and the output
    layer, the loss computed by ``fn`` with the options (fn's keyword-only parameters but the joint's own and the
    generator) the constructor took. The constructor's signature (``inspect.signature``, ``help``) shows them:
    ``(enc_dim, pred_dim, joint_dim, vocab_size, [extra], activation="relu", dropout=0.0, *, device=None,
    dtype=None, **options)``."""

    _loss: Callable
    _extra: str | None = None
    _options: dict[str, inspect.Parameter] = {}

    def __init_subclass__(cls, loss: Callable | None = None, extra: str | None = None, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if loss is None:
            return
        cls._loss, cls._extra = staticmethod(loss), extra
        cls._options = {
            name: p
            for name, p in inspect.signature(loss).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and name not in ("activation", "dropout", "generator")
        }
        P = inspect.Parameter
        dims = [
            P(n, P.POSITIONAL_OR_KEYWORD, annotation=int) for n in ("enc_dim", "pred_dim", "joint_dim", "vocab_size")
        ]
        own = [P(extra, P.POSITIONAL_OR_KEYWORD, annotation=Sequence[int])] if extra else []
        own += [P("activation", P.POSITIONAL_OR_KEYWORD, default="relu", annotation=str),
                P("dropout", P.POSITIONAL_OR_KEYWORD, default=0.0, annotation=float),
                P("device", P.KEYWORD_ONLY, default=None, annotation=torch.device | str | None),
                P("dtype", P.KEYWORD_ONLY, default=None, annotation=torch.dtype | None)]  # fmt: skip
        cls.__signature__ = inspect.Signature([*dims, *own, *cls._options.values()])

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()
        try:
            bound = self.__signature__.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{type(self).__name__}: {e} (the loss's options: {', '.join(self._options)})") from None
        bound.apply_defaults()
        a = bound.arguments
        names = ("enc_dim", "pred_dim", "joint_dim", "vocab_size")
        enc_dim, pred_dim, joint_dim, vocab_size = (as_int(a[k], k, minimum=1) for k in names)
        rows = 0
        if self._extra:
            value = self._check_extra(a[self._extra])
            setattr(self, self._extra, value)
            rows = self._extra_rows(value)
        self.activation = as_choice(a["activation"], "activation", ACTIVATIONS)
        self.dropout = as_dropout(a["dropout"])
        factory = dict(device=a["device"], dtype=a["dtype"])
        self.enc = torch.nn.Linear(enc_dim, joint_dim, **factory)
        self.pred = torch.nn.Linear(pred_dim, joint_dim, **factory)
        self.out = torch.nn.Linear(joint_dim, vocab_size + rows, **factory)
        self.loss_args = {name: a[name] for name in self._options}

    @staticmethod
    def _check_extra(value):
        return value

    @staticmethod
    def _extra_rows(value) -> int:
        return 0

    def forward(
        self,
        encoder_outputs: torch.Tensor,
        predictor_outputs: torch.Tensor,
        targets: torch.Tensor,
        logit_lengths: Lengths,
        target_lengths: Lengths,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """The loss of encoder outputs [N, T, enc_dim] and predictor outputs [N, U+1, pred_dim] (the prediction
        network's states before each label and after the last) for ``targets`` [N, U]."""
        return self._loss(
            self.enc(encoder_outputs), self.pred(predictor_outputs), self.out.weight, self.out.bias, targets,
            logit_lengths, target_lengths, *self._loss_inputs(), activation=self.activation,
            dropout=self.dropout if self.training else 0.0, generator=generator, **self.loss_args,
        )  # fmt: skip

    def _loss_inputs(self) -> tuple:
        """The loss's positional arguments after the lengths: the extra one, if any."""
        return (getattr(self, self._extra),) if self._extra else ()

    def joint(self, encoder_outputs: torch.Tensor, predictor_outputs: torch.Tensor) -> torch.Tensor:
        """The logits [N, T, U+1, outputs] (or of any broadcastable [..., T, 1, enc_dim] and [..., 1, U, pred_dim]
        pair, as greedy decoding uses), without dropout: materialised, for decoding."""
        e = self.enc(encoder_outputs)
        p = self.pred(predictor_outputs)
        if e.dim() == 3 and p.dim() == 3:
            e, p = e[:, :, None], p[:, None]
        return self.out(activation_fn(self.activation)(e + p))

    def extra_repr(self) -> str:
        extra = f"{self._extra}={list(getattr(self, self._extra))}, " if self._extra else ""
        return (
            extra
            + f"activation={self.activation!r}, dropout={self.dropout}, "
            + ", ".join(f"{k}={v!r}" for k, v in self.loss_args.items())
        )


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


__all__ = ["JointLossModule", "RNNTJointLoss", "rnnt_joint_loss", "joint_hidden"]
