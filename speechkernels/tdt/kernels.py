"""Triton kernels of the TDT and multi-blank transducer losses (see ``reference.py`` for the lattice).

Per cell (n, t, u) the lattice keeps K = 2 + X log2 entries: the blank token, the next label's token (neg() when
u = U_n), then X more: TDT's duration log-probabilities (their own log-softmax), or the multi-blank loss's big
blanks (the tokens' softmax). Every edge weighs one entry plus, optionally, a second (TDT: token + duration); an
edge table on the device lists per edge its duration and entries, blank edges first.

1. ``_tdt_lattice_kernel``: program = up to BLOCK_R cells of a row (n, t): the tokens' log-sum-exp (natural log,
   kept for the backward), the K entries, NaN counts per sample.
2. ``_tdt_recursion_kernel``: program (n, 0) = sample n's alpha frame by frame, t = 0 .. T_n: the edges into a
   frame's states summed as one maximum and one sum of exp2 (independent terms, not a chain of pairwise sums), then
   its 0-frame label edges by a scan along u (x_u = lae(a_u, x_{u-1} + c_u) composes as affine maps of the log
   semiring); log2 p. Program (n, 1), with a gradient to come: beta backwards, likewise, at the same time. State
   in float64.
3. ``_tdt_occupancy_kernel`` (with a gradient to come): program = a row (n, t): each edge's occupancy
   exp2(alpha + w + beta - log2 p), their sums per entry, written over the row's entries; alpha and beta are then
   dropped.
4. ``_tdt_grad_kernel``: program = cells of a row: the logits' gradient from the entries' sums (softmax times the
   cell's total minus the sums).

Deterministic: no atomics but the NaN counts (integers).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .._launch import cdiv, next_power_of_2
from .._logspace import lae, log2e, lse_total, neg
from .._outputs import kernel_output, kernel_output_like
from .._transducer.lattice import (
    cell_scores,
    grad_cells,
    grad_kernel_args,
    row_cells,
    sample_lengths,
    score_grad_chunks,
)
from .._transducer.options import TransducerOptions

RECURSION_LANES = 1  # values of u per thread in the recursions (warps: the lanes of u over 32 of them, at most 16)


@triton.jit
def _tdt_lattice_kernel(
    x_ptr,  # [N, T, U+1, C] scores or log-probs (any strides)
    lse_ptr,  # [N * T * (U+1)] float32 out (FUSED): the tokens' natural-log log-sum-exp
    lat_ptr,  # [N * T * (U+1), K] float32 out: log2 entries (blank, label, X extra)
    nan_ptr,  # [N] int32 in/out (zeroed): cells with a NaN entry
    tgt_ptr, il_ptr, tl_ptr,
    T, U1, V, X, stride_n, stride_t, stride_u, stride_v, stride_tg, blank, sigma2,
    FUSED: tl.constexpr,
    MULTI: tl.constexpr,  # extra entries: big blanks (blank - 1 - i, in the tokens' softmax), else durations
    ONE_CHUNK: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_X: tl.constexpr,
):  # fmt: skip
    o_r, n, t, u, m_r, T_n, U_n = row_cells(il_ptr, tl_ptr, T, U1, BLOCK_R)
    m_r, p_x, lse, lp_b, lp_y = cell_scores(o_r, n, t, u, m_r, T_n, U_n, x_ptr, lse_ptr, tgt_ptr, V, stride_n, stride_t,
                                            stride_u, stride_v, stride_tg, blank, FUSED, FUSED, ONE_CHUNK, BLOCK_R,
                                            BLOCK_V)  # fmt: skip
    lp_b -= sigma2  # sigma: once per token emitted (neg() stays far below any path)
    lp_y -= sigma2
    o_x = tl.arange(0, BLOCK_X)
    m_x = m_r[:, None] & (o_x < X)[None, :]
    if MULTI:
        xx = tl.load(p_x[:, None] + (blank - 1 - o_x)[None, :] * stride_v, mask=m_x, other=0.0).to(tl.float32)
        ext = (xx - lse[:, None]) * log2e() - sigma2
    else:
        xx = tl.load(p_x[:, None] + (V + o_x)[None, :] * stride_v, mask=m_x, other=float("-inf")).to(tl.float32)
        ext = xx * log2e()
        if FUSED:
            ext = ext - tl.where(m_r, lse_total(ext, 1.0, 1), 0.0)[:, None]
    K = 2 + X
    p_lat = lat_ptr + o_r * K
    tl.store(p_lat, lp_b, mask=m_r)
    tl.store(p_lat + 1, lp_y, mask=m_r)
    tl.store(p_lat[:, None] + 2 + o_x[None, :], ext, mask=m_x)
    nan_x = tl.sum(tl.where(m_x & (ext != ext), 1, 0), axis=1)
    bad = tl.where(m_r & ((lp_b != lp_b) | (lp_y != lp_y) | (nan_x > 0)), 1, 0)
    n_bad = tl.sum(bad, axis=0)
    if n_bad > 0:
        tl.atomic_add(nan_ptr + n, n_bad)


@triton.jit
def _compose(a1, c1, a2, c2):
    """Two steps x -> lae(a, x + c) of a scan, the first then the second (log2, float64)."""
    return lae(a2, a1 + c2), c1 + c2


@triton.jit
def _weight(p_cell, e_ptr, k, mask, U1):
    """Edge k's weight at the cells p_cell of a lattice with its entries U1 apart (entries a, then b unless -1),
    and its duration."""
    d = tl.load(e_ptr + 3 * k)
    ea = tl.load(e_ptr + 3 * k + 1)
    eb = tl.load(e_ptr + 3 * k + 2)
    w = tl.load(p_cell + ea * U1, mask=mask, other=0.0)
    w += tl.load(p_cell + eb * U1, mask=mask & (eb >= 0), other=0.0)
    return w.to(tl.float64), d


@triton.jit
def _edge_term(p_lat, p_st, edge_ptr, k, t, o_u, m_u, T_n, U_n, U1, K, LABEL: tl.constexpr, BETA: tl.constexpr):
    """Edge k's term at frame t of the state being computed: the state at its other end plus its weight, neg()
    where the edge does not exist. Alpha: from (t - d, u) (a blank) or (t - d, u - 1) (a label); beta: to
    (t + d, u) or (t + d, u + 1), the weight at (t, u). p_lat: the sample's lattice as [T, K, U + 1] (entry e of
    cell (t, u) at (t K + e) (U + 1) + u: each entry's row contiguous along u)."""
    d = tl.load(edge_ptr + 3 * k)
    if BETA:
        if LABEL:
            ok = tl.where(t + d < T_n, m_u & (o_u < U_n), False)
            p_other = p_st + (t + d) * U1 + o_u + 1
        else:
            ok = tl.where((t < T_n) & (t + d <= T_n), m_u, False)
            p_other = p_st + (t + d) * U1 + o_u
        p_cell = p_lat + t * K * U1 + o_u
    else:
        if LABEL:
            ok = tl.where((t - d >= 0) & (t < T_n), m_u & (o_u >= 1), False)
            p_other = p_st + (t - d) * U1 + o_u - 1
            p_cell = p_lat + (t - d) * K * U1 + o_u - 1
        else:
            ok = tl.where(t - d >= 0, m_u, False)
            p_other = p_st + (t - d) * U1 + o_u
            p_cell = p_lat + (t - d) * K * U1 + o_u
    w, d = _weight(p_cell, edge_ptr, k, ok, U1)
    other = tl.load(p_other, mask=ok, other=0.0)
    return tl.where(ok, other + w, neg())


@triton.jit
def _frame(start, p_lat, p_st, edge_ptr, t, o_u, m_u, T_n, U_n, U1, K, zero_a, zero_b, NB: tl.constexpr,
           NE: tl.constexpr, BETA: tl.constexpr):  # fmt: skip
    """Frame t's states (alpha, or beta with BETA): the log2-sum of ``start`` and every edge's term, as one
    maximum and one sum of exp2 (the terms are independent: no chain of pairwise sums), then the 0-frame label
    edges along u by a scan."""
    m = start
    for k in tl.static_range(NB + NE):
        m = tl.maximum(m, _edge_term(p_lat, p_st, edge_ptr, k, t, o_u, m_u, T_n, U_n, U1, K, k >= NB, BETA))
    s = tl.exp2((start - m).to(tl.float32))
    for k in tl.static_range(NB + NE):  # the same loads again (cached), each term's share
        x = _edge_term(p_lat, p_st, edge_ptr, k, t, o_u, m_u, T_n, U_n, U1, K, k >= NB, BETA)
        s += tl.exp2((x - m).to(tl.float32))
    a = m + tl.log2(s).to(tl.float64)
    if BETA:
        ok = tl.where((t < T_n) & (zero_a >= 0), m_u & (o_u < U_n), False)
        p_c = p_lat + t * K * U1 + o_u
    else:
        ok = tl.where((t < T_n) & (zero_a >= 0), m_u & (o_u >= 1), False)
        p_c = p_lat + t * K * U1 + o_u - 1
    c = tl.load(p_c + zero_a * U1, mask=ok, other=0.0)
    c += tl.load(p_c + zero_b * U1, mask=ok & (zero_b >= 0), other=0.0)
    c = tl.where(ok, c.to(tl.float64), neg())
    a, _c = tl.associative_scan((a, c), 0, _compose, reverse=BETA)
    return a


@triton.jit
def _tdt_recursion_kernel(
    lat_ptr, alpha_ptr, beta_ptr,  # lat: [N, T, K, U+1] (the lattice, each entry's row along u); alpha, beta:
    # [N, T+1, U+1] float64 out
    logp_ptr,  # [N] float64 out: log2 p (-inf without a path, NaN with a NaN entry)
    nan_ptr, edge_ptr, il_ptr, tl_ptr,
    T, U1, K, zero_a, zero_b,  # the 0-frame label edge's entries (zero_a -1: none)
    NB: tl.constexpr, NE: tl.constexpr,  # blank edges, then label edges of positive durations, in edge_ptr
    BLOCK_U: tl.constexpr,
):  # fmt: skip
    """Program (n, 0): sample n's alpha frame by frame and log2 p; program (n, 1) (launched with a gradient to
    come): its beta, backwards, at the same time."""
    n = tl.program_id(0).to(tl.int64)
    T_n, U_n = sample_lengths(il_ptr, tl_ptr, n, True, T, U1)
    o_u = tl.arange(0, BLOCK_U)
    m_u = o_u <= U_n
    p_lat = lat_ptr + n * T * U1 * K
    if tl.program_id(1) == 0:
        p_a = alpha_ptr + n * (T + 1) * U1
        for t in range(0, T_n + 1):
            start = tl.where(o_u + t == 0, 0.0, neg()).to(tl.float64)
            a = _frame(start, p_lat, p_a, edge_ptr, t, o_u, m_u, T_n, U_n, U1, K, zero_a, zero_b, NB, NE, False)
            tl.store(p_a + t * U1 + o_u, a, mask=m_u)
            tl.debug_barrier()
        logp = tl.sum(tl.where(o_u == U_n, tl.load(p_a + T_n * U1 + o_u, mask=m_u, other=0.0), 0.0), axis=0)
        logp = tl.where(logp < neg() * 0.5, float("-inf"), logp)
        logp = tl.where(tl.load(nan_ptr + n) > 0, float("nan"), logp)
        tl.store(logp_ptr + n, logp)
    else:
        p_b = beta_ptr + n * (T + 1) * U1
        for i in range(0, T_n + 1):
            t = T_n - i
            start = tl.where(t == T_n, tl.where(o_u == U_n, 0.0, neg()), neg()).to(tl.float64)
            b = _frame(start, p_lat, p_b, edge_ptr, t, o_u, m_u, T_n, U_n, U1, K, zero_a, zero_b, NB, NE, True)
            tl.store(p_b + t * U1 + o_u, b, mask=m_u)
            tl.debug_barrier()


@triton.jit
def _entry(rows, o_k, e):
    """Column e of the [R, BLOCK_K] block rows (0 where e < 0)."""
    return tl.sum(tl.where(o_k[None, :] == e, rows, 0.0), axis=1)


@triton.jit
def _add_occupancy(E, o_k, ea, eb, occ):
    return E + tl.where((o_k[None, :] == ea) | (o_k[None, :] == eb), occ[:, None], 0.0)


@triton.jit
def _tdt_occupancy_kernel(
    lat_ptr,  # [N * T * (U+1), K] float32: in, the log2 entries; out, each entry's coefficient (see below)
    alpha_ptr, beta_ptr, logp_ptr, edge_ptr, il_ptr, tl_ptr,
    T, U1, K, zero_a, zero_b, fastemit_scale,
    NB: tl.constexpr, NE: tl.constexpr, FUSED: tl.constexpr, MULTI: tl.constexpr, BLOCK_U: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Program = a row (n, t): each edge's occupancy exp2(alpha + w + beta - log2 p) (label edges times the
    FastEmit scale), summed per entry it weighs with: E. Written over the row's entries: E for the tokens' two and
    the big blanks; TDT's durations, their own softmax's gradient over the occupancy (softmax (FUSED) times the
    tokens' total, less E). Zero in cells without edges or of a sample without a path."""
    nt = tl.program_id(0)
    n = nt // T
    t = nt - n * T
    T_n, U_n = sample_lengths(il_ptr, tl_ptr, n, True, T, U1)
    logp = tl.load(logp_ptr + n)
    o_u = tl.arange(0, BLOCK_U)
    o_k = tl.arange(0, BLOCK_K)
    active = tl.where((t < T_n) & (logp != float("-inf")), o_u <= U_n, False)
    has_label = active & (o_u < U_n)
    p_lat = lat_ptr + (nt.to(tl.int64) * U1 + o_u)[:, None] * K + o_k[None, :]
    m_k = (o_k < K)[None, :]
    rows = tl.load(p_lat, mask=active[:, None] & m_k, other=0.0)
    p_s = (n.to(tl.int64) * (T + 1) + t) * U1 + o_u
    al = tl.load(alpha_ptr + p_s, mask=active, other=0.0) - logp
    E = tl.zeros([BLOCK_U, BLOCK_K], tl.float32)
    for k in tl.static_range(NB):
        d = tl.load(edge_ptr + 3 * k)
        ea = tl.load(edge_ptr + 3 * k + 1)
        eb = tl.load(edge_ptr + 3 * k + 2)
        ok = tl.where(t + d <= T_n, active, False)
        w = _entry(rows, o_k, ea) + _entry(rows, o_k, eb)
        bn = tl.load(beta_ptr + p_s + d * U1, mask=ok, other=0.0)
        E = _add_occupancy(E, o_k, ea, eb, tl.where(ok, tl.exp2((al + w + bn).to(tl.float32)), 0.0))
    for k in tl.static_range(NB, NB + NE + 1):  # the label edges, then the 0-frame one
        if k < NB + NE:
            d = tl.load(edge_ptr + 3 * k)
            ea = tl.load(edge_ptr + 3 * k + 1)
            eb = tl.load(edge_ptr + 3 * k + 2)
        else:
            d = 0
            ea = zero_a
            eb = zero_b
        ok = tl.where((t + d < T_n) & (ea >= 0), has_label, False)
        w = _entry(rows, o_k, ea) + _entry(rows, o_k, eb)
        bn = tl.load(beta_ptr + p_s + d * U1 + 1, mask=ok, other=0.0)
        occ = tl.where(ok, tl.exp2((al + w + bn).to(tl.float32)), 0.0) * fastemit_scale
        E = _add_occupancy(E, o_k, ea, eb, occ)
    if not MULTI:  # the durations' gradient: of their own log-softmax, its total the tokens' occupancy
        coef = -E
        if FUSED:
            total = _entry(E, o_k, 0) + _entry(E, o_k, 1)
            coef += tl.where(active[:, None], tl.exp2(rows), 0.0) * total[:, None]
        E = tl.where((o_k >= 2)[None, :], coef, E)
    tl.store(p_lat, E, mask=(o_u < U1)[:, None] & m_k)


@triton.jit
def _tdt_grad_kernel(
    x_ptr, grad_ptr, lse_ptr,
    occ_ptr,  # [N * T * (U+1), K] float32: the occupancy kernel's coefficients
    logp_ptr,
    gloss_ptr,  # upstream gradient per sample (stride 0: one for the batch)
    gloss_stride, gscale, tgt_ptr, il_ptr, tl_ptr,
    T, U1, V, X, K, stride_n, stride_t, stride_u, stride_v, gstride_n, gstride_t, gstride_u, gstride_v, stride_tg,
    blank, clamp,
    FUSED: tl.constexpr, MULTI: tl.constexpr, CLAMP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
    BLOCK_X: tl.constexpr,  # = X
):  # fmt: skip
    o_r, n, t, u, in_range, T_n, U_n, logp, active, has_label, g = grad_cells(
        il_ptr, tl_ptr, logp_ptr, gloss_ptr, gloss_stride, gscale, T, U1, BLOCK_R
    )
    # (per-cell vectors only, entry by entry: a [cells, K] block here changes the layout of the chunk loop's
    # blocks, at 4x the time)
    p_occ = occ_ptr + o_r * K
    e_blank = tl.load(p_occ, mask=active, other=0.0)
    e_label = tl.load(p_occ + 1, mask=active, other=0.0)
    total = e_blank + e_label  # the tokens' occupancy (each edge uses one token entry)
    if MULTI:
        for i in tl.static_range(BLOCK_X):
            total += tl.load(p_occ + 2 + i, mask=active, other=0.0)
    lab = tl.load(tgt_ptr + n * stride_tg + u, mask=has_label, other=-1).to(tl.int64)
    lab = tl.where(has_label, tl.minimum(tl.maximum(lab, 0), V - 1), -1).to(tl.int32)
    p_x = x_ptr + n * stride_n + t * stride_t + u.to(tl.int64) * stride_u
    p_g = grad_ptr + n * gstride_n + t * gstride_t + u.to(tl.int64) * gstride_u
    lse = tl.zeros([BLOCK_R], tl.float32)
    if FUSED:
        lse = tl.load(lse_ptr + o_r, mask=active, other=0.0)
    # the tokens' scores (multi-blank: but the big blanks' columns, written below)
    score_grad_chunks(p_x, p_g, lse, in_range, active, lab, total, e_blank, e_label, g, V, blank, clamp, stride_v,
                      gstride_v, blank - X, blank, FUSED, CLAMP, MULTI, BLOCK_R, BLOCK_V)  # fmt: skip
    for i in tl.static_range(BLOCK_X):
        e_i = tl.load(p_occ + 2 + i, mask=active, other=0.0)
        if MULTI:  # big blank i: class blank - 1 - i
            cls = blank - 1 - i
            b_g = -e_i
            if FUSED:
                b_x = tl.load(p_x + cls * stride_v, mask=active, other=0.0).to(tl.float32)
                b_g += tl.exp2((b_x - lse) * log2e()) * total
            if CLAMP:
                b_g = tl.minimum(tl.maximum(b_g, -clamp), clamp)
        else:  # duration i (class V + i): its gradient from the occupancy kernel, no clamp (as NeMo)
            cls = V + i
            b_g = e_i
        b_g = tl.where(active, g * b_g, 0.0)
        tl.store(p_g + cls * gstride_v, b_g.to(grad_ptr.dtype.element_ty), mask=in_range)


# ---------------------------------------------------------------------------------------------------------------
# launchers


@functools.cache
def _edge_table(kind: str, durations: tuple[int, ...], device: torch.device):
    """(edges [NB + NE, 3] int32 on ``device``: duration, entry a, entry b per edge, blank edges first; NB; NE;
    the 0-frame label edge's entries (-1: none))."""
    if kind == "tdt":
        blanks = [(d, 0, 2 + i) for i, d in enumerate(durations) if d > 0]
        labels = [(d, 1, 2 + i) for i, d in enumerate(durations) if d > 0]
        zero = next(((1, 2 + i) for i, d in enumerate(durations) if d == 0), (-1, -1))
    else:
        blanks = [(1, 0, -1)] + [(d, 2 + i, -1) for i, d in enumerate(durations)]
        labels, zero = [], (1, -1)
    table = torch.tensor(blanks + labels + [(0, -1, -1)], dtype=torch.int32).to(device)
    return table, len(blanks), len(labels), zero


def _row_blocks(U1: int, V: int) -> tuple[int, int]:
    """(cells per program, classes per chunk) of the passes over the logits (as the RNN-T kernels')."""
    block_v = min(next_power_of_2(V), 1024)
    return max(1, min(next_power_of_2(U1), 8, 1024 // block_v)), block_v


def tdt_forward(
    x: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    kind: str,
    durations: tuple[int, ...],
    opts: TransducerOptions,
    need_grad: bool,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Per-sample losses ([N] float32: -ln p times ``opts.loss_scale``; +inf without a path, NaN with a NaN read)
    and the backward's state (log-sum-exps, the entries' coefficients (``_tdt_occupancy_kernel``; with ``need_grad``),
    log2 p).

    Args:
        x: [N, T, U+1, C]: "tdt": C = V + len(durations) (tokens, then durations); "multiblank": C = V, the big
            blanks (durations ``durations``) at blank - 1 - i.
        opts.blank: in [0, V) (TDT: among the tokens).
    """
    fused = opts.fused_log_softmax
    N, T, U1, C = x.shape
    X = len(durations)
    V = C - X if kind == "tdt" else C
    dev = x.device
    cells = N * T * U1
    K = 2 + X
    lse = kernel_output(cells if fused else 0, dtype=torch.float32, device=dev)
    lat = kernel_output(cells * K, dtype=torch.float32, device=dev)
    nan = torch.zeros(N, dtype=torch.int32, device=dev)
    block_r, block_v = _row_blocks(U1, V)
    _tdt_lattice_kernel[(N * T, cdiv(U1, block_r))](
        x,
        lse,
        lat,
        nan,
        targets,
        logit_lengths,
        target_lengths,
        T,
        U1,
        V,
        X,
        *x.stride(),
        targets.stride(0),
        opts.blank,
        opts.sigma * 1.4426950408889634,
        FUSED=fused,
        MULTI=kind == "multiblank",
        ONE_CHUNK=V <= block_v,
        BLOCK_R=block_r,
        BLOCK_V=block_v,
        BLOCK_X=next_power_of_2(max(X, 1)),
        num_warps=1,
    )
    loss, logp = tdt_recursions(lat, nan, logit_lengths, target_lengths, kind, durations, T, U1, opts, need_grad)
    return loss, (lse, lat, logp)


def tdt_recursions(
    lat: torch.Tensor,
    nan: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    kind: str,
    durations: tuple[int, ...],
    T: int,
    U1: int,
    opts: TransducerOptions,
    need_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """From a lattice ([N * T * (U+1), 2 + X] log2 entries, as ``_tdt_lattice_kernel`` writes it) and the NaN
    counts per sample: the per-sample losses ([N] float32, -ln p times ``opts.loss_scale``) and log2 p ([N] float64);
    with ``need_grad`` the lattice is then overwritten by the entries' coefficients (``_tdt_occupancy_kernel``; the
    durations' with their softmax when ``opts.fused_log_softmax``)."""
    N = nan.shape[0]
    K = 2 + len(durations)
    dev = lat.device
    edges, nb, ne, (zero_a, zero_b) = _edge_table(kind, durations, dev)
    alpha = kernel_output(N * (T + 1) * U1, dtype=torch.float64, device=dev)
    beta = kernel_output(N * (T + 1) * U1 if need_grad else 0, dtype=torch.float64, device=dev)
    logp = kernel_output(N, dtype=torch.float64, device=dev)
    block_u = next_power_of_2(U1)
    # what both kernels take after their tables: the edges, the lengths and the sizes
    edge_args = (edges, logit_lengths, target_lengths, T, U1, K, zero_a, zero_b)
    # the recursions read a frame's entries across u: each entry's row contiguous ([N, T, K, U+1], a copy of about
    # 1/V of the logits' bytes), where the cells' K entries side by side would make every load a strided one
    lat_rows = lat.view(N * T, U1, K).transpose(1, 2).contiguous()
    _tdt_recursion_kernel[(N, 2 if need_grad else 1)](  # alpha and, with a gradient to come, beta at once
        lat_rows,
        alpha,
        beta,
        logp,
        nan,
        *edge_args,
        NB=nb,
        NE=ne,
        BLOCK_U=block_u,
        num_warps=max(1, min(16, block_u // (32 * RECURSION_LANES))),
    )
    if need_grad:
        _tdt_occupancy_kernel[(N * T,)](
            lat,
            alpha,
            beta,
            logp,
            *edge_args,
            opts.label_scale,
            NB=nb,
            NE=ne,
            FUSED=opts.fused_log_softmax,
            MULTI=kind == "multiblank",
            BLOCK_U=block_u,
            BLOCK_K=next_power_of_2(K),
            num_warps=max(1, min(8, block_u * next_power_of_2(K) // 256)),
        )
    return (logp * (-0.6931471805599453 * opts.loss_scale)).to(torch.float32), logp


def tdt_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    state: tuple[torch.Tensor, ...],
    kind: str,
    durations: tuple[int, ...],
    opts: TransducerOptions,
) -> torch.Tensor:
    """Gradient with respect to x, in x's dtype, of sum(grad_out * loss) (``opts.reduction`` "none": grad_out [N])
    or of grad_out * the batch sum or mean (grad_out 0-dim); ``state``: ``tdt_forward``'s."""
    clamp = opts.clamp
    N, T, U1, C = x.shape
    X = len(durations)
    V = C - X if kind == "tdt" else C
    grad = kernel_output_like(x)
    block_r, block_v = _row_blocks(U1, V)
    _tdt_grad_kernel[(N * T, cdiv(U1, block_r))](
        *grad_kernel_args(x, grad, state, grad_out, targets, logit_lengths, target_lengths, opts.reduction),
        V,
        X,
        2 + X,
        *x.stride(),
        *grad.stride(),
        targets.stride(0),
        opts.blank,
        max(clamp, 0.0),
        FUSED=opts.fused_log_softmax,
        MULTI=kind == "multiblank",
        CLAMP=clamp > 0,
        BLOCK_R=block_r,
        BLOCK_V=block_v,
        BLOCK_X=X,
        num_warps=1,
    )
    return grad
