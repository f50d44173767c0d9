"""The transducer family's loss options as one value: ``TransducerOptions`` (checked by ``transducer_options``),
which the losses' ops (``transducer_loss_op``), their kernels' launchers and their PyTorch paths take whole."""

from __future__ import annotations

import inspect
from typing import NamedTuple

from .._args import as_bool, as_choice, as_float, as_int
from .._loss_inputs import REDUCTIONS
from .._op import LossOp

RNNT_TYPES = ("rnnt", "rna")


class TransducerOptions(NamedTuple):
    """The options of a transducer loss (RNN-T and RNA, TDT, multi-blank, their fused joints), as the public
    functions take them; ``blank`` is resolved to an index in [0, V) before the loss's op gets the value."""

    blank: int = -1
    sigma: float = 0.0
    reduction: str = "mean"
    clamp: float = -1.0
    fastemit_lambda: float = 0.0
    fastemit_loss_scale: bool = True
    fused_log_softmax: bool = True
    validate: bool = True
    rnnt_type: str = "rnnt"

    @property
    def loss_scale(self) -> float:
        """The reported loss's factor: 1 + lambda with ``fastemit_loss_scale`` (NeMo's convention), else 1."""
        return 1.0 + self.fastemit_lambda if self.fastemit_loss_scale else 1.0

    @property
    def label_scale(self) -> float:
        """FastEmit's factor of the label edges' gradient: 1 + lambda."""
        return 1.0 + self.fastemit_lambda

    @property
    def rna(self) -> bool:
        return self.rnnt_type == "rna"


def transducer_options(
    blank: int = -1,
    sigma: float = 0.0,
    reduction: str = "mean",
    clamp: float = -1.0,
    fastemit_lambda: float = 0.0,
    fastemit_loss_scale: bool = True,
    fused_log_softmax: bool = True,
    validate: bool = True,
    rnnt_type: str = "rnnt",
) -> TransducerOptions:
    """The options the family's losses share, checked (a ValueError names a bad one; blank is checked against the
    classes later). The public functions declare them as explicit keywords (a test keeps their names and defaults
    those of this function) and pass them on positionally: no ``locals()``, which torch.compile cannot trace."""
    return TransducerOptions(
        as_int(blank, "blank"),
        as_float(sigma, "sigma", finite=True),
        as_choice(reduction, "reduction", REDUCTIONS),
        as_float(clamp, "clamp"),
        as_float(fastemit_lambda, "fastemit_lambda", minimum=0.0, finite=True),
        as_bool(fastemit_loss_scale, "fastemit_loss_scale"),
        as_bool(fused_log_softmax, "fused_log_softmax"),
        as_bool(validate, "validate"),
        as_choice(rnnt_type, "rnnt_type", RNNT_TYPES),
    )


def keywords_of(fn) -> tuple[str, ...]:
    """The options a loss function takes as keyword arguments: its parameters with defaults that are fields of
    ``TransducerOptions`` (read once, at import)."""
    params = inspect.signature(fn).parameters.values()
    return tuple(p.name for p in params if p.default is not p.empty and p.name in TransducerOptions._fields)


def as_keywords(opts: TransducerOptions, names: tuple[str, ...]) -> dict:
    """The options value as keyword arguments of the function whose ``keywords_of`` are ``names``: a loss that
    hands its work to another passes its options on without naming each."""
    return {name: getattr(opts, name) for name in names}


def transducer_loss_op(name: str, inputs: str, forward, forward_fake, backward, grads: str = "x", **options) -> LossOp:
    """A transducer loss's op (``LossOp``): three state tensors for its backward (log-sum-exps, the edges'
    occupancies or coefficients, log p), gradients for ``grads``, and as its last inputs the loss's options
    (``TransducerOptions``, named ``opts``), then a value of each of ``options``' types."""
    options = {"opts": TransducerOptions, **options}
    return LossOp(name, inputs, forward, forward_fake, backward, n_state=3, grads=grads, options=options)


class JointNetworkOptions(NamedTuple):
    """The fused joint network's options as its ops take them: the activation, dropout's probability and the
    dropout mask's seed (two int32 halves, drawn per call)."""

    activation: str = "relu"
    dropout: float = 0.0
    seed_lo: int = 0
    seed_hi: int = 0

    @property
    def seed(self) -> tuple[int, int]:
        return self.seed_lo, self.seed_hi
