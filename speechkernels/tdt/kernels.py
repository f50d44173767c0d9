"""Triton kernels of the TDT and multi-blank transducer losses (see ``reference.py`` for the lattice).

Per cell (n, t, u) the lattice keeps K = 2 + X log2 entries: the blank token, the next label's token (neg() when
u = U_n), then X more: TDT's duration log-probabilities (their own log-softmax), or the multi-blank loss's big
blanks (the tokens' softmax). Every edge weighs one entry plus, optionally, a second (TDT: token + duration); an
edge table on the device lists per edge its duration and entries, blank edges first.

1. ``_tdt_lattice_kernel``: program = up to BLOCK_R cells of a row (n, t): the tokens' log-sum-exp (natural log,
   kept for the backward), the K entries, NaN counts per sample.
2. ``_tdt_skew_kernel`` then ``_tdt_recursion_kernel``: a copy of the lattice with cell (t, u) on row (t + u) mod T,
   each entry's row along u; program (n, 0) = sample n's alpha along the anti-diagonals k = t + u = 0 .. T_n + U_n
   (every edge into a node comes from an earlier one: a blank of duration d from diagonal k - d, a label from
   k - d - 1), a diagonal's edge terms summed as one maximum and one sum of exp2; log2 p. The previous diagonal
   stays in registers (blank edges of duration 1, the 0-frame label edge: one exchange between lanes), the older
   ones are read back from the state, issued a step ahead. Program (n, 1), with a gradient to come: beta
   backwards, likewise, at the same time. State in float64, node (t, u) at row (t + u) mod (T + 1).
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
from .._logspace import log2e, lse_total, neg
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
def _tdt_skew_kernel(
    lat_ptr,  # [N * T * (U+1), K] float32: the lattice kernel's
    out_ptr,  # [N, T, K, U+1] float32 out: cell (t, u)'s entry e at row (t + u) mod T, column (e, u)
    T, U1, K, BLOCK_U: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Program (row (n, t), block of u): the row's cells, each entry along u, on their anti-diagonals' rows."""
    nt = tl.program_id(0).to(tl.int64)
    n = nt // T
    t = nt - n * T
    o_u = tl.program_id(1) * BLOCK_U + tl.arange(0, BLOCK_U)
    o_k = tl.arange(0, BLOCK_K)
    m = (o_u < U1)[:, None] & (o_k < K)[None, :]
    rows = tl.load(lat_ptr + (nt * U1 + o_u)[:, None] * K + o_k[None, :], mask=m)
    r = (t + o_u) % T
    tl.store(out_ptr + ((n * T + r)[:, None] * K + o_k[None, :]) * U1 + o_u[:, None], rows, mask=m)


@triton.jit
def _edge_rows(edge_ptr, first, count, R: tl.constexpr):
    """Edges first .. first + count - 1 of the table as [R, 1] columns: duration, entries a and b, and which
    rows hold an edge."""
    o_e = tl.arange(0, R)
    m_e = o_e < count
    p_e = edge_ptr + 3 * (first + o_e)
    d = tl.load(p_e, mask=m_e, other=0)
    ea = tl.load(p_e + 1, mask=m_e, other=0)
    eb = tl.load(p_e + 2, mask=m_e, other=-1)
    return d[:, None], ea[:, None], eb[:, None], m_e[:, None]


@triton.jit
def _edge_loads(p_lat, p_st, k, rk, lk, d, ea, eb, m_e, u, T, T_n, U_n, U1, K, LABEL: tl.constexpr,
                BETA: tl.constexpr):  # fmt: skip
    """A block of edges at anti-diagonal k (lane u: node (k - u, u)), [R, BLOCK_U] each: the state at each edge's
    other end (neg() where the edge does not exist; not read for the edges whose other end is on diagonal k -+ 1,
    the previous step's, which the caller holds) and its two entries (neg() and 0 where there is no edge).
    Alpha: edges in, from (t - d, u) (a blank: diagonal k - d) or (t - d, u - 1) (a label: k - d - 1), weighed
    at that cell; beta: edges out, to (t + d, u) or (t + d, u + 1), weighed at (t, u). A duration of 0 is the
    0-frame label edge (d = 0, LABEL). rk, lk: diagonal k's state row, k mod (T + 1), and lattice row, k mod T
    (an edge that exists has d + LABEL <= T: one wrap at most)."""
    t = k - u
    if BETA:
        if LABEL:
            ok = m_e & (t >= 0) & (t + d < T_n) & (u < U_n)
        else:
            ok = m_e & (t >= 0) & (t < T_n) & (t + d <= T_n) & (u <= U_n)
        r = rk + d + LABEL
        r = tl.where(r > T, r - (T + 1), r)
        u_s = u + LABEL
        p_c = p_lat + lk * K * U1 + u
    else:
        ok = m_e & (t - d >= 0) & (t <= T_n) & (u <= U_n)
        if LABEL:
            ok = ok & (u >= 1) & (t < T_n)
        r = rk - d - LABEL
        r = tl.where(r < 0, r + (T + 1), r)
        lr = lk - d - LABEL
        lr = tl.where(lr < 0, lr + T, lr)
        u_s = u - LABEL
        p_c = p_lat + lr * (K * U1) + u_s
    s = tl.load(p_st + r * U1 + u_s, mask=ok & (d + LABEL >= 2), other=neg())
    wa = tl.load(p_c + ea * U1, mask=ok, other=neg())
    wb = tl.load(p_c + eb * U1, mask=ok & (eb >= 0), other=0.0)
    return s, wa, wb


@triton.jit
def _diag_loads(p_lat, p_st, k, db, ab, bb, mb, dl, al, bl, ml, dz, az, bz, mz, o_u, T, T_n, U_n, U1, K,
                BETA: tl.constexpr):  # fmt: skip
    """Everything step k reads from memory: the blank edges', the label edges' and the 0-frame edge's blocks."""
    u = o_u[None, :]
    kk = tl.maximum(k, 0)  # (k = -1: beta's look-ahead past the last step, every lane masked off)
    rk = kk % (T + 1)
    lk = kk % tl.maximum(T, 1)
    sb, wab, wbb = _edge_loads(p_lat, p_st, k, rk, lk, db, ab, bb, mb, u, T, T_n, U_n, U1, K, 0, BETA)
    sl, wal, wbl = _edge_loads(p_lat, p_st, k, rk, lk, dl, al, bl, ml, u, T, T_n, U_n, U1, K, 1, BETA)
    _, waz, wbz = _edge_loads(p_lat, p_st, k, rk, lk, dz, az, bz, mz, u, T, T_n, U_n, U1, K, 1, BETA)
    return sb, wab, wbb, sl, wal, wbl, waz, wbz


@triton.jit
def _diag_step(prev, k, sb, wab, wbb, db, sl, wal, wbl, waz, wbz, o_u, i_nb, T_n, U_n, BETA: tl.constexpr):
    """The states of anti-diagonal k from the previous step's (``prev``: diagonal k - 1 for alpha, k + 1 for
    beta) and the loads: the log2-sum of every edge's term (state + entries) as one maximum and one sum of exp2
    (the terms are independent), neg() off the sample's nodes."""
    t = k - o_u
    if BETA:
        start = tl.where((t == T_n) & (o_u == U_n), 0.0, neg()).to(tl.float64)
    else:
        start = tl.where((k == 0) & (o_u == 0), 0.0, neg()).to(tl.float64)
    # the edges whose other end is on the previous diagonal: blank of duration 1 (lane u), the 0-frame label
    # (lane u -+ 1)
    xb = tl.where(db == 1, prev[None, :], sb) + (wab + wbb).to(tl.float64)
    xl = sl + (wal + wbl).to(tl.float64)
    xz = tl.gather(prev, i_nb, 0) + tl.sum(waz + wbz, axis=0).to(tl.float64)
    m = tl.maximum(tl.maximum(start, xz), tl.maximum(tl.max(xb, axis=0), tl.max(xl, axis=0)))
    s = tl.exp2((start - m).to(tl.float32)) + tl.exp2((xz - m).to(tl.float32))
    s += tl.sum(tl.exp2((xb - m[None, :]).to(tl.float32)), axis=0)
    s += tl.sum(tl.exp2((xl - m[None, :]).to(tl.float32)), axis=0)
    node = (t >= 0) & (t <= T_n) & (o_u <= U_n)
    return tl.where(node, m + tl.log2(s).to(tl.float64), neg()), node


@triton.jit
def _tdt_recursion_kernel(
    lat_ptr,  # [N, T, K, U+1]: the lattice skewed (``_tdt_skew_kernel``)
    alpha_ptr, beta_ptr,  # [N, T+1, U+1] float64 out: node (t, u) at row (t + u) mod (T + 1)
    logp_ptr,  # [N] float64 out: log2 p (-inf without a path, NaN with a NaN entry)
    nan_ptr, edge_ptr, il_ptr, tl_ptr,
    T, U1, K, zero_a, zero_b,  # the 0-frame label edge's entries (zero_a -1: none)
    NB: tl.constexpr, NE: tl.constexpr,  # blank edges, then label edges of positive durations, in edge_ptr
    RB: tl.constexpr, RL: tl.constexpr,  # their blocks' rows (powers of 2)
    BLOCK_U: tl.constexpr,
):  # fmt: skip
    """Program (n, 0): sample n's alpha along anti-diagonals k = t + u = 0 .. T_n + U_n (every edge's other
    end lies on an earlier one), and log2 p; program (n, 1) (launched with a gradient to come): its beta,
    backwards, at the same time. A step holds the previous diagonal in registers and reads the older ones from
    memory, issued a step ahead (a barrier per step orders them after their stores). State in float64."""
    n = tl.program_id(0).to(tl.int64)
    BETA = tl.program_id(1) == 1
    T_n, U_n = sample_lengths(il_ptr, tl_ptr, n, True, T, U1)
    o_u = tl.arange(0, BLOCK_U)
    p_lat = lat_ptr + n * T * K * U1
    db, ab, bb, mb = _edge_rows(edge_ptr, 0, NB, RB)
    dl, al, bl, ml = _edge_rows(edge_ptr, NB, NE, RL)
    dz = tl.zeros([1, 1], tl.int32)
    az = tl.zeros([1, 1], tl.int32) + zero_a
    bz = tl.zeros([1, 1], tl.int32) + zero_b
    mz = az >= 0
    last = T_n + U_n
    prev = tl.full([BLOCK_U], neg(), tl.float64)
    if not BETA:
        p_st = alpha_ptr + n * (T + 1) * U1
        i_nb = tl.maximum(o_u - 1, 0)
        sb, wab, wbb, sl, wal, wbl, waz, wbz = _diag_loads(p_lat, p_st, 0, db, ab, bb, mb, dl, al, bl, ml, dz, az,
                                                           bz, mz, o_u, T, T_n, U_n, U1, K, False)  # fmt: skip
        for k in range(0, last + 1):
            nsb, nwab, nwbb, nsl, nwal, nwbl, nwaz, nwbz = _diag_loads(p_lat, p_st, k + 1, db, ab, bb, mb, dl, al,
                                                                       bl, ml, dz, az, bz, mz, o_u, T, T_n, U_n,
                                                                       U1, K, False)  # fmt: skip
            prev, node = _diag_step(prev, k, sb, wab, wbb, db, sl, wal, wbl, waz, wbz, o_u, i_nb, T_n, U_n, False)
            tl.store(p_st + (k % (T + 1)) * U1 + o_u, prev, mask=node)
            tl.debug_barrier()
            sb, wab, wbb, sl, wal, wbl, waz, wbz = nsb, nwab, nwbb, nsl, nwal, nwbl, nwaz, nwbz
        logp = tl.sum(tl.where(o_u == U_n, prev, 0.0), axis=0)
        logp = tl.where(logp < neg() * 0.5, float("-inf"), logp)
        logp = tl.where(tl.load(nan_ptr + n) > 0, float("nan"), logp)
        tl.store(logp_ptr + n, logp)
    else:
        p_st = beta_ptr + n * (T + 1) * U1
        i_nb = tl.minimum(o_u + 1, BLOCK_U - 1)
        sb, wab, wbb, sl, wal, wbl, waz, wbz = _diag_loads(p_lat, p_st, last, db, ab, bb, mb, dl, al, bl, ml, dz,
                                                           az, bz, mz, o_u, T, T_n, U_n, U1, K, True)  # fmt: skip
        for i in range(0, last + 1):
            k = last - i
            nsb, nwab, nwbb, nsl, nwal, nwbl, nwaz, nwbz = _diag_loads(p_lat, p_st, k - 1, db, ab, bb, mb, dl, al,
                                                                       bl, ml, dz, az, bz, mz, o_u, T, T_n, U_n,
                                                                       U1, K, True)  # fmt: skip
            prev, node = _diag_step(prev, k, sb, wab, wbb, db, sl, wal, wbl, waz, wbz, o_u, i_nb, T_n, U_n, True)
            tl.store(p_st + (k % (T + 1)) * U1 + o_u, prev, mask=node)
            tl.debug_barrier()
            sb, wab, wbb, sl, wal, wbl, waz, wbz = nsb, nwab, nwbb, nsl, nwal, nwbl, nwaz, nwbz


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
    # alpha and beta: node (t, u) at row (t + u) mod (T + 1)
    p_s = n.to(tl.int64) * (T + 1) * U1 + o_u
    r0 = (t + o_u) % (T + 1)
    al = tl.load(alpha_ptr + p_s + r0 * U1, mask=active, other=0.0) - logp
    E = tl.zeros([BLOCK_U, BLOCK_K], tl.float32)
    for k in tl.static_range(NB):
        d = tl.load(edge_ptr + 3 * k)
        ea = tl.load(edge_ptr + 3 * k + 1)
        eb = tl.load(edge_ptr + 3 * k + 2)
        ok = tl.where(t + d <= T_n, active, False)
        w = _entry(rows, o_k, ea) + _entry(rows, o_k, eb)
        r = r0 + d
        bn = tl.load(beta_ptr + p_s + tl.where(r > T, r - (T + 1), r) * U1, mask=ok, other=0.0)
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
        r = r0 + d + 1
        bn = tl.load(beta_ptr + p_s + tl.where(r > T, r - (T + 1), r) * U1 + 1, mask=ok, other=0.0)
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
    # the recursions step along anti-diagonals: a copy of the lattice with each entry's row contiguous along u
    # and cell (t, u) on row (t + u) mod T, so that a step's loads are contiguous (about 1/V of the logits' bytes)
    lat_skew = kernel_output(N * T * K * U1, dtype=torch.float32, device=dev)
    skew_u = min(block_u, 128)
    _tdt_skew_kernel[(N * T, cdiv(U1, skew_u))](
        lat, lat_skew, T, U1, K, BLOCK_U=skew_u, BLOCK_K=next_power_of_2(K), num_warps=4
    )
    _tdt_recursion_kernel[(N, 2 if need_grad else 1)](  # alpha and, with a gradient to come, beta at once
        lat_skew,
        alpha,
        beta,
        logp,
        nan,
        *edge_args,
        NB=nb,
        NE=ne,
        RB=next_power_of_2(max(nb, 1)),
        RL=next_power_of_2(max(ne, 1)),
        BLOCK_U=block_u,
        num_warps=max(1, min(16, block_u // 32)),
    )
    del lat_skew
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
