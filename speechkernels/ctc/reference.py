"""CTC loss in pure PyTorch: the CPU path and the float64 oracle of the GPU kernels.

The forward-backward algorithm of Graves et al. (2006) in log space, vectorised over the batch, one time
step per loop iteration. Extended label sequence l' = (blank, l1, blank, l2, ..., lL, blank) of 2L+1 states;
a path may stay, advance by one, or skip a blank between two different labels.

    alpha_t(s) = lp_t(l'_s) + logsumexp(alpha_{t-1}(s), alpha_{t-1}(s-1), [skip] alpha_{t-1}(s-2))
    beta_t(s)  = lp_t(l'_s) + logsumexp(beta_{t+1}(s), beta_{t+1}(s+1), [skip] beta_{t+1}(s+2))
    loss       = -log p(l | x) = -logsumexp(alpha_{T-1}(2L), alpha_{T-1}(2L-1))
    d loss / d lp_t(c) = -sum_{s: l'_s = c} exp(alpha_t(s) + beta_t(s) - lp_t(s) + loss)

The gradient is the exact derivative with respect to the log-probabilities as given (they need not be
normalised). Samples with no valid alignment get an infinite loss and a zero gradient.
"""

from __future__ import annotations

import torch

from .._reference import LossWithGradient

NEG_INF = float("-inf")


def _logsumexp3(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(torch.stack((a, b, c)), dim=0)


def _shift_right(x: torch.Tensor, k: int) -> torch.Tensor:
    """x[..., s - k], -inf where s < k."""
    return torch.nn.functional.pad(x[..., : x.shape[-1] - k], (k, 0), value=NEG_INF)


def _shift_left(x: torch.Tensor, k: int) -> torch.Tensor:
    """x[..., s + k], -inf where s + k is past the end."""
    return torch.nn.functional.pad(x[..., k:], (0, k), value=NEG_INF)


def ctc_forward_backward_reference(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int = 0,
    need_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-sample CTC negative log-likelihood and its gradient with respect to ``log_probs``, in float64.

    Args:
        log_probs: [T, N, C] float, log-probabilities (or any scores treated as such).
        targets: [N, S] integer, padded label sequences; entries past ``target_lengths`` are ignored.
        input_lengths: [N] integer in [0, T].
        target_lengths: [N] integer in [0, S].
        blank: blank class index.
        need_grad: also return d loss_n / d log_probs.

    Returns:
        loss: [N] float64, +inf where no alignment exists.
        grad: [T, N, C] float64 or None; zero rows at t >= input_lengths[n] and for infinite losses.
    """
    lp = log_probs.to(torch.float64)
    T, N, C = lp.shape
    device = lp.device
    if targets.shape[1] == 0:  # no sample has labels: one padding column keeps the shifts below well defined
        targets = torch.zeros(N, 1, dtype=torch.int64, device=device)
    S = targets.shape[1]
    Sp = 2 * S + 1
    tl_ = target_lengths.to(device=device, dtype=torch.int64)
    il = input_lengths.to(device=device, dtype=torch.int64)

    pos = torch.arange(S, device=device)
    labels = torch.where(pos < tl_[:, None], targets.to(device=device, dtype=torch.int64), blank)
    ext = torch.full((N, Sp), blank, dtype=torch.int64, device=device)
    ext[:, 1::2] = labels
    s = torch.arange(Sp, device=device)
    valid = s[None, :] < (2 * tl_ + 1)[:, None]  # [N, Sp]
    skip = torch.zeros((N, Sp), dtype=torch.bool, device=device)
    skip[:, 3::2] = labels[:, 1:] != labels[:, :-1]  # label state may be entered from the previous label

    if T == 0:
        loss = torch.where(tl_ == 0, 0.0, float("inf")).to(torch.float64)
        return loss, (torch.zeros_like(lp) if need_grad else None)

    # the classes read, clamped to [0, C) (unchecked labels); which labels repeat is decided on the labels as given
    ext_c = ext.clamp(0, C - 1)
    lpe = lp.gather(2, ext_c[None].expand(T, N, Sp))  # [T, N, Sp] emission of each state
    neg = torch.full_like(lpe[0], NEG_INF)

    alpha = torch.empty_like(lpe)
    a = neg.clone()
    a[:, 0] = lpe[0, :, 0]
    a[:, 1] = torch.where(tl_ > 0, lpe[0, :, 1], NEG_INF)
    a = torch.where(valid, a, neg)
    alpha[0] = a
    for t in range(1, T):
        a = _logsumexp3(a, _shift_right(a, 1), torch.where(skip, _shift_right(a, 2), neg)) + lpe[t]
        a = torch.where(valid, a, neg)
        alpha[t] = a

    last = (il - 1).clamp(min=0)
    a_end = alpha[last, torch.arange(N, device=device)]  # [N, Sp] alpha at t = T_n - 1
    end_blank = a_end.gather(1, (2 * tl_)[:, None])[:, 0]
    end_label = torch.where(tl_ > 0, a_end.gather(1, (2 * tl_ - 1).clamp(min=0)[:, None])[:, 0], NEG_INF)
    logp = torch.logaddexp(end_blank, end_label)
    logp = torch.where(il == 0, torch.where(tl_ == 0, 0.0, NEG_INF).to(logp), logp)
    # a NaN among the emissions a sample reads (its states' classes at its frames) makes its loss NaN, also where
    # no complete path passes through it (as the kernels count NaN emissions apart); a sample with more labels
    # than the tensor has frames is not read at all (its loss is inf)
    read = valid[None] & (torch.arange(T, device=device)[:, None] < il[None, :])[..., None] & (tl_ <= T)[None, :, None]
    logp = torch.where((torch.isnan(lpe) & read).any(2).any(0), float("nan"), logp)
    loss = -logp
    if not need_grad:
        return loss, None

    grad = torch.zeros_like(lp)
    feasible = logp != NEG_INF  # NaN stays feasible so that it propagates into its own gradient
    is_end = (s[None, :] == (2 * tl_)[:, None]) | ((s[None, :] == (2 * tl_ - 1)[:, None]) & (tl_ > 0)[:, None])
    b = neg.clone()
    for t in range(T - 1, -1, -1):
        rec = _logsumexp3(b, _shift_left(b, 1), torch.where(_shift_left(skip, 2), _shift_left(b, 2), neg)) + lpe[t]
        init = torch.where(is_end, lpe[t], neg)
        b = torch.where((t == il - 1)[:, None], init, torch.where((t < il - 1)[:, None], rec, neg))
        b = torch.where(valid, b, neg)
        at = alpha[t]
        log_gamma = torch.where((at == NEG_INF) | (b == NEG_INF), neg, at + b - lpe[t]) + loss[:, None]
        occ = torch.where(feasible[:, None] & (t < il)[:, None], torch.exp(log_gamma), 0.0)
        grad[t].scatter_add_(1, ext_c, -occ)
    return loss, grad


def ctc_losses_reference(log_probs, targets, input_lengths, target_lengths, blank) -> torch.Tensor:
    """Per-sample CTC losses with the forward-backward gradient, differentiable with respect to log_probs."""

    def compute(x):
        return ctc_forward_backward_reference(x, targets, input_lengths, target_lengths, blank,
                                              need_grad=x.requires_grad)  # fmt: skip

    return LossWithGradient.apply(log_probs, compute, 1)


def ctc_loss_reference(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int = 0,
    reduction: str = "mean",
    zero_infinity: bool = False,
    *,
    logits: bool = False,
) -> torch.Tensor:
    """The whole loss in PyTorch, on already-checked arguments in the [T, N, C], padded-targets layout.

    With ``logits=True`` the scores go through log_softmax first (so the gradient is softmax - occupancy), frames
    past each input length masked out first (they are not read: a NaN there reaches neither loss nor gradient).
    """
    x = read_log_softmax(log_probs, input_lengths, target_lengths) if logits else log_probs
    loss = ctc_losses_reference(x, targets, input_lengths, target_lengths, blank)
    if logits and log_probs.dtype != torch.float64:
        loss = loss.to(torch.float32)
    return reduce_loss(loss, target_lengths, reduction, zero_infinity)


def read_log_softmax(x: torch.Tensor, input_lengths: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
    """float64 log_softmax over the classes of [T, N, C] scores, of the frames the loss reads only: those before
    each input length, of samples with at most T labels (more can never align, and are not read). The others are
    zeroed first, so that a NaN there reaches neither the loss nor, through log_softmax, the gradient."""
    T = x.shape[0]
    il, tl = input_lengths.to(x.device), target_lengths.to(x.device)
    read = (torch.arange(T, device=x.device)[:, None] < il[None, :]) & (tl <= T)[None, :]
    return torch.log_softmax(torch.where(read[..., None], x.to(torch.float64), 0.0), dim=-1)


def reduce_loss(loss: torch.Tensor, target_lengths: torch.Tensor, reduction: str, zero_infinity: bool) -> torch.Tensor:
    """torch.nn.functional.ctc_loss's reductions: "mean" divides by the target length, then averages."""
    if zero_infinity:
        loss = torch.where(loss == float("inf"), torch.zeros_like(loss), loss)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return (loss / target_lengths.to(loss.device).clamp(min=1).to(loss.dtype)).mean()
