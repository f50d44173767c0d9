"""What the fused joint losses (RNN-T's, TDT's, multi-blank's) share above their kernels: their op, dropout's seed
and probability, the checked inputs of a joint loss, and ``JointLossModule`` (the joint network's layers and a loss,
one module)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import torch

from .._args import as_choice, as_float, as_int, check_float_input
from .._loss_inputs import Lengths
from .._op import LossOp, bound_arguments
from .activations import ACTIVATIONS, activation_fn
from .checks import check_loss_arguments
from .options import JointNetworkOptions, transducer_loss_op


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


def joint_loss_op(name: str, inputs: str, forward, forward_fake, backward) -> LossOp:
    """A fused joint loss's op: ``transducer_loss_op``'s, with gradients for enc, pred, weight and bias, and the
    joint network's options (``JointNetworkOptions``, named ``net``) after the loss's."""
    return transducer_loss_op(
        name, inputs, forward, forward_fake, backward, "enc pred weight bias", net=JointNetworkOptions
    )


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


def joint_inputs(
    enc,
    pred,
    weight,
    bias,
    targets,
    logit_lengths,
    target_lengths,
    blank: int,
    reduction: str,
    extra: int = 0,
    what: str = "",
):
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
        own += [
            P("activation", P.POSITIONAL_OR_KEYWORD, default="relu", annotation=str),
            P("dropout", P.POSITIONAL_OR_KEYWORD, default=0.0, annotation=float),
            P("device", P.KEYWORD_ONLY, default=None, annotation=torch.device | str | None),
            P("dtype", P.KEYWORD_ONLY, default=None, annotation=torch.dtype | None),
        ]
        cls.__signature__ = inspect.Signature([*dims, *own, *cls._options.values()])

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()
        a = bound_arguments(
            self, self.__signature__, args, kwargs, f" (the loss's options: {', '.join(self._options)})"
        )
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
            self.enc(encoder_outputs),
            self.pred(predictor_outputs),
            self.out.weight,
            self.out.bias,
            targets,
            logit_lengths,
            target_lengths,
            *self._loss_inputs(),
            activation=self.activation,
            dropout=self.dropout if self.training else 0.0,
            generator=generator,
            **self.loss_args,
        )

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
