"""Token-and-Duration Transducer (TDT; Xu et al. 2023) and multi-blank transducer (Xu et al. 2022) losses in
PyTorch: the float64 oracle of the kernels to come, and the CPU path.

Both are transducers whose edges may jump over several frames. Node (t, u) means t frames consumed and u labels
emitted, t in [0, T_n], u in [0, U_n]; from a node with t < T_n leave

- blank edges of duration d >= 1, to (t + d, u), for t + d <= T_n;
- label edges (u < U_n) of duration d >= 0, to (t + d, u + 1), for t + d < T_n (a path ends with a blank that
  lands on the last frame exactly; an edge that would jump past it does not exist, its probability is lost).

Paths run from (0, 0) to (T_n, U_n), and the loss is -log of the sum over paths of exp(sum of their edge weights):

- TDT, logits [N, T, U+1, V + D]: token log-probabilities lp = log_softmax(logits[..., :V]) - sigma (sigma: the
  logit under-normalisation of the paper), duration log-probabilities ld = log_softmax(logits[..., V:]) over
  ``durations``. The blank edge of duration durations[i] > 0 weighs lp[blank] + ld[i]; the label edge of duration
  durations[i] (0 included) lp[y_u] + ld[i].
- Multi-blank, logits [N, T, U+1, V + B]: lp = log_softmax(logits) - sigma over all classes; the standard blank
  (index ``blank``) has duration 1, big blank i (index blank - 1 - i) duration big_blank_durations[i]; labels
  duration 0. Without big blanks (and sigma = 0) it is the RNN-T loss.

The gradient with respect to an edge weight is minus the edge's occupancy exp(alpha + w + beta - log p); FastEmit
multiplies the label edges' gradient by 1 + lambda (the loss by 1 + lambda too with ``fastemit_loss_scale``, as
``rnnt_loss``); ``clamp`` > 0 clamps the gradient of the token logits (not the durations', as NeMo). A sample with
no path has an infinite loss and a zero gradient; a NaN among the weights a sample reads makes its loss NaN.

alpha and beta run over anti-diagonals (t + u constant): every edge ends on a later diagonal than it starts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._reference import LossWithGradient
from .._transducer.options import TransducerOptions
from .._transducer.reference import reduce_loss

NEG_INF = float("-inf")


def label_log_probs(lp: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per node the log-probability of the next label: [N, T, U+1] from lp [N, T, U+1, C] and targets [N, U]
    (-inf in the last row)."""
    N, T, U1, C = lp.shape
    idx = targets.long().clamp(0, C - 1)[:, None, :, None].expand(N, T, U1 - 1, 1)
    emit = torch.gather(lp[:, :, : U1 - 1], 3, idx).squeeze(3)
    return torch.nn.functional.pad(emit, (0, 1), value=NEG_INF)


def _edge_masks(T_n, U_n, T: int, U1: int, d: int, label: bool) -> torch.Tensor:
    """[N, T, U+1]: where an edge of duration d leaves a node of the sample's lattice and lands inside it."""
    t = torch.arange(T, device=T_n.device)[None, :, None]
    u = torch.arange(U1, device=T_n.device)[None, None, :]
    T_n, U_n = T_n[:, None, None], U_n[:, None, None]
    if label:
        return (t + d < T_n) & (u < U_n)
    return (t < T_n) & (t + d <= T_n) & (u <= U_n)


def _lattice(wb, db, we, de, T_n, U_n):
    """alpha, beta [N, T+1, U+1] and log p [N] of the lattice with blank edges of durations ``db`` (weights
    wb [N, len(db), T, U+1], -inf where there is no edge) and label edges of durations ``de`` (we likewise)."""
    N, _, T, U1 = wb.shape
    dev, dt = wb.device, wb.dtype
    alpha = torch.full((N, T + 1, U1), NEG_INF, dtype=dt, device=dev)
    beta = torch.full_like(alpha, NEG_INF)
    alpha[:, 0, 0] = 0.0
    n_idx = torch.arange(N, device=dev)
    beta[n_idx, T_n, U_n] = 0.0
    edges = [(wb[:, k], d, 0) for k, d in enumerate(db)] + [(we[:, k], d, 1) for k, d in enumerate(de)]
    for diag in range(1, T + U1):
        ui = torch.arange(max(0, diag - T), min(diag, U1 - 1) + 1, device=dev)
        ti = diag - ui
        terms = []
        for w, d, du in edges:
            ts, us = ti - d, ui - du  # the edge's start
            ok = (ts >= 0) & (ts < T) & (us >= 0)
            tc, uc = ts.clamp(0, T - 1), us.clamp(min=0)
            terms.append(torch.where(ok, alpha[:, tc, uc] + w[:, tc, uc], NEG_INF))
        alpha[:, ti, ui] = torch.logsumexp(torch.stack(terms), 0)
    for diag in range(T + U1 - 2, -1, -1):
        ui = torch.arange(max(0, diag - T + 1), min(diag, U1 - 1) + 1, device=dev)  # nodes with t < T
        ti = diag - ui
        terms = []
        for w, d, du in edges:
            te, ue = ti + d, ui + du  # the edge's end
            ok = (te <= T) & (ue < U1)
            terms.append(torch.where(ok, w[:, ti, ui] + beta[:, te.clamp(max=T), ue.clamp(max=U1 - 1)], NEG_INF))
        end = (ti[None, :] == T_n[:, None]) & (ui[None, :] == U_n[:, None])
        beta[:, ti, ui] = torch.where(end, 0.0, torch.logsumexp(torch.stack(terms), 0))
    log_p = alpha[n_idx, T_n, U_n]
    read_nan = torch.isnan(wb).flatten(1).any(1) | torch.isnan(we).flatten(1).any(1)
    return alpha, beta, torch.where(read_nan, float("nan"), log_p)


def _occupancies(w, ds, du, alpha, beta, log_p):
    """Occupancy of each edge [N, K, T, U+1] (0 where there is none or no path exists; NaN throughout a sample
    whose log p is NaN, on its edges)."""
    N, K, T, U1 = w.shape
    out = torch.zeros_like(w)
    lp = log_p[:, None, None]
    for k, d in enumerate(ds):
        end = torch.nn.functional.pad(beta, (0, du, 0, d), value=NEG_INF)[:, d : d + T, du : du + U1]
        occ = torch.exp(alpha[:, :T] + w[:, k] + end - lp)
        occ = torch.where(torch.isfinite(lp), occ, 0.0)
        out[:, k] = torch.where(torch.isnan(lp) & (w[:, k] != NEG_INF), float("nan"), occ)  # NaN weights too
    return out


class _DurationLattice(torch.autograd.Function):
    """Per-sample loss -loss_scale * log p of a duration lattice, differentiable in its edge weights (the label
    edges' gradient times ``label_grad_scale``)."""

    @staticmethod
    def forward(ctx, wb, we, T_n, U_n, db, de, loss_scale, label_grad_scale):
        alpha, beta, log_p = _lattice(wb, db, we, de, T_n, U_n)
        ctx.save_for_backward(wb, we, alpha, beta, log_p)
        ctx.durations, ctx.label_grad_scale = (db, de), label_grad_scale
        return -loss_scale * log_p

    @staticmethod
    def backward(ctx, grad_loss):
        wb, we, alpha, beta, log_p = ctx.saved_tensors
        db, de = ctx.durations
        g = grad_loss[:, None, None, None]
        gb = -_occupancies(wb, db, 0, alpha, beta, log_p) * g
        ge = -ctx.label_grad_scale * _occupancies(we, de, 1, alpha, beta, log_p) * g
        return gb, ge, None, None, None, None, None, None


def _losses(logits, per_sample, clamp, clamp_cols) -> torch.Tensor:
    """Per-sample loss ``per_sample(x)`` of float64 logits x, its gradient computed with the loss (a unit upstream
    gradient per sample) and clamped there (its first ``clamp_cols`` columns: the tokens'), as the kernels do, then
    scaled by the upstream gradient."""

    def compute(x):
        with torch.enable_grad():
            x = x.detach().to(torch.float64).requires_grad_(logits.requires_grad)
            loss = per_sample(x)
            grad = torch.autograd.grad(loss.sum(), x)[0] if logits.requires_grad else None
        if grad is not None and clamp > 0:
            grad[..., :clamp_cols] = grad[..., :clamp_cols].clamp(-clamp, clamp)
        return loss.detach(), grad

    return LossWithGradient.apply(logits, compute, 0)


def _batch(x, targets, logit_lengths, target_lengths):
    """Lengths clamped into the lattice, labels past them zeroed (unchecked labels are clamped where read)."""
    N, T, U1, _ = x.shape
    T_n = torch.as_tensor(logit_lengths, device=x.device).long().clamp(0, T)
    U_n = torch.as_tensor(target_lengths, device=x.device).long().clamp(0, U1 - 1)
    valid = torch.arange(U1 - 1, device=x.device)[None, :] < U_n[:, None]
    return torch.where(valid, targets.to(x.device).long(), 0), T_n, U_n


def _reference(logits, targets, logit_lengths, target_lengths, edges, tokens, opts: TransducerOptions):
    """The per-sample losses of the lattice whose edges ``edges(x, labels)`` gives from float64 logits x: (blank
    weights [N, Kb, T, U+1], their durations, label weights [N, Ke, T, U+1], their durations); ``tokens``: the token
    logits' count (the columns ``opts.clamp`` applies to); FastEmit's factors ``opts.loss_scale`` and
    ``opts.label_scale``. Cells a sample does not read are zeroed first: a NaN there reaches neither its loss nor
    its gradient."""

    def per_sample(x):
        tg, T_n, U_n = _batch(x, targets, logit_lengths, target_lengths)
        N, T, U1, _ = x.shape
        t, u = torch.arange(T, device=x.device), torch.arange(U1, device=x.device)
        read = (t[None, :, None] < T_n[:, None, None]) & (u[None, None, :] <= U_n[:, None, None])
        wb, db, we, de = edges(torch.where(read[..., None], x, 0.0), tg)
        N, _, T, U1 = wb.shape
        wb = torch.where(torch.stack([_edge_masks(T_n, U_n, T, U1, d, False) for d in db], 1), wb, NEG_INF)
        we = torch.where(torch.stack([_edge_masks(T_n, U_n, T, U1, d, True) for d in de], 1), we, NEG_INF)
        return _DurationLattice.apply(wb, we, T_n, U_n, tuple(db), tuple(de), opts.loss_scale, opts.label_scale)

    return _losses(logits, per_sample, opts.clamp, tokens)


def tdt_loss_reference(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor | Sequence[int],
    target_lengths: torch.Tensor | Sequence[int],
    durations: Sequence[int],
    blank: int = -1,
    sigma: float = 0.0,
    fused_log_softmax: bool = True,
    **options,
) -> torch.Tensor:
    """The TDT loss in float64 (no argument checks; the gradient by autograd through the lattice's analytic one).

    Args:
        logits: [N, T, U+1, V + D]: V token logits (the blank among them), then D duration logits.
        durations: the D durations (distinct, >= 0; 0 is a label's duration only).
        blank: index of the blank among the V tokens (negative: from the end of the tokens).
        sigma: the logit undernormalisation subtracted from every token's log-probability.
        fused_log_softmax: False: the logits are the token and duration log-probabilities already.
        options: reduction ("mean", "sum", "none"), clamp (of the token logits' gradient, as NeMo), fastemit_lambda,
            fastemit_loss_scale, as ``rnnt_loss``'s.
    """
    opts = TransducerOptions(blank=blank, sigma=sigma, fused_log_softmax=fused_log_softmax, **options)
    losses = tdt_losses_reference(logits, targets, logit_lengths, target_lengths, tuple(durations), opts)
    return reduce_loss(losses, opts.reduction)


def tdt_losses_reference(
    logits, targets, logit_lengths, target_lengths, durations: tuple[int, ...], opts: TransducerOptions
) -> torch.Tensor:
    """``tdt_loss_reference``'s per-sample losses, with the options as one value."""
    D = len(durations)

    def edges(x, labels):
        V = x.shape[-1] - D
        b = opts.blank + V if opts.blank < 0 else opts.blank
        lp, ld = (torch.log_softmax(h, -1) if opts.fused_log_softmax else h for h in (x[..., :V], x[..., V:]))
        lp = lp - opts.sigma
        emit = label_log_probs(lp, labels)
        wb = torch.stack([lp[..., b] + ld[..., i] for i, d in enumerate(durations) if d > 0], 1)
        we = torch.stack([emit + ld[..., i] for i in range(D)], 1)
        return wb, [d for d in durations if d > 0], we, list(durations)

    return _reference(logits, targets, logit_lengths, target_lengths, edges, logits.shape[-1] - D, opts)


def multiblank_rnnt_loss_reference(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor | Sequence[int],
    target_lengths: torch.Tensor | Sequence[int],
    big_blank_durations: Sequence[int],
    blank: int = -1,
    sigma: float = 0.0,
    fused_log_softmax: bool = True,
    **options,
) -> torch.Tensor:
    """The multi-blank transducer loss in float64 (no argument checks).

    Args:
        logits: [N, T, U+1, V + B]: big blank i at index blank - 1 - i, before the standard blank.
        big_blank_durations: the B big blanks' durations (each >= 2).
        blank: index of the standard blank (negative: from the end).
        sigma, fused_log_softmax, options: as ``tdt_loss_reference``'s.
    """

    opts = TransducerOptions(blank=blank, sigma=sigma, fused_log_softmax=fused_log_softmax, **options)
    losses = multiblank_losses_reference(
        logits, targets, logit_lengths, target_lengths, tuple(big_blank_durations), opts
    )
    return reduce_loss(losses, opts.reduction)


def multiblank_losses_reference(
    logits, targets, logit_lengths, target_lengths, big_blank_durations: tuple[int, ...], opts: TransducerOptions
) -> torch.Tensor:
    """``multiblank_rnnt_loss_reference``'s per-sample losses, with the options as one value."""

    def edges(x, labels):
        b = opts.blank + x.shape[-1] if opts.blank < 0 else opts.blank
        lp = (torch.log_softmax(x, -1) if opts.fused_log_softmax else x) - opts.sigma
        wb = torch.stack([lp[..., b]] + [lp[..., b - 1 - i] for i in range(len(big_blank_durations))], 1)
        return wb, [1, *big_blank_durations], label_log_probs(lp, labels)[:, None], [0]

    return _reference(logits, targets, logit_lengths, target_lengths, edges, logits.shape[-1], opts)
