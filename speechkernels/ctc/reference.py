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

import threading

import torch

from .._backend import loop_threads
from .._reference import LossWithGradient

NEG_INF = float("-inf")
NORMALISE_EVERY = 8  # frames between normalisations of the scaled recursion (float64: 700 nats of headroom)
TOL = 1e-9  # largest deviation of a frame's occupancy sum from one that the scaled recursion accepts
SCRATCH_BYTES = 256 * 2**20  # the scaled recursion's buffers kept between calls: at most this much per thread


class _Scratch(threading.local):
    """The scaled recursion's working buffers, kept per thread between calls: fresh pages cost more than the
    arithmetic on them (a first touch of each page; measured as half the time of a T=150, N=8 step). At most
    SCRATCH_BYTES are kept in all; a call whose buffers would pass that gets fresh ones."""

    def __init__(self) -> None:
        self.buffers: dict = {}

    def take(self, slot: str, shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
        n = 1
        for d in shape:
            n *= d
        key = (slot, dtype)
        buf = self.buffers.get(key)
        if buf is not None and buf.numel() >= n:
            return buf[:n].view(shape)
        kept = sum(b.numel() * b.dtype.itemsize for k, b in self.buffers.items() if k != key)
        if torch.device(device).type != "cpu" or kept + n * dtype.itemsize > SCRATCH_BYTES:
            return torch.empty(shape, dtype=dtype, device=device)
        buf = self.buffers[key] = torch.empty(n, dtype=dtype)
        return buf[:n].view(shape)


_SCRATCH = _Scratch()


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
    logp = torch.where(tl_ > T, NEG_INF, logp)  # not read (below): a NaN in its recursion must not show
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


def ctc_forward_backward_scaled(
    x: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int = 0,
    need_grad: bool = True,
    logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``ctc_forward_backward_reference``'s results (to 1e-9 in float64), faster: the CPU path.

    Args:
        x: [T, N, C] log-probabilities, or with ``logits`` scores whose log_softmax is taken (in float32 for
            float32/float16/bfloat16 scores, as the GPU kernels take it; frames past a sample's input length, and
            samples with more labels than T, are not read).
        targets, input_lengths, target_lengths, blank, need_grad: as ``ctc_forward_backward_reference``.

    Returns:
        loss: [N] float64; grad: the gradient of loss.sum() with respect to x (float64 for float64 x, else
        float32): -occupancy for log-probabilities, softmax - occupancy for logits.

    The recursion runs on probabilities in float64 rather than on logarithms: each frame's emissions divided by
    their largest (exp(lp - max)), every NORMALISE_EVERY frames each row divided by its sum and the factor kept as
    a logarithm, so that one step is three multiply-adds over the batch instead of a log-sum-exp. The backward
    variables are the forward variables of the reversed problem (labels reversed, time reversed), run in the same
    loop as a second half of the batch. A sample is recomputed by the log-space reference when that cannot be
    exact: a NaN or an infinity among the scores it reads, a probability that underflowed (a path more than about
    700 nats behind the others at one frame that later matters), or a zero total probability where an alignment
    exists (-inf scores). The check of underflow is exact: the occupancies of every frame must sum to one (to
    TOL); a dropped path that matters shows as a deficit at the frames after it was dropped.
    """
    T, N, C = x.shape
    dev = x.device
    f64 = dict(dtype=torch.float64, device=dev)
    wd = torch.float64 if x.dtype == torch.float64 else torch.float32  # the gradient's dtype
    if targets.shape[1] == 0:
        targets = torch.zeros(N, 1, dtype=torch.int64, device=dev)
    S = targets.shape[1]
    Sp = 2 * S + 1
    tl = target_lengths.to(device=dev, dtype=torch.int64)
    il = input_lengths.to(device=dev, dtype=torch.int64)
    if T == 0 or N == 0:
        return _reference_on(x, targets, il, tl, blank, need_grad, logits)
    xw = x.to(wd)
    pos = torch.arange(S, device=dev)
    in_seq = pos < tl[:, None]
    labels = torch.where(in_seq, targets.to(device=dev, dtype=torch.int64), blank)
    labels_rev = torch.where(in_seq, labels.gather(1, (tl[:, None] - 1 - pos).clamp(min=0)), blank)
    lab2 = torch.cat((labels, labels_rev))  # [2N, S]: the forward problem, then the reversed one
    ext = torch.full((2 * N, Sp), blank, dtype=torch.int64, device=dev)
    ext[:, 1::2] = lab2
    ext_c = ext.clamp(0, C - 1)
    skip = torch.zeros((2 * N, Sp), **f64)
    skip[:, 3::2] = lab2[:, 1:] != lab2[:, :-1]
    skip[:, 1] = 1.0  # the first label is entered from the virtual start (the left pad)
    t_ar = torch.arange(T, device=dev)
    n_ar = torch.arange(N, device=dev)
    live = t_ar[:, None] < il[None, :]  # [T, N]
    t0 = T - il  # the reversed problem runs on time flipped over the whole tensor: it starts at frame T - T_n
    rev_t = torch.arange(T - 1, -1, -1, device=dev)
    take = _SCRATCH.take
    # emissions [2, T, N, Sp]: the forward problem's, then the reversed problem's on flipped time
    p = take("p", (2, T, N, Sp), torch.float64, dev)
    g = take("g", (T, N, Sp), wd, dev)
    torch.gather(xw, 2, ext_c[:N][None].expand(T, N, Sp), out=g)
    p[0].copy_(g)
    torch.gather(xw, 2, ext_c[N:][None].expand(T, N, Sp), out=g)
    torch.index_select(g, 0, rev_t, out=p[1]) if wd == torch.float64 else p[1].copy_(g.index_select(0, rev_t))
    m = p.amax(3, keepdim=True)  # per frame and row: the largest score read (a log_softmax shift cancels in it)
    p.sub_(m).exp_()
    # frames past T_n (NaN included) emit nothing: the forward half's last ones, the reversed half's first ones
    idle = torch.stack((~live, t_ar[:, None] < t0[None, :]))
    p.masked_fill_(idle[..., None], 0.0)
    A = take("A", (T + 1, 2, N, Sp + 2), torch.float64, dev)
    A[:, :, :, :2].zero_()
    A[0].zero_()
    A[0, 0, :, 1] = 1.0
    A[t0, 1, n_ar, 1] = 1.0
    sc = torch.ones(T, 2, N, 1, **f64)
    skip2 = skip.view(2, N, Sp)
    stays, steps, skips = A[..., 2:].unbind(0), A[..., 1:-1].unbind(0), A[..., :-2].unbind(0)
    ps, scs = p.unbind(1), sc.unbind(0)
    with loop_threads(dev, 2 * N * Sp):
        for t in range(T):
            cur = stays[t + 1]
            torch.add(stays[t], steps[t], out=cur)
            cur.addcmul_(skips[t], skip2)
            cur.mul_(ps[t])
            if (t + 1) % NORMALISE_EVERY == 0:
                s_t = scs[t]
                torch.sum(cur, 2, keepdim=True, out=s_t)
                s_t.masked_fill_(s_t == 0, 1.0)  # rows before a reversed problem starts
                cur.div_(s_t)
    sc = sc.view(T, 2 * N, 1)
    m = m.view(2, T, N)
    La = sc[..., 0].log_().cumsum(0)  # [T, 2N]: log of the factors taken out of rows 1..t+1
    last = (il - 1).clamp(min=0)
    a_end = A[il, 0, n_ar, 2:]  # [N, Sp] alpha at frame T_n - 1 (row T_n)
    Phat = a_end.gather(1, (2 * tl)[:, None])[:, 0] + torch.where(
        tl > 0, a_end.gather(1, (2 * tl - 1).clamp(min=0)[:, None])[:, 0], 0.0
    )
    shift = m[0]
    read = live & (tl <= T)[None, :]
    if logits:
        lse = torch.logsumexp(xw, 2)  # [T, N]
        shift = shift - lse.to(torch.float64)
        nan_read = (~torch.isfinite(lse) & read).any(0)
    else:
        nan_read = (shift.isnan() & read).any(0)
    logP = Phat.log() + La[last, n_ar] + torch.where(live, shift, 0.0).sum(0)
    repeats = ((labels[:, 1:] == labels[:, :-1]) & in_seq[:, 1:]).sum(1)
    impossible = (il < tl + repeats) | (tl > T)
    ok = ~impossible & ~nan_read & (Phat > 0) & torch.isfinite(logP)
    loss = torch.where(impossible, float("inf"), -logP)
    loss = torch.where((il == 0) & (tl == 0), 0.0, loss)
    grad = None
    if need_grad:
        # the reversed problem's values before each flipped frame f (row f of A; row t0: the virtual start),
        # brought back to the original frames (flipped again) and states (s' = 2 L - s; past the last: zero)
        R = take("R", (T, N, Sp + 2), torch.float64, dev)
        torch.index_select(A[:-1, 1], 0, rev_t, out=R)
        pre = take("pre", (T, N, Sp + 1), torch.float64, dev)
        pre[:, :, Sp].zero_()
        torch.add(R[:, :, 2:], R[:, :, 1:-1], out=pre[:, :, :Sp])
        pre[:, :, :Sp].addcmul_(R[:, :, :-2], skip[N:])
        s = torch.arange(Sp, device=dev)
        sidx = 2 * tl[:, None] - s[None, :]
        sidx = torch.where(sidx >= 0, sidx, Sp)
        gamma = take("gamma", (T, N, Sp), torch.float64, dev)
        torch.gather(pre, 2, sidx[None].expand(T, N, Sp), out=gamma)
        Lb = torch.cat((torch.zeros(1, N, **f64), La[:-1, N:])).flip(0)
        fac = torch.where(live, torch.exp(La[:, :N] + Lb - La[last, n_ar] - Phat.log()), 0.0)
        gamma.mul_(A[1:, 0, :, 2:]).mul_(fac[..., None])
        dev_n = torch.where(live, gamma.sum(2) - 1.0, 0.0).abs().amax(0)
        ok = ok & (dev_n < TOL)
        if not bool(ok.all()):
            gamma[:, ~ok] = 0.0
        if logits:  # softmax - occupancy on the frames read, of the samples with an alignment
            keep = read & ~impossible[None, :]
            grad = torch.softmax(xw, 2).masked_fill_(~keep[..., None], 0.0)
        else:
            grad = torch.zeros(T, N, C, dtype=wd, device=dev)
        occ = gamma.neg_() if wd == torch.float64 else g.copy_(gamma.neg_())
        grad.scatter_add_(2, ext_c[:N][None].expand(T, N, Sp), occ)
    redo = (~ok & ~impossible & (il > 0)) | nan_read
    if bool(redo.any()):
        idx = redo.nonzero()[:, 0]
        l2, g2 = _reference_on(
            x.index_select(1, idx), targets.index_select(0, idx), il[idx], tl[idx], blank, need_grad, logits
        )
        loss[idx] = l2
        if need_grad:
            grad[:, idx] = g2.to(wd)
    return loss, grad


def _reference_on(x, targets, il, tl, blank, need_grad, logits):
    """``ctc_forward_backward_reference`` on log-probabilities, or on logits through ``read_log_softmax`` with the
    gradient taken back through it (g - softmax * sum(g), log_softmax's derivative)."""
    if not logits:
        return ctc_forward_backward_reference(x, targets, il, tl, blank, need_grad)
    lp = read_log_softmax(x, il, tl)
    loss, g = ctc_forward_backward_reference(lp, targets, il, tl, blank, need_grad)
    if g is not None:
        g = g - lp.exp() * g.sum(2, keepdim=True)
    return loss, g


def ctc_losses_reference(log_probs, targets, input_lengths, target_lengths, blank) -> torch.Tensor:
    """Per-sample CTC losses with the forward-backward gradient, differentiable with respect to log_probs."""

    def compute(x):
        return ctc_forward_backward_reference(
            x, targets, input_lengths, target_lengths, blank, need_grad=x.requires_grad
        )

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
