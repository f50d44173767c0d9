"""CTC forced alignment (Viterbi) kernels in Triton.

The lattice is CTC's: for labels y_0 .. y_{L-1}, state 2j is the blank before label j (j = 0 .. L) and state
2j+1 is label j; lane j holds both. The score of the best path to each state,

    alpha_t(2j)   = max(alpha_{t-1}(2j), alpha_{t-1}(2j-1)) + lp_t(blank)
    alpha_t(2j+1) = max(alpha_{t-1}(2j+1), alpha_{t-1}(2j), alpha_{t-1}(2j-1) if y_j != y_{j-1}) + lp_t(y_j),

starts from a virtual frame -1 where only state 0 scores 0 (so frame 0 holds the first blank's and the first
label's log-probabilities, added to 0) and is accumulated in float32 in exactly this order, as torchaudio's CPU
forced_align accumulates it: the two agree bit for bit. Ties keep the nearest predecessor (staying, then the
state before, then the skip).

No backpointer is kept for the whole input (T * (2L+1) of them are gigabytes for an hour of audio). Two launches:

1. ``_align_forward_kernel``: the recursion, one program per BLOCK lanes of a sample. A long label sequence is
   split across programs as a wavefront: a program needs only its left neighbour's last label state, which the
   neighbour stores every frame and releases every F frames (a counter in global memory; programs are dispatched
   in order, so a program only ever waits on one that has started). Each state also carries its origin: the
   state, at the latest anchor frame (every K frames), that its best path passes through. At each anchor the
   program writes its states' scores and origins (as distances, int16) and restarts the origins; at the sample's
   last frame the same (the final row). Memory: (T / K) * (L + 1) * 12 bytes, plus 8 bytes per frame for each
   program's published state.
2. ``_align_fill_kernel``, one program per sample and segment of K frames: follows the origins from the final
   state back to its segment (at most T / K dependent loads), which gives the path's states at the segment's two
   ends; recomputes the segment's recursion from its anchor's scores over only the states between them (at most
   K + 1 lanes: a path advances at most two states a frame), keeping each frame's choices (one byte per lane, the
   segment's only); walks back through them; writes the tokens and their log-probabilities. Leaving out the
   states below the band lowers no score on the path: the path's states have their best predecessors inside it,
   so they get the forward's values bit for bit and the same choices.

Emissions: the forward reads the blank's and the labels' (F frames at a time, a chunk ahead); the fill reads the
band's again. The recursions are latency-bound (T dependent steps per program, plus F frames of wavefront delay
per program); the fill's segments run in parallel, so its time is that of one segment.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launch import cdiv, next_power_of_2
from .._outputs import kernel_output
from .._sync import frame, wait_counter

CHUNK = 16  # F: frames loaded per tile, and released per wavefront step
FILL_BLOCKS = (128, 256, 512)  # the fill's lanes; its segments are K = block - CHUNK frames (a multiple of F)
ANCHOR_BYTES = 384 << 20  # the shortest segment whose anchor rows fit in this is taken
# the forward's (lanes, warps) per program: the narrowest whose published states (8 bytes per program and frame)
# fit in BOUNDARY_BYTES; one warp exchanges neighbouring lanes by shuffles, more go through shared memory
FORWARD_BLOCKS = ((32, 1), (64, 2), (128, 4), (256, 8))
BOUNDARY_BYTES = 256 << 20


@triton.jit
def _tile(p_x, t0, T_n, cls, m_lane, o_f, stride_t, stride_c):
    """[BLOCK, F] float32 emissions at classes ``cls`` of frames t0 + o_f (-inf past T_n and off the lanes). Lanes
    come first: with no dimension contiguous, the layout's fastest dimension is the first, so each thread holds its
    lanes' F frames and ``frame`` takes one from registers."""
    t = t0 + o_f
    m = m_lane[:, None] & (t < T_n)[None, :]
    p = p_x + cls[:, None] * stride_c + t.to(tl.int64)[None, :] * stride_t
    return tl.load(p, mask=m, other=float("-inf")).to(tl.float32)


@triton.jit
def _sample(meta_ptr, N, i_n):
    """Sample i_n's frames, labels, first label's index in targets, and first lane in the W-wide rows (each sample
    has L + 1 lanes, so lane 0 is at the first label's index plus the samples before it)."""
    T_n = tl.load(meta_ptr + i_n)
    L = tl.load(meta_ptr + N + i_n)
    tgt_base = tl.load(meta_ptr + 2 * N + i_n)
    return T_n, L, tgt_base, tgt_base + i_n


@triton.jit
def _labels(tgt_ptr, tgt_base, j, L, C):
    """Label j (clamped to [0, C), as every path clamps unchecked labels) and whether label j may be entered from
    label j - 1 directly (the two differ)."""
    m_l = j < L
    lab = tl.load(tgt_ptr + tgt_base + j, mask=m_l, other=0).to(tl.int64)
    lab = tl.minimum(tl.maximum(lab, 0), C - 1)
    prev = tl.load(tgt_ptr + tgt_base + j - 1, mask=m_l & (j > 0), other=0).to(tl.int64)
    prev = tl.minimum(tl.maximum(prev, 0), C - 1)
    return lab, m_l & (j > 0) & (lab != prev)


@triton.jit
def _step(a_b, a_l, al_prev, e_b, e_l, can_skip, m_b, m_l):
    """One frame: the new blank and label scores, and the choices (blank: came from the label before; label: came
    from its blank; label: skipped from the label before). Strict comparisons keep the nearest predecessor on ties."""
    adv_b = al_prev > a_b
    n_b = tl.where(adv_b, al_prev, a_b) + e_b
    adv_l = a_b > a_l
    best = tl.where(adv_l, a_b, a_l)
    skip = can_skip & (al_prev > best)
    n_l = tl.where(skip, al_prev, best) + e_l
    n_b = tl.where(m_b, n_b, float("-inf"))
    n_l = tl.where(m_l, n_l, float("-inf"))
    return n_b, n_l, adv_b, adv_l, skip


@triton.jit
def _bad(tile):
    # NaN and +inf are not log-probabilities: a sample that reads one gets no path (NaN scores)
    return ((tile != tile) | (tile == float("inf"))).to(tl.int32)


# the sizes vary from call to call: specialising on them (== 1, multiples of 16) would compile a variant per shape
SIZES = ["N", "T", "W", "P", "K", "stride_n"]


@triton.jit(do_not_specialize=SIZES)
def _align_forward_kernel(
    x_ptr,  # [N, T, C] emissions (any strides)
    tgt_ptr,  # labels, int32/int64: padded rows or concatenated
    meta_ptr,  # [3, N] int64: frames T_n, labels L, index of the sample's first label in targets (each clamped)
    anc_a_ptr,  # [R, 2, W] float32 out: per row, every lane's blank and label scores
    anc_o_ptr,  # [R, 2, W] int16 out: their distances to their origins
    bnd_ptr,  # [N * P, T, 2] int32: each program's last label state per frame (score bits, origin), for its right
    # neighbour (interleaved, so that the neighbour's [BLOCK, F] loads of it get the emission tiles' layout)
    prog_ptr,  # [N * P] int32, zeroed: frames each program has released
    flag_ptr,  # [N * P] int32 out: 1 if the program read a NaN or +inf emission
    N, T, C, W, P, K, stride_n, stride_t, stride_c, blank,
    BLOCK: tl.constexpr, F: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    i_n = pid // P
    i_p = pid % P
    T_n, L, tgt_base, lane0 = _sample(meta_ptr, N, i_n)
    j0 = i_p * BLOCK
    o = tl.arange(0, BLOCK)
    o_f = tl.arange(0, F)
    j = j0 + o
    bad = tl.zeros([BLOCK, F], tl.int32)
    if j0 <= L:
        m_b = j <= L
        lab, can_skip = _labels(tgt_ptr, tgt_base, j, L, C)
        m_l = j < L
        cls_b = tl.zeros([BLOCK], tl.int64) + blank
        has_right = L >= j0 + BLOCK  # a program to the right reads this one's last label state
        p_x = x_ptr + i_n.to(tl.int64) * stride_n
        p_out = pid.to(tl.int64) * T
        p_in = p_out - T
        i_prev = tl.maximum(o - 1, 0)
        a_b = tl.where(j == 0, 0.0, float("-inf"))
        a_l = tl.full([BLOCK], float("-inf"), tl.float32)
        g_b = 2 * j
        g_l = 2 * j + 1
        e_l_nx = _tile(p_x, 0, T_n, lab, m_l, o_f, stride_t, stride_c)
        e_b_nx = _tile(p_x, 0, T_n, cls_b, m_b, o_f, stride_t, stride_c)
        for t0 in range(0, T_n, F):
            e_l_t = e_l_nx
            e_b_t = e_b_nx
            e_l_nx = _tile(p_x, t0 + F, T_n, lab, m_l, o_f, stride_t, stride_c)
            e_b_nx = _tile(p_x, t0 + F, T_n, cls_b, m_b, o_f, stride_t, stride_c)
            bad |= _bad(e_l_t) | _bad(e_b_t)
            e_l_t = e_l_t.to(tl.int32, bitcast=True)
            e_b_t = e_b_t.to(tl.int32, bitcast=True)
            if i_p > 0:
                # the left neighbour's label state at frames t0 - 1 .. t0 + F - 2, once it has released them
                need = tl.minimum(t0 + F, T_n)
                wait_counter(prog_ptr + pid - 1, need)
                tf = t0 - 1 + o_f
                m_f = (o == 0)[:, None] & (tf >= 0)[None, :]
                p_f = bnd_ptr + 2 * (p_in + o[:, None] * 0 + tf[None, :])
                # -8388608: the bits of float32 -inf (0xFF800000)
                left_a = tl.load(p_f, mask=m_f, other=-8388608, cache_modifier=".cg")
                left_o = tl.load(p_f + 1, mask=m_f, other=0, cache_modifier=".cg")
            else:
                left_a = tl.full([BLOCK, F], -8388608, tl.int32)
                left_o = tl.zeros([BLOCK, F], tl.int32)
            for i in tl.static_range(F):
                t = t0 + i
                e_l = frame(e_l_t, o_f, i).to(tl.float32, bitcast=True)
                e_b = frame(e_b_t, o_f, i).to(tl.float32, bitcast=True)
                al_prev = tl.where(
                    o == 0, frame(left_a, o_f, i).to(tl.float32, bitcast=True), tl.gather(a_l, i_prev, 0)
                )
                gl_prev = tl.where(o == 0, frame(left_o, o_f, i), tl.gather(g_l, i_prev, 0))
                a_b, a_l, adv_b, adv_l, skip = _step(a_b, a_l, al_prev, e_b, e_l, can_skip, m_b, m_l)
                n_gb = tl.where(adv_b, gl_prev, g_b)
                g_l = tl.where(skip, gl_prev, tl.where(adv_l, g_b, g_l))
                g_b = n_gb
                final = t == T_n - 1
                anchor = False
                if i == F - 1:  # K is a multiple of F: anchors fall on a chunk's last frame
                    anchor = ((t + 1) % K == 0) & (t + 1 < T_n)
                if final | anchor:
                    row = tl.where(final, 0, (t + 1) // K).to(tl.int64)
                    p_a = row * 2 * W + lane0 + j
                    tl.store(anc_a_ptr + p_a, a_b, mask=m_b)
                    tl.store(anc_a_ptr + p_a + W, a_l, mask=m_l)
                    tl.store(anc_o_ptr + p_a, (2 * j - g_b).to(tl.int16), mask=m_b)
                    tl.store(anc_o_ptr + p_a + W, (2 * j + 1 - g_l).to(tl.int16), mask=m_l)
                    g_b = tl.where(anchor, 2 * j, g_b)
                    g_l = tl.where(anchor, 2 * j + 1, g_l)
                if has_right:
                    m_last = tl.where(t < T_n, o == BLOCK - 1, False)
                    p_b = bnd_ptr + 2 * (p_out + t + o * 0)
                    tl.store(p_b, a_l.to(tl.int32, bitcast=True), mask=m_last)
                    tl.store(p_b + 1, g_l, mask=m_last)
            if has_right:
                # every thread's stores above are ordered before the release
                tl.debug_barrier()
                tl.atomic_xchg(prog_ptr + pid, tl.minimum(t0 + F, T_n), sem="release")
    tl.store(flag_ptr + pid, tl.max(tl.max(bad, axis=1), axis=0))


@triton.jit
def _distance(anc_o_ptr, row, s, W, lane0):
    """State s's distance to its origin, stored in anchor row ``row``."""
    return tl.load(anc_o_ptr + row.to(tl.int64) * 2 * W + (s % 2) * W + lane0 + s // 2).to(tl.int32)


@triton.jit(do_not_specialize=[*SIZES, "R"])
def _align_fill_kernel(
    x_ptr, tgt_ptr, meta_ptr, anc_a_ptr, anc_o_ptr, flag_ptr,
    ch_ptr,  # [N * R, K, BLOCK] uint8 scratch: each frame's choices in the segment's band
    ali_ptr,  # [N, T] int64 out: tokens (-1 past the input length or without a path)
    sc_ptr,  # [N, T] float32 out: their log-probabilities (0 past the input length, -inf or NaN without a path)
    N, T, C, W, P, R, K, stride_n, stride_t, stride_c, blank,
    BLOCK: tl.constexpr, BLOCK_P: tl.constexpr, F: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    i_n = pid // R
    i_k = pid % R
    T_n, L, tgt_base, lane0 = _sample(meta_ptr, N, i_n)
    p_x = x_ptr + i_n.to(tl.int64) * stride_n
    t_lo = i_k * K
    o = tl.arange(0, BLOCK)  # lanes of the band, and frames of the segment (K < BLOCK)
    o_f = tl.arange(0, F)
    t_out = t_lo + o
    m_out = (o < K) & (t_out < T)
    m_in = m_out & (t_out < T_n)
    o_p = tl.arange(0, BLOCK_P)
    nan = tl.max(tl.load(flag_ptr + i_n * P + o_p, mask=o_p < P, other=0), axis=0) > 0
    # the path ends in the last blank or, on a tie, the last label
    end_b = tl.load(anc_a_ptr + lane0 + L, mask=T_n > 0, other=float("-inf"))
    end_l = tl.load(anc_a_ptr + W + lane0 + L - 1, mask=(T_n > 0) & (L > 0), other=float("-inf"))
    ok = (tl.maximum(end_b, end_l) > float("-inf")) & (nan == 0)
    s_end = tl.where(end_b > end_l, 2 * L, 2 * L - 1).to(tl.int32)
    n_seg = (T_n + K - 1) // K
    path = tl.full([BLOCK], -1, tl.int32)  # the state at each frame of the segment
    if ok & (i_k < n_seg):
        # the path's states at the segment's last frame (s_hi) and at the anchor before its first (s_lo)
        s_hi = s_end
        s_lo = s_end - _distance(anc_o_ptr, n_seg * 0, s_end, W, lane0)
        for k in range(0, n_seg - 1 - i_k):
            s_hi = s_lo
            s_lo = s_hi - _distance(anc_o_ptr, n_seg - 1 - k, s_hi, W, lane0)
        t_hi = tl.minimum(t_lo + K, T_n)
        j_lo = tl.where(i_k > 0, s_lo // 2, 0)
        j = j_lo + o
        m_b = j <= L
        lab, can_skip = _labels(tgt_ptr, tgt_base, j, L, C)
        m_l = j < L
        cls_b = tl.zeros([BLOCK], tl.int64) + blank
        if i_k > 0:
            p_a = anc_a_ptr + i_k.to(tl.int64) * 2 * W + lane0 + j
            a_b = tl.load(p_a, mask=m_b & (2 * j >= s_lo), other=float("-inf"))
            a_l = tl.load(p_a + W, mask=m_l & (2 * j + 1 >= s_lo), other=float("-inf"))
        else:
            a_b = tl.where(j == 0, 0.0, float("-inf"))
            a_l = tl.full([BLOCK], float("-inf"), tl.float32)
        i_prev = tl.maximum(o - 1, 0)
        p_ch = ch_ptr + pid.to(tl.int64) * K * BLOCK
        e_l_nx = _tile(p_x, t_lo, t_hi, lab, m_l, o_f, stride_t, stride_c)
        e_b_nx = _tile(p_x, t_lo, t_hi, cls_b, m_b, o_f, stride_t, stride_c)
        for t0 in range(t_lo, t_hi, F):
            e_l_t = e_l_nx.to(tl.int32, bitcast=True)
            e_b_t = e_b_nx.to(tl.int32, bitcast=True)
            e_l_nx = _tile(p_x, t0 + F, t_hi, lab, m_l, o_f, stride_t, stride_c)
            e_b_nx = _tile(p_x, t0 + F, t_hi, cls_b, m_b, o_f, stride_t, stride_c)
            for i in tl.static_range(F):
                e_l = frame(e_l_t, o_f, i).to(tl.float32, bitcast=True)
                e_b = frame(e_b_t, o_f, i).to(tl.float32, bitcast=True)
                al_prev = tl.where(o == 0, float("-inf"), tl.gather(a_l, i_prev, 0))
                a_b, a_l, adv_b, adv_l, skip = _step(a_b, a_l, al_prev, e_b, e_l, can_skip, m_b, m_l)
                code = adv_b.to(tl.uint8) | (adv_l.to(tl.uint8) << 1) | (skip.to(tl.uint8) << 2)
                tl.store(p_ch + (t0 + i - t_lo) * BLOCK + o, code, mask=(t0 + i + o * 0) < t_hi)
        # the choices written above are read back by other threads
        tl.debug_barrier()
        s = s_hi
        for w in range(0, t_hi - t_lo):
            f = t_hi - 1 - w - t_lo
            path = tl.where(o == f, s, path)
            lane = tl.minimum(tl.maximum(s // 2 - j_lo, 0), BLOCK - 1)
            c = tl.load(p_ch + f * BLOCK + lane).to(tl.int32)
            s -= tl.where(s % 2 == 1, tl.where((c & 4) != 0, 2, (c >> 1) & 1), c & 1)
    label = (path % 2) == 1
    # (tl.where rather than &: Triton's interpreter cannot AND a vector with a scalar float comparison)
    take = tl.where(ok, m_in, False)
    lab = tl.load(tgt_ptr + tgt_base + path // 2, mask=take & label, other=0).to(tl.int64)
    token = tl.where(label, tl.minimum(tl.maximum(lab, 0), C - 1), blank)
    score = tl.load(p_x + t_out.to(tl.int64) * stride_t + token * stride_c, mask=take, other=0.0)
    score = tl.where(ok, score.to(tl.float32), tl.where(nan, float("nan"), float("-inf")))
    p_o = i_n.to(tl.int64) * T + t_out
    tl.store(ali_ptr + p_o, tl.where(take, token, -1), mask=m_out)
    tl.store(sc_ptr + p_o, tl.where(m_in, score, 0.0), mask=m_out)


def align_meta(input_lengths: torch.Tensor, target_lengths: torch.Tensor, T: int, S: int, padded: bool) -> torch.Tensor:
    """[3, N] int64: each sample's frames, labels and first label's index in targets, clamped as every path clamps
    unchecked lengths (S: the padded width, or the concatenated length)."""
    N = input_lengths.numel()
    t_n = input_lengths.to(torch.int64).clamp(0, T)
    l_pos = target_lengths.to(torch.int64).clamp(min=0)
    if padded:
        base = torch.arange(N, device=t_n.device, dtype=torch.int64) * S
        L = l_pos.clamp(max=S)
    else:
        base = (l_pos.cumsum(0) - l_pos).clamp(max=S)
        L = torch.minimum(l_pos, S - base)
    return torch.stack([t_n, L, base])


def segment_length(T: int, W: int) -> int:
    """K: the shortest segment (the fill's work and scratch) whose anchor rows fit in ANCHOR_BYTES."""
    for block in FILL_BLOCKS:
        K = block - CHUNK
        if cdiv(T, K) * 2 * W * 6 <= ANCHOR_BYTES:
            return K
    return FILL_BLOCKS[-1] - CHUNK


def ctc_align(
    x: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    padded: bool,
    *,
    block: int | None = None,
    segment: int | None = None,
    warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Viterbi path of each sample: tokens [N, T] int64 and their log-probabilities [N, T] float32.

    Args:
        x: [N, T, C] float32/float16/bfloat16 log-probabilities, any strides.
        targets: padded [N, S] (contiguous) or concatenated 1-D, int32/int64, on x's device.
        input_lengths, target_lengths: [N] integer tensors on x's device (clamped, not checked, here).
        block, segment, warps: the forward's lanes per program, the segment length K (a multiple of CHUNK) and the
            forward's num_warps (default: from the sizes); for tests and measurements.
    """
    N, T, C = x.shape
    dev = x.device
    S = targets.shape[1] if padded else targets.numel()
    W = targets.numel() + N  # lanes of all samples: sample n's L_n + 1 start at its first label's index + n
    meta = align_meta(input_lengths, target_lengths, T, S, padded)
    lanes = S + 1
    if block is None:
        if lanes <= 128:  # one program per sample (measured: 0.50 ms at 32x1500x1025x120, 0.57 split in four)
            block, block_warps = max(32, next_power_of_2(lanes)), max(1, next_power_of_2(lanes) // 32)
        else:
            for block, block_warps in FORWARD_BLOCKS:  # noqa: B007 - the loop picks the pair
                if N * cdiv(lanes, block) * T * 8 <= BOUNDARY_BYTES:
                    break
        warps = warps or block_warps
    P = cdiv(lanes, block)
    K = segment or segment_length(T, W)
    if K % CHUNK != 0:
        raise ValueError(f"segment={K} is not a multiple of {CHUNK}")
    fill_block = next_power_of_2(K + CHUNK)
    R = cdiv(T, K)
    anc_a = torch.empty(R * 2 * W, dtype=torch.float32, device=dev)
    anc_o = torch.empty(R * 2 * W, dtype=torch.int16, device=dev)
    wide = P > 1
    bnd = torch.empty(N * P * T * 2 if wide else 1, dtype=torch.int32, device=dev)
    prog = torch.zeros(N * P if wide else 1, dtype=torch.int32, device=dev)
    flags = kernel_output(N * P, dtype=torch.int32, device=dev)
    sn, st, sc = x.stride()
    _align_forward_kernel[(N * P,)](
        x,
        targets,
        meta,
        anc_a,
        anc_o,
        bnd,
        prog,
        flags,
        N,
        T,
        C,
        W,
        P,
        K,
        sn,
        st,
        sc,
        blank,
        BLOCK=block,
        F=CHUNK,
        num_warps=warps or max(1, min(8, block // 32)),
    )
    choices = torch.empty(N * R * K * fill_block, dtype=torch.uint8, device=dev)
    alignments = kernel_output((N, T), dtype=torch.int64, device=dev)
    scores = kernel_output((N, T), dtype=torch.float32, device=dev)
    _align_fill_kernel[(N * R,)](
        x,
        targets,
        meta,
        anc_a,
        anc_o,
        flags,
        choices,
        alignments,
        scores,
        N,
        T,
        C,
        W,
        P,
        R,
        K,
        sn,
        st,
        sc,
        blank,
        BLOCK=fill_block,
        BLOCK_P=next_power_of_2(P),
        F=CHUNK,
        num_warps=max(1, min(8, fill_block // 32)),
    )
    return alignments, scores
