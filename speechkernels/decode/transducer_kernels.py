"""The greedy transducer decoder in one launch: ``_transducer_greedy_kernel``, a persistent kernel whose programs
(one per SM) run the whole label-looping loop of a batch, meeting at grid-wide barriers (an atomic counter).

Before the loop, for a few rows (the FMA tiles' batches), the encoder projection enc_proj = x @ enc_w^T + enc_b of
every live frame, in tiles over the programs (tensor-core products), then a barrier (more rows: a matrix product
before the launch). Each step of the loop:
1. Joint: the logits of every active row at the SPEC frames of its window, t_n .. t_n + SPEC - 1 (those inside
   the utterance), act(enc_proj[n, t] + g_n) @ out_w^T + out_b: until the row emits a label its prediction
   network's output g_n stays the same, so the frames its blanks would walk to are computed at once. Tiles of
   ((row, frame) pairs, output columns) spread over the programs (tensor-core products; float32 as three TF32
   products). Each tile folds its token columns into a packed key (orderable value, first index) atomically maxed
   into the pair's slot, its duration columns likewise, and stores its partial log-sum-exp of the token logits.
   Barrier.
2. Decision, computed by every program for every row (the same values everywhere, so no barrier): the walk through
   the window as the label-looping rule takes it, one frame's label and duration at a time (a blank moves on by
   its duration, at least 1), to the first label (the step ends there: the prediction network changes) or out of
   the window; the next frame, the labels at the current frame (``max_symbols``); each row's owner program writes
   its outputs. Each program keeps these per-row values in its own scratch rows (read back by index
   in the tiles).
3. When some row emitted: the prediction network for the emitting rows. LSTM: one phase per layer, tiles of (rows,
   hidden units) computing the four gates of their units in one product (layer 0's input: the label's embedding),
   h ping-ponged between two buffers, a barrier after each layer; then the
   projection g = pred_w @ out + pred_b in tiles, and a barrier. Stateless: the conv of the last K tokens'
   embeddings is a sum of K rows of per-token tables (precomputed), fed to the projection directly.
Steps: max over rows of (labels + windows left without one); per step one barrier, plus L + 1 (LSTM) or 1
(stateless) when a row emitted. The window (``window``) spends joint products on frames a label then leaves unused
for fewer steps: at 128 x 15 s an RNN-T model (a blank moves on one frame) takes 1.4x fewer steps with 2 frames,
a stateless one 2.3x with 8, a TDT model (its blanks jump) about as many. The weights (13-26 MB for a 0.6B TDT
model) stay in L2 between steps.

The weights are read where they are: each LSTM layer's tensors are arguments of their own (up to MAX_LAYERS), so
a call copies nothing; the scratch is one allocation carved into 16-element-aligned pieces (aligned pointers keep
the K loops' loads 16-byte asynchronous copies); the kernel writes every output element, the padding past each
hypothesis included.

Slots of the packed keys rotate over three buffers (a slot is reset by its owner two steps before its reuse, when
every program has read it) and the partial sums over two.
"""

from __future__ import annotations

import itertools
import math
import os
import threading

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .._launch import cdiv, launch, next_power_of_2
from .._outputs import kernel_output
from .._sync import grid_sync

_INTERPRETER = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")
_NO_KEY = tl.constexpr(0)  # below every packed key (each is positive: a zeroed slot is empty)
SMALL_BATCH = 4  # up to this many rows: FMA tiles
MAX_LAYERS = 4  # LSTM layers the kernel takes (more: the PyTorch path)
MAX_PLANS = 32  # launch plans a decoder keeps (one per batch shape and start/continuation; the oldest go first)
# FMA tiles: elements of a phase's product block per program, warps; tensor-core tiles: the most rows, the K block,
# the output columns (joint), hidden units (LSTM) and projection columns of a tile, warps, pipeline stages of the K
# loops, whether a phase's columns are split into one range per program (spread) or into full blocks; for the
# LSTM and the joint the most ranges of K their tiles are split into while they fit the programs, and the fewest
# (tests); the rows of the split joint's sums (below the products' rows: fewer partial logits in registers, more
# programs); whether the prediction network's tiles cover only the rows that emitted, listed by the decision
# (compact; slower at 128 x 15 s); the joint's window, set (tests; None: ``window``); whether a stateless network's
# input is formed once per emitting row by its owner program before the projection, a barrier more, rather than
# gathered in the projection's K loops (stateless_input); the fewest (row, frame) pairs of the joint at which its
# hidden layer act(enc + pred) is formed once per step before the products, a barrier more, rather than in every
# column range's K loops (hidden_pairs; tensor-core tiles; None: never), in tiles of hidden_cols columns; whether
# float32 products of these two operands formed once (the joint's hidden layer, the stateless input) take them
# split in TF32 halves as they are formed, and the weights split once per call in the kernel (split_f32: every
# operand of the three TF32 products loaded as it is, rather than split in the K loops); the most ranges of K the
# projection's tiles are split into while they fit the programs (dot_proj_splits; only with the hidden layer formed
# once, whose phase sums the partial projections in the order of K), and the fewest (tests); whether a float32
# LSTM's products take their operands in TF32 halves too (split_f32_lstm: the layers' weights and the embedding
# split once per call in the kernel, each hidden state stored with its halves by its cell; not with compact)
TILES = dict(
    fma_elements=8192,
    fma_warps=8,
    dot_bb=64,
    dot_bk=32,
    dot_bv=64,
    dot_bh=16,
    dot_bj=32,
    dot_warps=4,
    dot_stages=4,
    dot_spread=False,
    dot_lstm_splits=4,
    dot_lstm_splits_min=1,
    dot_joint_splits=4,
    dot_joint_splits_min=1,
    dot_sum_rows=8,
    compact=False,
    window=None,
    stateless_input=True,
    hidden_pairs=32,  # (H200: tdt-8x8 float32 at 32 pairs 2.98 -> 2.56 ms; rnnt-8x8 bfloat16 at 64 2.60 -> 2.40)
    hidden_cols=64,
    split_f32=True,
    dot_proj_splits=4,
    dot_proj_splits_min=1,
    split_f32_lstm=False,
)
# the joint's window (frames per row and step, a power of two; ``TILES["window"]``, when set, for every model):
# FMA tiles: frames by kind of model; tensor-core tiles: the most (up to 8) while rows x frames stay within the
# kind's pairs. A TDT model's blanks already jump frames: its window pays only at 8 rows (benchmarks/notes/decode.md)
WINDOWS = dict(
    fma=dict(rnnt=4, stateless=4, tdt=1),
    pairs=dict(rnnt=256, stateless=1024, tdt=32),
    most=8,
)


@triton.jit
def _dot(a, b, acc, F32: tl.constexpr):
    """acc + a @ b with float32 sums: float32 operands as three TF32 products (about float32's precision), 16-bit
    operands on the tensor cores as they are."""
    if _INTERPRETER:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif F32:
        return tl.dot(a, b, acc, input_precision="tf32x3")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _tf32_hi(x):
    """x rounded to TF32 (to nearest, ties away from zero, as cvt.rna.tf32.f32) by its bits; x - this is exact."""
    return ((x.to(tl.int32, bitcast=True) + 0x1000) & -8192).to(tl.float32, bitcast=True)


@triton.jit
def _tf32_split(x):
    """(hi, lo) of float32 x: hi ``_tf32_hi(x)`` (x itself where that is not finite), lo = x - hi (exact)."""
    hi = _tf32_hi(x)
    hi = tl.where((hi == hi) & (tl.abs(hi) != float("inf")), hi, x)
    return hi, x - hi


@triton.jit
def _dot3(a_hi, a_lo, w_hi, w_lo, acc):
    """acc + a @ w from operands split by ``_tf32_split``: the three TF32 products a_lo w_hi, a_hi w_lo, a_hi w_hi
    (about float32's precision, as ``_dot``'s)."""
    if _INTERPRETER:  # (a = a_hi + a_lo exactly: the interpreter's one product, as ``_dot``'s)
        return tl.dot(a_hi + a_lo, w_hi + w_lo, acc, input_precision="ieee")
    else:
        acc = tl.dot(a_lo, w_hi, acc, input_precision="tf32")
        acc = tl.dot(a_hi, w_lo, acc, input_precision="tf32")
        return tl.dot(a_hi, w_hi, acc, input_precision="tf32")


@triton.jit
def _split_into(src, dst, n, lo_at, pid, nprog):
    """``_tf32_split`` of n contiguous float32 values at src: hi to dst, lo to dst + lo_at (the programs' share)."""
    o = tl.arange(0, 1024)
    for i0 in range(pid * 1024, n, nprog * 1024):
        i = i0 + o
        hi, lo = _tf32_split(tl.load(src + i, mask=i < n, other=0.0))
        tl.store(dst + i, hi, mask=i < n)
        tl.store(dst + lo_at + i, lo, mask=i < n)


@triton.jit
def _rows_range3(acc, p_x, x_lo, p_w, w_lo, m_x, m_w, K: tl.constexpr, k_lo, k_hi, BK: tl.constexpr):
    """``_rows_range`` of operands in TF32 halves (``_dot3``): X's hi rows at p_x, lo x_lo elements on, W's
    likewise (w_lo)."""
    o_k = tl.arange(0, BK)
    for k0 in tl.range(k_lo, k_hi, BK):
        kk = k0 + o_k
        m_xk = m_x[:, None] & (kk < K)[None, :]
        m_wk = m_w[None, :] & (kk < K)[:, None]
        acc = _dot3(tl.load(p_x + kk[None, :], mask=m_xk, other=0.0, cache_modifier=".cg"),
                    tl.load(p_x + x_lo + kk[None, :], mask=m_xk, other=0.0, cache_modifier=".cg"),
                    tl.load(p_w + kk[:, None], mask=m_wk, other=0.0),
                    tl.load(p_w + w_lo + kk[:, None], mask=m_wk, other=0.0), acc)  # fmt: skip
    return acc


@triton.jit
def _pair_frames(p_priv, pairs, NP, N, SPEC: tl.constexpr, T):
    """The joint's (row, frame offset) pairs p = row SPEC + offset: (rows, frames clamped to T - 1, whether the
    pair's frame is one its row decodes: inside the utterance, the row active)."""
    m_r = pairs < NP
    rows = pairs // SPEC
    f_p = pairs % SPEC
    t_r = tl.minimum(tl.load(p_priv + rows, mask=m_r, other=0) + f_p, T - 1)
    return rows, t_r, f_p < tl.load(p_priv + N + rows, mask=m_r, other=0)  # (frames left; 0: inactive)


@triton.jit
def _joint_hidden(encp_ptr, g_ptr, rows, t_r, kk, m, N, T, J: tl.constexpr, PS: tl.constexpr, F32: tl.constexpr,
                  WD: tl.constexpr, ACT: tl.constexpr):  # fmt: skip
    """The joint's hidden layer act(enc + pred) at columns kk of the rows' frames t_r (where m), in the weights'
    dtype: the sum rounded to it, the activation in float32; pred the sum of the PS partial projections in the
    order of K (rounded to the weights' dtype) or the projection itself."""
    e = tl.load(encp_ptr + (rows.to(tl.int64)[:, None] * T + t_r[:, None]) * J + kk[None, :], mask=m,
                other=0.0).to(tl.float32)  # fmt: skip
    p_g = g_ptr + rows[:, None] * J + kk[None, :]
    g = tl.load(p_g, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32)
    if PS > 1:
        for k2 in tl.static_range(1, PS):
            g += tl.load(p_g + k2 * N * J, mask=m, other=0.0, cache_modifier=".cg")
        if not F32:
            g = g.to(WD).to(tl.float32)
    return _act((e + g).to(WD).to(tl.float32), ACT).to(WD)


@triton.jit
def _wl_at(layer: tl.constexpr, PE: tl.constexpr, H: tl.constexpr):
    """Where layer ``layer``'s TF32 halves start in the LSTM's split weights (W_ih hi, lo, then W_hh hi, lo; the
    embedding's after the last layer's)."""
    if layer == 0:
        return 0
    else:
        return 8 * H * (PE + H) + (layer - 1) * 16 * H * H


@triton.jit
def _zeros(BB: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr, FMA: tl.constexpr):
    """The accumulator of ``_mm``: [BB, BN], or with FMA the products' partial sums [BB, BK, BN] (one reduction
    at the end, ``_total``, rather than one per block of K)."""
    if FMA:
        return tl.zeros([BB, BK, BN], tl.float32)
    else:
        return tl.zeros([BB, BN], tl.float32)


@triton.jit
def _mm(a, b, acc, F32: tl.constexpr, FMA: tl.constexpr):
    """acc + a [M, K] @ b [K, N]: on the tensor cores (``_dot``), or with FMA (a few rows: float32 products of the
    operands, float32 sums)."""
    if FMA:
        return acc + a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :]
    else:
        return _dot(a, b, acc, F32)


@triton.jit
def _rows_product(acc, p_x, p_w, m_x, m_w, K: tl.constexpr, BK: tl.constexpr, UNROLL: tl.constexpr, WD: tl.constexpr,
                  F32: tl.constexpr, FMA: tl.constexpr):  # fmt: skip
    """acc + X @ W^T over K in blocks of BK: rows of X at p_x [BB, 1] (those of m_x; read past L1: other programs
    write them), rows of W at p_w [1, BN] (those of m_w), both contiguous along K."""
    o_k = tl.arange(0, BK)
    for k0 in tl.range(0, K, BK, loop_unroll_factor=UNROLL):
        kk = k0 + o_k
        x = tl.load(p_x + kk[None, :], mask=m_x[:, None] & (kk < K)[None, :], other=0.0, cache_modifier=".cg")
        w = tl.load(p_w + kk[:, None], mask=m_w[None, :] & (kk < K)[:, None], other=0.0)
        acc = _mm(x.to(WD), w, acc, F32, FMA)
    return acc


@triton.jit
def _total(acc, FMA: tl.constexpr):
    if FMA:
        return tl.sum(acc, 1)
    else:
        return acc


@triton.jit
def _ranges(n, block: tl.constexpr, want):
    """How many ranges split n items: ``want`` (one per program) where each then holds at most ``block`` items,
    else as few as hold ``block`` each; range r is [r * n // count, (r + 1) * n // count)."""
    return tl.minimum(tl.maximum(tl.cdiv(n, block), want), n)


@triton.jit
def _emitting_rows(p_priv, block, o_b, n_emit, N, K: tl.constexpr, COMPACT: tl.constexpr):
    """Row block ``block`` of the prediction network's tiles: (rows, rows in range, rows that emitted). COMPACT:
    the emitting rows in the order the decision listed them (each program's own list, n_emit long), so that the
    tiles cover only them; else rows block * BB + o_b, masked by their emit flags."""
    if COMPACT:
        idx = block * o_b.shape[0] + o_b
        m_r = idx < n_emit
        rows = tl.load(p_priv + (4 + K) * N + idx, mask=m_r, other=0)
        return rows, m_r, m_r
    else:
        rows = block * o_b.shape[0] + o_b
        m_r = rows < N
        return rows, m_r, (tl.load(p_priv + 3 * N + rows, mask=m_r, other=0) != 0) & m_r


@triton.jit
def _carry_idle_rows(h_ptr, p_priv, hp, pid, nprog, N, H: tl.constexpr, L: tl.constexpr, BB: tl.constexpr,
                     BK: tl.constexpr):  # fmt: skip
    """COMPACT: every layer's hidden state of the rows that did not emit carried to the other buffer (the tiles
    cover the emitting rows only; ``_lstm_cell`` carries the others' where they do)."""
    o_b = tl.arange(0, BB)
    o_k = tl.arange(0, BK)
    n_r = tl.cdiv(N, BB)
    n_c = tl.cdiv(H, BK)
    for blk in range(pid, L * n_r * n_c, nprog):
        layer = blk // (n_r * n_c)
        rows = (blk % n_r) * BB + o_b
        cols = (blk // n_r) % n_c * BK + o_k
        m_r = rows < N
        idle = m_r & (tl.load(p_priv + 3 * N + rows, mask=m_r, other=1) == 0)
        m = idle[:, None] & (cols < H)[None, :]
        src = h_ptr + ((hp * L + layer) * N + rows[:, None]) * H + cols[None, :]
        tl.store(src + (1 - 2 * hp) * L * N * H, tl.load(src, mask=m, other=0.0, cache_modifier=".cg"), mask=m)


@triton.jit
def _list_emitting(p_priv, o_n, emit, N, K: tl.constexpr, COMPACT: tl.constexpr):
    """With COMPACT, the emitting rows (in row order) into this program's list (``_emitting_rows``)."""
    if COMPACT:
        pos = tl.cumsum(emit.to(tl.int32), 0) - 1
        tl.store(p_priv + (4 + K) * N + pos, o_n, mask=emit)


@triton.jit
def _split4(x, BB: tl.constexpr, BH: tl.constexpr):
    """x [BB, 4 * BH] with columns q * BH + u as the four [BB, BH] blocks q = 0..3."""
    x4 = tl.permute(tl.reshape(x, [BB, 2, 2, BH]), [0, 3, 1, 2])  # [BB, BH, a, b] for q = 2a + b
    even, odd = tl.split(x4)  # b = 0: q = 0, 2; b = 1: q = 1, 3
    q0, q2 = tl.split(even)
    q1, q3 = tl.split(odd)
    return q0, q1, q2, q3


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _tanh(x):
    return 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0


@triton.jit
def _act(x, ACT: tl.constexpr):
    """The joint's activation (0 relu, 1 tanh, 2 sigmoid); NaN stays NaN."""
    if ACT == 0:
        return tl.where(x < 0.0, 0.0, x)
    elif ACT == 1:
        return _tanh(x)
    else:
        return _sigmoid(x)


@triton.jit
def _key(v, idx):
    """A positive int64 whose order is (v's float order, then the lower index): v's bits made orderable as a signed
    int32 (NaN above everything, as torch.argmax; -0 as +0), offset by 2^31 into [1, 2^32), above 31 bits of
    2^31 - 1 - idx."""
    v = v + 0.0
    bits = v.to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    ordered = tl.where(v != v, 0x7FFFFFFF, ordered)
    return ((ordered.to(tl.int64) + tl.full([], 2147483648, tl.int64)) << 31) | (0x7FFFFFFF - idx).to(tl.int64)


@triton.jit
def _unkey(key):
    """(value, index) of a packed key."""
    ordered = ((key >> 31) - tl.full([], 2147483648, tl.int64)).to(tl.int32)
    bits = tl.where(ordered < 0, ordered ^ 0x7FFFFFFF, ordered)
    return bits.to(tl.float32, bitcast=True), 0x7FFFFFFF - (key & 0x7FFFFFFF).to(tl.int32)


@triton.jit
def _stamp(prof_ptr, i, code, PROFILE: tl.constexpr):
    """With PROFILE, program 0 records (code, the global timer in ns) as event i; returns i + 1."""
    if PROFILE:
        if tl.program_id(0) == 0:
            now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                            pack=1)  # fmt: skip
            tl.store(prof_ptr + 2 * i, tl.full([], code, tl.int64))
            tl.store(prof_ptr + 2 * i + 1, now)
        return tl.minimum(i + 1, PROFILE - 1)
    else:
        return i


@triton.jit
def _rows_range(acc, p_x, p_w, m_x, m_w, K: tl.constexpr, k_lo, k_hi, BK: tl.constexpr, WD: tl.constexpr,
                F32: tl.constexpr):  # fmt: skip
    """acc + X @ W^T over K in [k_lo, k_hi) (multiples of BK; an empty range adds nothing) with tensor-core tiles:
    ``_rows_product`` over a range of K."""
    o_k = tl.arange(0, BK)
    for k0 in tl.range(k_lo, k_hi, BK):
        kk = k0 + o_k
        x = tl.load(p_x + kk[None, :], mask=m_x[:, None] & (kk < K)[None, :], other=0.0, cache_modifier=".cg")
        w = tl.load(p_w + kk[:, None], mask=m_w[None, :] & (kk < K)[:, None], other=0.0)
        acc = _dot(x.to(WD), w, acc, F32)
    return acc


@triton.jit
def _lstm_cell(gates, rows, units, grow, m_r, m_u, m_g, e_r, layer: tl.constexpr, hp, p_bih, p_bhh, c_ptr, h_ptr, N,
               H: tl.constexpr, L: tl.constexpr, BH: tl.constexpr, HAS_LBIAS: tl.constexpr, hs_ptr,
               TSL: tl.constexpr):  # fmt: skip
    """An LSTM layer's cells of ``rows`` x ``units`` from their gates [rows, 4 BH] (columns q BH + u for gate q =
    i, f, g, o of unit u; the layer's biases added here): c and h of the emitting rows updated, the others' h carried
    to the other buffer."""
    if HAS_LBIAS:  # b_ih + b_hh in float32
        gates += tl.load(p_bih + grow, mask=m_g, other=0.0).to(tl.float32)[None, :]
        gates += tl.load(p_bhh + grow, mask=m_g, other=0.0).to(tl.float32)[None, :]
    gi, gf, gg, go = _split4(gates, rows.shape[0], BH)
    m_ru = e_r[:, None] & m_u[None, :]
    p_c = c_ptr + (layer * N + rows[:, None]) * H + units[None, :]
    c_old = tl.load(p_c, mask=m_ru, other=0.0)
    c_new = _sigmoid(gf) * c_old + _sigmoid(gi) * _tanh(gg)
    h_new = _sigmoid(go) * _tanh(c_new)
    tl.store(p_c, c_new, mask=m_ru)
    # rows not emitting carry their hidden state to the other buffer
    p_old = h_ptr + ((hp * L + layer) * N + rows[:, None]) * H + units[None, :]
    h_old = tl.load(p_old, mask=m_r[:, None] & m_u[None, :], other=0.0, cache_modifier=".cg")
    h_out = tl.where(e_r[:, None], h_new, h_old)
    tl.store(p_old + (1 - 2 * hp) * L * N * H, h_out, mask=m_r[:, None] & m_u[None, :])
    if TSL:  # its TF32 halves beside it (hs: [2, 2, L, N, H], hi then lo)
        h_hi, h_lo = _tf32_split(h_out)
        p_s = hs_ptr + (((1 - hp) * L + layer) * N + rows[:, None]) * H + units[None, :]
        tl.store(p_s, h_hi, mask=m_r[:, None] & m_u[None, :])
        tl.store(p_s + 2 * L * N * H, h_lo, mask=m_r[:, None] & m_u[None, :])


@triton.jit
def _joint_outputs(logits, rows, cols, m_c, a_r, c_lo, c_hi, ct, ob_ptr, key_ptr, part_ptr, kb, pb, N, NCB,
                   V: tl.constexpr, HAS_OB: tl.constexpr, HAS_DUR: tl.constexpr, F32: tl.constexpr,
                   WD: tl.constexpr):  # fmt: skip
    """A joint tile's outputs from its logits [BB, BV] (rows, columns c_lo + ..): the output bias, the rows' packed
    (value, index) keys of the token and duration columns, maxed atomically into slot kb, and the token columns'
    partial log-sum-exp (max, sum of exp) in column block ct of buffer pb."""
    o_b = tl.arange(0, rows.shape[0])
    if HAS_OB:
        logits += tl.load(ob_ptr + cols, mask=m_c, other=0.0).to(tl.float32)[None, :]
    if not F32:
        logits = logits.to(WD).to(tl.float32)
    is_tok = (m_c & (cols < V))[None, :]
    tkey = tl.max(tl.where(is_tok, _key(logits, cols[None, :]), _NO_KEY), 1)
    tl.atomic_max(key_ptr + (kb * 2) * N + rows, tkey, mask=a_r & (o_b * 0 + c_lo < V), sem="relaxed")
    if HAS_DUR:
        is_dur = (m_c & (cols >= V))[None, :]
        dkey = tl.max(tl.where(is_dur, _key(logits, cols[None, :] - V), _NO_KEY), 1)
        m_d = a_r & (o_b * 0 + c_hi > V)
        tl.atomic_max(key_ptr + (kb * 2 + 1) * N + rows, dkey, mask=m_d, sem="relaxed")
    # the partial log-sum-exp of the tile's token columns (-inf, 0 for a tile of durations only)
    lv = tl.where(is_tok, logits, float("-inf"))
    m = tl.max(lv, 1)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(tl.exp(lv - m_safe[:, None]), 1)
    p_part = part_ptr + ((pb * 2) * N + rows) * NCB + ct
    tl.store(p_part, m, mask=a_r)
    tl.store(p_part + N * NCB, s, mask=a_r)


@triton.jit
def _transducer_greedy_kernel(
    x_ptr,  # [N, T, E] encoder output, weight dtype
    ew_ptr,  # [J, E] enc_w
    eb_ptr,  # [J] enc_b (with HAS_EB)
    encp_ptr,  # [N, T, J] the encoder projection x @ enc_w^T + enc_b, weight dtype (ENC: written here)
    len_ptr,  # [N] int64 frames
    t0_ptr,  # [N] int64 first frame (the state's time jumps)
    fofs_ptr,  # [N] int64 frames decoded before (added to the reported frames)
    table_ptr,  # stateless: [K, R, P] f32 the conv's per-token taps (or the embedding)
    emb_ptr,  # LSTM: [R, P] the embedding (weight dtype)
    wih0_ptr, wih1_ptr, wih2_ptr, wih3_ptr,  # LSTM: W_ih [4H, in] of layers 0..L-1 (MAX_LAYERS)
    whh0_ptr, whh1_ptr, whh2_ptr, whh3_ptr,  # W_hh [4H, H]
    bih0_ptr, bih1_ptr, bih2_ptr, bih3_ptr,  # b_ih [4H] (with HAS_LBIAS)
    bhh0_ptr, bhh1_ptr, bhh2_ptr, bhh3_ptr,  # b_hh [4H]
    h_ptr,  # [2, L, N, H] ping-pong hidden states in the weights' dtype (buffer 0 holds the state's); stateless with
    # XS: [N, P] the emitting rows' prediction network input in the weights' dtype
    c_ptr,  # [L, N, H] f32 cells
    g_ptr,  # [N, J] pred_w @ out + pred_b for each row's current prediction output (weights' dtype); with PS > 1
    # [PS, N, J] f32 its partial sums per range of K (the first with the bias)
    pout_ptr,  # [N, P] f32 each row's current prediction output (in: the state's; START: written)
    part_ptr,  # [2, 2, NP, NCB] f32 partial (max, sum of exp) of the token logits per column block (NP: N SPEC)
    lpart_ptr,  # [LS, N, 4H] f32 an LSTM layer's partial gates per range of K (LS > 1)
    plog_ptr,  # [JS, NP, V + D] f32 the joint's partial logits per range of K (JS > 1)
    hj_ptr,  # [NP, J] the joint's hidden layer of each pair, weight dtype (JH); with TS [2, NP, J] its halves
    ws_ptr,  # with TS: [2, V + D, J] out_w's TF32 halves, then [2, J, P] pred_w's (f32)
    wl_ptr,  # with TSL: the LSTM's weights in TF32 halves (``_wl_at``), then the embedding's [2, R, PE] (f32)
    hs_ptr,  # with TSL: [2, 2, L, N, H] f32 the hidden states' TF32 halves (hi, lo; each as h's ping-pong buffers)
    ctx0_ptr,  # [N, K] int64 the state's context (stateless)
    pw_ptr,  # [J, P] pred_w
    pb_ptr,  # [J] pred_b (with HAS_PB)
    ow_ptr,  # [V + D, J] out_w
    ob_ptr,  # [V + D] out_b (with HAS_OB)
    dur_ptr,  # [D] int64 durations
    key_ptr,  # [3, 2, NP] int64 packed keys (token, duration), _NO_KEY (zero)
    priv_ptr,  # [nprog, 5 + K, N] int32 each program's row values (t, frames left while active, label, emit,
    # context), and the emitting rows' list (COMPACT)
    bar_ptr,  # [1] int32 barrier counter, 0
    tok_ptr, frm_ptr, dout_ptr, sc_ptr,  # [N, S] out: tokens, frames, durations (-1 past), scores (0 past)
    nout_ptr,  # [3, N] int64 out: hypothesis lengths, frames jumped past the end, frames decoded in all
    hout_ptr, cout_ptr,  # [L, N, H] weight dtype out: final LSTM state
    oout_ptr,  # [N, P] weight dtype out: final prediction output
    ctxout_ptr,  # [N, K] int64 out: final context
    prof_ptr,  # [PROFILE, 2] int64 out: program 0's (event, time) pairs, with PROFILE > 0 (events: _PHASES)
    N, T, S, R, NCB, blank, max_symbols,
    E: tl.constexpr, ENC: tl.constexpr, HAS_EB: tl.constexpr, EB: tl.constexpr, EJ: tl.constexpr, EK: tl.constexpr,
    J: tl.constexpr, H: tl.constexpr, P: tl.constexpr, PE: tl.constexpr, V: tl.constexpr, D: tl.constexpr,
    L: tl.constexpr, K: tl.constexpr, FMA: tl.constexpr, STATELESS: tl.constexpr, HAS_CONV: tl.constexpr,
    HAS_DUR: tl.constexpr, ACT: tl.constexpr, F32: tl.constexpr, BLOCK_N: tl.constexpr, NCB_P2: tl.constexpr,
    BD: tl.constexpr, BB: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr, BH: tl.constexpr, BJ: tl.constexpr,
    BS: tl.constexpr, UNROLL: tl.constexpr, SPREAD: tl.constexpr, LS: tl.constexpr, BR: tl.constexpr,
    SPEC: tl.constexpr, FP: tl.constexpr, BP: tl.constexpr, XS: tl.constexpr, BXS: tl.constexpr,
    KB0: tl.constexpr, KB1: tl.constexpr, JS: tl.constexpr, KJ: tl.constexpr, HAS_LBIAS: tl.constexpr,
    HAS_PB: tl.constexpr, HAS_OB: tl.constexpr, START: tl.constexpr, PROFILE: tl.constexpr,
    COMPACT: tl.constexpr, JH: tl.constexpr, BHJ: tl.constexpr, TS: tl.constexpr, PS: tl.constexpr,
    KP: tl.constexpr, TSL: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    WD = ow_ptr.dtype.element_ty
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < N
    own = m_n & (o_n % nprog == pid)
    p_priv = priv_ptr + pid * (5 + K) * N
    L_n = tl.minimum(tl.maximum(tl.load(len_ptr + o_n, mask=m_n, other=0), 0), T).to(tl.int32)
    t_n = tl.load(t0_ptr + o_n, mask=m_n & (not START), other=0).to(tl.int32)
    fofs = tl.load(fofs_ptr + o_n, mask=m_n & (not START), other=0)
    active = m_n & (t_n < L_n)
    k_n = tl.zeros([BLOCK_N], tl.int32)
    at_frame = tl.zeros([BLOCK_N], tl.int32)
    tl.store(p_priv + o_n, t_n, mask=m_n)
    tl.store(p_priv + N + o_n, tl.where(active, L_n - t_n, 0), mask=m_n)  # frames left while active
    # START: every row's prediction network first takes the blank (the start symbol) from a zero state
    emit0 = m_n & START
    tl.store(p_priv + 2 * N + o_n, tl.zeros([BLOCK_N], tl.int32) + blank, mask=m_n)
    tl.store(p_priv + 3 * N + o_n, emit0.to(tl.int32), mask=m_n)
    n_emit = tl.sum(emit0.to(tl.int32), 0)
    _list_emitting(p_priv, o_n, emit0, N, K, COMPACT)
    if STATELESS:
        for j in tl.static_range(K):
            if START:
                ctx = tl.zeros([BLOCK_N], tl.int32) + (blank if j == K - 1 else -1)
            else:
                ctx = tl.load(ctx0_ptr + o_n * K + j, mask=m_n, other=-1).to(tl.int32)
            tl.store(p_priv + (4 + j) * N + o_n, ctx, mask=m_n)
    tl.debug_barrier()
    o_d = tl.arange(0, BD)
    o_f = tl.arange(0, FP)
    o_p = tl.arange(0, BP)
    NP = N * SPEC  # the joint's (row, frame offset) pairs
    n_pb = tl.cdiv(NP, BP)
    durs_v = tl.load(dur_ptr + o_d, mask=o_d < D, other=1).to(tl.int32)
    n_rb = tl.cdiv(N, BB)
    o_b = tl.arange(0, BB)
    o_k = tl.arange(0, BK)
    n_act = tl.sum(active.to(tl.int32), 0)
    step = 0
    hp = 0  # the h buffer holding the current hidden states
    n_sync = 0
    ev = 0
    # ENC: the encoder projection of every live frame: tiles (block of EB frames of the flattened [N, T], EJ columns).
    # Compiled only with ENC (without it the tiles' frame index would divide by a zero count of blocks)
    if ENC:
        n_fb = tl.cdiv(N * T, EB)
        o_eb = tl.arange(0, EB)
        o_ej = tl.arange(0, EJ)
        o_ek = tl.arange(0, EK)
        for tile in range(pid, n_fb * tl.cdiv(J, EJ), nprog):
            fr = (tile % n_fb) * EB + o_eb
            m_f = fr < N * T
            m_f &= (fr % T) < tl.load(len_ptr + fr // T, mask=m_f, other=0)
            cols = (tile // n_fb) * EJ + o_ej
            m_j = cols < J
            acc = tl.zeros([EB, EJ], tl.float32)
            for k0 in tl.range(0, E, EK):
                kk = k0 + o_ek
                xe = tl.load(x_ptr + fr.to(tl.int64)[:, None] * E + kk[None, :], mask=m_f[:, None] & (kk < E)[None, :],
                             other=0.0)  # fmt: skip
                we = tl.load(ew_ptr + cols[None, :] * E + kk[:, None], mask=m_j[None, :] & (kk < E)[:, None], other=0.0)
                acc = _dot(xe, we, acc, F32)
            if HAS_EB:
                acc += tl.load(eb_ptr + cols, mask=m_j, other=0.0).to(tl.float32)[None, :]
            tl.store(encp_ptr + fr.to(tl.int64)[:, None] * J + cols[None, :], acc, mask=m_f[:, None] & m_j[None, :])
        n_sync += 1
        grid_sync(bar_ptr, n_sync * nprog)
    if TS:
        # the weights of the split products (out_w, pred_w) in TF32 halves, once per call
        _split_into(ow_ptr, ws_ptr, (V + D) * J, (V + D) * J, pid, nprog)
        _split_into(pw_ptr, ws_ptr + 2 * (V + D) * J, J * P, J * P, pid, nprog)
        if TSL:  # the LSTM's weights, the embedding and the state's hidden states (buffer 0) in halves too
            for layer in tl.static_range(L):
                if layer == 0:
                    n_ih = 4 * H * PE
                else:
                    n_ih = 4 * H * H
                at = _wl_at(layer, PE, H)
                _split_into(_layer(layer, wih0_ptr, wih1_ptr, wih2_ptr, wih3_ptr), wl_ptr + at, n_ih, n_ih, pid, nprog)
                _split_into(_layer(layer, whh0_ptr, whh1_ptr, whh2_ptr, whh3_ptr), wl_ptr + at + 2 * n_ih, 4 * H * H,
                            4 * H * H, pid, nprog)  # fmt: skip
            _split_into(emb_ptr, wl_ptr + _wl_at(L, PE, H), R * PE, R * PE, pid, nprog)
            _split_into(h_ptr, hs_ptr, L * N * H, 2 * L * N * H, pid, nprog)
        n_sync += 1
        grid_sync(bar_ptr, n_sync * nprog)
    while (n_act > 0) | (n_emit > 0):
        # the prediction network of the rows that emitted at the last step (at the start: every row, the blank)
        if n_emit > 0:
            n_rbe = n_rb  # the row blocks of the prediction network's tiles
            if COMPACT:
                n_rbe = tl.cdiv(n_emit, BB)
            if XS:
                # each emitting row's owner forms its network's input relu(sum of its context's taps) once (the
                # state's prediction output, and the projection's operand in the weights' dtype), then a barrier
                o_x = tl.arange(0, BXS)
                for r in range(pid, N, nprog):
                    if tl.load(p_priv + 3 * N + r) != 0:
                        for p0 in range(0, P, BXS):
                            pp = p0 + o_x
                            m_p = pp < P
                            x = tl.zeros([BXS], tl.float32)
                            for j in tl.static_range(K):
                                tok = tl.load(p_priv + (4 + j) * N + r + o_x * 0)  # (one token, every lane)
                                x += tl.load(table_ptr + (j * R + tok.to(tl.int64)) * P + pp, mask=m_p & (tok >= 0),
                                             other=0.0)  # fmt: skip
                            if HAS_CONV:
                                x = tl.where(x < 0.0, 0.0, x)
                            tl.store(pout_ptr + r * P + pp, x, mask=m_p)
                            if TS:
                                x_hi, x_lo = _tf32_split(x)
                                tl.store(h_ptr + r * P + pp, x_hi, mask=m_p)
                                tl.store(h_ptr + N * P + r * P + pp, x_lo, mask=m_p)
                            else:
                                tl.store(h_ptr + r * P + pp, x.to(WD), mask=m_p)
                n_sync += 1
                grid_sync(bar_ptr, n_sync * nprog)
            if not STATELESS:
                # tiles (row block, range of hidden units): the four gates of the units in one product, columns
                # q * BH + u for gate q (i, f, g, o) of unit u_lo + u
                n_ut = _ranges(H, BH, nprog // n_rbe if SPREAD else 0)
                o_g = tl.arange(0, 4 * BH)
                for layer in tl.static_range(L):
                    for tile in range(pid, n_rbe * n_ut * LS, nprog):
                        rows, m_r, e_r = _emitting_rows(p_priv, tile % n_rbe, o_b, n_emit, N, K, COMPACT)
                        ut = (tile // n_rbe) % n_ut
                        u_lo = ut * H // n_ut
                        u_hi = (ut + 1) * H // n_ut
                        units = u_lo + tl.arange(0, BH)
                        m_u = units < u_hi
                        grow = (o_g // BH) * H + u_lo + o_g % BH  # each column's row of W and of the table
                        m_g = (u_lo + o_g % BH) < u_hi
                        acc = _zeros(BB, BK, 4 * BH, FMA)
                        p_ih = _layer(layer, wih0_ptr, wih1_ptr, wih2_ptr, wih3_ptr)
                        p_hx = h_ptr + ((hp * L + layer) * N + rows[:, None]) * H  # the layer's own previous output
                        p_hw = _layer(layer, whh0_ptr, whh1_ptr, whh2_ptr, whh3_ptr) + grow[None, :] * H
                        ks = tile // (n_rbe * n_ut)  # (with LS > 1: K range ks, below)
                        if TSL:
                            # the operands' halves: K range ks of [input, own output] (LS == 1: all of it)
                            at = _wl_at(layer, PE, H)
                            if layer == 0:
                                lab = tl.load(p_priv + 2 * N + rows, mask=m_r, other=0)
                                IN = PE
                                b_in = (PE + BK - 1) // BK
                                b_lo = ks * KB0
                                b_hi = b_lo + KB0
                                p_x = wl_ptr + _wl_at(L, PE, H) + lab.to(tl.int64)[:, None] * PE
                                x_lo = R * PE
                            else:
                                IN = H
                                b_in = (H + BK - 1) // BK
                                b_lo = ks * KB1
                                b_hi = b_lo + KB1
                                p_x = hs_ptr + (((1 - hp) * L + layer - 1) * N + rows[:, None]) * H
                                x_lo = 2 * L * N * H
                            acc = _rows_range3(acc, p_x, x_lo, wl_ptr + at + grow[None, :] * IN, 4 * H * IN, e_r, m_g,
                                               IN, b_lo * BK, tl.minimum(b_hi, b_in) * BK, BK)  # fmt: skip
                            acc = _rows_range3(acc, hs_ptr + ((hp * L + layer) * N + rows[:, None]) * H, 2 * L * N * H,
                                               wl_ptr + at + 8 * H * IN + grow[None, :] * H, 4 * H * H, e_r, m_g, H,
                                               tl.maximum(b_lo - b_in, 0) * BK, tl.maximum(b_hi - b_in, 0) * BK,
                                               BK)  # fmt: skip
                        elif LS == 1:
                            if layer == 0:  # the label's embedding, through W_ih of layer 0
                                lab = tl.load(p_priv + 2 * N + rows, mask=m_r, other=0)
                                p_x = emb_ptr + lab.to(tl.int64)[:, None] * PE
                                acc = _rows_product(acc, p_x, p_ih + grow[None, :] * PE, e_r, m_g, PE, BK, UNROLL, WD,
                                                    F32, FMA)  # fmt: skip
                            else:  # the layer below's new output, through W_ih
                                p_x = h_ptr + (((1 - hp) * L + layer - 1) * N + rows[:, None]) * H
                                acc = _rows_product(acc, p_x, p_ih + grow[None, :] * H, e_r, m_g, H, BK, UNROLL, WD,
                                                    F32, FMA)  # fmt: skip
                            # the layer's own previous output, through W_hh
                            acc = _rows_product(acc, p_hx, p_hw, e_r, m_g, H, BK, UNROLL, WD, F32, FMA)
                        else:
                            # K range ks of [input, own output] concatenated: blocks [ks KB, (ks + 1) KB) of BK each
                            if layer == 0:
                                lab = tl.load(p_priv + 2 * N + rows, mask=m_r, other=0)
                                b_in = (PE + BK - 1) // BK
                                b_lo = ks * KB0
                                b_hi = b_lo + KB0
                                acc = _rows_range(acc, emb_ptr + lab.to(tl.int64)[:, None] * PE,
                                                  p_ih + grow[None, :] * PE, e_r, m_g, PE, b_lo * BK,
                                                  tl.minimum(b_hi, b_in) * BK, BK, WD, F32)  # fmt: skip
                            else:
                                b_in = (H + BK - 1) // BK
                                b_lo = ks * KB1
                                b_hi = b_lo + KB1
                                acc = _rows_range(acc, h_ptr + (((1 - hp) * L + layer - 1) * N + rows[:, None]) * H,
                                                  p_ih + grow[None, :] * H, e_r, m_g, H, b_lo * BK,
                                                  tl.minimum(b_hi, b_in) * BK, BK, WD, F32)  # fmt: skip
                            acc = _rows_range(acc, p_hx, p_hw, e_r, m_g, H, tl.maximum(b_lo - b_in, 0) * BK,
                                              tl.maximum(b_hi - b_in, 0) * BK, BK, WD, F32)  # fmt: skip
                        if LS == 1:
                            _lstm_cell(_total(acc, FMA), rows, units, grow, m_r, m_u, m_g, e_r, layer, hp,
                                       _layer(layer, bih0_ptr, bih1_ptr, bih2_ptr, bih3_ptr),
                                       _layer(layer, bhh0_ptr, bhh1_ptr, bhh2_ptr, bhh3_ptr), c_ptr, h_ptr, N, H, L,
                                       BH, HAS_LBIAS, hs_ptr, TSL)  # fmt: skip
                        else:
                            p_l = lpart_ptr + (ks * N + rows[:, None]) * (4 * H) + grow[None, :]
                            tl.store(p_l, acc, mask=e_r[:, None] & m_g[None, :])
                    if COMPACT:
                        if layer == 0:
                            _carry_idle_rows(h_ptr, p_priv, hp, pid, nprog, N, H, L, BB, BK)
                    if LS > 1:  # the partial gates summed in the order of K, the cells updated
                        n_sync += 1
                        grid_sync(bar_ptr, n_sync * nprog)
                        n_uc = tl.cdiv(H, BH)
                        for tile in range(pid, n_rbe * n_uc, nprog):
                            rows, m_r, e_r = _emitting_rows(p_priv, tile % n_rbe, o_b, n_emit, N, K, COMPACT)
                            units = (tile // n_rbe) * BH + tl.arange(0, BH)
                            m_u = units < H
                            o_g4 = tl.arange(0, 4 * BH)
                            grow = (o_g4 // BH) * H + (tile // n_rbe) * BH + o_g4 % BH
                            m_g = ((tile // n_rbe) * BH + o_g4 % BH) < H
                            m_rg = e_r[:, None] & m_g[None, :]
                            p_l = lpart_ptr + rows[:, None] * (4 * H) + grow[None, :]
                            gates = tl.load(p_l, mask=m_rg, other=0.0, cache_modifier=".cg")
                            for k2 in tl.static_range(1, LS):
                                gates += tl.load(p_l + k2 * N * 4 * H, mask=m_rg, other=0.0, cache_modifier=".cg")
                            _lstm_cell(gates, rows, units, grow, m_r, m_u, m_g, e_r, layer, hp,
                                       _layer(layer, bih0_ptr, bih1_ptr, bih2_ptr, bih3_ptr),
                                       _layer(layer, bhh0_ptr, bhh1_ptr, bhh2_ptr, bhh3_ptr), c_ptr, h_ptr, N, H, L,
                                       BH, HAS_LBIAS, hs_ptr, TSL)  # fmt: skip
                    ev = _stamp(prof_ptr, ev, 4, PROFILE)
                    n_sync += 1
                    grid_sync(bar_ptr, n_sync * nprog)
                    ev = _stamp(prof_ptr, ev, 5, PROFILE)
                hp = 1 - hp
            # the projection g = pred_w @ out + pred_b of the emitting rows: tiles (row block, range of J, range ks
            # of K: [ks KP, (ks + 1) KP))
            n_jt = _ranges(J, BJ, nprog // n_rbe if SPREAD else 0)
            for tile in range(pid, n_rbe * n_jt * PS, nprog):
                rows, m_r, e_r = _emitting_rows(p_priv, tile % n_rbe, o_b, n_emit, N, K, COMPACT)
                jt = (tile // n_rbe) % n_jt
                ks = tile // (n_rbe * n_jt)
                j_lo = jt * J // n_jt
                jj = j_lo + tl.arange(0, BJ)
                m_j = jj < (jt + 1) * J // n_jt
                acc = _zeros(BB, BK, BJ, FMA)
                if TS and (XS or TSL):  # the operands' halves as they are
                    if XS:
                        p_x = h_ptr + rows[:, None] * P
                        x_lo = N * P
                    else:  # the last layer's output, and its value kept for the returned state (first column range)
                        p_x = hs_ptr + ((hp * L + L - 1) * N + rows[:, None]) * H
                        x_lo = 2 * L * N * H
                        for k0 in tl.range(ks * KP, ks * KP + KP, BK):
                            kk = k0 + o_k
                            m_rk = e_r[:, None] & (kk < P)[None, :] & (o_b * 0 + jt == 0)[:, None]
                            tl.store(pout_ptr + rows[:, None] * P + kk[None, :],
                                     tl.load(h_ptr + ((hp * L + L - 1) * N + rows[:, None]) * H + kk[None, :],
                                             mask=m_rk, other=0.0, cache_modifier=".cg"), mask=m_rk)  # fmt: skip
                    acc = _rows_range3(acc, p_x, x_lo, ws_ptr + 2 * (V + D) * J + jj[None, :] * P, J * P, e_r, m_j, P,
                                       ks * KP, ks * KP + KP, BK)  # fmt: skip
                else:
                    for k0 in tl.range(ks * KP, ks * KP + KP, BK, loop_unroll_factor=UNROLL):
                        kk = k0 + o_k
                        m_rk = e_r[:, None] & (kk < P)[None, :]
                        if XS:
                            x = tl.load(
                                h_ptr + rows[:, None] * P + kk[None, :], mask=m_rk, other=0.0, cache_modifier=".cg"
                            )
                        elif STATELESS:
                            x = tl.zeros([BB, BK], tl.float32)
                            for j in tl.static_range(K):
                                tok = tl.load(p_priv + (4 + j) * N + rows, mask=m_r, other=-1)
                                x += tl.load(table_ptr + (j * R + tok.to(tl.int64)[:, None]) * P + kk[None, :],
                                             mask=m_rk & (tok >= 0)[:, None], other=0.0)  # fmt: skip
                            if HAS_CONV:
                                x = tl.where(x < 0.0, 0.0, x)
                        else:
                            x = tl.load(h_ptr + ((hp * L + L - 1) * N + rows[:, None]) * H + kk[None, :], mask=m_rk,
                                        other=0.0, cache_modifier=".cg")  # fmt: skip
                        w = tl.load(
                            pw_ptr + jj[None, :] * P + kk[:, None], mask=m_j[None, :] & (kk < P)[:, None], other=0.0
                        )
                        acc = _mm(x.to(WD), w, acc, F32, FMA)
                        if not XS:  # the prediction network's output, kept for the returned state (by
                            # the first range's tiles)
                            tl.store(pout_ptr + rows[:, None] * P + kk[None, :], x,
                                     mask=m_rk & (o_b * 0 + jt == 0)[:, None])  # fmt: skip
                acc = _total(acc, FMA)
                ev = _stamp(prof_ptr, ev, 10, PROFILE)
                if HAS_PB:
                    acc += tl.load(pb_ptr + jj, mask=m_j & (jj * 0 + ks == 0), other=0.0).to(tl.float32)[None, :]
                if (not F32) and PS == 1:
                    acc = acc.to(WD).to(tl.float32)
                tl.store(g_ptr + (ks * N + rows[:, None]) * J + jj[None, :], acc, mask=e_r[:, None] & m_j[None, :])
            ev = _stamp(prof_ptr, ev, 6, PROFILE)
            n_sync += 1
            grid_sync(bar_ptr, n_sync * nprog)
            ev = _stamp(prof_ptr, ev, 7, PROFILE)
        if n_act > 0:
            ev = _stamp(prof_ptr, ev, 0, PROFILE)
            kb = step % 3
            pb = step % 2
            # 1. joint logits of the active rows at frames t .. t + SPEC - 1 (the window: pair p = row * SPEC +
            # offset, those inside the utterance): tiles (pair block, range of output columns, range of K) over the
            # V + D columns; with JS > 1 ranges of K, each tile's partial logits in plog, summed in a fixed order by
            # the (pair block, column range) tiles after a barrier
            if JH:
                # the hidden layer act(enc + pred) of every pair, once (tiles: pair block, BHJ columns), then a
                # barrier: the products' tiles read it as their operand
                n_hc = tl.cdiv(J, BHJ)
                for tile in range(pid, n_pb * n_hc, nprog):
                    pairs = (tile % n_pb) * BP + o_p
                    jj = (tile // n_pb) * BHJ + tl.arange(0, BHJ)
                    rows, t_r, a_r = _pair_frames(p_priv, pairs, NP, N, SPEC, T)
                    m_rj = a_r[:, None] & (jj < J)[None, :]
                    x = _joint_hidden(encp_ptr, g_ptr, rows, t_r, jj, m_rj, N, T, J, PS, F32, WD, ACT)
                    if TS:
                        x_hi, x_lo = _tf32_split(x)
                        tl.store(hj_ptr + pairs[:, None] * J + jj[None, :], x_hi, mask=m_rj)
                        tl.store(hj_ptr + NP * J + pairs[:, None] * J + jj[None, :], x_lo, mask=m_rj)
                    else:
                        tl.store(hj_ptr + pairs[:, None] * J + jj[None, :], x, mask=m_rj)
                ev = _stamp(prof_ptr, ev, 11, PROFILE)
                n_sync += 1
                grid_sync(bar_ptr, n_sync * nprog)
                ev = _stamp(prof_ptr, ev, 12, PROFILE)
            n_ct = _ranges(V + D, BV, nprog // n_pb if SPREAD else 0)
            for tile in range(pid, n_pb * n_ct * JS, nprog):
                pairs = (tile % n_pb) * BP + o_p
                ct = (tile // n_pb) % n_ct
                k_lo = (tile // (n_pb * n_ct)) * KJ
                c_lo = ct * (V + D) // n_ct
                c_hi = (ct + 1) * (V + D) // n_ct
                cols = c_lo + tl.arange(0, BV)
                m_c = cols < c_hi
                rows, t_r, a_r = _pair_frames(p_priv, pairs, NP, N, SPEC, T)
                acc = _zeros(BP, BK, BV, FMA)
                if TS and JH:  # the operands' halves as they are
                    acc = _rows_range3(acc, hj_ptr + pairs[:, None] * J, NP * J, ws_ptr + cols[None, :] * J,
                                       (V + D) * J, a_r, m_c, J, k_lo, k_lo + KJ, BK)  # fmt: skip
                else:
                    for k0 in tl.range(k_lo, k_lo + KJ, BK, loop_unroll_factor=UNROLL):
                        kk = k0 + o_k
                        m_rk = a_r[:, None] & (kk < J)[None, :]
                        if JH:
                            x = tl.load(hj_ptr + pairs[:, None] * J + kk[None, :], mask=m_rk, other=0.0,
                                        cache_modifier=".cg")  # fmt: skip
                        else:
                            x = _joint_hidden(encp_ptr, g_ptr, rows, t_r, kk, m_rk, N, T, J, PS, F32, WD, ACT)
                        w = tl.load(
                            ow_ptr + cols[None, :] * J + kk[:, None], mask=m_c[None, :] & (kk < J)[:, None], other=0.0
                        )
                        acc = _mm(x, w, acc, F32, FMA)
                ev = _stamp(prof_ptr, ev, 8, PROFILE)
                if JS == 1:
                    _joint_outputs(_total(acc, FMA), pairs, cols, m_c, a_r, c_lo, c_hi, ct, ob_ptr, key_ptr,
                                   part_ptr, kb, pb, NP, NCB, V, HAS_OB, HAS_DUR, F32, WD)  # fmt: skip
                else:
                    p_l = plog_ptr + ((tile // (n_pb * n_ct)) * NP + pairs[:, None]) * (V + D) + cols[None, :]
                    tl.store(p_l, _total(acc, FMA), mask=a_r[:, None] & m_c[None, :])
            if JS > 1:
                n_sync += 1
                grid_sync(bar_ptr, n_sync * nprog)
                ev = _stamp(prof_ptr, ev, 9, PROFILE)
                n_rs = tl.cdiv(NP, BR)
                for tile in range(pid, n_rs * n_ct, nprog):
                    pairs = (tile % n_rs) * BR + tl.arange(0, BR)
                    ct = tile // n_rs
                    c_lo = ct * (V + D) // n_ct
                    c_hi = (ct + 1) * (V + D) // n_ct
                    cols = c_lo + tl.arange(0, BV)
                    m_c = cols < c_hi
                    m_r = pairs < NP
                    a_r = pairs % SPEC < tl.load(p_priv + N + pairs // SPEC, mask=m_r, other=0)
                    m_rc = a_r[:, None] & m_c[None, :]
                    p_l = plog_ptr + pairs[:, None] * (V + D) + cols[None, :]
                    logits = tl.load(p_l, mask=m_rc, other=0.0, cache_modifier=".cg")
                    for ks in tl.static_range(1, JS):  # in the order of K
                        logits += tl.load(p_l + ks * NP * (V + D), mask=m_rc, other=0.0, cache_modifier=".cg")
                    _joint_outputs(logits, pairs, cols, m_c, a_r, c_lo, c_hi, ct, ob_ptr, key_ptr, part_ptr, kb, pb,
                                   NP, NCB, V, HAS_OB, HAS_DUR, F32, WD)  # fmt: skip
            ev = _stamp(prof_ptr, ev, 1, PROFILE)
            n_sync += 1
            grid_sync(bar_ptr, n_sync * nprog)
            ev = _stamp(prof_ptr, ev, 2, PROFILE)
            # 2. the decision, every row in every program: the walk through the window's frames, each one's
            # decision as the label-looping rule takes it (a blank moves on by its duration, at least 1, inside the
            # window and the utterance), to the first label (then the prediction network changes: the step ends)
            # or out of the window
            m_w = active[:, None] & (o_f[None, :] < tl.minimum(L_n - t_n, SPEC)[:, None])
            p_key = key_ptr + (kb * 2) * NP + o_n[:, None] * SPEC + o_f[None, :]
            keys = tl.load(p_key, mask=m_w, other=_NO_KEY, cache_modifier=".cg")
            if HAS_DUR:
                dkeys = tl.load(p_key + NP, mask=m_w, other=_NO_KEY, cache_modifier=".cg")
            walk = tl.zeros([BLOCK_N], tl.int32)  # the walk's offset in the window
            going = active
            emit = active & False
            label = tl.zeros([BLOCK_N], tl.int32) + blank
            value = tl.zeros([BLOCK_N], tl.float32)
            dur = tl.zeros([BLOCK_N], tl.int32)  # the label's duration (RNN-T: 0)
            for j in tl.static_range(SPEC):
                here = going & (walk == j)
                v_j, l_j = _unkey(tl.sum(tl.where(o_f[None, :] == j, keys, 0), 1))
                em = here & (l_j != blank)
                d_j = tl.zeros([BLOCK_N], tl.int32)
                if HAS_DUR:
                    _, di = _unkey(tl.sum(tl.where(o_f[None, :] == j, dkeys, 0), 1))
                    d_j = tl.sum(tl.where(o_d[None, :] == di[:, None], durs_v[None, :], 0), 1)
                emit = emit | em
                label = tl.where(em, l_j, label)
                value = tl.where(em, v_j, value)
                dur = tl.where(em, d_j, dur)
                blank_here = here & (l_j == blank)
                walk = tl.where(blank_here, walk + tl.maximum(d_j, 1), walk)
                at_frame = tl.where(blank_here, 0, at_frame)
                going = going & ~em & (walk < L_n - t_n)
            # the owner's outputs: score = logit - logsumexp over the token logits (partials of the column blocks)
            m_own = own & emit
            o_cb = tl.arange(0, NCB_P2)
            m_c = m_own[:, None] & (o_cb < NCB)[None, :]
            p_part = part_ptr + ((pb * 2) * NP + o_n[:, None] * SPEC + walk[:, None]) * NCB + o_cb[None, :]
            pm = tl.load(p_part, mask=m_c, other=float("-inf"), cache_modifier=".cg")
            ps = tl.load(p_part + NP * NCB, mask=m_c, other=0.0, cache_modifier=".cg")
            lse_m = tl.max(pm, 1)
            safe = tl.where(lse_m == float("-inf"), 0.0, lse_m)
            score = value - (safe + tl.log(tl.sum(ps * tl.exp(pm - safe[:, None]), 1)))
            slot = tl.minimum(k_n, S - 1).to(tl.int64)
            p_out = o_n.to(tl.int64) * S + slot
            tl.store(tok_ptr + p_out, label.to(tl.int64), mask=m_own)
            tl.store(frm_ptr + p_out, (t_n + walk).to(tl.int64) + fofs, mask=m_own)
            tl.store(dout_ptr + p_out, dur.to(tl.int64), mask=m_own)
            tl.store(sc_ptr + p_out, score, mask=m_own)
            # the slots of two steps ahead, read by every program before the barrier above
            nb = (step + 2) % 3
            m_slots = own[:, None] & (o_f < SPEC)[None, :]
            p_reset = key_ptr + (nb * 2) * NP + o_n[:, None] * SPEC + o_f[None, :]
            tl.store(p_reset, tl.full([BLOCK_N, FP], _NO_KEY, tl.int64), mask=m_slots)
            tl.store(p_reset + NP, tl.full([BLOCK_N, FP], _NO_KEY, tl.int64), mask=m_slots)
            k_n += emit.to(tl.int32)
            # a label's advance (its duration), after max_symbols labels at one frame 1
            at_frame = tl.where(emit, tl.where(dur == 0, at_frame + 1, 0), at_frame)
            forced = emit & (at_frame >= max_symbols)
            adv = tl.where(forced, 1, dur)
            at_frame = tl.where(forced, 0, at_frame)
            t_n = tl.where(active, t_n + walk + tl.where(emit, adv, 0), t_n)
            active = active & (t_n < L_n)
            n_act = tl.sum(active.to(tl.int32), 0)
            n_emit = tl.sum(emit.to(tl.int32), 0)
            tl.store(p_priv + o_n, t_n, mask=m_n)
            tl.store(p_priv + N + o_n, tl.where(active, L_n - t_n, 0), mask=m_n)
            tl.store(p_priv + 2 * N + o_n, label, mask=m_n)
            tl.store(p_priv + 3 * N + o_n, emit.to(tl.int32), mask=m_n)
            _list_emitting(p_priv, o_n, emit, N, K, COMPACT)
            if STATELESS:
                for j in tl.static_range(K - 1):
                    prev = tl.load(p_priv + (5 + j) * N + o_n, mask=m_n, other=-1)
                    cur = tl.load(p_priv + (4 + j) * N + o_n, mask=m_n, other=-1)
                    tl.debug_barrier()
                    tl.store(p_priv + (4 + j) * N + o_n, tl.where(emit, prev, cur), mask=m_n)
                last = tl.load(p_priv + (3 + K) * N + o_n, mask=m_n, other=-1)
                tl.debug_barrier()
                tl.store(p_priv + (3 + K) * N + o_n, tl.where(emit, label, last), mask=m_n)
            tl.debug_barrier()
            ev = _stamp(prof_ptr, ev, 3, PROFILE)
            step += 1
        else:
            n_emit = n_emit * 0
    # the owners' final values: lengths, the frames jumped past the end and decoded in all, the padding past each
    # hypothesis, the prediction network's state
    tl.store(nout_ptr + o_n, k_n.to(tl.int64), mask=own)
    tl.store(nout_ptr + N + o_n, (t_n - L_n).to(tl.int64), mask=own)
    tl.store(nout_ptr + 2 * N + o_n, fofs + L_n, mask=own)
    o_s = tl.arange(0, BS)
    for n in range(pid, N, nprog):
        k = tl.sum(tl.where(o_n == n, k_n, 0), 0)
        for s0 in range(0, S, BS):
            ss = s0 + o_s
            m_s = (ss >= k) & (ss < S)
            p_s = (tl.zeros([], tl.int64) + n) * S + ss
            tl.store(tok_ptr + p_s, tl.full([BS], -1, tl.int64), mask=m_s)
            tl.store(frm_ptr + p_s, tl.full([BS], -1, tl.int64), mask=m_s)
            if HAS_DUR:
                tl.store(dout_ptr + p_s, tl.full([BS], -1, tl.int64), mask=m_s)
            tl.store(sc_ptr + p_s, tl.zeros([BS], tl.float32), mask=m_s)
    for p0 in range(0, P, BK):  # the prediction output, in the weights' dtype
        pp = p0 + o_k
        m = own[:, None] & (pp < P)[None, :]
        src = o_n[:, None] * P + pp[None, :]
        tl.store(oout_ptr + src, tl.load(pout_ptr + src, mask=m, other=0.0, cache_modifier=".cg").to(WD), mask=m)
    if STATELESS:
        for j in tl.static_range(K):
            tl.store(ctxout_ptr + o_n * K + j, tl.load(p_priv + (4 + j) * N + o_n, mask=own, other=-1).to(tl.int64),
                     mask=own)  # fmt: skip
    else:
        for layer in tl.static_range(L):
            for h0 in range(0, H, BK):
                hh = h0 + o_k
                m = own[:, None] & (hh < H)[None, :]
                src = (layer * N + o_n[:, None]) * H + hh[None, :]
                tl.store(hout_ptr + src, tl.load(h_ptr + hp * L * N * H + src, mask=m, other=0.0,
                                                 cache_modifier=".cg").to(WD), mask=m)  # fmt: skip
                tl.store(cout_ptr + src, tl.load(c_ptr + src, mask=m, other=0.0, cache_modifier=".cg").to(WD), mask=m)


@triton.jit
def _layer(layer: tl.constexpr, p0, p1, p2, p3):
    """The pointer of LSTM layer ``layer`` (< MAX_LAYERS) among the four."""
    if layer == 0:
        return p0
    elif layer == 1:
        return p1
    elif layer == 2:
        return p2
    else:
        return p3


def window(N: int, fma: bool, kind: str) -> int:
    """The joint's frames per row and step (WINDOWS) for N rows of a kind of model (rnnt, stateless, tdt)."""
    if fma:
        return WINDOWS["fma"][kind]
    spec = 1
    while spec < WINDOWS["most"] and N * spec * 2 <= WINDOWS["pairs"][kind]:
        spec *= 2
    return spec


def _programs(device: torch.device) -> int:
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return 1  # the interpreter runs programs one after the other: one program, so the barriers pass
    return torch.cuda.get_device_properties(device).multi_processor_count


def conv_taps(w) -> torch.Tensor:
    """A stateless prediction network's conv as per-token tables [K, R, P] float32 (tap k of every token row:
    the conv of a context is the sum of its K tokens' rows, then the relu), or the embedding [1, R, P] without a
    conv. Derived every call: a cache keyed on the tensors' version counters would miss changes through ``.data``."""
    f32 = torch.float32
    R, P = w.embedding.shape
    if w.conv is None:
        return w.embedding.to(f32)[None].contiguous()
    G, K = w.groups, w.context_size
    gs = P // G
    wc = w.conv.to(f32).reshape(G, P // G, gs, K)
    return torch.einsum("gojk,vgj->kvgo", wc, w.embedding.to(f32).reshape(R, G, gs)).reshape(K, R, P).contiguous()


_PHASES = (
    "step",
    "joint tiles",
    "joint barrier",
    "decision",
    "LSTM layer tiles",
    "LSTM barrier",
    "projection tiles",
    "projection barrier",
    "joint products",
    "joint split barrier",
    "projection products",
    "joint hidden",
    "joint hidden barrier",
)


class _Layout:
    """Flat pieces of one allocation of ``dtype``: piece i has ``shapes[i]`` (contiguous) and ``dtypes[i]`` (default
    ``dtype``; its size counts its own elements) and starts on a multiple of 16 elements of ``dtype`` (aligned
    pointers for the kernel's loads). Computed once; ``carve`` allocates and views (one view per piece)."""

    def __init__(self, dtype: torch.dtype, shapes: list[tuple[int, ...]], dtypes: tuple = ()) -> None:
        self.dtype = dtype
        self.pieces = []  # (dtype, shape, stride, offset in its dtype's elements)
        total = 0
        for i, shape in enumerate(shapes):
            d = dtypes[i] if i < len(dtypes) else dtype
            n = math.prod(shape)
            self.pieces.append((d, shape, tuple(math.prod(shape[j + 1 :]) for j in range(len(shape))),
                                total * dtype.itemsize // d.itemsize))  # fmt: skip
            words = -(-n * d.itemsize // dtype.itemsize)  # elements of dtype that hold the piece
            total += -(-words // 16) * 16
        self.total = total
        self.other = sorted({d for d, *_ in self.pieces if d != dtype}, key=str)

    def carve(self, alloc, device) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(the allocation, its pieces) from ``alloc`` (torch.zeros, torch.empty, kernel_output)."""
        buf = alloc(self.total, dtype=self.dtype, device=device)
        views = {self.dtype: buf}
        for d in self.other:
            views[d] = buf.view(d)
        return buf, [views[d].as_strided(shape, stride, at) for d, shape, stride, at in self.pieces]


def transducer_greedy(
    w,
    x: torch.Tensor,
    lengths: torch.Tensor | None,
    state,
    blank: int,
    durations: tuple[int, ...] | None,
    max_symbols: int,
    plans: dict | None = None,
    profile: torch.Tensor | None = None,
):
    """The kernel's launch: (Hypotheses' tensors: tokens, lengths, frames, scores, durations; then the state's:
    predictor, output, time jumps, frames decoded) as the PyTorch path's ``transducer_greedy_reference`` (w:
    TransducerWeights of float32/bfloat16 tensors; x [N, T, E] contiguous in w's dtype; lengths (None: T each;
    clamped to [0, T] here) and state (None: the start) on x's device). ``plans``: a cache of ``GreedyPlan`` for
    calls with these weights (the caller empties it when the weights change), or None (a plan for this call).
    ``profile``: an int64 [E, 2] tensor that receives program 0's first E events (_PHASES index, global timer ns)
    on a GPU."""
    N, T, _ = x.shape
    key = (N, T, state is None, blank, durations, max_symbols, x.device)
    plan = None if plans is None else plans.get(key)
    if plan is None:
        plan = GreedyPlan(w, N, T, state is None, blank, durations, max_symbols, x.device)
        if plans is not None and plan.reusable:
            while len(plans) >= MAX_PLANS:  # batches of ever new shapes: the oldest plans go
                plans.pop(next(iter(plans)))
            plans[key] = plan
    return plan(x, lengths, state, profile)


class GreedyPlan:
    """One configuration's launch (weights, batch size N, frames T, start or continuation, blank, durations,
    max_symbols), computed once and called per batch: the tiles, the launch's constant arguments, the scratch's
    layout, the default lengths. A call allocates the outputs, zeroes the scratch and launches: a few host
    operations (the eager call's time is the host's time to the launch plus the kernel's). A decoder keeps up to
    MAX_PLANS of them.

    The scratch is kept per CUDA stream and thread (one thread's calls on one stream run in order, so one buffer
    serves them; zeroed by each call) except while a CUDA graph is being captured (then a new one, the graph's
    own). The weights are held as they are (a call reads their current values; a stateless network's tables are
    derived from them each call); ``reusable`` is False when the plan holds a contiguous copy of one (derived from
    its values): such a plan serves one call."""

    _serials = itertools.count()

    def __init__(
        self,
        w,
        N: int,
        T: int,
        start: bool,
        blank: int,
        durations: tuple[int, ...] | None,
        max_symbols: int,
        dev: torch.device,
    ) -> None:
        self.serial = next(GreedyPlan._serials)  # the launch key's part for everything fixed here
        self.w, self.N, self.T, self.start, self.device = w, N, T, start, dev
        wd = w.enc_w.dtype
        f32 = torch.float32
        D = len(durations) if durations else 0
        V = w.out_w.shape[0] - D
        J = w.enc_w.shape[0]
        S = T * max_symbols
        R, PE = w.embedding.shape
        E = w.enc_w.shape[1]
        # filled on the device, not copied from the host: a plan may be made while a CUDA graph is captured (the
        # eager calls before the capture took greedy's other route)
        self.durations_tensor = torch.empty(len(durations or (1,)), dtype=torch.int64, device=dev)
        for i, d in enumerate(durations or (1,)):
            self.durations_tensor[i].fill_(d)
        self.lengths = torch.full((N,), T, dtype=torch.int64, device=dev)
        weights = [w.embedding, *(t for layer in w.lstm for t in layer if t is not None)]
        weights += [t for t in (w.enc_w, w.enc_b, w.pred_w, w.pred_b, w.out_w, w.out_b) if t is not None]
        self.reusable = all(t.is_contiguous() for t in weights)
        emb = w.embedding if w.embedding.is_contiguous() else w.embedding.contiguous()
        if w.stateless:
            P, H, L, K = PE, 1, 1, w.context_size
            table = None  # derived from the weights' values each call
            lstm, has_lbias = [emb] * 4 * MAX_LAYERS, False
        else:
            L, H, K = len(w.lstm), w.lstm[0][1].shape[1], 1
            P = H
            table = self.durations_tensor
            has_lbias = all(t is not None for layer in w.lstm for t in layer[2:])
            # the layers' tensors where they are (no stacked copy per call): W_ih, W_hh, b_ih, b_hh of each layer
            lstm = [
                t if t.is_contiguous() else t.contiguous()
                for q in range(4)
                for t in [layer[q] if q < 2 or has_lbias else emb for layer in w.lstm] + [emb] * (MAX_LAYERS - L)
            ]
        self.L, self.H, self.P, self.K = L, H, P, K
        # a few rows: FMA products over thin tiles, so that every program has a tile of each phase and loads it at
        # once; more: tensor-core tiles
        fma = self.fma = N <= SMALL_BATCH
        # the encoder projection: in the kernel for a few rows (one launch less: host time), else one matrix
        # product before it (cuBLAS; float32 without TF32: the kernel's tiles took longer at 128 x 15 s)
        self.encp_size = N * T * J
        nprog = self.nprog = _programs(dev)
        if fma:
            BB = max(1, next_power_of_2(N))
            BK = min(next_power_of_2(max(J, H, P, PE)), TILES["fma_elements"] // (32 * BB))
            # K loops unrolled: every block's loads issued before the products need them
            unroll = cdiv(max(J, H, P, PE), BK)
            tiles = dict(BB=BB, BV=8, BK=BK, BH=8, BJ=8, UNROLL=unroll, num_warps=TILES["fma_warps"])
        else:
            tiles = dict(
                BB=min(max(16, next_power_of_2(N)), TILES["dot_bb"]),
                BV=TILES["dot_bv"],
                BK=TILES["dot_bk"],
                BH=TILES["dot_bh"],
                BJ=TILES["dot_bj"],
                UNROLL=1,
                num_warps=TILES["dot_warps"],
                num_stages=TILES["dot_stages"],
            )
        tiles["SPREAD"] = fma or TILES["dot_spread"]
        n_rb = cdiv(N, tiles["BB"])
        # the joint's window: SPEC frames per row and step (pairs of a row and a frame offset), in blocks of BP pairs
        spec = TILES["window"] or window(N, fma, "tdt" if D else "stateless" if w.stateless else "rnnt")
        BP = next_power_of_2(N * spec) if fma else min(max(16, next_power_of_2(N * spec)), TILES["dot_bb"])
        tiles.update(SPEC=spec, FP=next_power_of_2(spec), BP=BP)
        n_pb = cdiv(N * spec, BP)
        # the LSTM layers' tensor-core tiles: (row block, range of hidden units), and LS ranges of K (each of KB0
        # blocks for layer 0, KB1 for the others) while the split tiles still fit one wave of programs; their
        # partial gates are summed after a barrier. At 128 rows (80 tiles on 132 programs) no split: splits of
        # taller tiles lost there (benchmarks/notes/decode.md)
        BK = tiles["BK"]
        LS = 1
        if not fma and not w.stateless:
            n_ut = min(cdiv(H, tiles["BH"]), H)
            LS = max(TILES["dot_lstm_splits_min"], min(TILES["dot_lstm_splits"], nprog // (n_rb * n_ut)))
            LS = min(LS, cdiv(PE, BK) + cdiv(H, BK))
        b_hh = cdiv(H, BK)
        tiles.update(LS=LS, KB0=cdiv(cdiv(PE, BK) + b_hh, LS), KB1=cdiv(2 * b_hh, LS))
        # the joint's column ranges, and with tensor-core tiles JS ranges of K too (KJ each): all
        # dot_joint_splits of them when the split tiles fit one wave of programs, else none (fewer ranges lost
        # to the barrier and the sums they add: benchmarks/notes/decode.md)
        NCB = min(max(cdiv(V + D, tiles["BV"]), nprog // n_pb if tiles["SPREAD"] else 0), V + D)
        k_blocks = cdiv(J, tiles["BK"])
        JS = TILES["dot_joint_splits"] if n_pb * NCB * TILES["dot_joint_splits"] <= nprog else 1
        JS = 1 if fma else min(max(JS, TILES["dot_joint_splits_min"]), k_blocks)
        tiles.update(JS=JS, KJ=cdiv(k_blocks, JS) * tiles["BK"])
        # the split's sums: tiles of (BR rows, a column range), BR below the products' BB (the sum of JS partial
        # [BR, BV] blocks in registers, and more programs)
        tiles.update(BR=min(tiles["BB"], TILES["dot_sum_rows"]))
        xs = w.stateless and TILES["stateless_input"]  # (XS: a stateless network's only)
        tiles.update(XS=xs, BXS=min(next_power_of_2(PE), 1024))
        jh = not fma and TILES["hidden_pairs"] is not None and N * spec >= TILES["hidden_pairs"]
        f32_dots = wd == torch.float32 and not fma and TILES["split_f32"]
        tsl = f32_dots and not w.stateless and not TILES["compact"] and TILES["split_f32_lstm"]
        ts = f32_dots and (jh or xs or tsl)
        tiles.update(JH=jh, BHJ=min(next_power_of_2(J), TILES["hidden_cols"]), TS=ts, TSL=tsl)
        # the projection's ranges of K: with the hidden layer formed once, as many as fit the programs beside its
        # (row block, column range) tiles, at most dot_proj_splits
        p_blocks = cdiv(P, BK)
        PS = min(TILES["dot_proj_splits"], nprog // (n_rb * cdiv(J, tiles["BJ"])))
        PS = min(max(PS, TILES["dot_proj_splits_min"]), p_blocks) if jh else 1
        tiles.update(PS=PS, KP=cdiv(p_blocks, PS) * BK)
        # one allocation per kind, carved into 16-element-aligned pieces. The scratch, zeroed (32-bit words): h and
        # g (the weights' dtype: the products read them so, half the bytes in 16 bits), c, the prediction output,
        # the partial sums, the LSTM's partial gates and the joint's partial logits (float32; zero: the zero
        # state), the packed keys (int64; zero: empty), each program's row values and the barrier (int32), the
        # joint's hidden layer (JH; the weights' dtype), the hidden states' TF32 halves (TSL)
        lpart_size = LS * N * 4 * H if LS > 1 else 1
        NP = N * spec
        plog_size = JS * NP * (V + D) if JS > 1 else 1
        hj_size = (2 if ts else 1) * NP * J if jh else 1
        ws_size = 2 * ((V + D) * J + J * P) if ts else 1
        wl_size = 8 * H * (PE + H) + (L - 1) * 16 * H * H + 2 * R * PE if tsl else 1
        hs_size = 4 * L * N * H if tsl else 1
        i32, i64 = torch.int32, torch.int64
        h_size = (2 if ts else 1) * N * P if xs else 2 * L * N * H  # (a stateless network's input, with XS)
        g_piece = ((PS, N, J), f32) if PS > 1 else ((N, J), wd)
        pieces = [((h_size,), wd), ((L, N, H), f32), g_piece, ((N, P), f32), ((4 * NP * NCB,), f32)]
        pieces += [((lpart_size,), f32), ((plog_size,), f32), ((3 * 2 * NP,), i64), ((nprog * (5 + K) * N,), i32)]
        pieces += [((1,), i32), ((hj_size,), wd), ((hs_size,), f32)]
        self.scratch_layout = _Layout(i32, *(list(v) for v in zip(*pieces, strict=True)))
        # the weights' TF32 halves (TS, TSL): written in full by the kernel before it reads them, not zeroed
        self.split_layout = _Layout(f32, [(ws_size,), (wl_size,)])
        self._scratch: dict[tuple[int, int], tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]] = {}
        # the outputs, one allocation per group (few host operations; the kernel only stores to them): tokens,
        # frames, durations [3, N, S] and the rows' values [3, N] (int64), the scores [N, S] (float32), the final
        # state in the weights' dtype: an LSTM's h and c [2, L, N, H] or a stateless network's context [N, K]
        # (int64), and the prediction output [N, P]
        self.S, self.wd = S, wd
        self.has_durations = D > 0
        # the launch's arguments fixed here, around those of each call (the joint's tensors packed: the kernel
        # reads them as such; absent biases replaced by their weights, unread)
        enc_w, pred_w, out_w = (t if t.is_contiguous() else t.contiguous() for t in (w.enc_w, w.pred_w, w.out_w))
        enc_b, pred_b, out_b = (
            wt if b is None else b if b.is_contiguous() else b.contiguous()
            for wt, b in ((enc_w, w.enc_b), (pred_w, w.pred_b), (out_w, w.out_b))
        )
        self.args_weights = (enc_w, enc_b)
        self.args_tables = (emb, *lstm)
        self.table = table
        self.args_joint = (pred_w, pred_b, out_w, out_b, self.durations_tensor)
        self.args_ints = (N, T, S, R, NCB, blank, max_symbols)
        self.options = dict(
            E=E, ENC=fma, HAS_EB=w.enc_b is not None, EB=64, EJ=64, EK=32, J=J, H=H, P=P, PE=PE, V=V, D=D, L=L, K=K,
            FMA=fma, STATELESS=w.stateless, HAS_CONV=w.conv is not None, HAS_DUR=D > 0,
            ACT=("relu", "tanh", "sigmoid").index(w.activation), F32=wd == f32, BLOCK_N=max(16, next_power_of_2(N)),
            NCB_P2=next_power_of_2(NCB), BD=next_power_of_2(max(D, 1)), HAS_LBIAS=has_lbias,
            HAS_PB=w.pred_b is not None, HAS_OB=w.out_b is not None, BS=min(1024, next_power_of_2(S)), START=start,
            PROFILE=0, COMPACT=TILES["compact"], **tiles,
        )  # fmt: skip
        self.launcher = launch(_transducer_greedy_kernel)

    def scratch(self) -> list[torch.Tensor]:
        """The scratch's pieces, zeroed (in stream order), then the weights' halves (not zeroed)."""
        dev = self.device
        if dev.type != "cuda" or torch.cuda.is_current_stream_capturing():
            return [*self.scratch_layout.carve(torch.zeros, dev)[1], *self.split_layout.carve(torch.empty, dev)[1]]
        # per stream and thread: calls on one stream run in order, but two threads' zeroing and launches interleave
        where = (torch._C._cuda_getCurrentRawStream(dev.index), threading.get_ident())
        kept = self._scratch.get(where)
        if kept is None:
            kept = self._scratch[where] = (
                *self.scratch_layout.carve(torch.zeros, dev),
                self.split_layout.carve(torch.empty, dev)[1],
            )
        else:
            kept[0].zero_()
        return [*kept[1], *kept[2]]

    def __call__(self, x: torch.Tensor, lengths: torch.Tensor | None, state, profile: torch.Tensor | None = None):
        w, N, L, H = self.w, self.N, self.L, self.H
        dev = self.device
        wd = w.enc_w.dtype
        start = self.start
        if lengths is None:
            lengths = self.lengths
        encp = torch.empty(self.encp_size, dtype=wd, device=dev) if self.fma else F.linear(x, w.enc_w, w.enc_b)
        h, c, g, pout, part, lpart, plog, keys, priv, bar, hj, hs, ws, wl = self.scratch()
        if start:
            t0 = fofs = lengths
            ctx0 = self.durations_tensor
        else:
            if not w.stateless:
                h[: L * N * H].view(L, N, H).copy_(state.predictor[0])
                c.copy_(state.predictor[1])
            g.view(-1, N, g.shape[-1])[0].copy_(F.linear(state.output.to(wd), w.pred_w, w.pred_b))
            pout.copy_(state.output)
            t0, fofs = state.time_jumps.contiguous(), state.frames.contiguous()
            ctx0 = state.predictor[0].contiguous() if w.stateless else self.durations_tensor
        i64, S = torch.int64, self.S
        tokens, frames, durs = kernel_output(3, N, S, dtype=i64, device=dev).unbind(0)
        per_row = kernel_output(3, N, dtype=i64, device=dev)
        scores = kernel_output(N, S, dtype=torch.float32, device=dev)
        out = kernel_output(N, self.P, dtype=wd, device=dev)
        if w.stateless:
            ctx_out = kernel_output(N, self.K, dtype=i64, device=dev)
            h_out = c_out = out  # not written
        else:
            h_out, c_out = kernel_output(2, L, N, H, dtype=wd, device=dev).unbind(0)
            ctx_out = per_row  # not written
        options = self.options
        key = (self.serial, *(t.data_ptr() & 15 == 0 for t in (x, lengths, t0, fofs, ctx0)))
        if profile is not None:
            options = dict(options, PROFILE=profile.shape[0])
            key += (profile.shape[0], profile.data_ptr() & 15 == 0)
        table = conv_taps(w) if w.stateless else self.table
        self.launcher.launch(
            (self.nprog,),
            (x, *self.args_weights, encp, lengths, t0, fofs, table, *self.args_tables, h, c, g, pout, part, lpart, plog,
             hj, ws, wl, hs, ctx0, *self.args_joint, keys, priv, bar, tokens, frames, durs, scores, per_row, h_out,
             c_out, out, ctx_out, bar if profile is None else profile, *self.args_ints),
            options,
            key,
        )  # fmt: skip
        n_out, jumps, done = per_row.unbind(0)
        predictor = (ctx_out,) if w.stateless else (h_out, c_out)
        return (tokens, n_out, frames, scores, durs if self.has_durations else None, predictor, out, jumps, done)
