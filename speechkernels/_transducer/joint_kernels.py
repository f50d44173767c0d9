"""The joint network fused with the transducer losses (Triton kernels; two products of the backward in cuBLAS): the
[N, T, U+1, V] logits never exist. The losses' recursions over the lattice it makes are theirs (``rnnt.kernels``,
``tdt.kernels``).

The lattice's cells are taken chunk by chunk (samples x labels, all frames; at most ``CHUNK_BYTES`` of buffers a
chunk): a chunk's cells are tiles of BT frames of one label, laid out one after another as the rows of the
chunk's buffers.

1. ``_joint_hidden_kernel``: the chunk's hidden vectors dropout(act(enc + pred)) in the products' dtype (0 in
   cells without edges), so that the products below load both operands straight into shared memory.
2. ``_joint_lattice_kernel`` (forward): per block of rows, the logits chunk by chunk of classes (tl.dot on tensor
   cores, both operands through TMA descriptors; float32 inputs as three bfloat16 products, ``_split``), consumed
   on chip: the online log-sum-exp of the V logits; then one narrow chunk of gathered weight rows (the last few
   classes, the blank, each tile's next label: a tile's rows share it) gives the blank and next-label logits; into
   the log2 lattice of the RNN-T kernels (``rnnt.kernels.rnnt_recursions`` then gives the loss and, for the gradient,
   the edge occupancies) and a float32 log-sum-exp per cell.
3. ``_joint_dlogits_kernel`` (backward): the logits made again and their gradient
   g * (softmax * (occ_blank + s occ_label) - occ_blank [blank] - s occ_label [label]) stored for the chunk
   (16-bit: through a TMA descriptor), one class chunk per program, with its column sums (the bias's gradient,
   added per block of rows over the chunks) and a flag per tile (the rows that hold
   cells with edges; 0 where the occupancies are all exactly zero, far from the alignment: the gradient is
   exactly zero there, stored as zeros, and the tile is skipped below).
4. Two products of the stored chunk, in cuBLAS (``torch.mm``, sizes padded to multiples of 16: zero rows and
   columns): the logits' gradient transposed times the hidden vectors, added to the weight's gradient (float32
   sums), then the logits' gradient times the weight (the hidden vectors' gradient, over the hidden vectors).
   float32 inputs: the hi and lo halves stored side by side ([hi | lo | hi] of the logits' gradient, [hi | lo]
   of the hidden vectors, ``_split_weight``'s of the weight): the weight's gradient in two cuBLAS bfloat16
   products, the hidden vectors' in one (float32, over the hidden vectors).
5. ``_joint_grad_rows_kernel``: the hidden vectors' gradient times act' (and the dropout mask), summed over the
   labels into the encoder rows and over the frames into the predictor rows.

Every sum has one owner and a fixed order (partial sums per group, added after): deterministic, no atomics.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .._launch import cdiv, next_power_of_2
from .._logspace import ln2, log2e, lse_step_rows, neg
from .._outputs import kernel_output
from .activations import ACTIVATIONS, DROP_BITS, drop_threshold
from .lattice import cell_offsets, lattice_buffers, sample_lengths
from .options import TransducerOptions


@triton.jit
def _act(x, ACT: tl.constexpr):
    """The activation (0 relu, 1 tanh, 2 sigmoid); NaN stays NaN."""
    if ACT == 0:
        return tl.where(x < 0.0, 0.0, x)
    elif ACT == 1:
        return 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0
    else:
        return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _act_grad(x, ACT: tl.constexpr):
    """d act / d x at x (relu: 0 at x <= 0, as torch's)."""
    if ACT == 0:
        return tl.where(x <= 0.0, 0.0, 1.0)
    elif ACT == 1:
        y = 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0
        return 1.0 - y * y
    else:
        y = 1.0 / (1.0 + tl.exp(-x))
        return y * (1.0 - y)


@triton.jit
def _fmix32(x):
    """MurmurHash3's 32-bit finaliser (uint32 in, uint32 out)."""
    x ^= x >> 16
    x *= 0x85EBCA6B
    x ^= x >> 13
    x *= 0xC2B2AE35
    x ^= x >> 16
    return x


@triton.jit
def _keep(cell, k, seed_lo, seed_hi, threshold, DROP_SHIFT: tl.constexpr):
    """Dropout's mask of the cells' features k ([BM] x [BK] -> bool), as ``joint_reference.dropout_keep``."""
    c32 = (cell ^ (cell >> 32)).to(tl.uint32)
    a = _fmix32(c32 ^ seed_lo.to(tl.uint32))
    kk = k.to(tl.uint32) * 0x9E3779B9 + seed_hi.to(tl.uint32)
    x = _fmix32(a[:, None] ^ kk[None, :])
    return (x >> DROP_SHIFT).to(tl.int32) >= threshold


@triton.jit
def _pre(p_e, p_p, m_row, k, m_k, s_eh, s_ph):
    """enc + pred of the cells for features k: [BM, BK] float32, 0 off the cells and past H."""
    m = m_row[:, None] & m_k[None, :]
    e = tl.load(p_e[:, None] + k[None, :] * s_eh, mask=m, other=0.0).to(tl.float32)
    p = tl.load(p_p[:, None] + k[None, :] * s_ph, mask=m, other=0.0).to(tl.float32)
    return e + p, m


@triton.jit
def _hidden(p_e, p_p, m_row, cell, k, m_k, s_eh, s_ph, seed_lo, seed_hi, threshold, drop_scale, ACT: tl.constexpr,
            DROPOUT: tl.constexpr, DROP_SHIFT: tl.constexpr, GRAD: tl.constexpr = False):  # fmt: skip
    """The hidden vectors' features k: dropout(act(enc + pred)), [BM, BK] float32, 0 off the cells; GRAD: instead
    d h / d (enc + pred), act' times dropout's mask and scale."""
    x, m = _pre(p_e, p_p, m_row, k, m_k, s_eh, s_ph)
    if GRAD:
        h = _act_grad(x, ACT)
    else:
        h = _act(x, ACT)
    if DROPOUT:
        h = tl.where(_keep(cell, k, seed_lo, seed_hi, threshold, DROP_SHIFT), h * drop_scale, 0.0)
    return tl.where(m, h, 0.0)


@triton.jit
def _chunk_cells(i0, n0, u0, UC, n_tb, BT: tl.constexpr, BM: tl.constexpr):
    """BM rows of a chunk from its tile i0 on (tile i = ((n - n0) * n_tb + frame block) * UC + label - u0): each
    row's tile, sample, frame and label."""
    o_m = tl.arange(0, BM)
    i = i0 + o_m // BT
    r = i // UC
    n = (n0 + r // n_tb).to(tl.int64)
    t = (r % n_tb) * BT + o_m % BT
    u = u0 + i % UC
    return i, n, t, u


@triton.jit
def _labels(tgt_ptr, stride_tg, n, u, m_row, U_n, V):
    """Each cell's next label (clamped to [0, V) as the RNN-T kernels clamp it), -1 where it has none."""
    has_label = m_row & (u < U_n)
    lab = tl.load(tgt_ptr + n * stride_tg + u, mask=has_label, other=0).to(tl.int64)
    return tl.where(has_label, tl.minimum(tl.maximum(lab, 0), V - 1), -1).to(tl.int32), has_label


@triton.jit
def _segment_cols(k0, H):
    """The columns of the hidden vectors and of the weight at the products' step k0 (of H, or of 3 H for float32's
    halves, both laid out [hi | lo] in segments of H columns, H a multiple of the step): h_hi w_hi, then h_lo
    w_hi, then h_hi w_lo."""
    seg = k0 // H
    k = k0 - seg * H
    return k + (seg == 1).to(tl.int32) * H, k + (seg == 2).to(tl.int32) * H


@triton.jit
def _logits(h_desc, r0, w_desc, v0, b_ptr, v, m_v, H, HAS_BIAS: tl.constexpr, DT: tl.constexpr, SPLIT: tl.constexpr,
            BM: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """Logits of the BM rows from r0 of a chunk buffer of hidden vectors (h_desc: blocks [BM, BK]; H features,
    zeros past them; SPLIT: ``_split``'s hi and lo in segments of H columns, H a multiple of BK) against the BV
    classes v from v0 (w_desc: blocks [BV, BK], rows past V read as 0): [BM, BV] float32 (bias included),
    tensor-core products in DT with float32 sums."""
    acc = tl.zeros([BM, BV], tl.float32)
    if SPLIT:
        for k0 in range(0, 3 * H, BK):
            kh, kw = _segment_cols(k0, H)
            acc = _dot(h_desc.load([r0, kh]), w_desc.load([v0, kw]).T, acc, DT)
    else:
        for k0 in range(0, H, BK):
            acc = _dot(h_desc.load([r0, k0]), w_desc.load([v0, k0]).T, acc, DT)
    if HAS_BIAS:
        acc += tl.load(b_ptr + v, mask=m_v, other=0.0).to(tl.float32)[None, :]
    return acc


# Triton's interpreter (3.9) multiplies bfloat16 operands of tl.dot wrongly: there the operands go to float32
# first (exact: the products of 16-bit values are exact in float32, as on the tensor cores)
_INTERPRETER = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def _dot(a, b, acc, DT: tl.constexpr):
    """acc + a @ b, tensor-core products in DT with float32 sums."""
    if _INTERPRETER:
        return tl.dot(a.to(DT).to(tl.float32), b.to(DT).to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a.to(DT), b.to(DT), acc)


@triton.jit
def _split(x, DT: tl.constexpr):
    """float32 x as hi + lo in DT (bfloat16): hi = x rounded, lo = the rest rounded (x to about 2^-17 relative;
    lo = 0 where hi is infinite, NaN stays NaN)."""
    hi = x.to(DT)
    hi32 = hi.to(tl.float32)
    return hi, tl.where(hi32 == x, 0.0, x - hi32).to(DT)


@triton.jit(do_not_specialize=["seed_lo", "seed_hi", "threshold"])
def _joint_hidden_kernel(
    enc_ptr,  # [N, T, H]
    pred_ptr,  # [N, U+1, H]
    il_ptr, tl_ptr,
    h_ptr,  # [rows, s_h] out: the chunk's hidden vectors (DT; SPLIT: segments hi, lo of s_seg columns)
    n0,  # the chunk: samples [n0, n0 + tiles / (n_tb * UC)), labels [u0, u0 + UC)
    u0, UC, tiles, T, U1, H, n_tb,
    s_h, s_seg,  # h's rows and segments
    s_en, s_et, s_eh, s_pn, s_pu, s_ph,  # enc's and pred's strides
    seed_lo, seed_hi, threshold, drop_scale,  # dropout (``_keep``)
    ACT: tl.constexpr, DROPOUT: tl.constexpr, DROP_SHIFT: tl.constexpr, DT: tl.constexpr, SPLIT: tl.constexpr,
    BT: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """Program (BM rows, BK features): dropout(act(enc + pred)), 0 in cells without edges and in the columns
    [H, s_seg); SPLIT (float32 inputs): ``_split``'s hi and lo, in two segments of s_seg columns."""
    i, n, t, u = _chunk_cells(tl.program_id(0) * (BM // BT), n0, u0, UC, n_tb, BT, BM)
    T_n, U_n = sample_lengths(il_ptr, tl_ptr, n, i < tiles, T, U1)
    m_row = (i < tiles) & (t < T_n) & (u <= U_n)
    k = tl.program_id(1) * BK + tl.arange(0, BK)
    m_k = k < H
    p_e = enc_ptr + n * s_en + t.to(tl.int64) * s_et
    p_p = pred_ptr + n * s_pn + u.to(tl.int64) * s_pu
    h = _hidden(p_e, p_p, m_row, (n * T + t) * U1 + u, k, m_k, s_eh, s_ph, seed_lo, seed_hi, threshold, drop_scale,
                ACT, DROPOUT, DROP_SHIFT)  # fmt: skip
    rows = (tl.program_id(0) * BM + tl.arange(0, BM)).to(tl.int64)
    q = h_ptr + rows[:, None] * s_h + k[None, :]
    m = (i < tiles)[:, None] & (k < s_seg)[None, :]
    if SPLIT:
        hi, lo = _split(h, DT)
        tl.store(q, hi, mask=m)
        tl.store(q + s_seg, lo, mask=m)
    else:
        tl.store(q, h.to(DT), mask=m)


@triton.jit
def _lse_chunk(b_m, b_s, v0, V, h_desc, r0, w_desc, b_ptr, H, HAS_BIAS: tl.constexpr, DT: tl.constexpr,
               SPLIT: tl.constexpr, BM: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """One chunk of classes [v0, v0 + BV) of the online log-sum-exp (log2 units)."""
    v = v0 + tl.arange(0, BV)
    m_v = v < V
    acc = _logits(h_desc, r0, w_desc, v0, b_ptr, v, m_v, H, HAS_BIAS, DT, SPLIT, BM, BV, BK)
    return lse_step_rows(b_m, b_s, tl.where(m_v[None, :], acc * log2e(), float("-inf")))


@triton.jit
def _gathered_logits(h_desc, r0, w_ptr, b_ptr, cls, H, s_wv, s_w, HAS_BIAS: tl.constexpr, DT: tl.constexpr,
                     SPLIT: tl.constexpr, BM: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """As ``_logits``, against the classes cls ([BV], -1: none, 0) whose weight rows (s_w columns) are gathered
    from w_ptr."""
    acc = tl.zeros([BM, BV], tl.float32)
    o_k = tl.arange(0, BK)
    p_w = w_ptr + tl.maximum(cls, 0).to(tl.int64)[:, None] * s_wv
    n_seg: tl.constexpr = 3 if SPLIT else 1
    for k0 in range(0, n_seg * H, BK):
        kh, kw = _segment_cols(k0, H)
        kw = kw + o_k
        w = tl.load(p_w + kw[None, :], mask=(cls >= 0)[:, None] & (kw < s_w)[None, :], other=0.0)
        acc = _dot(h_desc.load([r0, kh]), w.T, acc, DT)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cls, mask=cls >= 0, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def _joint_lattice_kernel(
    h_desc,  # the chunk's hidden vectors (``_joint_hidden_kernel``), blocks [BM, BK]
    w_desc,  # the weight as the products take it, blocks [BV, BK]
    w_ptr,  # the same ([V, s_w])
    b_ptr,  # [V] (HAS_BIAS)
    tgt_ptr,  # [N, U]
    il_ptr, tl_ptr,
    lse_ptr,  # [N * T * (U+1)] float32 out: natural-log log-sum-exp per cell
    lat_ptr,  # [N * T * (U+1), 2] float32 out: log2 p(blank), log2 p(next label), skewed as cell_offsets (TDT:
    # [N * T * (U+1), 2 + X], not skewed, then the X durations' log2 probabilities)
    cnt_ptr,  # int32: zeroed here for the batch reduction of the recursions (TDT: [N], cells with a NaN entry)
    n0, u0, UC, tiles, T, U1, V, H, n_tb,
    V_main,  # classes [0, V_main) in chunks of BV, the rest (at most BVT - 1 - BM / BT (- X)) with the gathered rows
    s_wv, s_w, stride_tg, blank,
    sigma2,  # TDT: sigma in log2 units, off each token's log-probability
    HAS_BIAS: tl.constexpr, DT: tl.constexpr, SPLIT: tl.constexpr, RNA: tl.constexpr,
    X: tl.constexpr,  # TDT: duration classes V .. V + X - 1 (their own log-softmax); 0: RNN-T
    MULTI: tl.constexpr,  # with X: multi-blank's big blanks instead, classes blank - 1 - i (in the softmax)
    BT: tl.constexpr, BM: tl.constexpr, BV: tl.constexpr, BVT: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """Program = BM rows of the chunk: online log-sum-exp over the classes [0, V), the lattice's log2
    probabilities."""
    pid = tl.program_id(0)
    if X == 0 and pid == 0:
        tl.store(cnt_ptr, 0)
    i, n, t, u = _chunk_cells(pid * (BM // BT), n0, u0, UC, n_tb, BT, BM)
    T_n, U_n = sample_lengths(il_ptr, tl_ptr, n, i < tiles, T, U1)
    m_row = (i < tiles) & (t < T_n) & (u <= U_n)
    if tl.sum(m_row.to(tl.int32), axis=0) > 0:
        lab, has_label = _labels(tgt_ptr, stride_tg, n, u, m_row, U_n, V)
        r0 = pid * BM
        b_m = tl.full([BM], float("-inf"), tl.float32)  # running maximum (log2 units)
        b_s = tl.zeros([BM], tl.float32)  # running sum of exp2(x - b_m)
        for v0 in range(0, V_main, BV):  # whole chunks
            b_m, b_s = _lse_chunk(b_m, b_s, v0, V, h_desc, r0, w_desc, b_ptr, H, HAS_BIAS, DT, SPLIT, BM, BV, BK)
        # one narrow chunk of gathered weight rows: the classes past V_main (V = 2^k + 1: one), the blank, each
        # tile's next label (a tile's rows share their sample and label)
        KT: tl.constexpr = BM // BT
        n_rest = V - V_main
        j = tl.arange(0, BVT)
        lab_t = tl.max(tl.reshape(lab, (KT, BT)), axis=1)  # -1: none
        lab_j = tl.sum(tl.where(j[:, None] == n_rest + 1 + tl.arange(0, KT)[None, :], lab_t[None, :], 0), axis=1)
        cls = tl.where(j < n_rest, V_main + j, tl.where(j == n_rest, blank, tl.where(j <= n_rest + KT, lab_j, -1)))
        j_dur = j - (n_rest + 1 + KT)  # TDT: the durations' columns next
        is_dur = (j_dur >= 0) & (j_dur < X)
        if X > 0:
            cls = tl.where(is_dur, blank - 1 - j_dur if MULTI else V + j_dur, cls)
        acc = _gathered_logits(h_desc, r0, w_ptr, b_ptr, cls, H, s_wv, s_w, HAS_BIAS, DT, SPLIT, BM, BVT, BK)
        b_m, b_s = lse_step_rows(b_m, b_s, tl.where((j < n_rest)[None, :], acc * log2e(), float("-inf")))
        x_blank = tl.sum(tl.where((j == n_rest)[None, :], acc, 0.0), axis=1)
        j_lab = n_rest + 1 + tl.arange(0, BM) // BT
        x_label = tl.sum(tl.where(j[None, :] == j_lab[:, None], acc, 0.0), axis=1)
        m_safe = tl.where(b_m == float("-inf"), 0.0, b_m)
        lse = (m_safe + tl.log2(b_s)) * ln2()
        cell = (n * T + t) * U1 + u
        tl.store(lse_ptr + cell, lse, mask=m_row)
        lp_b = (x_blank - lse) * log2e()
        lp_y = tl.where(has_label, (x_label - lse) * log2e(), neg())
        if X == 0:
            p_cell = lat_ptr + cell_offsets(n, t.to(tl.int64), u, T, U1, RNA)
            tl.store(p_cell, lp_b, mask=m_row)
            tl.store(p_cell + 1, lp_y, mask=m_row)
        else:  # TDT: [cells, 2 + X]; sigma once per token; the durations' own log-softmax; NaN counts
            lp_b -= sigma2
            lp_y -= sigma2
            x_d = tl.where(is_dur[None, :], acc * log2e(), float("-inf"))
            if MULTI:  # the big blanks' log-probabilities (the tokens' softmax), less sigma
                lp_d = x_d - (lse * log2e() + sigma2)[:, None]
            else:
                m_d = tl.max(x_d, axis=1)
                m_d = tl.where(m_d == float("-inf"), 0.0, m_d)
                lp_d = x_d - (m_d + tl.log2(tl.sum(tl.exp2(x_d - m_d[:, None]), axis=1)))[:, None]
            p_cell = lat_ptr + cell * (2 + X)
            tl.store(p_cell, lp_b, mask=m_row)
            tl.store(p_cell + 1, lp_y, mask=m_row)
            tl.store(p_cell[:, None] + 2 + j_dur[None, :], lp_d, mask=m_row[:, None] & is_dur[None, :])
            nan_d = tl.sum(tl.where(is_dur[None, :] & (lp_d != lp_d), 1, 0), axis=1)
            bad = tl.where(m_row & ((lp_b != lp_b) | (lp_y != lp_y) | (nan_d > 0)), 1, 0)
            tl.atomic_add(cnt_ptr + n, bad, mask=bad > 0)


@triton.jit
def _dlogits(acc, v, m_v, m_row, lse, occ_t, occ_b, occ_e, lab, g, blank, clamp, p_x, V_tok, CLAMP: tl.constexpr,
             X: tl.constexpr, MULTI: tl.constexpr):  # fmt: skip
    """The logits' gradient [BM, BV] float32: g * (softmax * occ_t - occ_b [blank] - occ_e [label]), clamped
    before g (per row) scales it (as torchaudio clamps); 0 off the cells and classes. With X: TDT's classes from
    V_tok on are the durations, their gradient the occupancy kernel's coefficients (at p_x, per row), not
    clamped; multi-blank's big blank i (class blank - 1 - i) less its occupancy (at p_x + i)."""
    d = tl.exp2((acc - lse[:, None]) * log2e()) * occ_t[:, None]
    d -= tl.where(v[None, :] == blank, occ_b[:, None], 0.0)
    d -= tl.where(v[None, :] == lab[:, None], occ_e[:, None], 0.0)
    if X > 0:
        j = blank - 1 - v if MULTI else v - V_tok
        is_x = (j >= 0) & (j < X) & m_v
        c = tl.load(p_x[:, None] + j[None, :], mask=m_row[:, None] & is_x[None, :], other=0.0)
        if MULTI:
            d -= c
    if CLAMP:
        d = tl.minimum(tl.maximum(d, -clamp), clamp)
    if X > 0 and not MULTI:
        d = tl.where(is_x[None, :], c, d)
    return tl.where(m_row[:, None] & m_v[None, :], g[:, None] * d, 0.0)


@triton.jit
def _ds_chunk(ds_ptr, ds_desc, gbp_ptr, gbp_off, rows, v0, V, V_st, s_lo, h_desc, r0, w_desc, b_ptr, lab, lse, occ_t,
              occ_b, occ_e, g, clamp, H, m_row, blank, p_x, V_tok, HAS_BIAS: tl.constexpr, DT: tl.constexpr,
              SPLIT: tl.constexpr, CLAMP: tl.constexpr, X: tl.constexpr, MULTI: tl.constexpr, BM: tl.constexpr,
              BV: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """One chunk of classes [v0, v0 + BV) (below V) of the rows' logits' gradient, stored at ``rows`` (in DT; the
    columns below V_st: zeros past V; SPLIT: ``_split``'s hi there, lo s_lo columns further and hi again 2 s_lo
    further, for the products [hi | lo | hi] @ [w_hi; w_hi; w_lo], hi^T @ [h_hi | h_lo] and lo^T @ h_hi), and its
    column sums (the bias's gradient; of the stored values) added at gbp_ptr + gbp_off."""
    v = v0 + tl.arange(0, BV)
    m_v = v < V
    x = _logits(h_desc, r0, w_desc, v0, b_ptr, v, m_v, H, HAS_BIAS, DT, SPLIT, BM, BV, BK)
    d = _dlogits(x, v, m_v, m_row, lse, occ_t, occ_b, occ_e, lab, g, blank, clamp, p_x, V_tok, CLAMP, X, MULTI)
    if SPLIT:
        q = ds_ptr + rows[:, None] + v[None, :]
        hi, lo = _split(d, DT)
        tl.store(q, hi, mask=(v < V_st)[None, :])
        tl.store(q + s_lo, lo, mask=(v < V_st)[None, :])
        tl.store(q + 2 * s_lo, hi, mask=(v < V_st)[None, :])
        d = hi.to(tl.float32) + lo.to(tl.float32)
    else:  # (ds_desc: the first s_lo columns, blocks [BM, BV])
        d = d.to(DT)
        ds_desc.store([r0, v0], d)
    if HAS_BIAS:
        p_b = gbp_ptr + gbp_off + v
        tl.store(p_b, tl.load(p_b, mask=m_v, other=0.0) + tl.sum(d.to(tl.float32), axis=0), mask=m_v)


@triton.jit
def _ds_zero(ds_ptr, rows, v0, V_st, s_lo, DT: tl.constexpr, SPLIT: tl.constexpr, BM: tl.constexpr,
             BV: tl.constexpr):  # fmt: skip
    """Zeros at ``rows``, columns [v0, v0 + BV) (below V_st; SPLIT: and s_lo and 2 s_lo columns further)."""
    v = v0 + tl.arange(0, BV)
    q = ds_ptr + rows[:, None] + v[None, :]
    tl.store(q, tl.zeros([BM, BV], DT), mask=(v < V_st)[None, :])
    if SPLIT:
        tl.store(q + s_lo, tl.zeros([BM, BV], DT), mask=(v < V_st)[None, :])
        tl.store(q + 2 * s_lo, tl.zeros([BM, BV], DT), mask=(v < V_st)[None, :])


@triton.jit
def _joint_dlogits_kernel(
    h_desc,  # blocks [BM, BK]
    w_desc,  # blocks [BV, BK]
    wt_desc,  # blocks [BVT, BK]
    b_ptr, tgt_ptr, il_ptr, tl_ptr, lse_ptr,
    occ_ptr,  # [N * T * (U+1), 2] edge occupancies (skewed); TDT: [N * T * (U+1), 2 + X], the occupancy kernel's
    logp_ptr,  # [N] float64 log2 p
    gloss_ptr,  # upstream gradient per sample (stride 0: one for the batch)
    ds_ptr,  # [rows, s_ds] out: the chunk's logits' gradient (DT; SPLIT: hi, lo, hi in segments of s_lo columns)
    ds_desc,  # its first s_lo columns, blocks [BM, BV]
    dst_desc,  # the same, blocks [BM, BVT]
    flag_ptr,  # [tiles] int32 out: rows written (the frames with edges) where the tile has work, else 0
    gbp_ptr,  # [rows / BM, V] float32 in/out (HAS_BIAS): column sums per block of rows, over the chunks
    gloss_stride, gscale,
    n0, u0, UC, tiles, T, U1, V, H, n_tb, V_main, s_ds, s_lo, stride_tg, blank,
    fastemit_scale, clamp,
    V_tok,  # the token classes (TDT: the durations after them, to V)
    HAS_BIAS: tl.constexpr, DT: tl.constexpr, SPLIT: tl.constexpr, CLAMP: tl.constexpr, RNA: tl.constexpr,
    X: tl.constexpr,  # TDT's durations; 0: RNN-T
    MULTI: tl.constexpr,  # with X: multi-blank's big blanks instead
    BT: tl.constexpr, BM: tl.constexpr, BV: tl.constexpr, BVT: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """Program = BM rows (BM / BT tiles) of the chunk x one chunk of classes (BV wide, or BVT for the last few):
    which cells take part (edges, a possible sample), their occupancies (the label's times 1 + lambda), the
    sample's upstream gradient (NaN for a NaN loss); the tiles' flags (by the first class chunk's program);
    where any tile has work, the logits made again and their gradient stored. The class chunks are independent
    (the log-sum-exps are the forward's): programs enough for the multiprocessors even when a chunk has few
    rows."""
    KT: tl.constexpr = BM // BT
    n_cg = tl.cdiv(V_main, BV) + tl.cdiv(V - V_main, BVT)
    cg = tl.program_id(0) % n_cg
    pid = tl.program_id(0) // n_cg
    i, n, t, u = _chunk_cells(pid * KT, n0, u0, UC, n_tb, BT, BM)
    T_n, U_n = sample_lengths(il_ptr, tl_ptr, n, i < tiles, T, U1)
    logp = tl.load(logp_ptr + n, mask=i < tiles, other=float("-inf"))
    m_row = (i < tiles) & (t < T_n) & (u <= U_n) & (logp != float("-inf"))
    cell = (n * T + t) * U1 + u
    if X == 0:
        p_cell = occ_ptr + cell_offsets(n, t.to(tl.int64), u, T, U1, RNA)
    else:
        p_cell = occ_ptr + cell * (2 + X)
    occ_b = tl.load(p_cell, mask=m_row, other=0.0)
    occ_e = tl.load(p_cell + 1, mask=m_row, other=0.0) * fastemit_scale
    occ_t = occ_b + occ_e
    if MULTI:  # the big blanks' occupancies: theirs too is the softmax's total
        for k in tl.static_range(X):
            occ_t += tl.load(p_cell + 2 + k, mask=m_row, other=0.0)
    g = tl.load(gloss_ptr + n * gloss_stride, mask=i < tiles, other=0.0).to(tl.float32) * gscale
    # NaN for a NaN loss: every read score's gradient is NaN then (an impossible sample's stays zero)
    g = g + tl.where(logp != float("-inf"), logp - logp, 0.0).to(tl.float32)
    work = (m_row & (occ_t != 0.0)) | (g != g)
    tile_work = tl.max(tl.reshape(work.to(tl.int32), (KT, BT)), axis=1)
    flags = tile_work * tl.sum(tl.reshape(m_row.to(tl.int32), (KT, BT)), axis=1)
    i_t = pid * KT + tl.arange(0, KT)
    tl.store(flag_ptr + i_t, flags, mask=tl.where(cg == 0, i_t < tiles, False))
    o_m = pid * BM + tl.arange(0, BM)
    rows = o_m.to(tl.int64) * s_ds
    n_main = tl.cdiv(V_main, BV)
    st_main = tl.where(V_main == V, s_lo, V_main)  # the columns the chunks store (zeros past V, up to s_lo)
    if tl.sum(flags, axis=0) == 0:  # zeros (the products take every row of the chunk)
        if cg < n_main:
            _ds_zero(ds_ptr, rows, cg * BV, st_main, s_lo, DT, SPLIT, BM, BV)
        else:
            _ds_zero(ds_ptr, rows, V_main + (cg - n_main) * BVT, s_lo, s_lo, DT, SPLIT, BM, BVT)
    else:
        lse = tl.load(lse_ptr + cell, mask=m_row, other=0.0)
        lab, _has_label = _labels(tgt_ptr, stride_tg, n, u, m_row, U_n, V_tok)
        state = (b_ptr, lab, lse, occ_t, occ_b, occ_e, g, clamp, H, m_row, blank, p_cell + 2, V_tok)
        gbp = (gbp_ptr, pid.to(tl.int64) * V)
        if cg < n_main:
            _ds_chunk(ds_ptr, ds_desc, *gbp, rows, cg * BV, V_main, st_main, s_lo, h_desc, pid * BM, w_desc, *state,
                      HAS_BIAS, DT, SPLIT, CLAMP, X, MULTI, BM, BV, BK)  # fmt: skip
        else:
            _ds_chunk(ds_ptr, dst_desc, *gbp, rows, V_main + (cg - n_main) * BVT, V, s_lo, s_lo, h_desc, pid * BM,
                      wt_desc, *state, HAS_BIAS, DT, SPLIT, CLAMP, X, MULTI, BM, BVT, BK)  # fmt: skip


@triton.jit(do_not_specialize=["seed_lo", "seed_hi", "threshold"])
def _joint_grad_rows_kernel(
    enc_ptr, pred_ptr,
    dh_ptr,  # [rows, s_dh]: the chunk's hidden vectors' gradient (its logits' gradient times the weight)
    flag_ptr,  # the chunk's tiles' flags (``_joint_dlogits_kernel``)
    genc_ptr,  # [N, T, H] float32 in/out: the encoder rows' gradient
    gpred_ptr,  # [samples, n_fb, UC, H] float32 out: the chunk's predictor rows, per (sample, block of FB frames)
    n0, u0, UC, T, U1, H, n_tb, n_fb, s_dh,
    s_en, s_et, s_eh, s_pn, s_pu, s_ph,  # enc's and pred's strides
    seed_lo, seed_hi, threshold, drop_scale,  # dropout (``_keep``)
    ACT: tl.constexpr, DROPOUT: tl.constexpr, DROP_SHIFT: tl.constexpr,
    BT: tl.constexpr, FB: tl.constexpr, BN: tl.constexpr,
):  # fmt: skip
    """Program (piece of BN features, sample and block of FB frames: FB / BT tiles a label): label by label, the
    hidden vectors' gradient times d h / d (enc + pred); summed over the labels into the encoder rows (registers,
    then added once) and over the frames into the frame block's share of each predictor row (all written: 0 where
    nothing is added). Each row belongs to one program of a chunk; chunks run one after another: deterministic."""
    p = tl.program_id(0)
    r = tl.program_id(1)
    n = (n0 + r // n_fb).to(tl.int64)
    f = tl.arange(0, FB)
    t = (r % n_fb) * FB + f
    tb = t // BT
    m_t = tb < n_tb
    k = p * BN + tl.arange(0, BN)
    m_k = k < H
    p_e = enc_ptr + n * s_en + t.to(tl.int64) * s_et
    acc_enc = tl.zeros([FB, BN], tl.float32)
    for j in range(0, UC):
        i = ((n - n0) * n_tb + tb) * UC + j  # each row's tile
        m_row = m_t & ((f % BT) < tl.load(flag_ptr + i, mask=m_t, other=0))
        part = tl.zeros([FB, BN], tl.float32)
        if tl.sum(m_row.to(tl.int32), axis=0) > 0:
            m = m_row[:, None] & m_k[None, :]
            rows = (i * BT + f % BT).to(tl.int64) * s_dh
            dh = tl.load(dh_ptr + rows[:, None] + k[None, :], mask=m, other=0.0).to(tl.float32)
            u = u0 + j
            p_p = pred_ptr + n * s_pn + u.to(tl.int64) * s_pu + tl.zeros([FB], tl.int64)
            d = _hidden(p_e, p_p, m_row, (n * T + t) * U1 + u, k, m_k, s_eh, s_ph, seed_lo, seed_hi, threshold,
                        drop_scale, ACT, DROPOUT, DROP_SHIFT, GRAD=True)  # fmt: skip
            # (where, not a product: a NaN weight leaves the rows of cells without edges alone)
            part = tl.where(m, dh * d, 0.0)
            acc_enc += part
        tl.store(gpred_ptr + (r * UC + j).to(tl.int64) * H + k, tl.sum(part, axis=0), mask=m_k)
    q = genc_ptr + (n * T + t.to(tl.int64))[:, None] * H + k[None, :]
    m = (t < T)[:, None] & m_k[None, :]
    tl.store(q, tl.load(q, mask=m) + acc_enc, mask=m)


# ---------------------------------------------------------------------------------------------------------------
# launchers

TUNING: dict | None = None  # block sizes that replace _blocks' (sweeps)
TRITON_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def _blocks(enc: torch.Tensor, kernel: str) -> dict:
    """Tile sizes per kernel: "tile" (BT frames of one label: the chunks' layout), "hidden" (BM rows x BK
    features), "forward" and "dlogits" (BM rows, BV classes a chunk (BVT for the last few), BK features a product
    step), "rows" (FB frames x BN features); small ones under the interpreter (CPU tests)."""
    if not enc.is_cuda:
        blk = dict(BT=8, BM=16, BV=32, BVT=16, BK=32, BN=16, FB=16, num_warps=4, num_stages=1)
    elif kernel == "tile":
        blk = dict(BT=16)  # few padded frames (T = 400: none; 64-frame tiles: 448), 25.3 -> 23.0 ms at the first row
    elif kernel == "hidden":
        blk = dict(BM=64, BK=128, num_warps=4, num_stages=1)  # BM: a multiple of BT
    elif kernel == "forward":
        blk = dict(BM=128, BV=256, BVT=16, BK=64, num_warps=8, num_stages=3)
    elif kernel == "dlogits" and enc.element_size() == 4:  # float32's split products: 374 spills in 4 warps
        blk = dict(BM=128, BV=256, BVT=16, BK=64, num_warps=8, num_stages=3)  # (26.0 against 22.6 ms)
    elif kernel == "dlogits":  # two CTAs a multiprocessor (255 registers, 96 KB): one's epilogue beside the other's
        blk = dict(BM=128, BV=128, BVT=16, BK=64, num_warps=4, num_stages=3)  # products (7.8 against 9.2 ms)
    else:  # rows: 128 frames x 32 features a program (at 16-frame tiles 2.75 ms at the first row; 64 x 32: 3.04)
        blk = dict(FB=128, BN=32, num_warps=4, num_stages=1)
    if TUNING and kernel in TUNING:
        blk.update(TUNING[kernel])
    return blk


def _common(joint: JointNetwork):
    """Arguments every kernel takes: strides, the dropout hash's parameters, the constexpr flags."""
    enc, pred, weight, bias, activation, dropout, seed = joint
    args = (enc.stride(0), enc.stride(1), enc.stride(2), pred.stride(0), pred.stride(1), pred.stride(2))
    drop = (seed[0], seed[1], drop_threshold(dropout), 1.0 / (1.0 - dropout))
    split = weight.dtype == torch.float32
    meta = dict(
        ACT=ACTIVATIONS.index(activation),
        DROPOUT=dropout > 0,
        DROP_SHIFT=32 - DROP_BITS,
        HAS_BIAS=bias is not None,
        DT=TRITON_DTYPES[_products_dtype(weight)],
        SPLIT=split,
    )
    return args, drop, meta


SPLIT_DTYPE = torch.bfloat16  # float32 inputs' products: three bfloat16 products each (``_split``)


def _split_weight(weight: torch.Tensor, s_h: int, s_ds: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight as the products take it: the forward's and dlogits' operand ([V, s_h], contiguous, the columns
    past H zero; float32: [V, 2 s_h], ``_split``'s [hi | lo] in segments of s_h columns) and the hidden vectors'
    gradient's, zero-padded to [s_ds, s_h] (float32: [hi; hi; lo] of [3 s_ds, s_h], against the logits'
    gradient's [hi | lo | hi])."""
    V, H = weight.shape
    if weight.dtype != torch.float32:
        w_pad = weight if (s_ds, s_h) == (V, H) else torch.nn.functional.pad(weight, (0, s_h - H, 0, s_ds - V))
        w_k = weight if H == s_h else w_pad[:V]
        return (w_k if w_k.is_contiguous() and w_k.data_ptr() % 16 == 0 else w_k.contiguous()), w_pad
    hi = weight.to(SPLIT_DTYPE)
    hi32 = hi.float()
    lo = torch.where(hi32 == weight, 0.0, weight - hi32).to(SPLIT_DTYPE)
    hi, lo = (torch.nn.functional.pad(x, (0, s_h - H, 0, s_ds - V)) for x in (hi, lo))
    return torch.cat([hi[:V], lo[:V]], 1), torch.cat([hi, hi, lo], 0)


def _widths(H: int, V: int, split: bool, enc: torch.Tensor) -> tuple[int, int]:
    """The products' padded sizes (s_h features, s_ds classes): multiples of 16, zero-padded (tensor cores' fast
    paths; at V = 1025, 5x faster than the odd sizes); float32's segments of s_h columns also a multiple of the
    products' steps."""
    step = 16
    if split:
        for k in ("forward", "dlogits"):
            step = step * _blocks(enc, k)["BK"] // math.gcd(step, _blocks(enc, k)["BK"])
    return -(-H // step) * step, -(-V // 16) * 16


def _launch(blk: dict) -> dict:
    return {k: blk[k] for k in ("num_warps", "num_stages", "maxnreg") if k in blk}


def _class_tiles(blk: dict) -> dict:
    """The tile sizes of a kernel over (rows, classes) tiles ("forward", "dlogits"), as its constexprs."""
    return {k: blk[k] for k in ("BM", "BV", "BVT", "BK")}


def _stage_hidden(enc, pred, logit_lengths, target_lengths, hbuf, n0, u0, ucc, tiles, n_tb, s_h, strides, seeds, meta):
    """A chunk's hidden vectors into hbuf (``_joint_hidden_kernel``; s_h columns a segment)."""
    T, H = enc.shape[1], enc.shape[2]
    bh, BT = _blocks(enc, "hidden"), _blocks(enc, "tile")["BT"]
    _joint_hidden_kernel[(cdiv(tiles * BT, bh["BM"]), cdiv(s_h, bh["BK"]))](
        enc,
        pred,
        logit_lengths,
        target_lengths,
        hbuf,
        n0,
        u0,
        ucc,
        tiles,
        T,
        pred.shape[1],
        H,
        n_tb,
        hbuf.stride(0),
        s_h,
        *strides,
        *seeds,
        ACT=meta["ACT"],
        DROPOUT=meta["DROPOUT"],
        DROP_SHIFT=meta["DROP_SHIFT"],
        DT=meta["DT"],
        SPLIT=meta["SPLIT"],
        BT=BT,
        BM=bh["BM"],
        BK=bh["BK"],
        **_launch(bh),
    )


def _descriptor(x: torch.Tensor, block: list[int]):
    """A TMA descriptor of x (2-D, unit stride along its rows, 16-byte aligned): blocks of ``block``, reads past
    its edges give zeros."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(x, block)


def _products_dtype(weight: torch.Tensor) -> torch.dtype:
    """The chunk buffers' dtype (float32 weights: ``_split``'s bfloat16 hi and lo)."""
    return SPLIT_DTYPE if weight.dtype == torch.float32 else weight.dtype


class JointNetwork(NamedTuple):
    """The joint network, logits = dropout(act(enc + pred)) @ weight.T + bias: its inputs (enc [N, T, H], pred
    [N, U+1, H], weight [V, H], bias [V] or None; one float dtype, any strides, on one device) and its hidden
    layer's settings (activation: a name of ``ACTIVATIONS``; dropout: the probability; seed: dropout's hash, two
    integers in [0, 2^31))."""

    enc: torch.Tensor
    pred: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    activation: str
    dropout: float
    seed: tuple[int, int]


def joint_lattice(
    joint: JointNetwork,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    rnna: bool,
    durations: int = 0,
    sigma: float = 0.0,
    multiblank: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The lattice of the joint network's logits, chunk by chunk: (log-sum-exps [cells] float32, lattice, aux).
    RNN-T (``durations`` 0): the [cells, 2] log2 lattice of ``rnnt.kernels.rnnt_recursions`` (skewed rows) and its
    counter. TDT: the weight's last ``durations`` rows are the duration head: a [cells, 2 + durations] lattice
    (blank, next label (less sigma, log2 units), the durations' log2 log-softmax) and [N] int32 NaN counts, as
    ``tdt.kernels``' recursions take them. ``multiblank``: the ``durations`` extra entries are instead the big
    blanks, classes blank - 1 - i among the V (their log2 probabilities less sigma, as the tokens')."""
    enc, pred, weight, bias = joint[:4]
    N, T, H = enc.shape
    U1 = pred.shape[1]
    V = weight.shape[0]
    V_tok = V if multiblank else V - durations
    dev = enc.device
    if durations:
        cells = N * T * U1
        lse = kernel_output(cells, dtype=torch.float32, device=dev)
        lat = kernel_output(cells * (2 + durations), dtype=torch.float32, device=dev)
        aux = torch.zeros(N, dtype=torch.int32, device=dev)
    else:
        lse, lat, aux = lattice_buffers(N, T, U1, dev, True)
    strides, seeds, meta = _common(joint)
    bh, bf = _blocks(enc, "hidden"), _blocks(enc, "forward")
    BT = _blocks(enc, "tile")["BT"]
    reserved = 1 + bf["BM"] // BT + durations  # the narrow chunk's blank, labels and durations
    bf = dict(bf, BVT=max(bf["BVT"], next_power_of_2(reserved + 1)))
    n_tb = cdiv(T, BT)
    split = meta["SPLIT"]
    s_h, s_ds = _widths(H, V, split, enc)
    pdt = _products_dtype(weight)
    w_k = _split_weight(weight, s_h, s_ds)[0]
    k_h = s_h if split else H  # the products' features (float32: a segment)
    h_cols = 2 * s_h if split else s_h
    nc, uc = _chunks(N, U1, n_tb * BT, h_cols * pdt.itemsize, dev, split)
    hbuf = kernel_output(_rows(nc * n_tb * uc * BT, bh["BM"], bf["BM"]), h_cols, dtype=pdt, device=dev)
    h_desc, w_desc = _descriptor(hbuf, [bf["BM"], bf["BK"]]), _descriptor(w_k, [bf["BV"], bf["BK"]])
    v_main = _main_classes(V_tok, bf, reserved)
    for n0, u0, tiles, _rows_n, ucc in _chunk_list(N, U1, n_tb, nc, uc):
        _stage_hidden(
            enc, pred, logit_lengths, target_lengths, hbuf, n0, u0, ucc, tiles, n_tb, s_h, strides, seeds, meta
        )
        _joint_lattice_kernel[(cdiv(tiles * BT, bf["BM"]),)](
            h_desc,
            w_desc,
            w_k,
            bias,
            targets,
            logit_lengths,
            target_lengths,
            lse,
            lat,
            aux,
            n0,
            u0,
            ucc,
            tiles,
            T,
            U1,
            V_tok,
            k_h,
            n_tb,
            v_main,
            w_k.stride(0),
            w_k.shape[1],
            targets.stride(0),
            blank,
            sigma * 1.4426950408889634,
            HAS_BIAS=bias is not None,
            DT=meta["DT"],
            SPLIT=split,
            RNA=rnna,
            X=durations,
            MULTI=multiblank,
            BT=BT,
            **_class_tiles(bf),
            **_launch(bf),
        )
    return lse, lat, aux


def joint_backward(
    grad_out: torch.Tensor,
    joint: JointNetwork,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    opts: TransducerOptions,
    durations: int = 0,
    multiblank: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients of sum(grad_out * loss) (``opts.reduction`` "none"; else of grad_out * the sum or batch mean) with
    respect to enc, pred, weight and bias, in their dtypes; ``state``: ``rnnt.kernels.joint_forward``'s
    (log-sum-exps, edge occupancies, log2 p). TDT (``durations`` > 0, the weight's last rows): the occupancies are
    the TDT occupancy kernel's (the label's FastEmit scale included: ``opts.label_scale`` is not applied again);
    ``multiblank``: the extra entries are big blanks.

    Chunk by chunk of tiles (samples x labels, all frames; at most ``CHUNK_BYTES`` of hidden vectors and logits'
    gradient): the logits' gradient of the chunk's tiles, then its products with the hidden vectors (into the
    weight) and with the weight (into the encoder and predictor rows). Each product runs in one fixed order; no
    atomics: deterministic."""
    enc, pred, weight, bias = joint[:4]
    N, T, H = enc.shape
    U1 = pred.shape[1]
    V = weight.shape[0]
    dev = enc.device
    lse, occ, logp = state
    blank, clamp, reduction = opts.blank, opts.clamp, opts.reduction
    strides, seeds, meta = _common(joint)
    gstride = grad_out.stride(0) if reduction == "none" else 0
    gscale = 1.0 / N if reduction == "mean" else 1.0
    act = {k: meta[k] for k in ("ACT", "DROPOUT", "DROP_SHIFT")}
    prec = {k: meta[k] for k in ("DT", "SPLIT")}
    split = meta["SPLIT"]
    bh, b1, b2 = (_blocks(enc, k) for k in ("hidden", "dlogits", "rows"))
    BT = _blocks(enc, "tile")["BT"]
    n_tb = cdiv(T, BT)
    # float32: two bfloat16 segments of hidden vectors a row (hi, lo), three of the logits' gradient (hi, lo, hi)
    s_h, s_ds = _widths(H, V, split, enc)
    pdt = _products_dtype(weight)
    w_k, w_d = _split_weight(weight, s_h, s_ds)
    k_h = s_h if split else H
    h_cols, d_cols = (2 * s_h, 3 * s_ds) if split else (s_h, s_ds)
    nc, uc = _chunks(N, U1, n_tb * BT, (h_cols + d_cols) * pdt.itemsize, dev, split)
    v_main = _main_classes(V, b1)
    n_cg = cdiv(v_main, b1["BV"]) + cdiv(V - v_main, b1["BVT"])
    rows_max = _rows(nc * n_tb * uc * BT, bh["BM"], b1["BM"])
    hbuf = kernel_output(rows_max, h_cols, dtype=pdt, device=dev)
    ds = kernel_output(rows_max, d_cols, dtype=pdt, device=dev)
    flags = kernel_output(rows_max // BT, dtype=torch.int32, device=dev)
    genc = torch.zeros(N, T, H, dtype=torch.float32, device=dev)
    gpred = torch.zeros(N, U1, H, dtype=torch.float32, device=dev)
    FB = max(b2["FB"], BT)  # the rows kernel's blocks of frames (a multiple of BT), n_fb a sample
    n_fb = cdiv(n_tb * BT, FB)
    gpred_part = kernel_output(nc * n_fb * uc * H, dtype=torch.float32, device=dev)
    # float32: hi^T @ [h_hi | h_lo] and lo^T @ h_hi of the logits' gradient's hi and lo
    gw = torch.zeros(s_ds, h_cols, dtype=torch.float32, device=dev)
    gw_lo = torch.zeros(s_ds, s_h, dtype=torch.float32, device=dev) if split else None
    gbp = torch.zeros(rows_max // b1["BM"], V, dtype=torch.float32, device=dev) if bias is not None else None
    # the products' operands (hidden vectors, weight) and the logits' gradient (its first s_ds columns)
    h_desc = _descriptor(hbuf, [b1["BM"], b1["BK"]])
    w_descs = tuple(_descriptor(w_k, [b1[k], b1["BK"]]) for k in ("BV", "BVT"))
    ds_descs = tuple(_descriptor(ds[:, :s_ds], [b1["BM"], b1[k]]) for k in ("BV", "BVT"))
    for n0, u0, tiles, rows, ucc in _chunk_list(N, U1, n_tb, nc, uc):
        _stage_hidden(
            enc, pred, logit_lengths, target_lengths, hbuf, n0, u0, ucc, tiles, n_tb, s_h, strides, seeds, meta
        )
        _joint_dlogits_kernel[(cdiv(tiles * BT, b1["BM"]) * n_cg,)](
            h_desc,
            *w_descs,
            bias,
            targets,
            logit_lengths,
            target_lengths,
            lse,
            occ,
            logp,
            grad_out,
            ds,
            *ds_descs,
            flags,
            gbp,
            gstride,
            gscale,
            n0,
            u0,
            ucc,
            tiles,
            T,
            U1,
            V,
            k_h,
            n_tb,
            v_main,
            d_cols,
            s_ds,
            targets.stride(0),
            blank,
            1.0 if durations else opts.label_scale,
            max(clamp, 0.0),
            V if multiblank else V - durations,
            HAS_BIAS=bias is not None,
            CLAMP=clamp > 0,
            RNA=opts.rna,
            X=durations,
            MULTI=multiblank,
            BT=BT,
            **_class_tiles(b1),
            **prec,
            **_launch(b1),
        )
        d, h = ds[: tiles * BT], hbuf[: tiles * BT]
        if split:  # the weight's gradient, then the hidden vectors' (float32, over the hidden vectors)
            _addmm_f32(gw, d[:, :s_ds].t(), h)
            _addmm_f32(gw_lo, d[:, s_ds : 2 * s_ds].t(), h[:, :s_h])
            dh = hbuf.view(torch.float32)[: tiles * BT]
            _mm_into(d, w_d, dh)
        else:
            _addmm_f32(gw, d.t(), h)  # the weight's gradient
            dh = _mm_into(d, w_d, h)  # the hidden vectors', in their place (DT)
        n_s = rows // n_tb  # the chunk's samples
        _joint_grad_rows_kernel[(cdiv(H, b2["BN"]), n_s * n_fb)](
            enc,
            pred,
            dh,
            flags,
            genc,
            gpred_part,
            n0,
            u0,
            ucc,
            T,
            U1,
            H,
            n_tb,
            n_fb,
            dh.stride(0),
            *strides,
            *seeds,
            BT=BT,
            FB=FB,
            BN=b2["BN"],
            **act,
            **_launch(b2),
        )
        # the frame blocks' shares of the chunk's predictor rows, in order
        part = gpred_part[: n_s * n_fb * ucc * H].view(n_s, n_fb, ucc, H)
        gpred[n0 : n0 + rows // n_tb, u0 : u0 + ucc] += part.sum(1)
    del hbuf, ds, h, d, dh, h_desc, ds_descs, gpred_part, part  # (freed before the gradients' copies below)
    if split:
        gw = gw[:, :s_h] + gw[:, s_h:] + gw_lo
    grad_b = None if bias is None else gbp.sum(0).to(bias.dtype)  # the blocks' column sums, in order
    return genc.to(enc.dtype), gpred.to(pred.dtype), gw[:V, :H].contiguous().to(weight.dtype), grad_b


_OUT_DTYPE = all("dtype_out" in op.overloads() for op in (torch.ops.aten.addmm, torch.ops.aten.mm))


def _addmm_f32(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc (float32) += a @ b (on a GPU, 16-bit inputs: tensor-core products with float32 sums)."""
    if a.is_cuda and a.dtype != torch.float32 and _OUT_DTYPE:
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:  # (torch before out_dtype: float32 products)
        acc.addmm_(a.float(), b.float())


def _mm_into(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = a @ b in out's dtype (a's, or float32), summed in float32 (on a GPU: tensor-core products)."""
    if a.is_cuda and out.dtype == a.dtype:
        return torch.mm(a, b, out=out)
    if a.is_cuda and _OUT_DTYPE:
        return torch.mm(a, b, out_dtype=out.dtype, out=out)
    return out.copy_(torch.mm(a.float(), b.float()))


CHUNK_BYTES = 192 << 20  # a chunk's buffers (hidden vectors; in the backward also the logits' gradient), on a GPU


def _main_classes(V: int, blk: dict, reserved: int = 0) -> int:
    """The classes taken in whole chunks of BV; the rest (when few: at most 2 BVT, or BVT - reserved with
    ``reserved`` columns of the narrow chunk taken) go in chunks of BVT."""
    rest = V % blk["BV"]
    return V - rest if rest <= (blk["BVT"] - reserved if reserved else 2 * blk["BVT"]) else V


def _chunks(N: int, U1: int, frames: int, cell_bytes: int, dev: torch.device, split: bool) -> tuple[int, int]:
    """A chunk: ``nc`` samples x ``uc`` labels (all frames), as many as ``CHUNK_BYTES`` holds (twice that for
    float32's split buffers: 2-3 times the bytes a cell, and fewer, larger products pay there: 81 against 88 ms at
    the first benchmark row; at least one sample's label); under the interpreter four samples' labels (CPU tests:
    several chunks of both kinds)."""
    row = frames * cell_bytes
    budget = CHUNK_BYTES * (2 if split else 1) if dev.type == "cuda" else 4 * row
    if N * row <= budget:
        return N, min(U1, budget // (N * row))
    nc = max(1, budget // row)
    return -(-N // -(-N // nc)), 1


def _chunk_list(N: int, U1: int, n_tb: int, nc: int, uc: int):
    """(n0, u0, tiles, rows of tiles (sample, frame block), labels) of each chunk, in order."""
    for n0 in range(0, N, nc):
        for u0 in range(0, U1, uc):
            rows = min(nc, N - n0) * n_tb
            ucc = min(uc, U1 - u0)
            yield n0, u0, rows * ucc, rows, ucc


def _rows(rows: int, *blocks: int) -> int:
    """Rows of a chunk buffer: ``rows`` rounded up to every block of rows that reads or writes it whole."""
    for b in blocks:
        rows = -(-rows // b) * b
    return rows
