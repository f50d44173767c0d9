"""RNN-Transducer loss kernels in Triton.

Four launches per forward+backward (five with the validation), deterministic (no floating-point atomics):

0. the validation (``_transducer.lattice``, one program): lengths and labels checked against the tensors; one flag read
   back.
1. ``_rnnt_lattice_kernel`` (a block of cells of one row (n, t) per program): per cell (n, t, u) the
   log-sum-exp of the V scores (with a fused log_softmax), and the log2-probabilities of the blank and of the
   next label into an [N, T, U+1, 2] float32 lattice. Reads the logits once.
2. ``_rnnt_halves_kernel`` and ``_rnnt_join_kernel`` (two programs per sample), the recursions. A step is a
   vector over u: RNN-T steps along anti-diagonals (t + u = d: both predecessors of a node lie on diagonal
   d - 1), RNA along rows t; either way new[u] = lae(prev[u] + blank edge, prev[u - 1] + label edge), one
   exchange between lanes (``tl.gather``) and two log-add-exps, with the loads two steps ahead. RNN-T's
   lattice and state rows are skewed (cell (t, u) at row (t + u) mod T) so that a step's accesses are
   contiguous. State values are float64 with a float32 correction (see ``.._logspace``).
   - halves: a sample's D steps are cut at M = D // 2; alpha runs over steps 0..M and beta over D..M in two
     programs at once, each storing its values at its nodes of one [T+1, U+1] float64 state.
   - join: log p = lae over step M's nodes of alpha + beta, the loss, and the batch sum or mean by the last
     program to finish; then alpha runs on over steps M+1..D and beta over M-1..0, each writing the edge
     occupancies exp(alpha + w + beta - log p) of its half over the lattice's log-probs.
3. ``_rnnt_grad_kernel`` (a block of cells per program): the dense gradient, g * (softmax * (occ_blank +
   (1 + lambda) occ_label) - occ_blank [v = blank] - (1 + lambda) occ_label [v = y_u]) with a fused
   log_softmax, without the softmax term otherwise; clamped. Reads the logits a second time, writes the
   gradient once.

Memory beyond the gradient: lattice 2 + log-sum-exp 1 + state 2 (float64) = 5 float32 values per node in the
forward, 3 kept for the backward; 4 and 2 with ``store_lse=False`` (the gradient pass computes the log-sum-exps
again).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launch import cdiv, launch, next_power_of_2
from .._logspace import lae, ln2, neg
from .._outputs import kernel_output, kernel_output_like
from .._transducer import joint_kernels
from .._transducer.lattice import (
    cell_blocks,
    cell_offsets,
    cell_scores,
    class_blocks,
    grad_cells,
    grad_kernel_args,
    lattice_buffers,
    row_cells,
    row_lse,
    sample_lengths,
    score_grad_chunks,
)
from .._transducer.options import TransducerOptions


@triton.jit
def _rnnt_lattice_kernel(
    x_ptr,  # [N, T, U+1, V] scores or log-probs (any strides)
    lse_ptr,  # [N * T * (U+1)] float32 out: natural-log log-sum-exp per cell (FUSED and STORE_LSE)
    lat_ptr,  # [N * T * (U+1), 2] float32 out: log2 p(blank), log2 p(next label)
    tgt_ptr,  # [N, U] labels
    il_ptr,  # [N] int32/int64 frames per sample
    tl_ptr,  # [N] int32/int64 labels per sample
    cnt_ptr,  # int32: zeroed here for the batch reduction of the join kernel (or the halves kernel, loss only)
    T, U1, V, stride_n, stride_t, stride_u, stride_v, stride_tg, blank,
    FUSED: tl.constexpr,
    STORE_LSE: tl.constexpr,  # else the gradient kernel computes it again (saves a float per cell)
    CHUNKS: tl.constexpr,  # full chunks of BLOCK_V classes: 0, 1 or 2 (more than one; ``class_blocks``)
    RNA: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
    REM: tl.constexpr,  # the classes past the full chunks, in a chunk of this width (0: none)
):  # fmt: skip
    o_r, n, t, u, m_r, T_n, U_n = row_cells(il_ptr, tl_ptr, T, U1, BLOCK_R)
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        tl.store(cnt_ptr, 0)
    m_r, p_x, lse, lp_b, lp_y = cell_scores(o_r, n, t, u, m_r, T_n, U_n, x_ptr, lse_ptr, tgt_ptr, V, stride_n, stride_t,
                                            stride_u, stride_v, stride_tg, blank, FUSED, STORE_LSE, CHUNKS, BLOCK_R,
                                            BLOCK_V, REM)  # fmt: skip
    p_cell = lat_ptr + cell_offsets(n, t, u, T, U1, RNA)
    tl.store(p_cell, lp_b, mask=m_r)
    tl.store(p_cell + 1, lp_y, mask=m_r)


@triton.jit
def _edge_rows(d, o_u, RNA: tl.constexpr):
    """Step d's node row per lane, and the rows of the blank edge into it and of the label edge into it."""
    if RNA:
        t = tl.zeros_like(o_u) + d
        return t, t - 1, t - 1
    else:
        t = d - o_u
        return t, t - 1, t


@triton.jit
def _lat_row(step, T, RNA: tl.constexpr):
    """The lattice row that holds the cells of a step's nodes. RNA steps are frames: row t. RNN-T's cell (t, u)
    lives at row (t + u) mod T, column u (a permutation within each column), so that the cells of an
    anti-diagonal t + u = d share row d mod T: a step's loads and stores are contiguous."""
    if RNA:
        return step
    else:
        return tl.maximum(step, 0) % T


@triton.jit
def _next_row(r, m, RNA: tl.constexpr):
    """The row of the next step from this step's, for a table of m rows (no division in the loops)."""
    if RNA:
        return r + 1
    else:
        return tl.where(r + 1 == m, 0, r + 1)


@triton.jit
def _prev_row(r, m, RNA: tl.constexpr):
    if RNA:
        return r - 1
    else:
        return tl.where(r == 0, m - 1, r - 1)


@triton.jit
def _state_row(step, T, RNA: tl.constexpr):
    """The same for the recursion state, [T+1, U+1] per sample: node (t, u) at row (t + u) mod (T + 1)."""
    if RNA:
        return step
    else:
        return tl.maximum(step, 0) % (T + 1)


@triton.jit
def _store_loss(a, o_u, U_n, nan, logp_ptr, loss_ptr, i_n, loss_scale):
    """log2 p from the end node's lane of the last alpha step (-inf below the sentinel's range, NaN if a NaN
    log-prob was read), and the loss -(1 + lambda) ln p. Returns log2 p."""
    logp = tl.sum(tl.where(o_u == U_n, a, 0.0), axis=0)
    logp = tl.where(logp < 0.5 * neg(), float("-inf"), logp)
    logp = tl.where(tl.sum(nan, axis=0) > 0, float("nan"), logp)
    tl.store(logp_ptr + i_n, logp)
    tl.store(loss_ptr + i_n, (-loss_scale * logp * ln2()).to(tl.float32))
    return logp


@triton.jit
def _reduce_losses(loss_ptr, cnt_ptr, N, scale, BLOCK_N: tl.constexpr):
    """Batch reduction by the last program to finish: loss[N] = scale * sum(loss[:N]), summed in a fixed order
    (deterministic, no floating-point atomics). The counter was zeroed by the lattice kernel; the atomic orders
    this program's loss store before it, and the others' before the last one's reads."""
    done = tl.atomic_add(cnt_ptr, 1, sem="acq_rel")
    if done == N - 1:
        o_n = tl.arange(0, BLOCK_N)
        acc = tl.zeros([BLOCK_N], tl.float64)
        for n0 in range(0, N, BLOCK_N):
            acc += tl.load(loss_ptr + n0 + o_n, mask=n0 + o_n < N, other=0.0, volatile=True).to(tl.float64)
        tl.store(loss_ptr + N, (tl.sum(acc, axis=0) * scale).to(tl.float32))


@triton.jit
def _nodes(d, o_u, T_n, U_n, RNA: tl.constexpr):
    """Step d's node row per lane and which lanes hold a node."""
    t, _, _ = _edge_rows(d, o_u, RNA)
    return t, (t >= 0) & (t <= T_n) & (o_u <= U_n)


@triton.jit
def _alpha_loads(p_lat, d, r, o_u, T_n, U_n, U1, RNA: tl.constexpr):
    """Step d's edge log-probs into its nodes: the blank edge's (from lane u's cell of step d - 1) and the
    label edge's (from lane u - 1's), per lane (NaN kept). r: the lattice row of step d - 1."""
    t, t_b, t_e = _edge_rows(d, o_u, RNA)
    node = (t >= 0) & (t <= T_n) & (o_u <= U_n)
    m_b = node & (t_b >= 0) & (t_b < T_n)
    m_e = node & (o_u > 0) & (t_e >= 0) & (t_e < T_n)
    p_row = p_lat + r * U1 * 2
    w_b = tl.load(p_row + o_u * 2, mask=m_b, other=neg())
    w_e = tl.load(p_row + o_u * 2 - 1, mask=m_e, other=neg())
    return w_b, w_e


@triton.jit
def _alpha_step(a, w_b, w_e, d, o_u, i_prev, T_n, U_n, RNA: tl.constexpr):
    """alpha of step d from alpha of step d - 1 and the edges into step d's nodes."""
    t, node = _nodes(d, o_u, T_n, U_n, RNA)
    a_prev = tl.where(o_u > 0, tl.gather(a, i_prev, 0), neg())
    from_b = a + tl.maximum(w_b, neg()).to(tl.float64)
    from_e = a_prev + tl.maximum(w_e, neg()).to(tl.float64)
    return tl.where(node, lae(from_b, from_e), neg()), t, node


@triton.jit
def _cell_loads(p_lat, d, r, o_u, T_n, U_n, U1, RNA: tl.constexpr):
    """The log-probs (blank, label) of the edges out of step d's nodes (lattice row r), per lane."""
    t, node = _nodes(d, o_u, T_n, U_n, RNA)
    has_b = node & (t < T_n)
    p_cell = p_lat + (r * U1 + o_u) * 2
    w_b = tl.load(p_cell, mask=has_b, other=neg())
    w_e = tl.load(p_cell + 1, mask=has_b & (o_u < U_n), other=neg())
    return w_b, w_e


@triton.jit
def _beta_step(b, w_b, w_e, d, o_u, i_next, T_n, U_n, RNA: tl.constexpr, BLOCK_U: tl.constexpr):
    """beta of step d from beta of step d + 1 and the edges out of step d's nodes: the blank edge leads to
    (t + 1, u), lane u of the next step; the label edge to (t or t + 1, u + 1), lane u + 1. Returns the new beta,
    the two edges' log2 (edge + beta of its end) and their masks."""
    t, node = _nodes(d, o_u, T_n, U_n, RNA)
    has_b = node & (t < T_n)
    has_e = has_b & (o_u < U_n)
    to_b = tl.where(has_b, tl.maximum(w_b, neg()).to(tl.float64) + b, neg())
    b_next = tl.where(o_u + 1 < BLOCK_U, tl.gather(b, i_next, 0), neg())
    to_e = tl.where(has_e, tl.maximum(w_e, neg()).to(tl.float64) + b_next, neg())
    return tl.where(node, lae(to_b, to_e), neg()), to_b, to_e, t, has_b, has_e


@triton.jit
def _store_occupancies(p_lat, row, o_u, U1, al, to_b, to_e, logp, has_b, has_e):
    """exp(alpha + edge + beta of its end - log p) of the two edges out of each lane's node, over the node's
    lattice cell (``row``: the step's lattice row)."""
    p_cell = p_lat + (row * U1 + o_u) * 2
    tl.store(p_cell, tl.where(has_b, tl.exp2((al + to_b - logp).to(tl.float32)), 0.0), mask=has_b)
    tl.store(p_cell + 1, tl.where(has_e, tl.exp2((al + to_e - logp).to(tl.float32)), 0.0), mask=has_b)


@triton.jit
def _split_lattice(il_ptr, tl_ptr, lat_ptr, state_ptr, T, U1, RNA: tl.constexpr, BLOCK_U: tl.constexpr):
    """Program (n, side) of the split recursions: the sample, its side (0: alpha, 1: beta), lengths, last step D
    and cut M = D // 2, the lanes, and the sample's lattice and state rows."""
    i_n = tl.program_id(0).to(tl.int64)
    side = tl.program_id(1)
    T_n, U_n = sample_lengths(il_ptr, tl_ptr, i_n, True, T, U1)
    D = T_n if RNA else T_n + U_n
    p_lat = lat_ptr + i_n * T * U1 * 2
    p_st = state_ptr + i_n * (T + 1) * U1
    return i_n, side, T_n, U_n, D, D // 2, tl.arange(0, BLOCK_U), p_lat, p_st


@triton.jit
def _rnnt_halves_kernel(
    lat_ptr,  # [N, T, U+1, 2] float32 log2 lattice
    state_ptr,  # [N, T+1, U+1] float64 out (SPLIT): alpha on steps 0..M, beta on steps M+1..D
    mid_ptr,  # [N, U+1] float64 out (SPLIT): beta on step M
    aux_ptr,  # int32 [1 + 2N]: the batch reduction's counter (zeroed by the lattice kernel), NaN counts
    loss_ptr,  # [N + 1] float32 out (not SPLIT): per-sample losses, then the batch reduction (REDUCE)
    logp_ptr,  # [N] float64 out (not SPLIT): log2 p(y | x)
    il_ptr, tl_ptr,
    N, T, U1,
    loss_scale,  # the reported loss's factor: 1 + lambda (FastEmit as NeMo reports it) or 1
    reduce_scale,  # 1 (sum) or 1 / N (mean)
    SPLIT: tl.constexpr, REDUCE: tl.constexpr, RNA: tl.constexpr, BLOCK_U: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """SPLIT (for the gradient): sample n's steps 0..D (D = T_n + U_n, T_n for RNA) cut at M = D // 2; program
    (n, 0) runs alpha over steps 0..M, program (n, 1) beta over steps D..M, each storing its values at its
    steps' nodes (disjoint; beta on step M apart), concurrently: the serial chain is half of alpha-then-beta.
    Not SPLIT (loss only):
    program (n, 0) runs alpha over all steps and writes the loss."""
    i_n, side, T_n, U_n, D, M, o_u, p_lat, p_st = _split_lattice(il_ptr, tl_ptr, lat_ptr, state_ptr, T, U1, RNA,
                                                                 BLOCK_U)  # fmt: skip
    # NaN is counted apart: the maximum that clamps -inf log-probs would drop it
    nan = tl.zeros([BLOCK_U], tl.int32)
    if side == 0:
        i_prev = tl.maximum(o_u - 1, 0)
        a = tl.where(o_u == 0, 0.0, neg()).to(tl.float64)
        last = M if SPLIT else D
        if SPLIT:
            _, node = _nodes(0, o_u, T_n, U_n, RNA)
            tl.store(p_st + o_u, a, mask=node)
        # the loads run two steps ahead of the recursion (their latency is most of a step otherwise); past
        # the last step every lane is masked off
        w_b, w_e = _alpha_loads(p_lat, 1, _lat_row(0, T, RNA), o_u, T_n, U_n, U1, RNA)
        w_b2, w_e2 = _alpha_loads(p_lat, 2, _lat_row(1, T, RNA), o_u, T_n, U_n, U1, RNA)
        r3 = _lat_row(2, T, RNA)  # the lattice row of step d + 1 (loads for step d + 2)
        rs = _state_row(1, T, RNA)  # the state row of step d
        for d in range(1, last + 1):
            w_b3, w_e3 = _alpha_loads(p_lat, d + 2, r3, o_u, T_n, U_n, U1, RNA)
            nan += tl.where((w_b != w_b) | (w_e != w_e), 1, 0)
            a, t_a, node_a = _alpha_step(a, w_b, w_e, d, o_u, i_prev, T_n, U_n, RNA)
            if SPLIT:
                tl.store(p_st + rs * U1 + o_u, a, mask=node_a)
            w_b, w_e, w_b2, w_e2 = w_b2, w_e2, w_b3, w_e3
            r3 = _next_row(r3, T, RNA)
            rs = _next_row(rs, T + 1, RNA)
        if not SPLIT:
            # the last step's lane U_n holds the end node (T_n, U_n); with D = 0 no step ran
            _store_loss(a, o_u, U_n, nan, logp_ptr, loss_ptr, i_n, loss_scale)
            if REDUCE:
                _reduce_losses(loss_ptr, aux_ptr, N, reduce_scale, BLOCK_N)
    else:
        i_next = tl.minimum(o_u + 1, BLOCK_U - 1)
        # beta at step D: 0 at the end node (T_n, U_n)
        b = tl.where(o_u == U_n, 0.0, neg()).to(tl.float64)
        if D > M:
            _, node = _nodes(D, o_u, T_n, U_n, RNA)
            tl.store(p_st + _state_row(D, T, RNA) * U1 + o_u, b, mask=node)
        w_b, w_e = _cell_loads(p_lat, D - 1, _lat_row(D - 1, T, RNA), o_u, T_n, U_n, U1, RNA)
        w_b2, w_e2 = _cell_loads(p_lat, D - 2, _lat_row(D - 2, T, RNA), o_u, T_n, U_n, U1, RNA)
        r3 = _lat_row(D - 3, T, RNA)  # the lattice row of step d - 2 (a negative step's is masked off)
        rs = _state_row(D - 1, T, RNA)  # the state row of step d
        for k in range(1, D - M + 1):
            d = D - k
            w_b3, w_e3 = _cell_loads(p_lat, d - 2, r3, o_u, T_n, U_n, U1, RNA)
            nan += tl.where((w_b != w_b) | (w_e != w_e), 1, 0)
            b, to_b, to_e, t_b, has_b, has_e = _beta_step(b, w_b, w_e, d, o_u, i_next, T_n, U_n, RNA, BLOCK_U)
            t_b, node_b = _nodes(d, o_u, T_n, U_n, RNA)
            tl.store(p_st + rs * U1 + o_u, b, mask=tl.where(d > M, node_b, False))
            w_b, w_e, w_b2, w_e2 = w_b2, w_e2, w_b3, w_e3
            r3 = _prev_row(r3, T, RNA)
            rs = _prev_row(rs, T + 1, RNA)
        # beta on step M (with D = 0 the end node's), where the join kernel takes it
        tl.store(mid_ptr + i_n * U1 + o_u, b, mask=o_u < U1)
    if SPLIT:
        tl.store(aux_ptr + 1 + 2 * i_n + side, tl.sum(nan, axis=0))


@triton.jit
def _join_loads(p_lat, p_st, d, r, rs, o_u, T_n, U_n, U1, RNA: tl.constexpr):
    """What the join kernel's alpha side reads for step d: the edges into step d's nodes (blank, label), the
    label edge out of step d - 1's node of the same lane, and beta of step d at lanes u and u + 1 (the ends of
    the edges out of that node). r: the lattice row of step d - 1, rs: the state row of step d."""
    w_b, w_e = _alpha_loads(p_lat, d, r, o_u, T_n, U_n, U1, RNA)
    _, c_e = _cell_loads(p_lat, d - 1, r, o_u, T_n, U_n, U1, RNA)
    _, node = _nodes(d, o_u, T_n, U_n, RNA)
    _, node_r = _nodes(d, o_u + 1, T_n, U_n, RNA)
    p_row = p_st + rs * U1
    be_b = tl.load(p_row + o_u, mask=node, other=neg())
    be_e = tl.load(p_row + o_u + 1, mask=node_r, other=neg())
    return w_b, w_e, c_e, be_b, be_e


@triton.jit
def _beta_loads(p_lat, p_st, d, r, rs, o_u, T_n, U_n, U1, RNA: tl.constexpr):
    """What the join kernel's beta side reads for step d: the edges out of its nodes, and their alpha (r, rs:
    step d's lattice and state rows)."""
    w_b, w_e = _cell_loads(p_lat, d, r, o_u, T_n, U_n, U1, RNA)
    _, node = _nodes(d, o_u, T_n, U_n, RNA)
    return w_b, w_e, tl.load(p_st + rs * U1 + o_u, mask=node, other=neg())


@triton.jit
def _rnnt_join_kernel(
    lat_ptr,  # log2 lattice in; edge occupancies out, in place
    state_ptr,  # alpha on steps 0..M, beta on steps M+1..D (the halves kernel's)
    mid_ptr,  # beta on step M
    aux_ptr, loss_ptr, logp_ptr, il_ptr, tl_ptr,
    N, T, U1, loss_scale, reduce_scale,
    REDUCE: tl.constexpr, RNA: tl.constexpr, BLOCK_U: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """After the halves kernel: log p from the cut (sum over step M's nodes of alpha * beta), then program
    (n, 0) runs alpha on over steps M+1..D with the occupancies of the edges out of steps M..D-1, program
    (n, 1) beta on over steps M-1..0 with those out of steps M-1..0 (disjoint lattice cells)."""
    i_n, side, T_n, U_n, D, M, o_u, p_lat, p_st = _split_lattice(il_ptr, tl_ptr, lat_ptr, state_ptr, T, U1, RNA,
                                                                 BLOCK_U)  # fmt: skip
    i_prev = tl.maximum(o_u - 1, 0)
    i_next = tl.minimum(o_u + 1, BLOCK_U - 1)
    # log p = log sum_u alpha(M, u) beta(M, u)
    t_m, node_m = _nodes(M, o_u, T_n, U_n, RNA)
    a = tl.load(p_st + _state_row(M, T, RNA) * U1 + o_u, mask=node_m, other=neg())
    b = tl.load(mid_ptr + i_n * U1 + o_u, mask=o_u < U1, other=neg())
    nan = tl.load(aux_ptr + 1 + 2 * i_n) + tl.load(aux_ptr + 2 + 2 * i_n)
    ab = tl.where(node_m, a + b, neg())
    top = tl.max(ab, axis=0)
    logp = top + tl.log2(tl.sum(tl.exp2((ab - top).to(tl.float32)), axis=0)).to(tl.float64)
    logp = tl.where(top < 0.5 * neg(), float("-inf"), logp)
    logp = tl.where(nan > 0, float("nan"), logp)
    # impossible samples keep no occupancy (zero gradient); NaN goes on so that it propagates
    live = logp != float("-inf")
    if side == 0:
        tl.store(logp_ptr + i_n, logp)
        tl.store(loss_ptr + i_n, (-loss_scale * logp * ln2()).to(tl.float32))
        if REDUCE:
            _reduce_losses(loss_ptr, aux_ptr, N, reduce_scale, BLOCK_N)
        # step d's alpha from step d - 1's (in a), and the occupancies of the edges out of step d - 1's nodes:
        # their cells' log-probs, beta of the edges' ends (step d, lanes u and u + 1, stored by the halves
        # kernel). This side reads and writes the cells of steps M..D-1 only, the other side those of 0..M-1.
        last = tl.where(live, D, M)
        r_x = _lat_row(M, T, RNA)  # the lattice row of step d - 1
        w_b, w_e, c_e, be_b, be_e = _join_loads(p_lat, p_st, M + 1, r_x, _state_row(M + 1, T, RNA), o_u, T_n,
                                                U_n, U1, RNA)  # fmt: skip
        w_b2, w_e2, c_e2, be_b2, be_e2 = _join_loads(p_lat, p_st, M + 2, _lat_row(M + 1, T, RNA),
                                                     _state_row(M + 2, T, RNA), o_u, T_n, U_n, U1, RNA)  # fmt: skip
        r3 = _lat_row(M + 2, T, RNA)  # rows for the loads of step d + 2
        rs3 = _state_row(M + 3, T, RNA)
        for d in range(M + 1, last + 1):
            # loads two steps ahead of the recursion
            w_b3, w_e3, c_e3, be_b3, be_e3 = _join_loads(p_lat, p_st, d + 2, r3, rs3, o_u, T_n, U_n, U1, RNA)
            t_x, node_x = _nodes(d - 1, o_u, T_n, U_n, RNA)
            has_b = node_x & (t_x < T_n)
            has_e = has_b & (o_u < U_n)
            to_b = tl.where(has_b, tl.maximum(w_b, neg()).to(tl.float64) + be_b, neg())
            to_e = tl.where(has_e, tl.maximum(c_e, neg()).to(tl.float64) + be_e, neg())
            _store_occupancies(p_lat, r_x, o_u, U1, a, to_b, to_e, logp, has_b, has_e)
            a, t_a, node_a = _alpha_step(a, w_b, w_e, d, o_u, i_prev, T_n, U_n, RNA)
            w_b, w_e, c_e, be_b, be_e = w_b2, w_e2, c_e2, be_b2, be_e2
            w_b2, w_e2, c_e2, be_b2, be_e2 = w_b3, w_e3, c_e3, be_b3, be_e3
            r_x = _next_row(r_x, T, RNA)
            r3 = _next_row(r3, T, RNA)
            rs3 = _next_row(rs3, T + 1, RNA)
    else:
        # beta on from step M's, with the occupancies of the edges out of each step's nodes
        first = tl.where(live, M, 0)
        r_x = _lat_row(first - 1, T, RNA)  # the lattice row of step d
        w_b, w_e, al = _beta_loads(p_lat, p_st, first - 1, r_x, _state_row(first - 1, T, RNA), o_u, T_n, U_n, U1,
                                   RNA)  # fmt: skip
        w_b2, w_e2, al2 = _beta_loads(p_lat, p_st, first - 2, _lat_row(first - 2, T, RNA),
                                      _state_row(first - 2, T, RNA), o_u, T_n, U_n, U1, RNA)  # fmt: skip
        r3 = _lat_row(first - 3, T, RNA)  # rows for the loads of step d - 2 (a negative step's are masked off)
        rs3 = _state_row(first - 3, T, RNA)
        for k in range(1, first + 1):
            d = first - k
            w_b3, w_e3, al3 = _beta_loads(p_lat, p_st, d - 2, r3, rs3, o_u, T_n, U_n, U1, RNA)
            b, to_b, to_e, t, has_b, has_e = _beta_step(b, w_b, w_e, d, o_u, i_next, T_n, U_n, RNA, BLOCK_U)
            _store_occupancies(p_lat, r_x, o_u, U1, al, to_b, to_e, logp, has_b, has_e)
            w_b, w_e, al, w_b2, w_e2, al2 = w_b2, w_e2, al2, w_b3, w_e3, al3
            r_x = _prev_row(r_x, T, RNA)
            r3 = _prev_row(r3, T, RNA)
            rs3 = _prev_row(rs3, T + 1, RNA)


@triton.jit
def _rnnt_grad_kernel(
    x_ptr,
    grad_ptr,  # [N, T, U+1, V] out
    lse_ptr,
    occ_ptr,  # [N * T * (U+1), 2] edge occupancies
    logp_ptr,
    gloss_ptr,  # upstream gradient per sample (stride 0: one for the batch)
    gloss_stride,
    gscale,  # 1, or 1 / N for a batch mean
    tgt_ptr, il_ptr, tl_ptr,
    T, U1, V, stride_n, stride_t, stride_u, stride_v, gstride_n, gstride_t, gstride_u, gstride_v, stride_tg, blank,
    fastemit_scale, clamp,
    FUSED: tl.constexpr,
    LOAD_LSE: tl.constexpr,  # else computed here
    CHUNKS: tl.constexpr, CLAMP: tl.constexpr, RNA: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
    REM: tl.constexpr,
):  # fmt: skip
    o_r, n, t, u, in_range, T_n, U_n, logp, active, has_label, g = grad_cells(
        il_ptr, tl_ptr, logp_ptr, gloss_ptr, gloss_stride, gscale, T, U1, BLOCK_R
    )
    p_cell = occ_ptr + cell_offsets(n, t, u, T, U1, RNA)
    occ_b = tl.load(p_cell, mask=active, other=0.0)
    occ_e = tl.load(p_cell + 1, mask=has_label, other=0.0) * fastemit_scale
    lab = tl.load(tgt_ptr + n * stride_tg + u, mask=has_label, other=-1).to(tl.int64)
    # clamped as the lattice kernel clamps it (unchecked labels): the gradient goes to the score that was read;
    # then int32, so that the comparisons with the classes in the loop below are 32-bit (int64 ones cost 12 % of
    # this kernel at (1500, 300, 50))
    lab = tl.where(has_label, tl.minimum(tl.maximum(lab, 0), V - 1), -1).to(tl.int32)
    p_x = x_ptr + n * stride_n + t * stride_t + u.to(tl.int64) * stride_u
    lse = tl.zeros([BLOCK_R], tl.float32)
    if FUSED:
        if LOAD_LSE:
            lse = tl.load(lse_ptr + o_r, mask=active, other=0.0)
        else:  # a pass over the cells' scores first (they are read before any gradient is written)
            lse = row_lse(p_x, active, stride_v, V, CHUNKS, BLOCK_R, BLOCK_V, REM)
    p_g = grad_ptr + n * gstride_n + t * gstride_t + u.to(tl.int64) * gstride_u
    score_grad_chunks(p_x, p_g, lse, in_range, active, lab, occ_b + occ_e, occ_b, occ_e, g, V, blank, clamp, stride_v,
                      gstride_v, 0, 0, FUSED, CLAMP, False, BLOCK_R, BLOCK_V)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# launchers


def _batch_block(N: int) -> int:
    """Losses per tile of the last program's batch sum."""
    return min(1024, next_power_of_2(N))


def _row_blocks(U1: int, V: int) -> tuple[int, int, int]:
    """(cells per program, classes per chunk, warps) of the lattice pass (``cell_blocks``): one warp."""
    return *cell_blocks(U1, V, split=True), 1


def _grad_blocks(U1: int, V: int) -> tuple[int, int, int]:
    """``_row_blocks`` of the gradient pass (``cell_blocks`` without the split), but where it recomputes the
    log-sum-exps (``rnnt_backward``)."""
    return *cell_blocks(U1, V, split=False), 1


def _recursion_warps(block: int, N: int) -> int:
    """Warps of the recursion kernels (two programs per sample): one lane per thread up to 16 warps while the
    programs are few, 4 warps once they fill the GPU (from sweeps on an H100, benchmarks/tune_rnnt.py)."""
    return min(16, max(4, block // 32)) if 2 * N <= 32 else 4


def rnnt_forward(
    x: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    opts: TransducerOptions,
    need_grad: bool,
    store_lse: bool = True,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The loss (per-sample [N] float32 for ``opts.reduction`` "none", else a 0-dim sum or batch mean), and the
    state ``rnnt_backward`` takes (lse, occupancies, log p). The kernels clamp lengths and labels: unchecked values
    cannot fault. ``store_lse=False``: the log-sum-exps are not kept (the backward then computes them again,
    with ``recompute_lse=True``). The reported loss is times ``opts.loss_scale`` (FastEmit as NeMo reports it;
    the gradient's label edges are scaled by ``opts.label_scale`` in ``rnnt_backward`` either way).

    Args:
        x: [N, T, U+1, V] float32/float16/bfloat16, any strides.
        targets: [N, U] int32/int64 on x's device (unit stride along U).
        logit_lengths, target_lengths: [N] int32/int64 on x's device.
    """
    N, T, U1, V = x.shape
    dev = x.device
    fused = opts.fused_log_softmax
    lse, lat, aux = lattice_buffers(N, T, U1, dev, fused and store_lse)
    block_r, block_v, warps = _row_blocks(U1, V)
    chunks, rem = class_blocks(V, block_v)
    launch(_rnnt_lattice_kernel)[(N * T, cdiv(U1, block_r))](
        x,
        lse,
        lat,
        targets,
        logit_lengths,
        target_lengths,
        aux,
        T,
        U1,
        V,
        x.stride(0),
        x.stride(1),
        x.stride(2),
        x.stride(3),
        targets.stride(0),
        opts.blank,
        FUSED=fused,
        STORE_LSE=store_lse,
        CHUNKS=chunks,
        RNA=opts.rna,
        BLOCK_R=block_r,
        BLOCK_V=block_v,
        REM=rem,
        num_warps=warps,
    )
    return rnnt_recursions(lse, lat, aux, logit_lengths, target_lengths, N, T, U1, opts, need_grad)


def rnnt_recursions(
    lse: torch.Tensor,
    lat: torch.Tensor,
    aux: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    N: int,
    T: int,
    U1: int,
    opts: TransducerOptions,
    need_grad: bool,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The recursions over a log2 lattice (``lat``: [N * T * (U+1), 2] in the skewed layout of
    ``cell_offsets``, written for the cells with edges): the loss ([N], or the batch sum or mean) and the
    backward's state (``lse`` passed through, the lattice, log2 p [N] float64); with ``need_grad`` the lattice then
    holds the edge occupancies. ``aux``: [1 + 2N] int32, its
    first element zeroed by the kernel that wrote the lattice."""
    dev = lat.device
    loss = kernel_output(N + 1, dtype=torch.float32, device=dev)  # per sample, then the batch reduction
    logp = kernel_output(N, dtype=torch.float64, device=dev)
    block_u = max(16, next_power_of_2(U1))
    state = kernel_output(N * (T + 1) * U1 if need_grad else 0, dtype=torch.float64, device=dev)
    mid = kernel_output(N * U1 if need_grad else 0, dtype=torch.float64, device=dev)
    reduce = opts.reduction != "none"
    args = (
        lat,
        state,
        mid,
        aux,
        loss,
        logp,
        logit_lengths,
        target_lengths,
        N,
        T,
        U1,
        opts.loss_scale,
        1.0 / N if opts.reduction == "mean" else 1.0,
    )
    meta = dict(
        REDUCE=reduce, RNA=opts.rna, BLOCK_U=block_u, BLOCK_N=_batch_block(N), num_warps=_recursion_warps(block_u, N)
    )
    launch(_rnnt_halves_kernel)[(N, 2 if need_grad else 1)](*args, SPLIT=need_grad, **meta)
    if need_grad:
        launch(_rnnt_join_kernel)[(N, 2)](*args, **meta)
    return (loss[N] if reduce else loss[:N]), (lse, lat, logp)


def rnnt_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    opts: TransducerOptions,
    out: torch.Tensor | None = None,
    recompute_lse: bool = False,
) -> torch.Tensor:
    """Gradient of the loss with respect to x, in x's dtype: of sum(grad_out * loss) for ``opts.reduction`` "none"
    (grad_out: [N]), else of grad_out * the sum or batch mean (grad_out: 0-dim). Into ``out`` when given, which
    may be x's own storage (each cell's logits are read before its gradient is written). ``state``: the
    forward's (log-sum-exps, edge occupancies, log2 p)."""
    N, T, U1, V = x.shape
    grad = out if out is not None else kernel_output_like(x)
    # recomputing the log-sum-exps: the lattice pass's blocks, so that they equal its own to the bit (the gradient
    # of consumed logits equals the other's)
    block_r, block_v, warps = (_row_blocks if recompute_lse else _grad_blocks)(U1, V)
    chunks, rem = class_blocks(V, block_v)
    launch(_rnnt_grad_kernel)[(N * T, cdiv(U1, block_r))](
        *grad_kernel_args(x, grad, state, grad_out, targets, logit_lengths, target_lengths, opts.reduction),
        V,
        *x.stride(),
        *grad.stride(),
        targets.stride(0),
        opts.blank,
        opts.label_scale,
        max(opts.clamp, 0.0),
        FUSED=opts.fused_log_softmax,
        LOAD_LSE=not recompute_lse,
        CHUNKS=chunks,
        CLAMP=opts.clamp > 0,
        RNA=opts.rna,
        BLOCK_R=block_r,
        BLOCK_V=block_v,
        REM=rem,
        num_warps=warps,
    )
    return grad


def joint_forward(
    joint: joint_kernels.JointNetwork,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    opts: TransducerOptions,
    need_grad: bool,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The fused joint's RNN-T loss: its lattice (``_transducer.joint_kernels.joint_lattice``), then the recursions.
    Returns the loss ([N] float32 for reduction "none", else the batch sum or mean) and the state ``joint_backward``
    takes (log-sum-exps, occupancies, log2 p).

    Args:
        joint: the joint network (``JointNetwork``).
        targets: [N, U] int32/int64 (unit stride along U); lengths: [N] int32/int64; all on enc's device.
    """
    N, T, _ = joint.enc.shape
    U1 = joint.pred.shape[1]
    lse, lat, aux = joint_kernels.joint_lattice(joint, targets, logit_lengths, target_lengths, opts.blank, opts.rna)
    return rnnt_recursions(lse, lat, aux, logit_lengths, target_lengths, N, T, U1, opts, need_grad)
