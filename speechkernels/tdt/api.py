"""Public Token-and-Duration Transducer (TDT) and multi-blank transducer losses: argument checks, the draw of
``omega``, dispatch to the Triton kernels (CUDA tensors, or CPU ones under the interpreter) or the float64
reference, autograd.

The two losses declare the family's options as explicit keywords (the names and defaults of
``_transducer.options.transducer_options``, which a test keeps so) and check them through it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._args import as_float, as_generator, as_int, check_float_input
from .._backend import kernel_layout, triton_missing, use_triton
from .._loss_inputs import Lengths, first_index
from .._op import LossModule, autograd_inside_op, pytorch_path_op
from .._transducer.checks import check_contents, check_loss_arguments, state_fake, validate_on_device
from .._transducer.options import TransducerOptions, as_keywords, keywords_of, transducer_loss_op, transducer_options
from .._transducer.reference import reduce_loss
from ..rnnt import rnnt_loss
from .reference import multiblank_losses_reference, tdt_losses_reference

try:  # the Triton kernels; without Triton (error names it) the PyTorch path serves every call
    from . import kernels
except ImportError as error:
    kernels = triton_missing(error)

_RNNT_LOSS_OPTIONS = keywords_of(rnnt_loss)  # omega's fallback: the RNN-T loss with the same options
_INPUTS = "Tensor x, Tensor targets, Tensor il, Tensor tl, str kind, int[] durations, bool need_grad"


def _check_contents(kind, x, targets, il, tl, durations, blank, on_device: bool) -> None:
    """Lengths and labels (on the kernels' path by a device-side check, one value read back), and no label a big
    blank (multi-blank)."""
    N, T, U1, V = x.shape
    V -= len(durations) if kind == "tdt" else 0
    (validate_on_device if on_device else check_contents)(T, U1 - 1, V, targets, il, tl, blank)
    if kind == "multiblank":
        check_no_big_blank_label(targets, tl, blank, len(durations))


def _forward(x, targets, il, tl, kind, durations, need_grad, opts: TransducerOptions):
    """The kernels' per-sample losses, reduced; the state: log-sum-exps, the entries' coefficients, log2 p."""
    if opts.validate:
        _check_contents(kind, x, targets, il, tl, durations, opts.blank, True)
    loss, state = kernels.tdt_forward(x, targets, il, tl, kind, tuple(durations), opts, need_grad)
    return reduce_loss(loss, opts.reduction), state


def _forward_fake(x, targets, il, tl, kind, durations, need_grad, opts: TransducerOptions):
    N, T, U1, _ = x.shape
    cells = N * T * U1
    return state_fake(x, N, opts.reduction, cells if opts.fused_log_softmax else 0, cells * (2 + len(durations)))


def _backward(grad_loss, x, targets, il, tl, lse, occ, logp, kind, durations, opts: TransducerOptions):
    return kernels.tdt_backward(grad_loss, x, targets, il, tl, (lse, occ, logp), kind, tuple(durations), opts)


TDT_LOSS_OP = None
if kernels is not None:
    TDT_LOSS_OP = transducer_loss_op("speechkernels::tdt_loss", _INPUTS, _forward, _forward_fake, _backward)


def _pytorch_losses(x, targets, il, tl, kind, durations, need_grad, opts: TransducerOptions):
    """The PyTorch path: the contents checked, then the float64 reference's losses and their gradient (by
    autograd, in float64)."""
    if opts.validate:
        _check_contents(kind, x, targets, il, tl, durations, opts.blank, False)
    reference = tdt_losses_reference if kind == "tdt" else multiblank_losses_reference
    with autograd_inside_op():
        v = x.detach().to(torch.float64).requires_grad_(need_grad)
        loss = reference(v, targets, il, tl, tuple(durations), opts)
        grad = torch.autograd.grad(loss.sum(), v)[0] if need_grad else None
    return loss.detach(), grad


TDT_PYTORCH_OP = pytorch_path_op(
    "speechkernels::tdt_loss_pytorch",
    _INPUTS,
    _pytorch_losses,
    batch_dim=0,
    grad_dtype=lambda dtype: torch.float64,
    options={"opts": TransducerOptions},
)


def _durations(value, name: str, minimum: int) -> tuple[int, ...]:
    """A non-empty sequence of distinct integers >= minimum (a list, tuple, numpy array or 1-D integer tensor)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.dtype.is_floating_point or value.dtype == torch.bool:
            raise ValueError(
                f"{name} must be a sequence of integers, got a tensor of shape "
                f"{tuple(value.shape)} and dtype {value.dtype}"
            )
        value = value.tolist()
    if isinstance(value, (str, bytes)) or (not isinstance(value, Sequence) and not hasattr(value, "__len__")):
        raise ValueError(f"{name} must be a sequence of integers, got {type(value).__name__}")
    out = tuple(as_int(d, f"{name}[{i}]", minimum=minimum) for i, d in enumerate(value))
    if len(set(out)) != len(out):
        raise ValueError(f"{name} must be distinct, got {list(out)}")
    return out


def durations_of(value) -> tuple[int, ...]:
    """TDT's ``durations``, checked: distinct integers >= 0, at least one > 0 (a blank's)."""
    durations = _durations(value, "durations", 0)
    if not durations or max(durations) == 0:
        raise ValueError(f"durations must hold a positive duration (a blank's), got {list(durations)}")
    return durations


def _check_logits(logits, extra: int, what: str) -> tuple[int, int, int, int]:
    """(N, T, U + 1, V): V the token classes, the last dimension less the ``extra`` columns (``what``)."""
    check_float_input(logits, "logits")
    if logits.dim() != 4:
        raise ValueError(f"logits must have 4 dimensions [N, T, U+1, V + {what}], got shape {tuple(logits.shape)}")
    N, T, U1, C = logits.shape
    if C <= extra:
        raise ValueError(f"logits.shape[3]={C} leaves no token class after the {extra} {what}")
    return N, T, U1, C - extra


def _inputs(logits, targets, logit_lengths, target_lengths, opts: TransducerOptions, V: int, classes_of: str):
    """Lengths on the logits' device, blank in [0, V), targets on the device (their contents are checked inside
    the loss's op)."""
    N, T, U1, _ = logits.shape
    dev = logits.device
    targets, il, tl, blank = check_loss_arguments(
        targets,
        logit_lengths,
        target_lengths,
        opts.blank,
        opts.reduction,
        N,
        U1,
        V,
        dev,
        "logits",
        "logits.shape[2]",
        classes_of,
    )
    if not _on_kernels(logits):
        il, tl = il.long(), tl.long()
    return targets, il, tl, blank


def _on_kernels(logits: torch.Tensor) -> bool:
    N, T = logits.shape[:2]
    return kernels is not None and use_triton(logits) and N > 0 and T > 0


def _loss(kind, logits, targets, il, tl, durations, blank, opts: TransducerOptions) -> torch.Tensor:
    """The loss, by the kernels where they take the logits, else by the float64 reference (``blank`` resolved)."""
    opts = opts._replace(blank=blank)
    need_grad = torch.is_grad_enabled() and logits.requires_grad
    if _on_kernels(logits):
        return TDT_LOSS_OP.apply(kernel_layout(logits), targets, il, tl, kind, list(durations), need_grad, opts)
    loss = TDT_PYTORCH_OP.apply(logits, targets, il, tl, kind, list(durations), need_grad, opts)
    return reduce_loss(loss, opts.reduction)


def tdt_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: Lengths,
    target_lengths: Lengths,
    durations: Sequence[int],
    *,
    omega: float = 0.0,
    generator: torch.Generator | None = None,
    blank: int = -1,
    sigma: float = 0.0,
    reduction: str = "mean",
    clamp: float = -1.0,
    fastemit_lambda: float = 0.0,
    fastemit_loss_scale: bool = True,
    fused_log_softmax: bool = True,
    validate: bool = True,
) -> torch.Tensor:
    """Token-and-Duration Transducer loss (Xu et al. 2023; NVIDIA's Parakeet-TDT models).

    Args:
        logits: [N, T, U+1, V + D] float: the V token logits (the blank among them), then the D duration logits
            (``fused_log_softmax=False``: the token and the duration log-probabilities). The tokens and the
            durations have separate softmaxes.
        targets: [N, U] int32/int64 labels in [0, V), never the blank; entries past ``target_lengths`` are ignored.
        logit_lengths, target_lengths: [N] frames and labels per sample, as ``rnnt_loss`` takes them.
        durations: the D durations, in the duration logits' order: distinct integers >= 0, at least one > 0
            (e.g. [0, 1, 2, 3, 4]). A blank lasts a positive duration; a label may last 0 frames (the next label
            is emitted at the same frame). A path ends with a blank landing on the sample's last frame exactly.
        omega: the probability that the call computes the plain RNN-T loss of the token logits instead (one draw
            from ``generator`` per call, for the whole batch; the duration logits then get a zero gradient; no
            sigma in that loss), as NeMo's training recipe mixes them.
        generator: the source of omega's draw (None: torch's default CPU generator): a seeded generator makes
            the choice reproducible. A CUDA generator costs a synchronisation per call.
        blank: index of the blank among the V tokens; negative counts from the end of the tokens (-1: the last
            token, NeMo's layout).
        sigma: the logit under-normalisation (the paper's and NeMo's): subtracted from every token
            log-probability of the path (blank or label).
        reduction: "none" ([N] losses), "sum", or "mean" (over the batch).
        clamp: when > 0, the token logits' gradient is clamped to [-clamp, clamp] (the durations' is not, as NeMo).
        fastemit_lambda, fastemit_loss_scale: FastEmit as ``rnnt_loss``: the label edges' gradient (every
            duration) times 1 + lambda, so the duration logits' too (NeMo's TDT kernel leaves those out); the
            reported loss times 1 + lambda with ``fastemit_loss_scale`` (NeMo's convention).
        fused_log_softmax: see ``logits``.
        validate: check lengths and labels against the tensors' contents (reads them once).

    Returns:
        The loss: [N] with ``reduction="none"``, else a scalar; float64 for float64 logits, else float32. +inf
        for a sample with no path (its gradient is zero), NaN for a sample that reads a NaN (only that sample).

    Raises:
        ValueError: an argument of the wrong type, shape or value, naming it.

    Example:
        >>> logits = torch.randn(2, 10, 4, 6 + 3, requires_grad=True)  # 6 tokens (blank last), durations 0, 1, 2
        >>> loss = tdt_loss(logits, torch.randint(0, 5, (2, 3)), [10, 8], [3, 2], durations=[0, 1, 2])
        >>> loss.backward()
    """
    opts = transducer_options(
        blank, sigma, reduction, clamp, fastemit_lambda, fastemit_loss_scale, fused_log_softmax, validate
    )
    durations = durations_of(durations)
    omega = as_float(omega, "omega", minimum=0.0)
    if omega > 1.0:
        raise ValueError(f"omega must be a probability in [0, 1], got {omega}")
    generator = as_generator(generator)
    N, T, U1, V = _check_logits(logits, len(durations), "durations")
    if not -V <= opts.blank < V:
        raise ValueError(
            f"blank={opts.blank} is outside [-V, V) for V={V} token classes (logits.shape[3] - len(durations))"
        )
    if omega > 0.0:
        dev = generator.device if generator is not None else "cpu"
        if torch.rand((), generator=generator, device=dev).item() < omega:
            return rnnt_loss(
                logits[..., :V], targets, logit_lengths, target_lengths, **as_keywords(opts, _RNNT_LOSS_OPTIONS)
            )
    targets, il, tl, blank = _inputs(logits, targets, logit_lengths, target_lengths, opts, V, " token classes")
    return _loss("tdt", logits, targets, il, tl, durations, blank, opts)


def multiblank_rnnt_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: Lengths,
    target_lengths: Lengths,
    big_blank_durations: Sequence[int],
    *,
    blank: int = -1,
    sigma: float = 0.0,
    reduction: str = "mean",
    clamp: float = -1.0,
    fastemit_lambda: float = 0.0,
    fastemit_loss_scale: bool = True,
    fused_log_softmax: bool = True,
    validate: bool = True,
) -> torch.Tensor:
    """Multi-blank transducer loss (Xu et al. 2022): big blanks that consume several frames at once.

    Args:
        logits: [N, T, U+1, V] float, one softmax over all V classes, laid out as NeMo's: the standard blank at
            ``blank`` (default the last class), big blank i at ``blank - 1 - i`` (for durations [2, 4, 8]:
            ..., 8, 4, 2, blank).
        targets: [N, U] int32/int64 labels in [0, V), none of them a blank or a big blank.
        logit_lengths, target_lengths: as ``rnnt_loss`` takes them.
        big_blank_durations: the big blanks' durations: distinct integers >= 2 (the standard blank lasts 1
            frame, a label 0).
        blank, sigma, reduction, clamp, fastemit_lambda, fastemit_loss_scale, fused_log_softmax, validate: as
            ``tdt_loss`` (sigma: subtracted from every class's log-probability; clamp: of the whole gradient).

    Returns:
        As ``tdt_loss``. Without big blanks (and sigma = 0) it is ``rnnt_loss``.

    Example:
        >>> logits = torch.randn(2, 10, 4, 8, requires_grad=True)  # 5 labels, big blanks 4 and 2, the blank
        >>> loss = multiblank_rnnt_loss(logits, torch.randint(0, 5, (2, 3)), [10, 8], [3, 2], [2, 4])
    """
    opts = transducer_options(
        blank, sigma, reduction, clamp, fastemit_lambda, fastemit_loss_scale, fused_log_softmax, validate
    )
    big = big_blanks_of(big_blank_durations)
    N, T, U1, V = _check_logits(logits, 0, "big blanks")
    if not -V <= opts.blank < V:
        raise ValueError(f"blank={opts.blank} is outside [-V, V) for V={V}")
    check_big_blank_room(opts.blank, V, len(big))
    targets, il, tl, blank = _inputs(logits, targets, logit_lengths, target_lengths, opts, V, "")
    return _loss("multiblank", logits, targets, il, tl, big, blank, opts)


def big_blanks_of(value) -> tuple[int, ...]:
    """Multi-blank's ``big_blank_durations``, checked: distinct integers >= 2."""
    return _durations(value, "big_blank_durations", 2)


def check_big_blank_room(blank: int, V: int, n_big: int) -> None:
    """The big blanks sit before the blank: blank (in [-V, V)) leaves room for them among the V classes."""
    b = blank + V if blank < 0 else blank
    if b < n_big:
        raise ValueError(
            f"the {n_big} big blanks sit before the blank (indices {b - n_big} to {b - 1}): "
            f"blank={blank} leaves no room for them in V={V} classes"
        )


def check_no_big_blank_label(targets: torch.Tensor, tl: torch.Tensor, blank: int, n_big: int) -> None:
    """No label (within target_lengths) is a big blank (classes blank - n_big .. blank - 1); reads them once."""
    if not n_big:
        return
    U = targets.shape[1]
    valid = torch.arange(U, device=targets.device)[None, :] < tl[:, None]
    bad = valid & (targets >= blank - n_big) & (targets < blank)
    if bad.any():
        flat = first_index(bad.reshape(-1))
        raise ValueError(
            f"targets[{flat // U}, {flat % U}]={int(targets.reshape(-1)[flat])} is a big blank "
            f"(indices {blank - n_big} to {blank - 1})"
        )


class TDTLoss(LossModule, loss=tdt_loss):
    """Module form of :func:`tdt_loss`: the constructor takes ``durations`` and its keyword options with the same
    defaults; ``forward`` its tensors.

    Example:
        >>> criterion = TDTLoss(durations=[0, 1, 2, 3, 4], sigma=0.05, omega=0.1)
        >>> loss = criterion(logits, targets, logit_lengths, target_lengths)
    """


class MultiblankRNNTLoss(LossModule, loss=multiblank_rnnt_loss):
    """Module form of :func:`multiblank_rnnt_loss`: the constructor takes ``big_blank_durations`` and its keyword
    options with the same defaults; ``forward`` its tensors."""
