"""Triton kernels of the TDT and multi-blank transducer losses (see ``reference.py`` for the lattice).

Per cell (n, t, u) the lattice keeps K = 2 + X log2 entries: the blank token, the next label's token (neg() when
u = U_n), then X more: TDT's duration log-probabilities (their own log-softmax), or the multi-blank loss's big
blanks (the tokens' softmax). Every edge weighs one entry plus, optionally, a second (TDT: token + duration); an
edge table on the device lists per edge its duration and entries, blank edges first.

1. ``_tdt_lattice_kernel``: program = up to BLOCK_R cells of a row (n, t): the tokens' log-sum-exp (natural log,
   kept for the backward), the K entries, NaN counts per sample.
2. ``_tdt_edge_weights_kernel`` then ``_tdt_recursion_kernel``: each edge's weight per cell (entry a + entry b;
   neg() where the edge does not exist, so that the recursions read every weight unmasked), each edge's row along
   u, cell (t, u) on the row of its anti-diagonal (``_sweep``: the rows); program (n, 0) =
   sample n's alpha along the anti-diagonals k = t + u = 0 .. T_n + U_n (every edge into a node comes from an
   earlier one: a blank of duration d from diagonal k - d, a label from k - d - 1), a diagonal's edge terms summed
   as one maximum and one sum of exp2; log2 p. The previous diagonal stays in registers (blank edges of duration
   1, the 0-frame label edge: one exchange between lanes), the older ones are read back from the state, issued a
   step ahead. Program (n, 1), with a gradient to come: beta backwards, likewise, at the same time. A state is a
   pair of float32 (high and low parts, packed in an int64: ``_diag_step``), node (t, u) on the row of its
   anti-diagonal. The kernels are specialised on the durations and on the rows' length (``_row``), so that every
   load's offset from a lane's pointer is a constant.
3. ``_tdt_occupancy_kernel`` (with a gradient to come): program = an anti-diagonal (n, k), a cell a lane: each
   edge's occupancy exp2(alpha + w + beta - log2 p), their sums per entry, written over the cells' entries; the
   states and weights are then dropped.
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
    cell_blocks,
    cell_scores,
    class_blocks,
    grad_cells,
    grad_kernel_args,
    row_cells,
    sample_lengths,
    score_grad_chunks,
)
from .._transducer.options import TransducerOptions

RECURSION_WARPS = 0  # warps of the recursion kernel (0: a lane of u a thread, 16 at most)


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
    CHUNKS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_X: tl.constexpr,
    REM: tl.constexpr,  # the tokens past the full chunks of BLOCK_V, in a chunk of this width (``class_blocks``)
):  # fmt: skip
    o_r, n, t, u, m_r, T_n, U_n = row_cells(il_ptr, tl_ptr, T, U1, BLOCK_R)
    m_r, p_x, lse, lp_b, lp_y = cell_scores(o_r, n, t, u, m_r, T_n, U_n, x_ptr, lse_ptr, tgt_ptr, V, stride_n, stride_t,
                                            stride_u, stride_v, stride_tg, blank, FUSED, FUSED, CHUNKS, BLOCK_R,
                                            BLOCK_V, REM)  # fmt: skip
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
def _store_mirrored(p, x, mask, mirror, back):
    """x at p, and at p - back where ``mirror`` (a scalar)."""
    tl.store(p, x, mask=mask)
    tl.store(p - back, x, mask=tl.where(mirror, mask, False))


@triton.jit
def _tdt_edge_weights_kernel(
    lat_ptr,  # [N * T * (U+1), K] float32: the lattice kernel's
    out_ptr,  # [N, T + H, E + 2, ROW] float32 out (``_sweep``: the layout), then ROW + 1 entries
    edge_ptr, il_ptr, tl_ptr, T, U1, K, zero_a, zero_b,
    H,  # rows of history: rows T .. T + H - 1 are also written at 0 .. H - 1 (no step's read wraps)
    NB: tl.constexpr, RB: tl.constexpr,  # the table's blank edges (TDT: as many label edges after them), RB >= NB
    E: tl.constexpr,  # the table's edges and the 0-frame label edge (row E - 1)
    MULTI: tl.constexpr, ROW: tl.constexpr, BLOCK_U: tl.constexpr,  # ROW: a row's entries (>= U + 1, ``_row``)
):  # fmt: skip
    """Program (row (n, j), block of u): each edge's weight (entry a + entry b) at the cells (t, u) with
    (t + u) mod T = j, one lane each, written along row j + H, contiguous; neg() where the edge does not exist
    (its cell or its other end outside sample n's lattice, a label edge ending at T_n), so that the recursions
    read every weight unmasked. A label edge's weight goes to column u + 1 (its other end's), column 0 holding
    neg(); rows E and E + 1 are neg() throughout (the edge blocks' padding rows read row E, a label edge's at
    column U + 1 row E + 1's first). The cells' entries are read cell by
    cell. The edge table's structure (``_edge_table``; as the occupancy kernel uses it): TDT's blank edge i and
    label edge i weigh with the blank's or the label's entry and the same duration's; the multi-blank's blank
    edges with one entry each."""
    nj = tl.program_id(0).to(tl.int64)
    n = nj // T
    j = nj - n * T
    T_n, U_n = sample_lengths(il_ptr, tl_ptr, n, True, T, U1)
    o_u = tl.program_id(1) * BLOCK_U + tl.arange(0, BLOCK_U)
    m_u = o_u < U1
    t = (j - o_u) % T
    t = tl.where(t < 0, t + T, t)  # (a remainder takes the dividend's sign)
    cell = m_u & (t < T_n) & (o_u <= U_n)  # a cell with edges out
    lab = cell & (o_u < U_n)
    p_cell = lat_ptr + ((n * T + t) * U1 + o_u) * K
    r = j + H
    RS = (E + 2) * ROW  # a diagonal's rows
    p_out = out_ptr + (n * (T + H) + r) * RS + o_u
    mirror = r >= T  # also at row r - T
    back = T * RS
    o_e = tl.arange(0, RB)[:, None]
    m_e = o_e < NB
    d = tl.load(edge_ptr + 3 * o_e, mask=m_e, other=0)
    ok_b = m_e & cell[None, :] & (t[None, :] + d <= T_n)
    # a label edge's weight at its other end's column, u + 1; column 0 neg()
    m_l = m_e & (m_u & (o_u + 1 < ROW))[None, :]  # (at U + 1 < ROW: neg(), no edge ends past U)
    first = m_e & (o_u == 0)[None, :]
    if MULTI:
        ent = tl.load(edge_ptr + 3 * o_e + 1, mask=m_e, other=0)
        wb = tl.load(p_cell[None, :] + ent, mask=ok_b, other=neg())
    else:
        ent = tl.load(edge_ptr + 3 * o_e + 2, mask=m_e, other=0)
        dur = tl.load(p_cell[None, :] + ent, mask=m_e & cell[None, :], other=0.0)
        e0 = tl.load(p_cell, mask=cell, other=0.0)
        e1 = tl.load(p_cell + 1, mask=cell, other=0.0)
        wb = tl.where(ok_b, e0[None, :] + dur, neg())
        wl = tl.where(m_e & lab[None, :] & (t[None, :] + d < T_n), e1[None, :] + dur, neg())
        p_l = p_out[None, :] + (NB + o_e) * ROW + 1
        _store_mirrored(p_l, wl, m_l, mirror, back)
        _store_mirrored(p_l - 1, tl.full([RB, BLOCK_U], neg(), tl.float32), first, mirror, back)
    _store_mirrored(p_out[None, :] + o_e * ROW, wb, m_e & m_u[None, :], mirror, back)
    # the 0-frame label edge: entries zero_a (+ zero_b), neg() without one; then the row of neg()
    za = tl.zeros([BLOCK_U], tl.int32) + zero_a  # (a tensor: an argument of 1 arrives as a constant)
    zb = tl.zeros([BLOCK_U], tl.int32) + zero_b
    ok_z = lab & (za >= 0)
    wz = tl.load(p_cell + za, mask=ok_z, other=neg())
    wz += tl.load(p_cell + zb, mask=ok_z & (zb >= 0), other=0.0)
    p_z = p_out + (E - 1) * ROW + 1
    _store_mirrored(p_z, wz, m_u & (o_u + 1 < ROW), mirror, back)
    _store_mirrored(p_z - 1, tl.full([BLOCK_U], neg(), tl.float32), o_u == 0, mirror, back)
    _store_mirrored(p_out + E * ROW, tl.full([BLOCK_U], neg(), tl.float32), o_u < ROW, mirror, back)
    _store_mirrored(p_out + (E + 1) * ROW, tl.full([BLOCK_U], neg(), tl.float32), o_u < ROW, mirror, back)


@triton.jit
def _edge_rows(first, count, DS: tl.constexpr, R: tl.constexpr):
    """Edges first .. first + count - 1 of the table as [R, 1] columns: their rows, durations (DS, a tuple: the
    kernels are specialised on them, so that every load's offset from the lane's pointer is a constant), and
    which rows hold an edge."""
    o_e = tl.arange(0, R)[:, None]
    d = tl.zeros([R, 1], tl.int32)
    for i in tl.static_range(len(DS)):
        d = tl.where(o_e == i, DS[i], d)
    return first + o_e, tl.where(o_e < count, d, 0), o_e < count


@triton.jit
def _neg_pair():
    """A state pair (high neg(), low 0) as ``_pack`` writes it."""
    return 4048155338  # 0xF149F2CA: float32 -1e30


@triton.jit
def _pack(hi, lo):
    """A float32 pair as one int64 (high in the low word): one load and one store a state."""
    h = hi.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    return h | (lo.to(tl.int32, bitcast=True).to(tl.int64) << 32)


@triton.jit
def _unpack(x):
    return x.to(tl.int32).to(tl.float32, bitcast=True), (x >> 32).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _edge_loads(p_w, p_st, k, rk, lk, e, d, m_e, u, lane_ok, T, T_n, ROW: tl.constexpr, E: tl.constexpr, H,
                LABEL: tl.constexpr, BETA: tl.constexpr):  # fmt: skip
    """A block of edges at anti-diagonal k (lane u: node (k - u, u)), [R, BLOCK_U] each: the state at each edge's
    other end (packed; whatever the state rows hold where the edge does not exist), the edge's weight (neg()
    where there is no edge) and which edges exist. Alpha: edges in, from (t - d, u) (a blank: diagonal k - d)
    or (t - d, u - 1) (a label: k - d - 1), weighed at that cell; beta: edges out, to (t + d, u) or
    (t + d, u + 1), weighed at (t, u). A duration of 0 is the 0-frame label edge (d = 0, LABEL). ``lane_ok``:
    the lanes' own conditions; rk, lk: k mod (T + 1) and k mod T (``_sweep``: the rows' layout, ROW entries a
    row). Pointers are formed per row, then offset by the lane."""
    # offsets: the step's row times the row length plus or less the edge's rows (invariant across steps); the
    # rows past the ends are mirrored (``_sweep``), so none wraps
    e_row = tl.where(m_e, e, E)  # padding rows: the row of neg()
    if BETA:
        ok = (m_e & lane_ok) & (u >= k + d + LABEL - T_n)  # t + d <= T_n (a blank), < T_n (a label)
        p_s = (p_st + rk * ROW) + ((d + LABEL) * ROW + LABEL)
        p_c = (p_w + (lk + H) * ((E + 2) * ROW)) + (e_row * ROW + LABEL)
    else:
        ok = (m_e & lane_ok) & (u <= k - d)  # t - d >= 0
        p_s = (p_st + (rk + H) * ROW) - ((d + LABEL) * ROW + LABEL)
        p_c = (p_w + (lk + H) * ((E + 2) * ROW)) + (e_row * ROW - (d + LABEL) * ((E + 2) * ROW))
    # every state and weight is read unmasked, in bounds (``_sweep``): where the edge does not exist its weight
    # is neg() (``_tdt_edge_weights_kernel``), or its state is (an end before the lattice: a diagonal not yet
    # reached, still (neg(), 0)), which makes the term neg(); lanes off the sample's nodes are discarded
    s = tl.load(p_s + u)
    w = tl.load(p_c + u)
    return s, w, ok


@triton.jit
def _diag_loads(p_w, p_st, k, rk, lk, eb, db, mb, el, dl, ml, ez, o_u, T, T_n, U_n, E: tl.constexpr, H,
                ROW: tl.constexpr, BETA: tl.constexpr):  # fmt: skip
    """Everything step k reads from memory: the blank edges', the label edges' and the 0-frame edge's blocks
    (rk, lk: k mod (T + 1) and k mod T, ``_next_rows``)."""
    u = o_u[None, :]
    t = k - u
    if BETA:
        ok_b = (t >= 0) & (t < T_n) & (u <= U_n)
        ok_l = (t >= 0) & (u < U_n)
    else:
        ok_b = (t <= T_n) & (u <= U_n)
        ok_l = (t < T_n) & (u >= 1) & (u <= U_n)
    sb, wb, _ = _edge_loads(p_w, p_st, k, rk, lk, eb, db, mb, u, ok_b, T, T_n, ROW, E, H, 0, BETA)
    sl, wl, _ = _edge_loads(p_w, p_st, k, rk, lk, el, dl, ml, u, ok_l, T, T_n, ROW, E, H, 1, BETA)
    zero = ez * 0
    _, wz, _ = _edge_loads(p_w, p_st, k, rk, lk, ez, zero, zero == 0, u, ok_l, T, T_n, ROW, E, H, 1, BETA)
    return sb, wb, sl, wl, wz


@triton.jit
def _next_rows(rk, lk, T, BACK: tl.constexpr):
    """The state and weights' rows (k mod (T + 1), k mod T) of step k + 1 (BACK: k - 1) from step k's. Past the
    ends (steps -1, -2 or last + 1, last + 2) they wrap too; every lane is masked off there."""
    if BACK:
        return tl.where(rk == 0, T, rk - 1), tl.where(lk == 0, tl.maximum(T, 1) - 1, lk - 1)
    else:
        return tl.where(rk == T, 0, rk + 1), tl.where(lk >= T - 1, 0, lk + 1)


@triton.jit
def _two_sum(a, b):
    """a + b as a float32 pair (sum, error): exact."""
    s = a + b
    bp = s - a
    return s, (a - (s - bp)) + (b - bp)


@triton.jit
def _diag_step(prev, k, sb, wb, db, sl, wl, wz, o_u, i_nb, T_n, U_n, BETA: tl.constexpr):
    """The states of anti-diagonal k (packed) from the previous step's (``prev``: diagonal k - 1 for alpha, k + 1
    for beta) and the loads: the log2-sum of every edge's term (state + weight) as one maximum and one sum of exp2
    (the terms are independent), (neg(), 0) off the sample's nodes. A state is a pair of float32 (high, low: its
    value their sum, as exact as a float64's to the 1e-7 the occupancies need, where the values grow to
    thousands); a term's difference from the terms' maximum R, (high - R) + weight + low, is exact in its high
    part (both near R) and leaves float32 only for its exp2."""
    t = k - o_u
    if BETA:
        start = tl.where((t == T_n) & (o_u == U_n), 0.0, neg())
    else:
        start = tl.where((k == 0) & (o_u == 0), 0.0, neg())
    hb, lb = _unpack(sb)
    hl, ll = _unpack(sl)
    # the edges whose other end is on the previous diagonal: blank of duration 1 (lane u), the 0-frame label
    # (lane u -+ 1)
    p_hi, p_lo = _unpack(prev)
    one = db == 1
    hb = tl.where(one, p_hi[None, :], hb)
    lb = tl.where(one, p_lo[None, :], lb)
    wz = tl.where(t < T_n, tl.sum(wz, axis=0), neg())  # (at t = T the weights' row would be t = 0's)
    hz, lz = _unpack(tl.gather(prev, i_nb, 0))  # (one exchange for both parts)
    r = tl.maximum(tl.maximum(start, hz + wz), tl.maximum(tl.max(hb + wb, axis=0), tl.max(hl + wl, axis=0)))
    s = tl.exp2(start - r) + tl.exp2(((hz - r) + wz) + lz)
    s += tl.sum(tl.exp2(((hb - r[None, :]) + wb) + lb), axis=0)
    s += tl.sum(tl.exp2(((hl - r[None, :]) + wl) + ll), axis=0)
    node = (t >= 0) & (t <= T_n) & (o_u <= U_n)
    a_hi, a_lo = _two_sum(r, tl.log2(s))
    return _pack(tl.where(node, a_hi, neg()), tl.where(node, a_lo, 0.0)), node


@triton.jit
def _state_start(n, T, H, ROW: tl.constexpr, BLOCK_U: tl.constexpr):
    """Where sample n's state rows (ROW entries each) start: each sample's rows have an entry before them and
    BLOCK_U + 1 after, so that a step's unmasked reads stay in the sample's own entries (a NaN of one sample
    reaches no other)."""
    return n * ((T + 1 + H) * ROW + BLOCK_U + 2) + 1


@triton.jit
def _store_row(p_st, rk, shift, mirror, H, T, o_u, x, node, ROW: tl.constexpr, BETA: tl.constexpr):
    """A diagonal's states at its row, and at its mirrored row where it has one (``_sweep``)."""
    p = p_st + (rk + shift) * ROW + o_u
    tl.store(p, x, mask=node)
    if BETA:
        has_mirror = rk < H
    else:
        has_mirror = rk + H > T
    tl.store(p + mirror * ROW, x, mask=tl.where(has_mirror, node, False))


@triton.jit
def _sweep(p_w, p_st, first, steps, eb, db, mb, el, dl, ml, ez, o_u, T, T_n, U_n, E: tl.constexpr, H,
           BLOCK_U: tl.constexpr, ROW: tl.constexpr, BETA: tl.constexpr):  # fmt: skip
    """Steps k = first, first + 1, ... (BETA: first - 1, ...), ``steps`` of them rounded up to even (the extra one,
    past the sample's end, stores nothing), each stored at its row, a barrier after each store. Each step's loads
    are issued one step ahead; two steps an iteration, so the prefetched registers alternate instead of being
    moved.

    The rows (ROW entries each, ``_row``): T + 1 + H of them a sample (H: 1 + the longest duration, the diagonals a
    step reads back), with diagonal k at row k mod (T + 1) (beta) or H + k mod (T + 1) (alpha); beta's rows
    0 .. H - 1 are also stored at T + 1 .., alpha's T + 1 .. T + H at 0 .., so a read of diagonal k -+ (d + LABEL)
    is at row k's -+ (d + LABEL) without a wrap. The weights likewise: T + H diagonal rows of E + 2 rows, cell
    (t, u) at H + (t + u) mod T, T .. T + H - 1 also at 0 .. H - 1. The state rows are filled with (neg(), 0)
    beforehand, and a sample's start is one entry in, with BLOCK_U + 1 entries after its last (``_state_start``):
    every state read is in bounds and is the sample's own (finite unless the sample reads a NaN, when its loss is
    NaN anyway)."""
    if BETA:
        i_nb = tl.minimum(o_u + 1, BLOCK_U - 1)
        sgn = -1
    else:
        i_nb = tl.maximum(o_u - 1, 0)
        sgn = 1
    rk = first % (T + 1)  # step k's state row, k mod (T + 1), and weights' row, k mod T, carried (no division a
    lk = first % tl.maximum(T, 1)  # step)
    prev = tl.full([BLOCK_U], _neg_pair(), tl.int64)
    sb, wb, sl, wl, wz = _diag_loads(p_w, p_st, first, rk, lk, eb, db, mb, el, dl, ml, ez, o_u, T, T_n, U_n, E, H,
                                     ROW, BETA)  # fmt: skip
    if BETA:
        shift = 0  # the rows' offset, and where a mirrored row goes
        mirror = T + 1
    else:
        shift = H
        mirror = -(T + 1)
    for i in range(0, steps, 2):
        k = first + sgn * i
        rk1, lk1 = _next_rows(rk, lk, T, BETA)
        rk2, lk2 = _next_rows(rk1, lk1, T, BETA)
        sb2, wb2, sl2, wl2, wz2 = _diag_loads(p_w, p_st, k + sgn, rk1, lk1, eb, db, mb, el, dl, ml, ez, o_u, T, T_n,
                                              U_n, E, H, ROW, BETA)  # fmt: skip
        prev, node = _diag_step(prev, k, sb, wb, db, sl, wl, wz, o_u, i_nb, T_n, U_n, BETA)
        _store_row(p_st, rk, shift, mirror, H, T, o_u, prev, node, ROW, BETA)
        tl.debug_barrier()
        sb, wb, sl, wl, wz = _diag_loads(p_w, p_st, k + 2 * sgn, rk2, lk2, eb, db, mb, el, dl, ml, ez, o_u, T, T_n,
                                         U_n, E, H, ROW, BETA)  # fmt: skip
        prev, node = _diag_step(prev, k + sgn, sb2, wb2, db, sl2, wl2, wz2, o_u, i_nb, T_n, U_n, BETA)
        _store_row(p_st, rk1, shift, mirror, H, T, o_u, prev, node, ROW, BETA)
        tl.debug_barrier()
        rk = rk2
        lk = lk2


# w_ptr: not specialised on its alignment. Aligned, the rows' constant offsets make the weights' loads 16-byte vectors
# (four lanes a thread), each converted to the step's layout through shared memory: 57 barriers a loop instead of 4,
# 2.76 ms a call at (4, 1200, 200, 513, 0..8) instead of 1.03 (benchmarks/notes/tdt.md)
@triton.jit(do_not_specialize_on_alignment=["w_ptr"])
def _tdt_recursion_kernel(
    w_ptr,  # [N, T + H, E + 2, ROW] float32: the edges' weights on their rows (``_tdt_edge_weights_kernel``)
    alpha_ptr, beta_ptr,  # int64: the states, pairs (``_pack``), ``_sweep``'s rows (``_state_start``)
    logp_ptr,  # [N] float64 out: log2 p (-inf without a path, NaN with a NaN entry)
    nan_ptr, edge_ptr, il_ptr, tl_ptr,
    T, U1, H,  # H: 1 + the longest duration (``_sweep``)
    NB: tl.constexpr, NE: tl.constexpr,  # blank edges, then label edges of positive durations, in edge_ptr
    RB: tl.constexpr, RL: tl.constexpr,  # their blocks' rows (powers of 2)
    DB: tl.constexpr, DL: tl.constexpr,  # their durations (tuples)
    E: tl.constexpr,  # NB + NE + 1: the weights' rows (the 0-frame label edge's last)
    BLOCK_U: tl.constexpr, ROW: tl.constexpr,  # lanes; a row's entries (``_row``)
):  # fmt: skip
    """Program (n, 0): sample n's alpha along anti-diagonals k = t + u = 0 .. T_n + U_n (every edge's other
    end lies on an earlier one), and log2 p; program (n, 1) (launched with a gradient to come): its beta,
    backwards, at the same time. A step holds the previous diagonal in registers and reads the older ones from
    memory, issued a step ahead (a barrier per step orders them after their stores); two steps an iteration,
    the loads' registers alternating (the last, past the sample's end with an odd count, stores nothing)."""
    n = tl.program_id(0).to(tl.int64)
    BETA = tl.program_id(1) == 1
    T_n, U_n = sample_lengths(il_ptr, tl_ptr, n, True, T, U1)
    o_u = tl.arange(0, BLOCK_U)
    p_w = w_ptr + n * (T + H) * (E + 2) * ROW
    eb, db, mb = _edge_rows(0, NB, DB, RB)
    el, dl, ml = _edge_rows(NB, NE, DL, RL)
    ez = tl.full([1, 1], NB + NE, tl.int32)
    last = T_n + U_n
    if not BETA:
        p_st = alpha_ptr + _state_start(n, T, H, ROW, BLOCK_U)
        _sweep(p_w, p_st, 0, last + 1, eb, db, mb, el, dl, ml, ez, o_u, T, T_n, U_n, E, H, BLOCK_U, ROW, False)
        # the end node (T_n, U_n), stored by its step (the sweep may have run one step past it)
        x = tl.load(p_st + (H + last % (T + 1)) * ROW + o_u, mask=o_u == U_n, other=0)
        logp = tl.sum(tl.where(o_u == U_n, _pair_sum(x), 0.0), axis=0)
        logp = tl.where(logp < neg() * 0.5, float("-inf"), logp)
        logp = tl.where(tl.load(nan_ptr + n) > 0, float("nan"), logp)
        tl.store(logp_ptr + n, logp)
    else:
        p_st = beta_ptr + _state_start(n, T, H, ROW, BLOCK_U)
        _sweep(p_w, p_st, last, last + 1, eb, db, mb, el, dl, ml, ez, o_u, T, T_n, U_n, E, H, BLOCK_U, ROW, True)


@triton.jit
def _pair_sum(x):
    """A packed state pair as float64."""
    hi, lo = _unpack(x)
    return hi.to(tl.float64) + lo.to(tl.float64)


@triton.jit
def _state(p, mask):
    """The recursions' states at p (pairs, ``_pack``) as float64, 0 where masked."""
    return _pair_sum(tl.load(p, mask=mask, other=0))


@triton.jit(do_not_specialize_on_alignment=["w_ptr"])  # as the recursion kernel (its loads: 17 barriers -> 3)
def _tdt_occupancy_kernel(
    lat_ptr,  # [N * T * (U+1), K] float32: in, the log2 entries; out, each entry's coefficient (see below)
    w_ptr,  # [N, T + H, E + 2, ROW] float32: the edges' weights on their rows (``_tdt_edge_weights_kernel``)
    alpha_ptr, beta_ptr,  # int64: the recursions' states (pairs, ``_pack``; ``_sweep``'s rows)
    logp_ptr, edge_ptr, il_ptr, tl_ptr,
    T, U1, K, zero_a, zero_b, fastemit_scale, H,
    NB: tl.constexpr, NE: tl.constexpr, RB: tl.constexpr, RL: tl.constexpr, DB: tl.constexpr, DL: tl.constexpr,
    E: tl.constexpr, FUSED: tl.constexpr, MULTI: tl.constexpr, BLOCK_U: tl.constexpr, ROW: tl.constexpr,
):  # fmt: skip
    """Program (n, k): the cells (k - u, u) of sample n's anti-diagonal k, one lane each: each edge's occupancy
    exp2(alpha + w + beta - log2 p) (label edges times the FastEmit scale), summed per entry it weighs with: E.
    Written over the cells' entries: E for the tokens' two and the big blanks; TDT's durations, their own
    softmax's gradient over the occupancy (softmax (FUSED) times the tokens' total, less E). Zero in cells without
    edges or of a sample without a path. alpha, beta and the weights are read along the diagonal (contiguous);
    the entries cell by cell."""
    n = tl.program_id(0).to(tl.int64)
    k = tl.program_id(1)
    T_n, U_n = sample_lengths(il_ptr, tl_ptr, n, True, T, U1)
    logp = tl.load(logp_ptr + n)
    o_u = tl.arange(0, BLOCK_U)
    t = k - o_u
    in_range = (t >= 0) & (t < T) & (o_u < U1)
    # the sample's cells with edges (none without a path)
    active = tl.where(logp != float("-inf"), in_range & (t < T_n) & (o_u <= U_n), False)
    rk = k % (T + 1)
    lk = k % tl.maximum(T, 1)
    p_a = alpha_ptr + _state_start(n, T, H, ROW, BLOCK_U) + (rk + H) * ROW + o_u
    al = _state(p_a, active) - logp
    p_st = beta_ptr + _state_start(n, T, H, ROW, BLOCK_U)
    p_w = w_ptr + n * (T + H) * (E + 2) * ROW
    u = o_u[None, :]
    ok_b = active[None, :]
    ok_l = (active & (o_u < U_n))[None, :]
    eb_, db, mb = _edge_rows(0, NB, DB, RB)
    el_, dl, ml = _edge_rows(NB, NE, DL, RL)
    ez = tl.full([1, 1], NB + NE, tl.int32)
    zero = ez * 0
    sb, wb, okb = _edge_loads(p_w, p_st, k, rk, lk, eb_, db, mb, u, ok_b, T, T_n, ROW, E, H, 0, True)
    sl, wl, okl = _edge_loads(p_w, p_st, k, rk, lk, el_, dl, ml, u, ok_l, T, T_n, ROW, E, H, 1, True)
    sz, wz, okz = _edge_loads(p_w, p_st, k, rk, lk, ez, zero, zero + zero_a >= 0, u, ok_l, T, T_n, ROW, E, H, 1,
                              True)  # fmt: skip
    occ_b = tl.where(okb, tl.exp2((al[None, :] + wb.to(tl.float64) + _pair_sum(sb)).to(tl.float32)), 0.0)
    occ_l = tl.where(okl, tl.exp2((al[None, :] + wl.to(tl.float64) + _pair_sum(sl)).to(tl.float32)), 0.0)
    occ_z = tl.where(okz, tl.exp2((al[None, :] + wz.to(tl.float64) + _pair_sum(sz)).to(tl.float32)), 0.0)
    occ_l *= fastemit_scale
    occ_z *= fastemit_scale
    p_cell = lat_ptr + ((n * T + t) * U1 + o_u) * K
    # the entries each edge weighs with (``_edge_table``): TDT's blank and label edges of positive durations, rows
    # alike (NB = NE), weigh with the blank's or the label's entry (0 or 1) and the duration's (2 + i), the 0-frame
    # label edge with 1 and its duration's; the multi-blank's blank edges with one entry each (0, the big blanks'
    # 2 + i), its label edge with 1. Every entry past the tokens' two is one edge row's (TDT: a blank and a label
    # edge) or the 0-frame edge's, so it is written once, [rows, lanes] at a time.
    if MULTI:
        ent = tl.load(edge_ptr + 3 * eb_ + 1, mask=mb, other=-1)
        e0 = tl.sum(tl.where(ent == 0, occ_b, 0.0), axis=0)
        e1 = tl.sum(occ_z, axis=0)
        x = occ_b
    else:
        ent = tl.load(edge_ptr + 3 * eb_ + 2, mask=mb, other=-1)
        e0 = tl.sum(occ_b, axis=0)
        oz = tl.sum(occ_z, axis=0)  # the 0-frame label edge's (one row)
        e1 = tl.sum(occ_l, axis=0) + oz
        x = -(occ_b + occ_l)  # the durations' gradient: of their own log-softmax, its total the tokens' occupancy
        if FUSED:
            lp = tl.load(p_cell[None, :] + ent, mask=(ent >= 2) & active[None, :], other=float("-inf"))
            x += tl.exp2(lp) * (e0 + e1)[None, :]
        if zero_b >= 0:  # the 0-frame label edge's duration
            xz = -oz
            if FUSED:
                lpz = tl.load(p_cell + zero_b, mask=active, other=float("-inf"))
                xz += tl.exp2(lpz) * (e0 + e1)
            tl.store(p_cell + zero_b, xz, mask=in_range)
    tl.store(p_cell, e0, mask=in_range)
    tl.store(p_cell + 1, e1, mask=in_range)
    tl.store(p_cell[None, :] + ent, x, mask=(ent >= 2) & in_range[None, :])


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
    the 0-frame label edge's entries (-1: none); the blank and the label edges' durations (the label edges':
    (0,) without any))."""
    if kind == "tdt":
        blanks = [(d, 0, 2 + i) for i, d in enumerate(durations) if d > 0]
        labels = [(d, 1, 2 + i) for i, d in enumerate(durations) if d > 0]
        zero = next(((1, 2 + i) for i, d in enumerate(durations) if d == 0), (-1, -1))
    else:
        blanks = [(1, 0, -1)] + [(d, 2 + i, -1) for i, d in enumerate(durations)]
        labels, zero = [], (1, -1)
    table = torch.tensor(blanks + labels + [(0, -1, -1)], dtype=torch.int32).to(device)
    return table, len(blanks), len(labels), zero, tuple(e[0] for e in blanks), tuple(e[0] for e in labels) or (0,)


def _row(U1: int) -> int:
    """Entries a row of the recursions' states and weights: U + 1 rounded up to 32 (a warp's lanes), within the
    lanes' power of 2. A constant of the kernels, so that each load's offset from a lane's pointer is one."""
    return min(next_power_of_2(U1), 32 * cdiv(U1, 32))


def _row_blocks(U1: int, V: int) -> tuple[int, int]:
    """(cells per program, classes per chunk) of the lattice pass (``cell_blocks``, as the RNN-T kernels')."""
    return cell_blocks(U1, V, split=True)


def _grad_blocks(U1: int, V: int) -> tuple[int, int]:
    """``_row_blocks`` of the gradient pass (``cell_blocks`` without the split)."""
    return cell_blocks(U1, V, split=False)


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
    chunks, rem = class_blocks(V, block_v)
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
        CHUNKS=chunks,
        BLOCK_R=block_r,
        BLOCK_V=block_v,
        BLOCK_X=next_power_of_2(max(X, 1)),
        REM=rem,
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
    edges, nb, ne, (zero_a, zero_b), db, dl = _edge_table(kind, durations, dev)
    # the states: a pair of float32 a node, packed in an int64 (``_diag_step``, ``_pack``), on ``_sweep``'s rows,
    # filled with (neg(), 0) (every read of the recursions is unmasked)
    block_u = next_power_of_2(U1)
    hist = max((1, *durations)) + 1  # the diagonals a step reads back (``_sweep``)
    row = _row(U1)
    n_st = N * ((T + 1 + hist) * row + block_u + 2)  # (``_state_start``)
    alpha = torch.full((n_st,), _neg_pair.fn(), dtype=torch.int64, device=dev)
    beta = torch.full((n_st if need_grad else 0,), _neg_pair.fn(), dtype=torch.int64, device=dev)
    logp = kernel_output(N, dtype=torch.float64, device=dev)
    # the recursions step along anti-diagonals: each edge's weight at each cell, each edge's row contiguous along u
    # and cell (t, u) on row (t + u) mod T, so that a step's loads are contiguous (E = NB + NE + 1 values a cell,
    # against the logits' V + X; rows of ``_row(U1)`` entries, so that a load's offset from a lane's pointer is
    # a constant)
    n_w = nb + ne + 1
    n_wt = N * (T + hist) * (n_w + 2) * row + block_u + 1
    if hist > T:  # rows 0 .. hist - T - 1 mirror no row (a read there is before the lattice: any finite weight)
        weights = torch.full((n_wt,), -1e30, dtype=torch.float32, device=dev)
    else:
        weights = kernel_output(n_wt, dtype=torch.float32, device=dev)
    w_u = min(block_u, 128)
    table = (edges, logit_lengths, target_lengths, T, U1, K, zero_a, zero_b)  # the edges, lengths and sizes
    rows = dict(NB=nb, NE=ne, RB=next_power_of_2(max(nb, 1)), RL=next_power_of_2(max(ne, 1)), DB=db, DL=dl, E=n_w)
    _tdt_edge_weights_kernel[(N * T, block_u // w_u)](
        lat,
        weights,
        *table,
        hist,
        NB=nb,
        RB=rows["RB"],
        E=n_w,
        MULTI=kind == "multiblank",
        ROW=row,
        BLOCK_U=w_u,
        num_warps=max(1, min(4, w_u // 32)),
    )
    _tdt_recursion_kernel[(N, 2 if need_grad else 1)](  # alpha and, with a gradient to come, beta at once
        weights,
        alpha,
        beta,
        logp,
        nan,
        edges,
        logit_lengths,
        target_lengths,
        T,
        U1,
        hist,
        **rows,
        BLOCK_U=block_u,
        ROW=row,
        num_warps=RECURSION_WARPS or max(1, min(16, block_u // 32)),
    )
    if need_grad:
        _tdt_occupancy_kernel[(N, T + U1 - 1)](  # every cell once: diagonals 0 .. T + U
            lat,
            weights,
            alpha,
            beta,
            logp,
            *table,
            opts.label_scale,
            hist,
            **rows,
            FUSED=opts.fused_log_softmax,
            MULTI=kind == "multiblank",
            BLOCK_U=block_u,
            ROW=row,
            num_warps=max(1, min(8, block_u // 32)),
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
    block_r, block_v = _grad_blocks(U1, V)
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
