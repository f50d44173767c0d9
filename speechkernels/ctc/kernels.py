"""CTC loss kernels in Triton.

Four launches per forward+backward (three for small problems, five with the wavefront), all deterministic (no
floating-point atomics):

1. ``_ctc_prepare_kernel`` (one program per sample): clamps the lengths, computes the sample's offsets into
   the packed tables (a prefix sum over the lengths, recomputed by each program), checks the labels, and
   sorts the sample's labels by class (``tl.sort``) so that repeated classes can be summed in a fixed order.
2. ``_ctc_emission_kernel`` (one program per frame and sample): with ``IS_LOGITS`` the log-sum-exp of the
   row; then the log-probabilities of the blank and of the sample's labels, in base 2, into a packed
   table of L+1 values per frame. Reads the activations once.
3. ``_ctc_recursion_kernel`` (one program per sample), in three parts:
   - the forward recursion (alpha) over t in log2 space, the blank states and the label states held apart in
     registers as two vectors of length BLOCK; label j's predecessor, label j-1, comes from ``tl.gather`` (one
     exchange between warps per step). The state values are float64: they fall to thousands below zero over
     long inputs, and the states that carry the posterior sit far below alpha's maximum, where float32 would
     lose the absolute precision the gradient needs; only the correction log2(1 + 2^-|a-b|) is float32 (a
     polynomial). Each label update reuses the blank's sum, so a state costs two log-add-exps. Impossible
     states hold a finite sentinel, and NaN emissions are counted apart. With a gradient to compute it writes
     the label states' alpha before each frame's emission (L float64 values per frame);
   - then the backward recursion fused with the occupancies (warp-ctc's scheme: beta is never stored).
     gamma_t(j) = alpha_t(j) beta_t(j) / p with log p from the alpha part, so the loop has no reduction; each
     label position's occupancy overwrites its emission in the table. The blank's total occupancy is 1 minus
     the labels' (every path is in one state per frame);
   - for reduction "sum"/"mean", the last program to finish (an integer counter) sums the weighted losses in
     a fixed order, so the public function returns the kernel's output with no further torch op.
4. ``_ctc_grad_kernel`` (one program per frame and sample, in the backward): writes the dense gradient row,
   g * (softmax - occupancy) with ``IS_LOGITS`` or -g * occupancy otherwise; the occupancies of repeated
   classes are added by a segmented scan over the sorted labels, then written after a barrier. Reads the
   activations a second time and writes the gradient once.

For few classes and short inputs (``use_small_forward``), ``_ctc_small_forward_kernel`` does 2 and 3 in one
program per sample (the emissions in [32 frames, C] tiles), one launch fewer.

For long label sequences in small batches (``wave_shape``), ``_ctc_wave_kernel`` runs 3 instead as a wavefront:
each sample's lanes are split across programs of one lane per thread, launched twice (alpha, then beta). Alpha's
lane j needs only label j - 1's state of the frame before, so a program takes its first lane's from its left
neighbour, which publishes its last label's state every frame and releases them every F frames (a counter in
global memory); beta runs right to left the same way, passing what label j receives from lane j + 1. Programs
take their places from a ticket counter in the order they start, so each waits only on one that is running. The
arithmetic is ``_alpha``'s and ``_beta``'s in the same order: the two paths give the same bits.

HBM traffic, T*N rows of C classes in b bytes: 2*T*N*C*b read + T*N*C*b written, plus O(T * sum(L)) floats
of tables. The recursions are latency-bound: one program per sample, T dependent steps each. For small
problems the host's time per launch (tens of microseconds) dominates, hence few launches and no torch ops.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .._launch import cdiv, launch, next_power_of_2
from .._logspace import lae, ln2, log2e, lse_step, lse_total, neg
from .._outputs import kernel_output, kernel_output_like
from .._sync import frame, wait_counter

# Constants are jit functions rather than constexpr globals (see .._logspace).

# meta (int64, flattened [META_ROWS * N + 1]): row r holds meta[r * N + n]; after the rows, the counter of
# finished recursion programs (for the reduction)
META_ROWS = 7


@triton.jit
def _row_t():  # T_n, clamped to [0, T]
    return 0


@triton.jit
def _row_l():  # L used by the tables: 0 when L > T (no alignment exists)
    return 1


@triton.jit
def _row_err():  # validation bits: 1 input length, 2 target length, 4 label outside [0, C), 8 label == blank
    return 2


@triton.jit
def _row_lc():  # L, clamped to the targets
    return 3


@triton.jit
def _row_tgt():  # start of the sample's labels in targets
    return 4


@triton.jit
def _row_lp():  # offset of the sample's emission/occupancy table
    return 5


@triton.jit
def _row_alpha():  # offset of the sample's alpha table
    return 6


@triton.jit
def _row_counter():
    return 7  # META_ROWS


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def _pick(x, o, i):
    """x[i] of a 1-D block as a scalar (0.0 if i is out of range); NaN and -inf pass through."""
    return tl.sum(tl.where(o == i, x, 0.0), axis=0)


@triton.jit
def _seg_add(a, fa, b, fb):
    # segmented sum: a segment restarts where the flag is set
    return tl.where(fb, b, a + b), fa | fb


@triton.jit
def _ctc_prepare_kernel(
    in_len_ptr,  # [N] int64
    tgt_len_ptr,  # [N] int64
    tgt_ptr,  # targets, int32/int64, padded [N, S] (row stride S) or concatenated
    meta_ptr,  # [META_ROWS * N + 1] int64 out
    srt_ptr,  # like targets, int64 out: per sample, (class << 32 | position) sorted, at the sample's base
    w_ptr,  # [N] float32 out: weight of the sample's loss in the reduction: 1 / (N * max(L, 1)) for "mean", else 1
    N, T,
    S,  # padded width, or the concatenated length
    C, blank,
    PADDED: tl.constexpr, VALIDATE: tl.constexpr, MEAN: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    i_n = tl.program_id(0)
    if i_n == 0:
        tl.store(meta_ptr + _row_counter() * N, 0)
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < N
    raw_t = tl.load(in_len_ptr + o_n, mask=m_n, other=0)
    raw_l = tl.load(tgt_len_ptr + o_n, mask=m_n, other=0)
    l_pos = tl.maximum(raw_l, 0)
    if PADDED:
        l_c = tl.minimum(l_pos, S)
        base = o_n.to(tl.int64) * S
    else:
        ends = tl.cumsum(l_pos, axis=0)
        base = tl.minimum(ends - l_pos, S)
        l_c = tl.minimum(l_pos, S - base)
    # a label sequence longer than T can never be aligned: it gets no table space
    l_eff = tl.where(l_c <= T, l_c, 0)
    w = tl.where(m_n, l_eff + 1, 0)
    before = m_n & (o_n < i_n)
    lp_off = T * tl.sum(tl.where(before, w, 0), axis=0)
    al_off = T * tl.sum(tl.where(before, w - 1, 0), axis=0)
    mine = o_n == i_n
    my_t = tl.sum(tl.where(mine, tl.minimum(tl.maximum(raw_t, 0), T), 0), axis=0)
    my_l = tl.sum(tl.where(mine, l_eff, 0), axis=0)
    my_lc = tl.sum(tl.where(mine, l_c, 0), axis=0)
    my_base = tl.sum(tl.where(mine, base, 0), axis=0)
    tl.store(meta_ptr + _row_t() * N + i_n, my_t)
    tl.store(meta_ptr + _row_l() * N + i_n, my_l)
    tl.store(meta_ptr + _row_lc() * N + i_n, my_lc)
    tl.store(meta_ptr + _row_tgt() * N + i_n, my_base)
    tl.store(meta_ptr + _row_lp() * N + i_n, lp_off)
    tl.store(meta_ptr + _row_alpha() * N + i_n, al_off)
    my_raw_l = tl.sum(tl.where(mine, raw_l, 0), axis=0)
    if MEAN:
        tl.store(w_ptr + i_n, 1.0 / (N * tl.maximum(my_raw_l, 1).to(tl.float32)))
    else:
        tl.store(w_ptr + i_n, 1.0)

    o_j = tl.arange(0, BLOCK)
    if VALIDATE:
        my_raw_t = tl.sum(tl.where(mine, raw_t, 0), axis=0)
        bits = tl.where((my_raw_t < 0) | (my_raw_t > T), 1, 0)
        bits |= tl.where((my_raw_l < 0) | (my_lc < my_raw_l), 2, 0)
        for j0 in range(0, my_lc, BLOCK):
            m_j = j0 + o_j < my_lc
            lab = tl.load(tgt_ptr + my_base + j0 + o_j, mask=m_j, other=0).to(tl.int64)
            bad = tl.where(m_j & ((lab < 0) | (lab >= C)), 4, 0)
            bad |= tl.where(m_j & (lab == blank), 8, 0)
            bits |= tl.reduce(bad, 0, _or)
        tl.store(meta_ptr + _row_err() * N + i_n, bits.to(tl.int64))

    # sort (class, position) keys; positions past the label count sort last
    m_l = o_j < my_l
    lab = tl.load(tgt_ptr + my_base + o_j, mask=m_l, other=0).to(tl.int64)
    lab = tl.minimum(tl.maximum(lab, 0), C - 1)
    key = tl.where(m_l, (lab << 32) | o_j.to(tl.int64), 0x7FFFFFFFFFFFFFFF)
    key = tl.sort(key, 0)
    tl.store(srt_ptr + my_base + o_j, key, mask=m_l)


@triton.jit
def _ctc_emission_kernel(
    x_ptr,  # [T, N, C] activations (any strides)
    lse_ptr,  # [N, T] float32 out (IS_LOGITS)
    lp_ptr,  # packed float32 out: per sample and frame, log2-prob of blank then of each label
    tgt_ptr, meta_ptr,
    N, T, C, stride_t, stride_n, stride_c, blank,
    IS_LOGITS: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_L: tl.constexpr,
):  # fmt: skip
    i_r = tl.program_id(0).to(tl.int64)
    i_t = i_r // N
    i_n = i_r % N
    T_n = tl.load(meta_ptr + _row_t() * N + i_n)
    if i_t < T_n:
        L = tl.load(meta_ptr + _row_l() * N + i_n)
        tgt_base = tl.load(meta_ptr + _row_tgt() * N + i_n)
        p_x = x_ptr + i_t * stride_t + i_n * stride_n
        lse = 0.0
        if IS_LOGITS:
            # online log-sum-exp, one running (max, sum) per lane, in base 2
            o_c = tl.arange(0, BLOCK_C)
            b_m = tl.full([BLOCK_C], float("-inf"), tl.float32)
            b_s = tl.zeros([BLOCK_C], tl.float32)
            for c0 in range(0, C, BLOCK_C):
                b_x = tl.load(p_x + (c0 + o_c) * stride_c, mask=c0 + o_c < C, other=float("-inf")).to(tl.float32)
                b_m, b_s = lse_step(b_m, b_s, b_x * log2e())
            lse = lse_total(b_m, b_s, 0) * ln2()
            tl.store(lse_ptr + i_n * T + i_t, lse)
        p_lp = lp_ptr + tl.load(meta_ptr + _row_lp() * N + i_n) + i_t * (L + 1)
        x_blank = tl.load(p_x + blank * stride_c).to(tl.float32)
        tl.store(p_lp, (x_blank - lse) * log2e())
        o_l = tl.arange(0, BLOCK_L)
        for j0 in range(0, L, BLOCK_L):
            m_l = j0 + o_l < L
            lab = tl.load(tgt_ptr + tgt_base + j0 + o_l, mask=m_l, other=0).to(tl.int64)
            lab = tl.minimum(tl.maximum(lab, 0), C - 1)
            b_x = tl.load(p_x + lab * stride_c, mask=m_l, other=0.0).to(tl.float32)
            tl.store(p_lp + 1 + j0 + o_l, (b_x - lse) * log2e(), mask=m_l)


@triton.jit
def _recursion_setup(lp_ptr, alpha_ptr, tgt_ptr, meta_ptr, N, i_n, BLOCK: tl.constexpr):
    """A sample's lengths and table pointers, the label index vector, and can_skip[j]: label j may be entered
    from label j-1 directly (the two differ)."""
    T_n = tl.load(meta_ptr + _row_t() * N + i_n)
    L = tl.load(meta_ptr + _row_l() * N + i_n)
    L_c = tl.load(meta_ptr + _row_lc() * N + i_n)
    tgt_base = tl.load(meta_ptr + _row_tgt() * N + i_n)
    p_lp = lp_ptr + tl.load(meta_ptr + _row_lp() * N + i_n)
    p_al = alpha_ptr + tl.load(meta_ptr + _row_alpha() * N + i_n)
    o_j = tl.arange(0, BLOCK)
    m_l = o_j < L
    lab = tl.load(tgt_ptr + tgt_base + o_j, mask=m_l, other=-1)
    lab_prev = tl.load(tgt_ptr + tgt_base + o_j - 1, mask=m_l & (o_j > 0), other=-1)
    can_skip = m_l & (o_j > 0) & (lab != lab_prev)
    return T_n, L, L_c, p_lp, p_al, o_j, can_skip


@triton.jit
def _alpha(p_lp, p_al, T, T_n, L, L_c, o_j, can_skip, STORE_ALPHA: tl.constexpr):
    """The forward recursion of one sample; returns log2 p(labels | input) (-inf if impossible, NaN if a NaN
    emission was read). With STORE_ALPHA, writes the label states before each frame's emission."""
    W = L + 1
    m_b = o_j <= L
    m_l = o_j < L
    i_prev = tl.maximum(o_j - 1, 0)

    # frame 0: paths start in the first blank or the first label
    e_b = tl.load(p_lp)
    e_l = tl.load(p_lp + 1 + o_j, mask=m_l, other=0.0)
    # NaN is counted apart: the maximum that clamps the emissions would drop it
    nan_l = tl.where(e_l != e_l, 1, 0)
    nan_b = tl.where(e_b != e_b, 1, 0)
    a_l = tl.where((o_j == 0) & m_l, 0.0, neg()).to(tl.float64)
    if STORE_ALPHA:
        tl.store(p_al + o_j, a_l, mask=m_l)
    a_b = tl.where(o_j == 0, tl.maximum(e_b, neg()), neg()).to(tl.float64)
    a_l = tl.where((o_j == 0) & m_l, tl.maximum(e_l, neg()), neg()).to(tl.float64)
    n_steps = tl.where(L_c <= T, T_n, 0)
    # the next frame's emissions are loaded one step ahead
    e_b_nx = tl.load(p_lp + W, mask=n_steps > 1, other=0.0)
    e_l_nx = tl.load(p_lp + W + 1 + o_j, mask=tl.where(n_steps > 1, m_l, False), other=0.0)
    for t in range(1, n_steps):
        e_b = e_b_nx
        e_l = e_l_nx
        row_nx = p_lp + tl.minimum(t + 1, n_steps - 1) * W
        e_b_nx = tl.load(row_nx)
        e_l_nx = tl.load(row_nx + 1 + o_j, mask=m_l, other=0.0)
        nan_l += tl.where(e_l != e_l, 1, 0)
        nan_b += tl.where(e_b != e_b, 1, 0)
        a_l_prev = tl.where(o_j > 0, tl.gather(a_l, i_prev, 0), neg())
        # blank j from blank j or label j-1; label j from label j, blank j, or label j-1 when it differs:
        # lae3(a_l, a_b, a_l_prev) = lae(a_l, lae(a_b, a_l_prev)), so the blank's sum is reused
        n_b = tl.where(m_b, lae(a_b, a_l_prev), neg())
        n_l = tl.where(m_l, lae(a_l, tl.where(can_skip, n_b, a_b)), neg())
        if STORE_ALPHA:
            tl.store(p_al + t * L + o_j, n_l, mask=m_l)
        a_b = n_b + tl.maximum(e_b, neg()).to(tl.float64)
        a_l = n_l + tl.maximum(e_l, neg()).to(tl.float64)
    logp = lae(_pick(a_b, o_j, L), tl.where(L > 0, _pick(a_l, o_j, L - 1), neg()))
    logp = tl.where(logp < 0.5 * neg(), float("-inf"), logp)
    logp = tl.where(tl.sum(nan_l, axis=0) + nan_b > 0, float("nan"), logp)
    logp = tl.where(T_n == 0, tl.where(L_c == 0, 0.0, float("-inf")), logp)
    logp = tl.where(L_c <= T, logp, float("-inf"))
    return logp


@triton.jit
def _beta(p_lp, p_al, logp, T, T_n, L, L_c, o_j, can_skip):
    """The backward recursion of one sample fused with the occupancies, which overwrite the label emissions."""
    W = L + 1
    m_b = o_j <= L
    m_l = o_j < L
    i_next = tl.minimum(o_j + 1, o_j.shape[0] - 1)
    # impossible samples keep no occupancy (their gradient is zero); NaN goes on so that it propagates
    n_steps = tl.where((L_c <= T) & (logp != float("-inf")), T_n, 0)

    b_b = tl.full(o_j.shape, neg(), tl.float64)
    b_l = tl.full(o_j.shape, neg(), tl.float64)
    # frame t's emissions and alpha are loaded one step ahead
    t_nx = tl.maximum(n_steps - 1, 0)
    e_b_nx = tl.load(p_lp + t_nx * W, mask=n_steps > 0, other=0.0)
    e_l_nx = tl.load(p_lp + t_nx * W + 1 + o_j, mask=tl.where(n_steps > 0, m_l, False), other=0.0)
    al_l_nx = tl.load(p_al + t_nx * L + o_j, mask=tl.where(n_steps > 0, m_l, False), other=neg())
    for k in range(0, n_steps):
        t = n_steps - 1 - k
        e_b = tl.maximum(e_b_nx, neg()).to(tl.float64)
        e_l = tl.maximum(e_l_nx, neg()).to(tl.float64)
        al_l = al_l_nx
        t_nx = tl.maximum(t - 1, 0)
        e_b_nx = tl.load(p_lp + t_nx * W)
        e_l_nx = tl.load(p_lp + t_nx * W + 1 + o_j, mask=m_l, other=0.0)
        al_l_nx = tl.load(p_al + t_nx * L + o_j, mask=m_l, other=neg())
        # blank j goes to blank j or label j; label j to label j, blank j+1, or label j+1 when it differs:
        # lae3(b_l, b_b[j+1], b_l[j+1]) = lae(b_l, r_b[j+1]), so the blank's sum is reused
        r_b = lae(b_b, b_l)
        r_next = tl.where(o_j + 1 <= L, tl.gather(tl.where(can_skip, r_b, b_b), i_next, 0), neg())
        r_l = lae(b_l, r_next)
        # the last frame: paths end in the last blank or the last label
        r_b = tl.where(k == 0, tl.where(o_j == L, 0.0, neg()).to(tl.float64), r_b)
        r_l = tl.where(k == 0, tl.where(o_j == L - 1, 0.0, neg()).to(tl.float64), r_l)
        b_b = tl.where(m_b, r_b + e_b, neg())
        b_l = tl.where(m_l, r_l + e_l, neg())
        # gamma_t(s) = alpha_t(s) beta_t(s) / p, alpha taken before the frame's emission; the blank's total
        # occupancy is 1 - sum of the labels' (the grad kernel takes it so), so no reduction is needed here
        occ = tl.exp2((al_l + b_l - logp).to(tl.float32))
        tl.store(p_lp + t * W + 1 + o_j, occ, mask=m_l)


@triton.jit
def _finish(logp, loss_ptr, logp_ptr, out_ptr, w_ptr, meta_ptr, N, i_n, ZERO_INFINITY: tl.constexpr,
            REDUCE: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """Stores sample i_n's log2 p and loss; with REDUCE, the last sample to finish sums the weighted losses."""
    tl.store(logp_ptr + i_n, logp)
    loss = -logp * ln2()
    if ZERO_INFINITY:
        loss = tl.where(loss == float("inf"), 0.0, loss)
    tl.store(loss_ptr + i_n, loss.to(tl.float32))
    if REDUCE:
        # the last program to finish sums the losses in a fixed order (deterministic, no float atomics); the
        # counter was zeroed by _ctc_prepare_kernel, and the atomic orders this program's loss store before it
        done = tl.atomic_add(meta_ptr + _row_counter() * N, 1, sem="acq_rel")
        if done == N - 1:
            o_n = tl.arange(0, BLOCK_N)
            acc = tl.zeros([BLOCK_N], tl.float64)
            for n0 in range(0, N, BLOCK_N):
                m_n = n0 + o_n < N
                b_loss = tl.load(loss_ptr + n0 + o_n, mask=m_n, other=0.0, cache_modifier=".cg")
                b_w = tl.load(w_ptr + n0 + o_n, mask=m_n, other=0.0)
                acc += b_loss.to(tl.float64) * b_w.to(tl.float64)
            tl.store(out_ptr, tl.sum(acc, axis=0).to(tl.float32))


@triton.jit
def _recursions(
    lp_ptr, alpha_ptr, loss_ptr, logp_ptr, out_ptr, w_ptr, tgt_ptr, meta_ptr, N, T, i_n,
    NEED_GRAD: tl.constexpr, ZERO_INFINITY: tl.constexpr, REDUCE: tl.constexpr, PARTS: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Sample i_n's alpha pass (loss, log p, and with REDUCE the batch reduction by the last program) and/or
    its beta pass (occupancies), as PARTS says."""
    T_n, L, L_c, p_lp, p_al, o_j, can_skip = _recursion_setup(lp_ptr, alpha_ptr, tgt_ptr, meta_ptr, N, i_n, BLOCK)
    if PARTS & 1:
        logp = _alpha(p_lp, p_al, T, T_n, L, L_c, o_j, can_skip, STORE_ALPHA=NEED_GRAD)
        _finish(logp, loss_ptr, logp_ptr, out_ptr, w_ptr, meta_ptr, N, i_n, ZERO_INFINITY, REDUCE, BLOCK_N)
    else:
        logp = tl.load(logp_ptr + i_n)
    if PARTS & 2:
        if PARTS & 1:
            # the alpha table written above is read back by other threads of this program
            tl.debug_barrier()
        _beta(p_lp, p_al, logp, T, T_n, L, L_c, o_j, can_skip)


@triton.jit
def _ctc_recursion_kernel(
    lp_ptr,  # packed emissions (log2) in; with NEED_GRAD label occupancies out, in place
    alpha_ptr,  # packed float64 scratch: per frame, the L label states before the frame's emission
    loss_ptr,  # [N] float32 out: per-sample losses
    logp_ptr,  # [N] float64 out: log2 p(labels | input)
    out_ptr,  # [] float32 out with REDUCE: sum over samples of loss * weight
    w_ptr,  # [N] float32 weights of the reduction (from _ctc_prepare_kernel)
    tgt_ptr, meta_ptr,
    N, T,
    NEED_GRAD: tl.constexpr, ZERO_INFINITY: tl.constexpr, REDUCE: tl.constexpr,
    PARTS: tl.constexpr,  # 1: alpha (+ reduction), 2: beta (log p from logp_ptr), 3: both
    BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    i_n = tl.program_id(0).to(tl.int64)
    _recursions(lp_ptr, alpha_ptr, loss_ptr, logp_ptr, out_ptr, w_ptr, tgt_ptr, meta_ptr, N, T, i_n,
                NEED_GRAD, ZERO_INFINITY, REDUCE, PARTS, BLOCK, BLOCK_N)  # fmt: skip


@triton.jit
def _ctc_small_forward_kernel(
    x_ptr,  # [T, N, C] activations (any strides), C <= BLOCK_C
    lse_ptr,  # [N, T] float32 out (IS_LOGITS)
    lp_ptr, alpha_ptr, loss_ptr, logp_ptr, out_ptr, w_ptr, tgt_ptr, meta_ptr,
    N, T, C, stride_t, stride_n, stride_c, blank,
    IS_LOGITS: tl.constexpr, NEED_GRAD: tl.constexpr, ZERO_INFINITY: tl.constexpr, REDUCE: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_L: tl.constexpr,
):  # fmt: skip
    """Emission pass and recursions of one sample in one program, for small problems (few classes), where a
    launch costs more host time than the grid-wide emission pass saves: frames are taken BLOCK_T at a time
    as [BLOCK_T, BLOCK_C] tiles, so the sample's emissions cost T / BLOCK_T dependent steps."""
    i_n = tl.program_id(0).to(tl.int64)
    T_n = tl.load(meta_ptr + _row_t() * N + i_n)
    L = tl.load(meta_ptr + _row_l() * N + i_n)
    tgt_base = tl.load(meta_ptr + _row_tgt() * N + i_n)
    p_lp = lp_ptr + tl.load(meta_ptr + _row_lp() * N + i_n)
    o_t = tl.arange(0, BLOCK_T)
    o_c = tl.arange(0, BLOCK_C)
    o_l = tl.arange(0, BLOCK_L)
    for t0 in range(0, T_n, BLOCK_T):
        t = t0 + o_t
        m_t = t < T_n
        p_x = x_ptr + t.to(tl.int64) * stride_t + i_n * stride_n
        lse = tl.zeros([BLOCK_T], tl.float32)
        if IS_LOGITS:
            m_tc = m_t[:, None] & (o_c[None, :] < C)
            b_x = tl.load(p_x[:, None] + o_c[None, :] * stride_c, mask=m_tc, other=float("-inf"))
            b_x = b_x.to(tl.float32) * log2e()
            b_m = tl.max(b_x, axis=1)
            b_m = tl.where(b_m == float("-inf"), 0.0, b_m)
            lse = (b_m + tl.log2(tl.sum(tl.exp2(b_x - b_m[:, None]), axis=1))) * ln2()
            tl.store(lse_ptr + i_n * T + t, lse, mask=m_t)
        p_row = p_lp + t * (L + 1)
        x_blank = tl.load(p_x + blank * stride_c, mask=m_t, other=0.0).to(tl.float32)
        tl.store(p_row, (x_blank - lse) * log2e(), mask=m_t)
        for j0 in range(0, L, BLOCK_L):
            m_l = j0 + o_l < L
            lab = tl.load(tgt_ptr + tgt_base + j0 + o_l, mask=m_l, other=0).to(tl.int64)
            lab = tl.minimum(tl.maximum(lab, 0), C - 1)
            m_tl = m_t[:, None] & m_l[None, :]
            b_e = tl.load(p_x[:, None] + lab[None, :] * stride_c, mask=m_tl, other=0.0).to(tl.float32)
            tl.store(p_row[:, None] + 1 + j0 + o_l[None, :], (b_e - lse[:, None]) * log2e(), mask=m_tl)
    # the table written above is read by other threads of this program
    tl.debug_barrier()
    _recursions(lp_ptr, alpha_ptr, loss_ptr, logp_ptr, out_ptr, w_ptr, tgt_ptr, meta_ptr, N, T, i_n,
                NEED_GRAD, ZERO_INFINITY, REDUCE, 3 if NEED_GRAD else 1, BLOCK, BLOCK_N)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# the wavefront: one sample's label states split across programs (long label sequences in small batches)


@triton.jit
def _tile(p, t, m_t, W, ju, m_lane):
    """[BLOCK, F] values p[t * W + ju] of frames t (0 where masked). ``ju`` is the lanes' offsets times a run-time 1,
    so that no dimension of the addresses is known to be contiguous: the layout then puts lanes first (each
    thread holds its lanes' F frames, and ``frame`` takes one from registers)."""
    return tl.load(p + t.to(tl.int64)[None, :] * W + ju[:, None], mask=m_lane[:, None] & m_t[None, :], other=0.0)


@triton.jit
def _wave_alpha(p_lp, p_al, bnd_ptr, prog_ptr, nan_ptr, slot, i_p, T, T_n, L, L_c, j, o, o_f, ju, m_b, m_l, can_skip,
                has_right, unit, STORE_ALPHA: tl.constexpr, BLOCK: tl.constexpr, F: tl.constexpr):  # fmt: skip
    """``_alpha`` over this program's lanes, label j0 - 1's state at each frame taken from the left neighbour;
    publishes its last label's state every frame and releases them every F frames. Returns the last state
    vectors and the NaN reads of this program and those to its left (exact for the program holding lane L)."""
    W = L + 1
    n_steps = tl.where(L_c <= T, T_n, 0).to(tl.int32)
    i_prev = tl.maximum(o - 1, 0)
    zero_j = ju * 0
    # a virtual frame -1 where only the first blank is possible: frame 0 then gives _alpha's start (paths begin in
    # the first blank or the first label) with no select in the loop; states that stay impossible hold values at or
    # below neg(), which read as zero probability everywhere
    a_b = tl.where(j == 0, 0.0, neg()).to(tl.float64)
    a_l = tl.full([BLOCK], neg(), tl.float64)
    fin_b = a_b
    fin_l = a_l
    bad = tl.zeros([BLOCK, F], tl.int32)
    left_nan = tl.zeros([], tl.int32)
    no_left = tl.full([BLOCK, F], neg(), tl.float64).to(tl.int64, bitcast=True)
    t_nx = o_f
    e_l_nx = _tile(p_lp + 1, t_nx, t_nx < n_steps, W, ju, m_l)
    e_b_nx = _tile(p_lp, t_nx, t_nx < n_steps, W, zero_j, m_b)
    for t0 in range(0, n_steps, F):
        e_l_t = e_l_nx
        e_b_t = e_b_nx
        t_nx = t0 + F + o_f
        e_l_nx = _tile(p_lp + 1, t_nx, t_nx < n_steps, W, ju, m_l)
        e_b_nx = _tile(p_lp, t_nx, t_nx < n_steps, W, zero_j, m_b)
        # NaN is counted apart: the maximum that clamps the emissions would drop it
        bad |= ((e_l_t != e_l_t) | (e_b_t != e_b_t)).to(tl.int32)
        e_l_t = e_l_t.to(tl.int32, bitcast=True)
        e_b_t = e_b_t.to(tl.int32, bitcast=True)
        left = no_left
        if i_p > 0:
            # the left neighbour's last label state at frames t0 - 1 .. t0 + F - 2, once it has released them
            wait_counter(prog_ptr + slot - 1, tl.minimum(t0 + F, n_steps))
            tf = t0 - 1 + o_f
            m_f = (o == 0)[:, None] & (tf >= 0)[None, :]
            p_f = bnd_ptr + (slot - 1) * T + zero_j[:, None] + tf[None, :] * unit
            left = tl.load(p_f, mask=m_f, other=neg(), cache_modifier=".cg").to(tl.int64, bitcast=True)
            if t0 + F >= n_steps:  # released with its last frames
                left_nan = tl.load(nan_ptr + slot - 1, cache_modifier=".cg")
        for i in tl.static_range(F):
            t = t0 + i
            e_l = tl.maximum(frame(e_l_t, o_f, i).to(tl.float32, bitcast=True), neg()).to(tl.float64)
            e_b = tl.maximum(frame(e_b_t, o_f, i).to(tl.float32, bitcast=True), neg()).to(tl.float64)
            a_l_prev = tl.where(o == 0, frame(left, o_f, i).to(tl.float64, bitcast=True), tl.gather(a_l, i_prev, 0))
            n_b = tl.where(m_b, lae(a_b, a_l_prev), neg())
            n_l = tl.where(m_l, lae(a_l, tl.where(can_skip, n_b, a_b)), neg())
            # frames past n_steps (the last tile's tail) run on zeros and are neither stored nor published
            live = t < n_steps
            if STORE_ALPHA:
                tl.store(p_al + t * L + j, n_l, mask=tl.where(live, m_l, False))
            a_b = n_b + e_b
            a_l = n_l + e_l
            last = t == n_steps - 1
            fin_b = tl.where(last, a_b, fin_b)
            fin_l = tl.where(last, a_l, fin_l)
            if has_right:
                tl.store(bnd_ptr + slot * T + t + zero_j, a_l, mask=tl.where(live, o == BLOCK - 1, False))
        if has_right:
            if t0 + F >= n_steps:
                tl.store(nan_ptr + slot, tl.max(tl.max(bad, axis=1), axis=0) | left_nan)
            # every thread's stores above are ordered before the release
            tl.debug_barrier()
            tl.atomic_xchg(prog_ptr + slot, tl.minimum(t0 + F, n_steps), sem="release")
    return fin_b, fin_l, tl.max(tl.max(bad, axis=1), axis=0) | left_nan


@triton.jit
def _wave_beta(p_lp, p_al, bnd_ptr, prog_ptr, slot, i_p, logp, T, T_n, L, L_c, j, o, o_f, ju, m_b, m_l, can_skip,
               has_right, unit, BLOCK: tl.constexpr, F: tl.constexpr):  # fmt: skip
    """``_beta`` over this program's lanes, what label j0 + BLOCK - 1 receives from the right taken from the right
    neighbour; publishes what its first lane passes left every frame and releases it every F frames."""
    W = L + 1
    n_steps = tl.where((L_c <= T) & (logp != float("-inf")), T_n, 0).to(tl.int32)
    i_next = tl.minimum(o + 1, BLOCK - 1)
    zero_j = ju * 0
    # a virtual step -1 where only the last blank is possible: step 0 then gives _beta's end (paths end in the last
    # blank or the last label) with no select in the loop
    b_b = tl.where(j == L, 0.0, neg()).to(tl.float64)
    b_l = tl.full([BLOCK], neg(), tl.float64)
    r_b = lae(b_b, b_l)
    # what the right neighbour's first lane passes at step -1: 0 if it holds only the last blank
    right_start = tl.where(L == (i_p + 1) * BLOCK, 0.0, neg()).to(tl.float64)
    no_right = tl.full([BLOCK, F], neg(), tl.float64).to(tl.int64, bitcast=True)
    # step k is frame n_steps - 1 - k
    t_nx = n_steps - 1 - o_f
    e_l_nx = _tile(p_lp + 1, t_nx, t_nx >= 0, W, ju, m_l)
    e_b_nx = _tile(p_lp, t_nx, t_nx >= 0, W, zero_j, m_b)
    al_nx = _tile(p_al, t_nx, t_nx >= 0, L, ju, m_l)
    for k0 in range(0, n_steps, F):
        e_l_t = e_l_nx.to(tl.int32, bitcast=True)
        e_b_t = e_b_nx.to(tl.int32, bitcast=True)
        al_t = al_nx.to(tl.int64, bitcast=True)
        t_nx = n_steps - 1 - (k0 + F + o_f)
        e_l_nx = _tile(p_lp + 1, t_nx, t_nx >= 0, W, ju, m_l)
        e_b_nx = _tile(p_lp, t_nx, t_nx >= 0, W, zero_j, m_b)
        al_nx = _tile(p_al, t_nx, t_nx >= 0, L, ju, m_l)
        right = no_right
        if has_right:
            # what the right neighbour's first lane passed at steps k0 - 1 .. k0 + F - 2
            wait_counter(prog_ptr + slot + 1, tl.minimum(k0 + F, n_steps))
            kf = k0 - 1 + o_f
            m_f = (o == BLOCK - 1)[:, None] & (kf >= 0)[None, :]
            p_f = bnd_ptr + (slot + 1) * T + zero_j[:, None] + kf[None, :] * unit
            right = tl.load(p_f, mask=m_f, other=right_start, cache_modifier=".cg").to(tl.int64, bitcast=True)
        for i in tl.static_range(F):
            k = k0 + i
            t = n_steps - 1 - k
            e_l = tl.maximum(frame(e_l_t, o_f, i).to(tl.float32, bitcast=True), neg()).to(tl.float64)
            e_b = tl.maximum(frame(e_b_t, o_f, i).to(tl.float32, bitcast=True), neg()).to(tl.float64)
            al_l = tl.where(m_l, frame(al_t, o_f, i).to(tl.float64, bitcast=True), neg())
            passed = tl.gather(tl.where(can_skip, r_b, b_b), i_next, 0)
            r_next = tl.where(o == BLOCK - 1, frame(right, o_f, i).to(tl.float64, bitcast=True), passed)
            r_l = lae(b_l, tl.where(j + 1 <= L, r_next, neg()))
            # steps past n_steps (the last tile's tail) run on zeros and are neither stored nor published
            live = k < n_steps
            b_b = tl.where(m_b, r_b + e_b, neg())
            b_l = tl.where(m_l, r_l + e_l, neg())
            occ = tl.exp2((al_l + b_l - logp).to(tl.float32))
            tl.store(p_lp + t * W + 1 + j, occ, mask=tl.where(live, m_l, False))
            r_b = lae(b_b, b_l)
            if i_p > 0:
                tl.store(
                    bnd_ptr + slot * T + k + zero_j, tl.where(can_skip, r_b, b_b), mask=tl.where(live, o == 0, False)
                )
        if i_p > 0:
            tl.debug_barrier()
            tl.atomic_xchg(prog_ptr + slot, tl.minimum(k0 + F, n_steps), sem="release")


# the sizes vary from call to call (no variant per shape); ``unit`` must stay a run-time 1 (see _tile)
WAVE_SIZES = ["N", "T", "P", "unit"]


@triton.jit(do_not_specialize=WAVE_SIZES)
def _ctc_wave_kernel(
    lp_ptr, alpha_ptr, loss_ptr, logp_ptr, out_ptr, w_ptr, tgt_ptr, meta_ptr,
    bnd_ptr,  # [N * P, T] float64: each program's boundary value per frame (or step), for its neighbour
    prog_ptr,  # [N * P + 1] int32, zeroed: frames (steps) each program has released, then the ticket counter
    nan_ptr,  # [N * P] int32 (alpha): 1 if this program or one to its left read a NaN emission
    N, T, P, unit,
    BETA: tl.constexpr,  # False: alpha (loss, log p, reduction); True: beta (occupancies)
    STORE_ALPHA: tl.constexpr, ZERO_INFINITY: tl.constexpr, REDUCE: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, F: tl.constexpr,
):  # fmt: skip
    """One pass of the recursions with each sample's lanes split across P programs of BLOCK lanes."""
    # programs take their places in the order they start, so that a program only ever waits on one that is
    # running: alpha's run left to right, beta's right to left
    ticket = tl.atomic_add(prog_ptr + N * P, 1)
    i_n = (ticket // P).to(tl.int64)
    i_p = ticket % P
    if BETA:
        i_p = P - 1 - i_p
    slot = i_n * P + i_p
    T_n = tl.load(meta_ptr + _row_t() * N + i_n)
    L = tl.load(meta_ptr + _row_l() * N + i_n)
    L_c = tl.load(meta_ptr + _row_lc() * N + i_n)
    j0 = i_p * BLOCK
    if j0 <= L:
        tgt_base = tl.load(meta_ptr + _row_tgt() * N + i_n)
        p_lp = lp_ptr + tl.load(meta_ptr + _row_lp() * N + i_n)
        p_al = alpha_ptr + tl.load(meta_ptr + _row_alpha() * N + i_n)
        o = tl.arange(0, BLOCK)
        o_f = tl.arange(0, F)
        j = j0 + o
        ju = j.to(tl.int64) * unit
        m_b = j <= L
        m_l = j < L
        lab = tl.load(tgt_ptr + tgt_base + j, mask=m_l, other=-1)
        lab_prev = tl.load(tgt_ptr + tgt_base + j - 1, mask=m_l & (j > 0), other=-1)
        can_skip = m_l & (j > 0) & (lab != lab_prev)
        has_right = L >= j0 + BLOCK  # a program to the right holds lanes
        if BETA:
            logp = tl.load(logp_ptr + i_n)
            _wave_beta(p_lp, p_al, bnd_ptr, prog_ptr, slot, i_p, logp, T, T_n, L, L_c, j, o, o_f, ju, m_b, m_l,
                       can_skip, has_right, unit, BLOCK, F)  # fmt: skip
        else:
            a_b, a_l, nan = _wave_alpha(p_lp, p_al, bnd_ptr, prog_ptr, nan_ptr, slot, i_p, T, T_n, L, L_c, j, o, o_f,
                                        ju, m_b, m_l, can_skip, has_right, unit, STORE_ALPHA, BLOCK, F)  # fmt: skip
            if not has_right:
                # lane L (the last blank) is this program's; label L - 1 is too, or is its left neighbour's last
                a_last = tl.where(L > j0, _pick(a_l, o, L - 1 - j0), neg())
                n_steps = tl.where(L_c <= T, T_n, 0)
                if (L == j0) & (L > 0) & (n_steps > 0):
                    a_last = tl.load(bnd_ptr + (slot - 1) * T + n_steps - 1, cache_modifier=".cg")
                logp = lae(_pick(a_b, o, L - j0), a_last)
                logp = tl.where(logp < 0.5 * neg(), float("-inf"), logp)
                logp = tl.where(nan > 0, float("nan"), logp)
                logp = tl.where(T_n == 0, tl.where(L_c == 0, 0.0, float("-inf")), logp)
                logp = tl.where(L_c <= T, logp, float("-inf"))
                _finish(logp, loss_ptr, logp_ptr, out_ptr, w_ptr, meta_ptr, N, i_n, ZERO_INFINITY, REDUCE, BLOCK_N)


@triton.jit
def _ctc_grad_kernel(
    x_ptr,  # [T, N, C] activations
    grad_ptr,  # [T, N, C] out
    lse_ptr,  # [N, T] float32 (IS_LOGITS)
    occ_ptr,  # packed label occupancies from _ctc_recursion_kernel
    logp_ptr,  # [N] float64 log2 p from _ctc_recursion_kernel
    gloss_ptr,  # upstream gradient: [N] of each sample's loss (any float dtype and stride), or [] of the reduction
    gloss_stride,
    w_ptr,  # [N] float32 weights of the reduction (REDUCED)
    srt_ptr,  # sorted (class << 32 | position) keys from _ctc_prepare_kernel
    meta_ptr,
    N, T, C, stride_t, stride_n, stride_c, gstride_t, gstride_n, gstride_c, blank,
    IS_LOGITS: tl.constexpr, REDUCED: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    i_r = tl.program_id(0).to(tl.int64)
    i_t = i_r // N
    i_n = i_r % N
    T_n = tl.load(meta_ptr + _row_t() * N + i_n)
    L = tl.load(meta_ptr + _row_l() * N + i_n)
    L_c = tl.load(meta_ptr + _row_lc() * N + i_n)
    logp = tl.load(logp_ptr + i_n)
    active = (i_t < T_n) & (L_c <= T) & (logp != float("-inf"))
    # (logp - logp) is NaN for a NaN loss: then the sample's whole gradient is NaN, as through log_softmax
    g = tl.load(gloss_ptr + i_n * gloss_stride).to(tl.float32) + tl.where(active, logp - logp, 0.0).to(tl.float32)
    if REDUCED:
        g = g * tl.load(w_ptr + i_n)
    p_x = x_ptr + i_t * stride_t + i_n * stride_n
    p_g = grad_ptr + i_t * gstride_t + i_n * gstride_n
    lse = 0.0
    if IS_LOGITS:
        lse = tl.load(lse_ptr + i_n * T + i_t, mask=active, other=0.0)
    o_c = tl.arange(0, BLOCK_C)
    for c0 in range(0, C, BLOCK_C):
        m_c = c0 + o_c < C
        if IS_LOGITS:
            b_x = tl.load(p_x + (c0 + o_c) * stride_c, mask=tl.where(active, m_c, False), other=0.0).to(tl.float32)
            b_g = tl.where(active, g * tl.exp2((b_x - lse) * log2e()), 0.0)
        else:
            b_g = tl.zeros([BLOCK_C], tl.float32)
        tl.store(p_g + (c0 + o_c) * gstride_c, b_g.to(grad_ptr.dtype.element_ty), mask=m_c)
    if active:
        # the rows above were written by other threads of this program: order them before the corrections
        tl.debug_barrier()
        p_occ = occ_ptr + tl.load(meta_ptr + _row_lp() * N + i_n) + i_t * (L + 1)
        srt_base = tl.load(meta_ptr + _row_tgt() * N + i_n)
        o_k = tl.arange(0, BLOCK_K)
        carry = 0.0
        occ_labels = 0.0
        for k0 in range(0, L, BLOCK_K):
            m_k = k0 + o_k < L
            key = tl.load(srt_ptr + srt_base + k0 + o_k, mask=m_k, other=-1)
            key_prev = tl.load(srt_ptr + srt_base + k0 + o_k - 1, mask=m_k & (k0 + o_k > 0), other=-1)
            key_next = tl.load(srt_ptr + srt_base + k0 + o_k + 1, mask=k0 + o_k + 1 < L, other=-1)
            cls = key >> 32
            pos = key & 0xFFFFFFFF
            occ = tl.load(p_occ + 1 + pos, mask=m_k, other=0.0)
            start = cls != (key_prev >> 32)
            seg, seen = tl.associative_scan((occ, start), 0, _seg_add)
            # positions before the chunk's first segment start continue the previous chunk's last segment
            seg = tl.where(seen, seg, seg + carry)
            carry = _pick(seg, o_k, tl.minimum(L - k0, BLOCK_K) - 1)
            end = m_k & (cls != (key_next >> 32))
            b_p = tl.zeros([BLOCK_K], tl.float32)
            if IS_LOGITS:
                b_x = tl.load(p_x + cls * stride_c, mask=end, other=0.0).to(tl.float32)
                b_p = tl.exp2((b_x - lse) * log2e())
            tl.store(p_g + cls * gstride_c, (g * (b_p - seg)).to(grad_ptr.dtype.element_ty), mask=end)
            occ_labels += tl.sum(occ, axis=0)
        # every path is in exactly one state at each frame: the blank's occupancy is the rest
        p_b = 0.0
        if IS_LOGITS:
            p_b = tl.exp2((tl.load(p_x + blank * stride_c).to(tl.float32) - lse) * log2e())
        tl.store(p_g + blank * gstride_c, (g * (p_b - (1.0 - occ_labels))).to(grad_ptr.dtype.element_ty))


# ---------------------------------------------------------------------------------------------------------------
# launchers


def _recursion_warps(block: int) -> int:
    # measured on the H100 (benchmarks/notes/ctc.md): one warp per 64 states, up to 32: few warps for short label
    # sequences, where the per-step exchange between warps dominates; up to 32 for long ones, where the
    # arithmetic per step does
    return min(32, max(1, block // 64))


SMALL_BLOCK_T = 32
SMALL_BLOCK_L = 64


def use_small_forward(T: int, C: int, block: int) -> bool:
    """Whether one program per sample computes its own emissions: for few classes and few (frame tile, label
    chunk) steps, where the launch it saves costs more host time than the serial tiles cost GPU time."""
    tiles = -(-T // SMALL_BLOCK_T) * -(-block // SMALL_BLOCK_L)
    return C <= 256 and tiles <= 32


WAVE_F = 16  # frames per tile, and released per wavefront step
WAVE_BLOCK = (128, 4)  # lanes and warps per program of the wavefront (one lane per thread)


def wave_shape(N: int, lanes: int, sms: int) -> tuple[int, int] | None:
    """(lanes, warps) per program of the wavefront for N samples of up to ``lanes`` lanes (L + 1) on a GPU of
    ``sms`` multiprocessors, or None where one program per sample is as fast.

    Measured on the H100 (benchmarks/notes/ctc.md, tune_ctc.py --wave): with one lane per thread a step costs about
    the same at 32 to 256 lanes per program, and half what two lanes per thread cost; the wavefront wins from
    about 300 lanes (L = 300, N = 1: 0.84 -> 0.74 ms of recursions; L up to 1500: 3.2 -> 1.0 ms at N = 1, 2.3 ms
    at N = 64) until the programs no longer run at once (N = 128, L up to 1500: 1536 programs, 3.2 -> 4.3 ms)."""
    block, warps = WAVE_BLOCK
    if lanes <= 2 * block or N * cdiv(lanes, block) > 6 * sms:
        return None
    return block, warps


def state_block(T: int, targets: torch.Tensor, padded: bool) -> int:
    """Vector length of the recursions: room for the longest label sequence that can still align (L <= T)."""
    longest = targets.shape[1] if padded else targets.numel()
    return max(16, next_power_of_2(min(longest, T) + 1))


def table_sizes(T: int, N: int, targets: torch.Tensor, padded: bool) -> tuple[int, int]:
    """Upper bounds, from shapes alone, of the packed emission/occupancy table and the alpha table."""
    label_total = min(targets.numel(), N * T)
    return T * (label_total + N), T * label_total


REDUCTIONS = ("none", "sum", "mean")


def ctc_forward(
    x: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    padded: bool,
    logits: bool,
    need_grad: bool,
    validate: bool,
    zero_infinity: bool = False,
    reduction: str = "none",
    warps: int | None = None,
    split_recursion: bool = False,
    fuse_emission: bool | None = None,
    wave: tuple[int, int] | None | bool = True,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], list[int] | None]:
    """The loss, and with ``need_grad`` the occupancies for ``ctc_backward``.

    Args:
        x: [T, N, C] float32/float16/bfloat16, any strides.
        targets: padded [N, S] (contiguous) or concatenated 1-D, int32/int64, on x's device.
        input_lengths, target_lengths: [N] int64 on x's device.
        validate: check the lengths and labels (reads them back: one synchronisation, which also sizes the
            alpha table exactly; without it the table is sized from the shapes).
        reduction: "none" ([N] losses), "sum" or "mean" (a scalar, reduced on the device in a fixed order).
        warps, split_recursion, fuse_emission: the recursion kernel's num_warps, whether alpha and beta run as
            two launches, whether the emission pass runs inside the recursion kernel (``_ctc_small_forward_kernel``;
            default: for small problems, see ``use_small_forward``); for measurements and tests.
        wave: (lanes, warps) per program of the wavefront (``_ctc_wave_kernel``), None for one program per
            sample, True (default) for the choice of ``wave_shape``.

    Returns:
        The output (float32; infinite losses are 0 with ``zero_infinity``), the state ``ctc_backward`` takes
        (weights of the reduction [N], log2 p [N] float64, lse [N, T] (empty unless logits), occupancy table,
        meta, sorted label keys), and None when the lengths and labels are valid (or not validated), else each
        sample's error bits (1 its input length, 2 its target length, 4 a label outside [0, C), 8 a label equal to
        the blank; no loss computed).
    """
    T, N, C = x.shape
    dev = x.device
    S = targets.shape[1] if padded else targets.numel()
    block = state_block(T, targets, padded)
    lp_size, alpha_size = table_sizes(T, N, targets, padded)
    reduce = REDUCTIONS.index(reduction)
    meta = kernel_output(META_ROWS * N + 1, dtype=torch.int64, device=dev)
    srt = kernel_output(targets.numel(), dtype=torch.int64, device=dev)
    weights = kernel_output(N, dtype=torch.float32, device=dev)
    lse = kernel_output((N, T) if logits else (0,), dtype=torch.float32, device=dev)
    table = kernel_output(lp_size, dtype=torch.float32, device=dev)
    warps = warps or _recursion_warps(block)
    block_n = max(16, next_power_of_2(N))
    launch(_ctc_prepare_kernel)[(N,)](
        input_lengths,
        target_lengths,
        targets,
        meta,
        srt,
        weights,
        N,
        T,
        S,
        C,
        blank,
        PADDED=padded,
        VALIDATE=validate,
        MEAN=reduce == 2,
        BLOCK_N=block_n,
        BLOCK=block,
        num_warps=warps,
    )
    if validate:  # one read of the device: the error bits, and the label counts that size the alpha table
        counts_and_errors = meta[N : 3 * N].tolist()  # rows _row_l, _row_err
        if any(counts_and_errors[N:]):
            return weights, (), counts_and_errors[N:]
        alpha_size = T * sum(counts_and_errors[:N])
        lanes = max(counts_and_errors[:N]) + 1
    else:
        lanes = min(S, T) + 1
    loss = kernel_output(N, dtype=torch.float32, device=dev)
    out = kernel_output((), dtype=torch.float32, device=dev) if reduce else loss
    alpha = kernel_output(alpha_size if need_grad else 0, dtype=torch.float64, device=dev)
    logp = kernel_output(N, dtype=torch.float64, device=dev)
    if fuse_emission is None:
        fuse_emission = use_small_forward(T, C, block)
    common = dict(ZERO_INFINITY=zero_infinity, REDUCE=reduce != 0, BLOCK=block, BLOCK_N=min(block_n, 1024))
    emission_args = (targets, meta, N, T, C, *x.stride(), blank)  # the emission pass's, after x and its outputs
    recursion_args = (alpha, loss, logp, out, weights)  # the recursions', after the emission table
    if fuse_emission:
        block_c = max(2, next_power_of_2(C))
        launch(_ctc_small_forward_kernel)[(N,)](
            x,
            lse,
            table,
            *recursion_args,
            *emission_args,
            IS_LOGITS=logits,
            NEED_GRAD=need_grad,
            **common,
            BLOCK_C=block_c,
            BLOCK_T=max(1, min(SMALL_BLOCK_T, 4096 // block_c)),
            BLOCK_L=SMALL_BLOCK_L,
            num_warps=warps,
        )
        return out, (weights, logp, lse, table, meta, srt), None
    block_c = min(next_power_of_2(C), 2048)
    launch(_ctc_emission_kernel)[(T * N,)](
        x,
        lse,
        table,
        *emission_args,
        IS_LOGITS=logits,
        BLOCK_C=block_c,
        BLOCK_L=min(block, 256),
        num_warps=4 if block_c >= 512 else 1,
    )
    if wave is True:
        wave = wave_shape(N, lanes, _multiprocessors(dev))
    if wave is not None:
        wave_block, wave_warps = wave
        P = cdiv(lanes, wave_block)
        bnd = torch.empty(N * P * T, dtype=torch.float64, device=dev)
        prog = torch.zeros(2 * (N * P + 1), dtype=torch.int32, device=dev)  # alpha's counters, then beta's
        nan = torch.empty(N * P, dtype=torch.int32, device=dev)
        args = (table, *recursion_args, targets, meta, bnd)
        common.update(BLOCK=wave_block, F=WAVE_F, STORE_ALPHA=need_grad, num_warps=wave_warps)
        launch(_ctc_wave_kernel)[(N * P,)](*args, prog, nan, N, T, P, 1, BETA=False, **common)
        if need_grad:
            launch(_ctc_wave_kernel)[(N * P,)](*args, prog[N * P + 1 :], nan, N, T, P, 1, BETA=True, **common)
        return out, (weights, logp, lse, table, meta, srt), None
    args = (table, *recursion_args, targets, meta, N, T)
    parts = 3 if need_grad and not split_recursion else 1
    launch(_ctc_recursion_kernel)[(N,)](*args, NEED_GRAD=need_grad, PARTS=parts, **common, num_warps=warps)
    if need_grad and parts == 1:
        launch(_ctc_recursion_kernel)[(N,)](*args, NEED_GRAD=True, PARTS=2, **common, num_warps=warps)
    return out, (weights, logp, lse, table, meta, srt), None


@functools.cache
def _multiprocessors(dev: torch.device) -> int:
    return torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 1


def ctc_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weights: torch.Tensor,
    logp: torch.Tensor,
    lse: torch.Tensor,
    table: torch.Tensor,
    meta: torch.Tensor,
    srt: torch.Tensor,
    blank: int,
    logits: bool,
    block_c: int | None = None,
    warps: int | None = None,
    block_k: int | None = None,
) -> torch.Tensor:
    """Gradient of the output with respect to x, given its upstream gradient ``grad_out`` ([N] for
    reduction="none", else a scalar): [T, N, C] in x's dtype and layout. ``block_c``, ``warps``, ``block_k``:
    the row block, num_warps and label block (default: chosen from the sizes; for measurements)."""
    T, N, C = x.shape
    grad = kernel_output_like(x)
    reduced = grad_out.dim() == 0
    # measured on the H100 (benchmarks/notes/ctc.md): wide rows want 8 warps; long label sequences a label block of
    # 256 when there are 4 warps or more to scan it (one warp scans 64 faster)
    block_c = block_c or min(next_power_of_2(C), 4096)
    warps = warps or (8 if block_c >= 2048 else 4 if block_c >= 512 else 1)
    block_k = block_k or (256 if warps >= 4 and srt.numel() > 256 * N else 64)
    launch(_ctc_grad_kernel)[(T * N,)](
        x,
        grad,
        lse,
        table,
        logp,
        grad_out,
        0 if reduced else grad_out.stride(0),
        weights,
        srt,
        meta,
        N,
        T,
        C,
        *x.stride(),
        *grad.stride(),
        blank,
        IS_LOGITS=logits,
        REDUCED=reduced,
        BLOCK_C=block_c,
        BLOCK_K=block_k,
        num_warps=warps,
    )
    return grad
