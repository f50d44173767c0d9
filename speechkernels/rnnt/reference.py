"""RNN-Transducer loss in pure PyTorch: the CPU path and the float64 oracle of the GPU kernels.

The lattice of Graves (2012): node (t, u) means t frames consumed and u labels emitted, for t in [0, T_n] and
u in [0, U_n]. From a node at t < T_n two edges leave:

- blank, to (t + 1, u), weight lp[t, u, blank];
- label u + 1 (when u < U_n), weight lp[t, u, y_u], to (t, u + 1) for RNN-T, or to (t + 1, u + 1) for the
  Recurrent Neural Aligner ("rna": at most one label per frame, and emitting it consumes the frame).

Paths run from (0, 0) to (T_n, U_n); with alpha (from the start) and beta (to the end),

    log p(y | x) = alpha[T_n, U_n] = beta[0, 0]
    occupancy of an edge e from (t, u) to v = exp(alpha[t, u] + w_e + beta[v] - log p)

and the loss is -log p. The gradient with respect to the log-probabilities is minus the edge occupancies,
exactly; through a fused log_softmax it is softmax * (total occupancy of the node) - occupancy. FastEmit
(Yu et al. 2021, as warp-rnnt and NeMo define it) multiplies the label edges' gradient by 1 + lambda; NeMo
also reports the loss times 1 + lambda, warp-rnnt the plain loss (``fastemit_loss_scale``). ``clamp`` > 0
clamps the gradient to [-clamp, clamp].

RNN-T's alpha is computed along anti-diagonals (t + u constant), RNA's row by row; both vectorised over the
batch. Samples with no path (T_n = 0, or U_n > T_n for RNA) get an infinite loss and a zero gradient; a NaN
a sample reads stays in that sample.
"""

from __future__ import annotations

import contextlib

import torch

from .._backend import GRAIN_SIZE, loop_threads
from .._reference import LossWithGradient
from .._transducer.options import TransducerOptions
from .._transducer.reference import reduce_loss

# a lattice of fewer values than this (both directions) is worked on one thread on the CPU (benchmarks/notes/
# package.md, "CPU paths with shared cores")
LATTICE_ONE_THREAD = 8 * GRAIN_SIZE

NEG_INF = float("-inf")
NORMALISE_EVERY = 8  # diagonals between normalisations of the scaled recursion (float64: 700 nats of headroom)
TOL = 1e-9  # largest deviation of a diagonal's occupancy sum from one that the scaled recursion accepts


def lattice_log_probs(
    logits: torch.Tensor, targets: torch.Tensor, blank: int, fused_log_softmax: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The log-probabilities, and per node those of the blank and of the next label.

    Args:
        logits: [N, T, U+1, V].
        targets: [N, U] labels (padding past the target lengths must still index [0, V)).

    Returns:
        lp [N, T, U+1, V], blank [N, T, U+1], emit [N, T, U+1] (-inf in the last row u = U).
    """
    lp = torch.log_softmax(logits, dim=-1) if fused_log_softmax else logits
    lp_blank = lp[..., blank]
    N, T, U1, _ = lp.shape
    idx = targets.long().clamp(0, lp.shape[-1] - 1)[:, None, :, None].expand(N, T, U1 - 1, 1)
    lp_emit = torch.gather(lp[:, :, : U1 - 1], 3, idx).squeeze(3)
    lp_emit = torch.nn.functional.pad(lp_emit, (0, 1), value=NEG_INF)
    return lp, lp_blank, lp_emit


def lattice_masks(T_n: torch.Tensor, U_n: torch.Tensor, T: int, U1: int):
    t = torch.arange(T + 1, device=T_n.device)[None, :, None]
    u = torch.arange(U1, device=T_n.device)[None, None, :]
    node = (t <= T_n[:, None, None]) & (u <= U_n[:, None, None])
    has_edges = node & (t < T_n[:, None, None])  # frames left to consume
    return t, u, node, has_edges


def pad_frame(x: torch.Tensor) -> torch.Tensor:
    """[N, T, U+1] edge weights -> [N, T+1, U+1] (the row t = T has no edges)."""
    return torch.nn.functional.pad(x, (0, 0, 0, 1), value=NEG_INF)


def alpha_beta(
    lp_blank: torch.Tensor, lp_emit: torch.Tensor, T_n: torch.Tensor, U_n: torch.Tensor, rnnt_type: str = "rnnt"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward and backward variables over the nodes, and log p(y | x).

    Args:
        lp_blank, lp_emit: [N, T, U+1] edge weights (from ``lattice_log_probs``).
        T_n, U_n: [N] frames and labels of each sample (T_n in [0, T], U_n in [0, U]).

    Returns:
        alpha, beta: [N, T+1, U+1], -inf outside each sample's lattice; log_p: [N].
    """
    N, T, U1 = lp_blank.shape
    rna = rnnt_type == "rna"
    t, u, node, has_edges = lattice_masks(T_n, U_n, T, U1)
    wb = torch.where(has_edges, pad_frame(lp_blank), NEG_INF)
    we = torch.where(has_edges & (u < U_n[:, None, None]), pad_frame(lp_emit), NEG_INF)
    alpha = torch.full((N, T + 1, U1), NEG_INF, dtype=lp_blank.dtype, device=lp_blank.device)
    beta = torch.full_like(alpha, NEG_INF)
    alpha[:, 0, 0] = 0.0
    n_idx = torch.arange(N, device=alpha.device)
    beta[n_idx, T_n, U_n] = 0.0
    if rna:
        for ti in range(1, T + 1):
            from_blank = alpha[:, ti - 1] + wb[:, ti - 1]
            from_emit = torch.nn.functional.pad(alpha[:, ti - 1, :-1] + we[:, ti - 1, :-1], (1, 0), value=NEG_INF)
            alpha[:, ti] = torch.where(node[:, ti], torch.logaddexp(from_blank, from_emit), NEG_INF)
        for ti in range(T - 1, -1, -1):
            to_blank = wb[:, ti] + beta[:, ti + 1]
            to_emit = torch.nn.functional.pad(we[:, ti, :-1] + beta[:, ti + 1, 1:], (0, 1), value=NEG_INF)
            end = (ti == T_n)[:, None] & (u[0, 0] == U_n[:, None])
            beta[:, ti] = torch.where(end, 0.0, torch.where(node[:, ti], torch.logaddexp(to_blank, to_emit), NEG_INF))
    else:
        # anti-diagonal d holds the nodes t + u = d; both predecessors of a node lie on diagonal d - 1
        for d in range(1, T + U1):
            ui = torch.arange(max(0, d - T), min(d, U1 - 1) + 1, device=alpha.device)
            ti = d - ui
            from_blank = torch.where(ti > 0, alpha[:, ti - 1, ui] + wb[:, (ti - 1).clamp(min=0), ui], NEG_INF)
            from_emit = torch.where(ui > 0, alpha[:, ti, ui - 1] + we[:, ti, (ui - 1).clamp(min=0)], NEG_INF)
            alpha[:, ti, ui] = torch.where(node[:, ti, ui], torch.logaddexp(from_blank, from_emit), NEG_INF)
        for d in range(T + U1 - 2, -1, -1):
            ui = torch.arange(max(0, d - T), min(d, U1 - 1) + 1, device=alpha.device)
            ti = d - ui
            to_blank = torch.where(ti < T, wb[:, ti.clamp(max=T - 1), ui] + beta[:, (ti + 1).clamp(max=T), ui], NEG_INF)
            to_emit = torch.where(ui < U1 - 1, we[:, ti, ui] + beta[:, ti, (ui + 1).clamp(max=U1 - 1)], NEG_INF)
            end = (ti[None, :] == T_n[:, None]) & (ui[None, :] == U_n[:, None])
            value = torch.where(node[:, ti, ui], torch.logaddexp(to_blank, to_emit), NEG_INF)
            beta[:, ti, ui] = torch.where(end, 0.0, value)
    log_p = alpha[n_idx, T_n, U_n]
    # a NaN among the edge weights a sample reads makes its log p NaN, also off every complete path (an RNA cell
    # that cannot reach the end), as the kernels count NaN apart
    read_nan = (torch.isnan(wb) | torch.isnan(we)).flatten(1).any(1)
    log_p = torch.where(read_nan, float("nan"), log_p)
    return alpha, beta, log_p


def rnnt_forward_backward_reference(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    fused_log_softmax: bool = True,
    fastemit_lambda: float = 0.0,
    clamp: float = -1.0,
    rnnt_type: str = "rnnt",
    need_grad: bool = True,
    fastemit_loss_scale: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-sample loss and its gradient with respect to ``logits``, in float64.

    Args:
        logits: [N, T, U+1, V] scores (``fused_log_softmax``) or log-probabilities.
        targets: [N, U] labels; entries past ``target_lengths`` are ignored.
        logit_lengths: [N] in [0, T]; target_lengths: [N] in [0, U].
        blank: index of the blank class in [0, V).
        fused_log_softmax, fastemit_lambda, clamp, rnnt_type, fastemit_loss_scale: as ``rnnt_loss``.

    Returns:
        loss [N] float64 (+inf where no path exists), grad [N, T, U+1, V] float64 or None (zero outside the
        cells with edges, t < T_n and u <= U_n, whatever the scores there).
    """
    opts = TransducerOptions(
        blank=blank,
        clamp=clamp,
        fastemit_lambda=fastemit_lambda,
        fastemit_loss_scale=fastemit_loss_scale,
        fused_log_softmax=fused_log_softmax,
        rnnt_type=rnnt_type,
    )
    return log_space_forward_backward(logits, targets, logit_lengths, target_lengths, opts, need_grad)


def log_space_forward_backward(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    opts: TransducerOptions,
    need_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``rnnt_forward_backward_reference`` with the options as one value (``opts.blank`` an index in [0, V))."""
    blank, fused_log_softmax, clamp, rnnt_type = opts.blank, opts.fused_log_softmax, opts.clamp, opts.rnnt_type
    x = logits.to(torch.float64)
    N, T, U1, V = x.shape
    T_n = logit_lengths.to(x.device, torch.long).clamp(0, T)
    U_n = target_lengths.to(x.device, torch.long).clamp(0, U1 - 1)
    valid_label = torch.arange(U1 - 1, device=x.device)[None, :] < U_n[:, None]
    tg = torch.where(valid_label, targets.to(x.device).long().clamp(0, V - 1), 0)  # unchecked labels: clamped
    lp, lp_blank, lp_emit = lattice_log_probs(x, tg, blank, fused_log_softmax)
    alpha, beta, log_p = alpha_beta(lp_blank, lp_emit, T_n, U_n, rnnt_type)
    loss = -opts.loss_scale * log_p
    if not need_grad:
        return loss, None
    t, u, node, has_edges = lattice_masks(T_n, U_n, T, U1)
    possible = (log_p > NEG_INF)[:, None, None]
    lp_ = log_p[:, None, None]
    wb = torch.where(has_edges, pad_frame(lp_blank), NEG_INF)[:, :T]
    we = torch.where(has_edges & (u < U_n[:, None, None]), pad_frame(lp_emit), NEG_INF)[:, :T]
    beta_next = beta[:, 1:]  # node (t + 1, u)
    beta_emit = beta[:, 1:] if rnnt_type == "rna" else beta[:, :T]
    beta_emit = torch.nn.functional.pad(beta_emit[..., 1:], (0, 1), value=NEG_INF)  # node (t or t + 1, u + 1)
    occ_b = torch.where(possible, torch.exp(alpha[:, :T] + wb + beta_next - lp_), 0.0)
    occ_e = torch.where(possible, torch.exp(alpha[:, :T] + we + beta_emit - lp_), 0.0)
    # NaN anywhere in the sample (log p is NaN then): the gradient of every score it reads is NaN, each blank
    # of its lattice and each next label (and every score of those cells through a fused log_softmax)
    nan = torch.isnan(lp_) & has_edges[:, :T]
    occ_b = torch.where(nan, float("nan"), occ_b)
    occ_e = torch.where(nan & (u < U_n[:, None, None])[:, :T], float("nan"), occ_e)
    g_lp = torch.zeros_like(x)
    g_lp[..., blank] -= occ_b
    g_lp.scatter_add_(3, tg[:, None, :, None].expand(N, T, U1 - 1, 1), -opts.label_scale * occ_e[..., :-1, None])
    if fused_log_softmax:
        grad = g_lp - torch.exp(lp) * g_lp.sum(-1, keepdim=True)
    else:
        grad = g_lp
    if clamp > 0:
        grad = grad.clamp(-clamp, clamp)
    # cells a sample does not read get no gradient, even where their scores are NaN (softmax * 0 above)
    grad = torch.where(has_edges[:, :T, :, None], grad, 0.0)
    return loss, grad


def rnnt_forward_backward_scaled(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    opts: TransducerOptions,
    need_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log_space_forward_backward``'s results (to 1e-9 in float64), faster: the CPU path. The gradient is
    float64 for float64 logits, else float32 (the log-sum-exp over the classes too, as the GPU kernels take it).

    The recursion runs on probabilities in float64 along the anti-diagonals t + u = d (both edges leaving a
    diagonal reach the next one): one diagonal is two ops over the batch, a multiplication by the blank edges'
    probabilities and a shifted multiply-add of the label edges'. Each diagonal's edges are divided by the
    largest of them and every NORMALISE_EVERY diagonals each row is divided by its sum, the factors kept as
    logarithms. The backward variables are the forward variables of the reversed lattice ((t, u) -> (T_n - t,
    U_n - u)), run in the same loop as a second half of the batch. Every path crosses each diagonal once, so the
    occupancies of the edges leaving a diagonal must sum to one (to TOL): an underflow that matters shows there.
    Such samples, samples with a NaN or an infinity among what they read, with no frames, or with zero
    probability, and the RNA lattice go to the log-space reference.

    On the CPU the work on the lattice (the recursion, the occupancies) runs on one thread where the lattice is
    small (``LATTICE_ONE_THREAD``): its operations gain little from threads and, where another process shares the
    cores, each waits for the thread left on a busy core; the operations over the logits keep torch's threads.
    """
    with contextlib.ExitStack() as lattice_threads:
        return _forward_backward_scaled(
            lattice_threads, logits, targets, logit_lengths, target_lengths, opts, need_grad
        )


def _forward_backward_scaled(lattice_threads, logits, targets, logit_lengths, target_lengths, opts, need_grad):
    blank, fused_log_softmax, clamp = opts.blank, opts.fused_log_softmax, opts.clamp
    x = logits
    N, T, U1, V = x.shape
    dev = x.device
    f64 = dict(dtype=torch.float64, device=dev)
    wd = torch.float64 if x.dtype == torch.float64 else torch.float32
    T_n = logit_lengths.to(dev, torch.long).clamp(0, T)
    U_n = target_lengths.to(dev, torch.long).clamp(0, U1 - 1)
    if opts.rna or N == 0 or T == 0:
        return log_space_forward_backward(x, targets, T_n, U_n, opts, need_grad)
    U = U1 - 1
    xw = x.to(wd)
    u_ar = torch.arange(U1, device=dev)
    t_ar = torch.arange(T + 1, device=dev)
    valid_label = u_ar[None, :U] < U_n[:, None]
    tg = torch.where(valid_label, targets.to(dev).long().clamp(0, V - 1), 0)
    # edge log-weights [N, T + 1, U + 1] in float64 (row T: no edges)
    wb = torch.full((N, T + 1, U1), NEG_INF, **f64)
    we = torch.full((N, T + 1, U1), NEG_INF, **f64)
    wb[:, :T] = xw[..., blank]
    we[:, :T, :U] = xw[:, :, :U].gather(3, tg[:, None, :, None].expand(N, T, U, 1))[..., 0]
    lse = None
    if fused_log_softmax:
        lse = torch.logsumexp(xw, 3)  # [N, T, U1]
        wb[:, :T] -= lse
        we[:, :T] -= lse
    lattice_threads.enter_context(loop_threads(dev, 2 * N * (T + U1) * U1, below=LATTICE_ONE_THREAD))
    has_edges = (t_ar[None, :, None] < T_n[:, None, None]) & (u_ar[None, None, :] <= U_n[:, None, None])
    emits = has_edges & (u_ar[None, None, :] < U_n[:, None, None])
    wb = wb.masked_fill(~has_edges, NEG_INF)
    we = we.masked_fill(~emits, NEG_INF)
    bad = (wb.isnan() | (wb == float("inf")) | we.isnan() | (we == float("inf"))).flatten(1).any(1)
    if lse is not None:
        bad |= (~torch.isfinite(lse) & has_edges[:, :T]).flatten(1).any(1)
    # the reversed lattice: node (t', u') is (T_n - t', U_n - u'); its blank edge from (t', u') is the original
    # one into (T_n - t', U_n - u'), its label edge the original one into it from the left
    tb = T_n[:, None] - 1 - t_ar[None, :]  # [N, T+1]
    ub = U_n[:, None] - u_ar[None, :]  # [N, U1]
    te = T_n[:, None] - t_ar[None, :]
    ue = U_n[:, None] - 1 - u_ar[None, :]
    n_ar = torch.arange(N, device=dev)
    ok_b = (tb >= 0)[:, :, None] & (ub >= 0)[:, None, :]
    ok_e = ((te >= 0) & (te < T_n[:, None]))[:, :, None] & (ue >= 0)[:, None, :]
    wbr = torch.where(ok_b, wb[n_ar[:, None, None], tb.clamp(min=0)[:, :, None], ub.clamp(min=0)[:, None, :]], NEG_INF)
    wer = torch.where(ok_e, we[n_ar[:, None, None], te.clamp(min=0)[:, :, None], ue.clamp(min=0)[:, None, :]], NEG_INF)
    # skew: node (t, u) at diagonal d = t + u; both edges leaving diagonal d reach d + 1
    D = T + U1
    d_ar = torch.arange(D, device=dev)
    tt = d_ar[:, None] - u_ar[None, :]  # [D, U1]
    in_lat = (tt >= 0) & (tt <= T)
    idx = tt.clamp(0, T)[None].expand(2 * N, D, U1)
    WB = torch.cat((wb, wbr)).gather(1, idx).masked_fill_(~in_lat, NEG_INF)  # [2N, D, U1]
    WE = torch.cat((we, wer)).gather(1, idx).masked_fill_(~in_lat, NEG_INF)
    m = torch.maximum(WB.amax(2), WE.amax(2))  # [2N, D] per diagonal: the largest edge leaving it
    m = torch.where(torch.isfinite(m), m, 0.0)
    PB = (WB - m[..., None]).exp_().transpose(0, 1).contiguous()  # [D, 2N, U1]
    PE = (WE - m[..., None]).exp_().transpose(0, 1).contiguous()
    A = torch.empty(D, 2 * N, U1, **f64)
    A[0].zero_()
    A[0, :, 0] = 1.0
    sc = torch.ones(D, 2 * N, 1, **f64)
    rows, rows_l, rows_r = A.unbind(0), A[..., :-1].unbind(0), A[..., 1:].unbind(0)
    pbs, pes, scs = PB.unbind(0), PE[..., :-1].unbind(0), sc.unbind(0)
    with loop_threads(dev, 2 * N * U1):
        for d in range(1, D):
            cur = rows[d]
            torch.mul(rows[d - 1], pbs[d - 1], out=cur)
            rows_r[d].addcmul_(rows_l[d - 1], pes[d - 1])
            if d % NORMALISE_EVERY == 0:
                s_d = scs[d]
                torch.sum(cur, 1, keepdim=True, out=s_d)
                s_d.masked_fill_(s_d == 0, 1.0)  # diagonals past a sample's last node
                cur.div_(s_d)
    # log of what was taken out of diagonal d: the normalisations up to d and the shifts of the edges before it
    logF = sc[..., 0].log_().cumsum(0).T + torch.nn.functional.pad(m[:, :-1].cumsum(1), (1, 0))  # [2N, D]
    Dn = T_n + U_n
    a_end = A[Dn, n_ar, U_n]
    logP = a_end.log() + logF[n_ar, Dn]
    ok = ~bad & (a_end > 0) & torch.isfinite(logP) & (T_n > 0)
    loss = -opts.loss_scale * logP
    grad = None
    if need_grad:
        tT = torch.arange(T, device=dev)
        d_tu = tT[None, :, None] + u_ar[None, None, :]  # [1, T, U1]
        dr = (Dn[:, None, None] - d_tu - 1).clamp(min=0)  # the reversed diagonal of either edge's end
        nn_ = n_ar[:, None, None]
        alpha = A[d_tu.clamp(max=D - 1), nn_, u_ar[None, None, :]]  # [N, T, U1]
        lf = logF[nn_, d_tu] - logP[:, None, None]
        rb = A[dr, N + nn_, ub.clamp(min=0)[:, None, :]]
        re = A[dr, N + nn_, (ue.clamp(min=0))[:, None, :]]
        lr = logF[N + nn_, dr]
        occ_b = alpha * rb * torch.exp(wb[:, :T] + lf + lr)
        occ_e = alpha * re * torch.exp(we[:, :T] + lf + lr)
        occ_b = occ_b.masked_fill_(~has_edges[:, :T], 0.0)
        occ_e = occ_e.masked_fill_(~emits[:, :T], 0.0)
        # every path crosses from diagonal d to d + 1 once: the occupancies leaving each diagonal sum to one
        per_d = torch.zeros(N, D, **f64).scatter_add_(
            1, d_tu.expand(N, T, U1).reshape(N, -1), (occ_b + occ_e).reshape(N, -1)
        )
        live_d = torch.arange(D, device=dev)[None, :] < Dn[:, None]
        dev_n = torch.where(live_d, per_d - 1.0, 0.0).abs().amax(1)
        ok = ok & (dev_n < TOL)
        occ_b = occ_b.masked_fill_(~ok[:, None, None], 0.0)
        occ_e = occ_e.masked_fill_(~ok[:, None, None], 0.0)
        lam = opts.label_scale
        lattice_threads.close()  # the dense gradient: operations over the logits
        if fused_log_softmax:
            grad = torch.sub(xw, lse[..., None]).exp_().mul_((occ_b + lam * occ_e).to(wd)[..., None])
        else:
            grad = torch.zeros(N, T, U1, V, dtype=wd, device=dev)
        grad[..., blank] -= occ_b.to(wd)
        grad[:, :, :U].scatter_add_(3, tg[:, None, :, None].expand(N, T, U, 1), (-lam * occ_e[:, :, :U, None]).to(wd))
        if clamp > 0:
            grad.clamp_(-clamp, clamp)
        grad.masked_fill_(~has_edges[:, :T, :, None], 0.0)
    redo = ~ok
    if bool(redo.any()):
        idx = redo.nonzero()[:, 0]
        l2, g2 = log_space_forward_backward(
            x.index_select(0, idx), targets.index_select(0, idx), T_n[idx], U_n[idx], opts, need_grad
        )
        loss[idx] = l2
        if need_grad:
            grad[idx] = g2.to(wd)
    return loss, grad


def rnnt_losses_reference(logits, targets, logit_lengths, target_lengths, opts: TransducerOptions) -> torch.Tensor:
    """Per-sample losses with the analytic gradient of ``log_space_forward_backward`` (gradcheck'd), in
    float32 for every input dtype but float64, as the kernels return them."""

    def compute(x):
        return log_space_forward_backward(x, targets, logit_lengths, target_lengths, opts, need_grad=x.requires_grad)

    return LossWithGradient.apply(logits, compute, 0)


def rnnt_loss_reference(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int = -1,
    clamp: float = -1.0,
    reduction: str = "mean",
    fused_log_softmax: bool = True,
    fastemit_lambda: float = 0.0,
    rnnt_type: str = "rnnt",
    fastemit_loss_scale: bool = True,
) -> torch.Tensor:
    """The reference with torchaudio's signature (no argument checks): float64 arithmetic, any device."""
    V = logits.shape[-1]
    opts = TransducerOptions(
        blank=blank + V if blank < 0 else blank,
        clamp=clamp,
        fastemit_lambda=fastemit_lambda,
        fastemit_loss_scale=fastemit_loss_scale,
        fused_log_softmax=fused_log_softmax,
        rnnt_type=rnnt_type,
    )
    return reduce_loss(rnnt_losses_reference(logits, targets, logit_lengths, target_lengths, opts), reduction)
