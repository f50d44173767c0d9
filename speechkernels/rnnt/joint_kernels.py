"""The joint network fused with the RNN-T loss, in Triton: logits are made tile by tile on chip and consumed there.

A tile is BT frames x BU labels of one sample (BM = BT * BU lattice cells). Its logits against a chunk of BV
classes are ``act(enc + pred) @ weight.T + bias``, the hidden vectors formed chunk by chunk of BK features in
registers and fed to tl.dot (tensor cores for 16-bit inputs, IEEE float32 products for float32 ones). Neither
the [N, T, U+1, V] logits nor the [N, T, U+1, H] hidden vectors are ever written.

1. ``_joint_lattice_kernel`` (a tile per program): the online log-sum-exp of each cell's V logits, and its blank
   and next-label logits, into the log2 lattice of the RNN-T kernels (``kernels.rnnt_recursions`` then gives
   the loss and, for the gradient, the edge occupancies) and a float32 log-sum-exp per cell.
2. ``_joint_grad_hidden_kernel``: the logits made again, their gradient
   g * (softmax * (occ_blank + s occ_label) - occ_blank [blank] - s occ_label [label]) on chip, times the
   weight chunk: the hidden vectors' gradient, times act' (and the dropout mask), summed over the tile's labels
   into the encoder rows and over its frames into the predictor rows. A program owns a group of tiles: the
   rows it adds to belong to it alone (partial sums per group of label blocks, resp. frame blocks, then added
   in a fixed order): deterministic, no atomics.
3. ``_joint_grad_weight_kernel``: per (class chunk, feature chunk, group of tiles) the logits' gradient again,
   against the hidden vectors: d weight = sum over cells of dlogits^T h, d bias = sum of dlogits; partial
   sums per group, added in a fixed order.

Tiles whose cells have no edge, or whose edges all have occupancy exactly zero (float32 underflow far from the
alignment), are skipped in the backward: their logits' gradient is exactly zero.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._logspace import _ln2, _log2e, _neg
from .joint_reference import ACTIVATIONS, DROP_BITS
from .kernels import _cell_offsets, _empty, _lengths, rnnt_recursions


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
def _pre(p_e, p_p, m_row, k, m_k, s_eh, s_ph, ONE_PRED: tl.constexpr):
    """enc + pred of the tile's cells for features k: [BM, BK] float32, 0 off the cells and past H. A tile of one
    label (ONE_PRED) has one predictor row (``p_p`` a scalar): loaded once and broadcast."""
    m = m_row[:, None] & m_k[None, :]
    e = tl.load(p_e[:, None] + k[None, :] * s_eh, mask=m, other=0.0).to(tl.float32)
    if ONE_PRED:
        p = tl.load(p_p + k * s_ph, mask=m_k, other=0.0).to(tl.float32)[None, :]
    else:
        p = tl.load(p_p[:, None] + k[None, :] * s_ph, mask=m, other=0.0).to(tl.float32)
    return e + p, m


@triton.jit
def _hidden(p_e, p_p, m_row, cell, k, m_k, s_eh, s_ph, seed_lo, seed_hi, threshold, drop_scale,
            ACT: tl.constexpr, DROPOUT: tl.constexpr, DROP_SHIFT: tl.constexpr, ONE_PRED: tl.constexpr):  # fmt: skip
    """The hidden vectors' features k: dropout(act(enc + pred)), [BM, BK] float32, 0 off the cells."""
    x, m = _pre(p_e, p_p, m_row, k, m_k, s_eh, s_ph, ONE_PRED)
    h = _act(x, ACT)
    if DROPOUT:
        h = tl.where(_keep(cell, k, seed_lo, seed_hi, threshold, DROP_SHIFT), h * drop_scale, 0.0)
    return tl.where(m, h, 0.0)


@triton.jit
def _hidden_grad(p_e, p_p, m_row, cell, k, m_k, s_eh, s_ph, seed_lo, seed_hi, threshold, drop_scale,
                 ACT: tl.constexpr, DROPOUT: tl.constexpr, DROP_SHIFT: tl.constexpr,
                 ONE_PRED: tl.constexpr):  # fmt: skip
    """d h / d (enc + pred) for features k: act' times dropout's mask and scale, [BM, BK] float32."""
    x, m = _pre(p_e, p_p, m_row, k, m_k, s_eh, s_ph, ONE_PRED)
    f = _act_grad(x, ACT)
    if DROPOUT:
        f = tl.where(_keep(cell, k, seed_lo, seed_hi, threshold, DROP_SHIFT), f * drop_scale, 0.0)
    return tl.where(m, f, 0.0)


@triton.jit
def _logits(p_e, p_p, m_row, cell, w_ptr, b_ptr, v, m_v, H, s_eh, s_ph, s_wv, s_wh, seed_lo, seed_hi, threshold,
            drop_scale, ACT: tl.constexpr, DROPOUT: tl.constexpr, DROP_SHIFT: tl.constexpr,
            HAS_BIAS: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr, BM: tl.constexpr, BV: tl.constexpr,
            BK: tl.constexpr, BU: tl.constexpr):  # fmt: skip
    """The tile's logits against classes v: [BM, BV] float32 (bias included; garbage in masked columns)."""
    acc = tl.zeros([BM, BV], tl.float32)
    o_k = tl.arange(0, BK)
    for k0 in range(0, H, BK):
        k = k0 + o_k
        m_k = k < H
        h = _hidden(p_e, p_p, m_row, cell, k, m_k, s_eh, s_ph, seed_lo, seed_hi, threshold, drop_scale, ACT,
                    DROPOUT, DROP_SHIFT, BU == 1)  # fmt: skip
        w = tl.load(w_ptr + v[None, :] * s_wv + k[:, None] * s_wh, mask=m_k[:, None] & m_v[None, :], other=0.0)
        acc = _mma(h, w, acc, DT, PREC)
    if HAS_BIAS:
        acc += tl.load(b_ptr + v, mask=m_v, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def _lse_chunk(b_m, b_s, x_blank, x_label, v0, V, p_e, p_p, m_row, cell, w_ptr, b_ptr, lab, H, s_eh, s_ph, s_wv, s_wh,
               seed_lo, seed_hi, threshold, drop_scale, blank, ACT: tl.constexpr, DROPOUT: tl.constexpr,
               DROP_SHIFT: tl.constexpr, HAS_BIAS: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
               BM: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr, BU: tl.constexpr):  # fmt: skip
    """One chunk of classes [v0, v0 + BV) of the online log-sum-exp (log2 units), and the blank and label logits."""
    v = v0 + tl.arange(0, BV)
    m_v = v < V
    acc = _logits(p_e, p_p, m_row, cell, w_ptr, b_ptr, v, m_v, H, s_eh, s_ph, s_wv, s_wh, seed_lo, seed_hi, threshold,
                  drop_scale, ACT, DROPOUT, DROP_SHIFT, HAS_BIAS, DT, PREC, BM, BV, BK, BU)  # fmt: skip
    x2 = tl.where(m_v[None, :], acc * _log2e(), float("-inf"))
    m_new = tl.maximum(b_m, tl.max(x2, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    b_s = b_s * tl.exp2(b_m - m_safe) + tl.sum(tl.exp2(x2 - m_safe[:, None]), axis=1)
    x_blank += tl.sum(tl.where(v[None, :] == blank, acc, 0.0), axis=1)
    x_label += tl.sum(tl.where(v[None, :] == lab[:, None], acc, 0.0), axis=1)
    return m_new, b_s, x_blank, x_label


@triton.jit
def _ds_chunk(ds_ptr, rows, v0, V, p_e, p_p, m_row, cell, w_ptr, b_ptr, lab, lse, occ_b, occ_e, g, clamp, H, s_eh,
              s_ph, s_wv, s_wh, seed_lo, seed_hi, threshold, drop_scale, blank, ACT: tl.constexpr,
              DROPOUT: tl.constexpr, DROP_SHIFT: tl.constexpr, HAS_BIAS: tl.constexpr, DT: tl.constexpr,
              PREC: tl.constexpr, CLAMP: tl.constexpr, BM: tl.constexpr, BV: tl.constexpr,
              BK: tl.constexpr):  # fmt: skip
    """One chunk of classes [v0, v0 + BV) of the tile's logits' gradient, stored at ``rows``."""
    v = v0 + tl.arange(0, BV)
    m_v = v < V
    x = _logits(p_e, p_p, m_row, cell, w_ptr, b_ptr, v, m_v, H, s_eh, s_ph, s_wv, s_wh, seed_lo, seed_hi, threshold,
                drop_scale, ACT, DROPOUT, DROP_SHIFT, HAS_BIAS, DT, PREC, BM, BV, BK, 1)  # fmt: skip
    d = _dlogits(x, v, m_v, m_row, lse, occ_b, occ_e, lab, g, blank, clamp, CLAMP)
    tl.store(ds_ptr + rows[:, None] + v[None, :], d.to(DT), mask=m_v[None, :])


@triton.jit
def _tile(pid, n_tb, n_ub, il_ptr, tl_ptr, T, U1, BT: tl.constexpr, BU: tl.constexpr):
    """Tile ``pid`` (sample-major, then frame blocks, then label blocks): its sample, first frame and label,
    the sample's lengths, and whether the tile holds a cell with edges (t < T_n, u <= U_n)."""
    per_n = n_tb * n_ub
    n = pid // per_n
    r = pid - n * per_n
    tb = r // n_ub
    t0 = tb * BT
    u0 = (r - tb * n_ub) * BU
    T_n, U_n = _lengths(il_ptr, tl_ptr, n, True, T, U1)
    return n.to(tl.int64), t0, u0, T_n, U_n, (t0 < T_n) & (u0 <= U_n)


@triton.jit
def _tile_cells(n, t0, u0, T_n, U_n, T, U1, enc_ptr, pred_ptr, s_en, s_et, s_pn, s_pu,
                BT: tl.constexpr, BU: tl.constexpr):  # fmt: skip
    """The tile's cells (frame-major): t, u, which have edges, their indices (n * T + t) * (U + 1) + u, and
    pointers to their encoder and predictor rows."""
    o_m = tl.arange(0, BT * BU)
    t = t0 + o_m // BU
    u = u0 + o_m % BU
    m_row = (t < T_n) & (u <= U_n)
    cell = (n * T + t) * U1 + u
    p_e = enc_ptr + n * s_en + t.to(tl.int64) * s_et
    if BU == 1:
        p_p = pred_ptr + n * s_pn + u0.to(tl.int64) * s_pu
    else:
        p_p = pred_ptr + n * s_pn + u.to(tl.int64) * s_pu
    return t, u, m_row, cell, p_e, p_p


@triton.jit
def _labels(tgt_ptr, stride_tg, n, u, m_row, U_n, V):
    """Each cell's next label (clamped to [0, V) as the RNN-T kernels clamp it), -1 where it has none."""
    has_label = m_row & (u < U_n)
    lab = tl.load(tgt_ptr + n * stride_tg + u, mask=has_label, other=0).to(tl.int64)
    return tl.where(has_label, tl.minimum(tl.maximum(lab, 0), V - 1), -1).to(tl.int32), has_label


@triton.jit(do_not_specialize=["seed_lo", "seed_hi", "threshold"])
def _joint_lattice_kernel(
    enc_ptr,  # [N, T, H]
    pred_ptr,  # [N, U+1, H]
    w_ptr,  # [V, H]
    b_ptr,  # [V] (HAS_BIAS)
    tgt_ptr,  # [N, U]
    il_ptr,
    tl_ptr,
    lse_ptr,  # [N * T * (U+1)] float32 out: natural-log log-sum-exp per cell
    lat_ptr,  # [N * T * (U+1), 2] float32 out: log2 p(blank), log2 p(next label), skewed as _cell_offsets
    cnt_ptr,  # int32: zeroed here for the batch reduction of the recursions
    T,
    U1,
    V,
    H,
    n_tb,
    n_ub,
    V_main,  # classes [0, V_main) in chunks of BV, the rest in chunks of BVT
    s_en,
    s_et,
    s_eh,
    s_pn,
    s_pu,
    s_ph,
    s_wv,
    s_wh,
    stride_tg,
    blank,
    seed_lo,
    seed_hi,
    threshold,
    drop_scale,
    ACT: tl.constexpr,
    DROPOUT: tl.constexpr,
    DROP_SHIFT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DT: tl.constexpr,
    PREC: tl.constexpr,
    RNA: tl.constexpr,
    BT: tl.constexpr,
    BU: tl.constexpr,
    BV: tl.constexpr,
    BVT: tl.constexpr,
    BK: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid == 0:
        tl.store(cnt_ptr, 0)
    n, t0, u0, T_n, U_n, live = _tile(pid, n_tb, n_ub, il_ptr, tl_ptr, T, U1, BT, BU)
    if live:
        BM: tl.constexpr = BT * BU
        t, u, m_row, cell, p_e, p_p = _tile_cells(n, t0, u0, T_n, U_n, T, U1, enc_ptr, pred_ptr, s_en, s_et, s_pn,
                                                  s_pu, BT, BU)  # fmt: skip
        lab, has_label = _labels(tgt_ptr, stride_tg, n, u, m_row, U_n, V)
        b_m = tl.full([BM], float("-inf"), tl.float32)  # running maximum (log2 units)
        b_s = tl.zeros([BM], tl.float32)  # running sum of exp2(x - b_m)
        x_blank = tl.zeros([BM], tl.float32)
        x_label = tl.zeros([BM], tl.float32)
        tile = (p_e, p_p, m_row, cell, w_ptr, b_ptr, lab, H, s_eh, s_ph, s_wv, s_wh, seed_lo, seed_hi, threshold,
                drop_scale, blank)  # fmt: skip
        for v0 in range(0, V_main, BV):  # whole chunks
            b_m, b_s, x_blank, x_label = _lse_chunk(b_m, b_s, x_blank, x_label, v0, V, *tile, ACT, DROPOUT,
                                                    DROP_SHIFT, HAS_BIAS, DT, PREC, BM, BV, BK, BU)  # fmt: skip
        for v0 in range(V_main, V, BVT):  # the last classes in narrow chunks (V = 2^k + 1: the blank alone)
            b_m, b_s, x_blank, x_label = _lse_chunk(b_m, b_s, x_blank, x_label, v0, V, *tile, ACT, DROPOUT,
                                                    DROP_SHIFT, HAS_BIAS, DT, PREC, BM, BVT, BK, BU)  # fmt: skip
        m_safe = tl.where(b_m == float("-inf"), 0.0, b_m)
        lse = (m_safe + tl.log2(b_s)) * _ln2()
        tl.store(lse_ptr + cell, lse, mask=m_row)
        p_cell = lat_ptr + _cell_offsets(n, t.to(tl.int64), u, T, U1, RNA)
        tl.store(p_cell, (x_blank - lse) * _log2e(), mask=m_row)
        tl.store(p_cell + 1, tl.where(has_label, (x_label - lse) * _log2e(), _neg()), mask=m_row)


@triton.jit
def _tile_state(n, t, u, m_row, cell, lse_ptr, occ_ptr, logp_ptr, gloss_ptr, gloss_stride, gscale, fastemit_scale,
                T, U1, RNA: tl.constexpr):  # fmt: skip
    """What the backward needs of a tile: which cells take part (edges, a possible sample), their log-sum-exps,
    blank and label occupancies (the latter times 1 + lambda), the sample's upstream gradient (NaN for a NaN
    loss), and whether any of it is nonzero (else the tile's gradient is exactly zero)."""
    logp = tl.load(logp_ptr + n)
    # (a block mask and a scalar condition combine through where: the interpreter rejects block & scalar)
    m_row = tl.where(logp != float("-inf"), m_row, False)
    p_cell = occ_ptr + _cell_offsets(n, t.to(tl.int64), u, T, U1, RNA)
    occ_b = tl.load(p_cell, mask=m_row, other=0.0)
    occ_e = tl.load(p_cell + 1, mask=m_row, other=0.0) * fastemit_scale
    lse = tl.load(lse_ptr + cell, mask=m_row, other=0.0)
    g = tl.load(gloss_ptr + n * gloss_stride).to(tl.float32) * gscale
    # NaN for a NaN loss: every read score's gradient is NaN then (an impossible sample's stays zero)
    g = g + tl.where(logp != float("-inf"), logp - logp, 0.0).to(tl.float32)
    nonzero = tl.sum(tl.where(m_row & ((occ_b + occ_e) != 0.0), 1, 0), axis=0) > 0
    return m_row, occ_b, occ_e, lse, g, nonzero | (g != g)


@triton.jit
def _dlogits(acc, v, m_v, m_row, lse, occ_b, occ_e, lab, g, blank, clamp, CLAMP: tl.constexpr):
    """The logits' gradient [BM, BV] float32: g * (softmax * (occ_b + occ_e) - occ_b [blank] - occ_e [label]),
    clamped before g scales it (as torchaudio clamps); 0 off the cells and classes."""
    d = tl.exp2((acc - lse[:, None]) * _log2e()) * (occ_b + occ_e)[:, None]
    d -= tl.where(v[None, :] == blank, occ_b[:, None], 0.0)
    d -= tl.where(v[None, :] == lab[:, None], occ_e[:, None], 0.0)
    if CLAMP:
        d = tl.minimum(tl.maximum(d, -clamp), clamp)
    return tl.where(m_row[:, None] & m_v[None, :], g * d, 0.0)


@triton.jit
def _mma(a, b, acc, DT: tl.constexpr, PREC: tl.constexpr):
    """acc + a @ b on tensor cores: in DT (the inputs' 16-bit dtype), or float32 products (DT float32) at the
    precision PREC ("ieee", or "tf32x3": three TF32 products, float32's accuracy on tensor cores)."""
    if DT == tl.float32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision=PREC)
    else:
        return tl.dot(a.to(DT), b.to(DT), acc)


@triton.jit(do_not_specialize=["seed_lo", "seed_hi", "threshold"])
def _joint_dlogits_kernel(
    enc_ptr,
    pred_ptr,
    w_ptr,
    b_ptr,
    tgt_ptr,
    il_ptr,
    tl_ptr,
    lse_ptr,
    occ_ptr,  # [N * T * (U+1), 2] edge occupancies (skewed)
    logp_ptr,  # [N] float64 log2 p
    gloss_ptr,  # upstream gradient per sample (stride 0: one for the batch)
    ds_ptr,  # [tiles, BT, s_ds] out: the chunk's logits' gradient (the products' dtype)
    flag_ptr,  # [tiles] int32 out: rows written (the frames with edges) where the tile has work, else 0
    gloss_stride,
    gscale,
    n0,  # the chunk: samples [n0, n0 + rows / n_tb), labels [u0, u0 + UC)
    u0,
    UC,
    T,
    U1,
    V,
    H,
    n_tb,
    V_main,
    s_ds,
    s_en,
    s_et,
    s_eh,
    s_pn,
    s_pu,
    s_ph,
    s_wv,
    s_wh,
    stride_tg,
    blank,
    fastemit_scale,
    clamp,
    seed_lo,
    seed_hi,
    threshold,
    drop_scale,
    ACT: tl.constexpr,
    DROPOUT: tl.constexpr,
    DROP_SHIFT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DT: tl.constexpr,
    PREC: tl.constexpr,
    CLAMP: tl.constexpr,
    RNA: tl.constexpr,
    BT: tl.constexpr,
    BV: tl.constexpr,
    BVT: tl.constexpr,
    BK: tl.constexpr,
):
    """Program = tile (sample, frame block, label) of the chunk: its logits made again, chunk by chunk of BV classes,
    and their gradient g * (softmax * (occ_b + occ_e) - occ_b [blank] - occ_e [label]) stored in the products'
    dtype (0 in rows without edges); a tile without work writes nothing and flags it."""
    i = tl.program_id(0)
    j = i % UC
    r = i // UC
    tb = r % n_tb
    n = (n0 + r // n_tb).to(tl.int64)
    t0 = tb * BT
    u = u0 + j
    T_n, U_n = _lengths(il_ptr, tl_ptr, n, True, T, U1)
    rows_ok = 0
    if (t0 < T_n) & (u <= U_n):
        t, uu, m_row, cell, p_e, p_p = _tile_cells(n, t0, u, T_n, U_n, T, U1, enc_ptr, pred_ptr, s_en, s_et, s_pn,
                                                   s_pu, BT, 1)  # fmt: skip
        m_row, occ_b, occ_e, lse, g, work = _tile_state(n, t, uu, m_row, cell, lse_ptr, occ_ptr, logp_ptr, gloss_ptr,
                                                        gloss_stride, gscale, fastemit_scale, T, U1, RNA)  # fmt: skip
        if work:
            rows_ok = tl.sum(m_row.to(tl.int32), axis=0)
            lab, _has_label = _labels(tgt_ptr, stride_tg, n, uu, m_row, U_n, V)
            rows = (i * BT + tl.arange(0, BT)).to(tl.int64) * s_ds
            tile = (p_e, p_p, m_row, cell, w_ptr, b_ptr, lab, lse, occ_b, occ_e, g, clamp, H, s_eh, s_ph, s_wv, s_wh,
                    seed_lo, seed_hi, threshold, drop_scale, blank)  # fmt: skip
            for v0 in range(0, V_main, BV):
                _ds_chunk(ds_ptr, rows, v0, V, *tile, ACT, DROPOUT, DROP_SHIFT, HAS_BIAS, DT, PREC, CLAMP, BT, BV, BK)
            for v0 in range(V_main, V, BVT):
                _ds_chunk(ds_ptr, rows, v0, V, *tile, ACT, DROPOUT, DROP_SHIFT, HAS_BIAS, DT, PREC, CLAMP, BT, BVT, BK)
    # the rows with edges (a prefix of the tile's frames), 0 for a tile without work
    tl.store(flag_ptr + i, rows_ok)


@triton.jit
def _chunk_rows(i0, n0, u0, UC, tiles, n_tb, flag_ptr, enc_ptr, pred_ptr, T, U1, s_en, s_et, s_pn, s_pu,
                BT: tl.constexpr, BM: tl.constexpr):  # fmt: skip
    """BM rows of the chunk's logits' gradient from tile i0 on (BM / BT consecutive tiles): which hold a cell with
    edges (written by ``_joint_dlogits_kernel``), their frames, labels, cells and encoder and predictor rows."""
    o_m = tl.arange(0, BM)
    i = i0 + o_m // BT
    r = i // UC
    tb = r % n_tb
    n = (n0 + r // n_tb).to(tl.int64)
    t = tb * BT + o_m % BT
    u = u0 + i % UC
    m_row = (o_m % BT) < tl.load(flag_ptr + i, mask=i < tiles, other=0)
    cell = (n * T + t) * U1 + u
    p_e = enc_ptr + n * s_en + t.to(tl.int64) * s_et
    p_p = pred_ptr + n * s_pn + u.to(tl.int64) * s_pu
    return m_row, t, u, cell, p_e, p_p


@triton.jit(do_not_specialize=["seed_lo", "seed_hi", "threshold"])
def _joint_grad_rows_kernel(
    enc_ptr,
    pred_ptr,
    w_ptr,
    ds_ptr,  # the chunk's logits' gradient and flags (``_joint_dlogits_kernel``)
    flag_ptr,
    genc_ptr,  # [N, T, H] float32 in/out: the encoder rows' gradient
    gpred_ptr,  # [n_tb, N, U+1, H] float32 out (zeroed): the predictor rows' per frame block
    n0,
    u0,
    UC,
    N,
    T,
    U1,
    V,
    H,
    n_tb,
    s_ds,
    s_en,
    s_et,
    s_eh,
    s_pn,
    s_pu,
    s_ph,
    s_wv,
    s_wh,
    seed_lo,
    seed_hi,
    threshold,
    drop_scale,
    ACT: tl.constexpr,
    DROPOUT: tl.constexpr,
    DROP_SHIFT: tl.constexpr,
    DT: tl.constexpr,
    PREC: tl.constexpr,
    BT: tl.constexpr,
    UB: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    """Program (piece of BN features, sample and frame block of the chunk): UB labels at a time, the logits'
    gradient [UB * BT, V] times the weight's piece, times d h / d (enc + pred); summed over the labels into the
    encoder rows (registers, then added once) and over the frames into the frame block's share of each predictor
    row (stored). Each row belongs to one program of a chunk; chunks run one after another: deterministic."""
    BM: tl.constexpr = UB * BT
    p = tl.program_id(0)
    r = tl.program_id(1)
    tb = r % n_tb
    n = (n0 + r // n_tb).to(tl.int64)
    t = tb * BT + tl.arange(0, BT)
    k = p * BN + tl.arange(0, BN)
    m_k = k < H
    o_v = tl.arange(0, BK)
    acc_enc = tl.zeros([BT, BN], tl.float32)
    for j0 in range(0, UC, UB):
        i0 = r * UC + j0
        m_row, _t, u, cell, p_e, p_p = _chunk_rows(i0, n0, u0, UC, r * UC + UC, n_tb, flag_ptr, enc_ptr, pred_ptr, T,
                                                   U1, s_en, s_et, s_pn, s_pu, BT, BM)  # fmt: skip
        if tl.sum(m_row.to(tl.int32), axis=0) > 0:
            rows = (i0 * BT + tl.arange(0, BM)).to(tl.int64) * s_ds
            acc = tl.zeros([BM, BN], tl.float32)
            for v0 in range(0, V, BK):
                v = v0 + o_v
                m_v = v < V
                d = tl.load(ds_ptr + rows[:, None] + v[None, :], mask=m_row[:, None] & m_v[None, :], other=0.0)
                w = tl.load(w_ptr + v[:, None] * s_wv + k[None, :] * s_wh, mask=m_v[:, None] & m_k[None, :],
                            other=0.0)  # fmt: skip
                acc = _mma(d, w, acc, DT, PREC)
            f = _hidden_grad(p_e, p_p, m_row, cell, k, m_k, s_eh, s_ph, seed_lo, seed_hi, threshold, drop_scale, ACT,
                             DROPOUT, DROP_SHIFT, False)  # fmt: skip
            # (where, not a product: a NaN weight leaves the rows of cells without edges alone)
            part = tl.reshape(tl.where(m_row[:, None], acc * f, 0.0), (UB, BT, BN))
            acc_enc += tl.sum(part, axis=0)
            j = j0 + tl.arange(0, UB)
            q = gpred_ptr + ((tb * N + n) * U1 + u0 + j.to(tl.int64))[:, None] * H + k[None, :]
            tl.store(q, tl.sum(part, axis=1), mask=(j < UC)[:, None] & m_k[None, :])
    q = genc_ptr + (n * T + t.to(tl.int64))[:, None] * H + k[None, :]
    m = (t < T)[:, None] & m_k[None, :]
    tl.store(q, tl.load(q, mask=m) + acc_enc, mask=m)


@triton.jit(do_not_specialize=["seed_lo", "seed_hi", "threshold"])
def _joint_grad_weight_kernel(
    enc_ptr,
    pred_ptr,
    ds_ptr,
    flag_ptr,
    gw_ptr,  # [S, V, H] float32 in/out: the weight's gradient per group of tiles
    gb_ptr,  # [S, V] float32 in/out (WITH_BIAS): the bias's
    n0,
    u0,
    UC,
    tiles,
    S,
    T,
    U1,
    V,
    H,
    n_tb,
    s_ds,
    s_en,
    s_et,
    s_eh,
    s_pn,
    s_pu,
    s_ph,
    seed_lo,
    seed_hi,
    threshold,
    drop_scale,
    ACT: tl.constexpr,
    DROPOUT: tl.constexpr,
    DROP_SHIFT: tl.constexpr,
    DT: tl.constexpr,
    PREC: tl.constexpr,
    WITH_BIAS: tl.constexpr,
    BT: tl.constexpr,
    KT: tl.constexpr,
    BV: tl.constexpr,
    BN: tl.constexpr,
):
    """Program (BV classes x BN features, group s): over blocks of KT consecutive tiles of the chunk (blocks s,
    s + S, ...), the logits' gradient transposed [BV, KT * BT] times the hidden features [KT * BT, BN] (made
    again from enc and pred; rows without edges masked), added once to the group's partial sums (groups summed
    in a fixed order after the last chunk). The bias's gradient, the column sums, by the first feature piece."""
    BM: tl.constexpr = KT * BT
    n_vt = tl.cdiv(V, BV)
    i_v = tl.program_id(0) % n_vt
    i_k = tl.program_id(0) // n_vt
    s = tl.program_id(1)
    v = i_v * BV + tl.arange(0, BV)
    m_v = v < V
    k = i_k * BN + tl.arange(0, BN)
    m_k = k < H
    acc = tl.zeros([BV, BN], tl.float32)
    acc_b = tl.zeros([BV], tl.float32)
    for i0 in range(s * KT, tiles, S * KT):
        m_row, _t, _u, cell, p_e, p_p = _chunk_rows(i0, n0, u0, UC, tiles, n_tb, flag_ptr, enc_ptr, pred_ptr, T, U1,
                                                    s_en, s_et, s_pn, s_pu, BT, BM)  # fmt: skip
        rows = (i0 * BT + tl.arange(0, BM)).to(tl.int64) * s_ds
        d = tl.load(ds_ptr + rows[:, None] + v[None, :], mask=m_row[:, None] & m_v[None, :], other=0.0)
        h = _hidden(p_e, p_p, m_row, cell, k, m_k, s_eh, s_ph, seed_lo, seed_hi, threshold, drop_scale, ACT, DROPOUT,
                    DROP_SHIFT, False)  # fmt: skip
        acc = _mma(tl.trans(d), h, acc, DT, PREC)
        if WITH_BIAS:
            acc_b += tl.sum(d.to(tl.float32), axis=0)
    q = gw_ptr + (s * V + v.to(tl.int64))[:, None] * H + k[None, :]
    m = m_v[:, None] & m_k[None, :]
    tl.store(q, tl.load(q, mask=m) + acc, mask=m)
    if WITH_BIAS:
        if i_k == 0:
            qb = gb_ptr + s * V + v
            tl.store(qb, tl.load(qb, mask=m_v) + acc_b, mask=m_v)


# ---------------------------------------------------------------------------------------------------------------
# launchers

TUNING: dict | None = None  # block sizes that replace _blocks' (sweeps)
FLOAT32_PRECISION = "ieee"  # float32 inputs' products: "ieee" or "tf32x3"
TRITON_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def _blocks(enc: torch.Tensor, kernel: str) -> dict:
    """Tile sizes per kernel: "forward" (BT x BU cells, BV classes a logits chunk, BK features a product step),
    "dlogits" (BT frames of one label; BT is the backward's), "rows" (BN features, BK classes a step), "weight"
    (BV classes x BN features); small ones under the interpreter (CPU tests)."""
    if not enc.is_cuda:
        blk = dict(BT=4, BU=4, BV=32, BVT=16, BK=16, BN=16, UB=2, KT=2, num_warps=4, num_stages=1)
        if kernel != "forward":
            blk.update(BT=8, BU=1)
    elif kernel == "forward":
        blk = dict(BT=128, BU=1, BV=256, BVT=16, BK=64, num_warps=8, num_stages=3)
    elif kernel == "dlogits":
        blk = dict(BT=64, BV=256, BVT=16, BK=64, num_warps=8, num_stages=3)
    elif kernel == "rows":
        blk = dict(UB=2, BN=256, BK=64, num_warps=8, num_stages=3)
    else:
        blk = dict(KT=2, BV=128, BN=256, num_warps=8, num_stages=2)
    if enc.is_cuda and enc.element_size() == 4:
        # float32 tiles fill the shared memory sooner
        blk.update(dict(BV=128, num_stages=2) if kernel in ("forward", "dlogits") else dict(num_stages=2))
    if TUNING and kernel in TUNING:
        blk.update(TUNING[kernel])
    return blk


def _common(enc, pred, weight, bias, dropout, seed, activation, precision):
    """Arguments every kernel takes: strides, the dropout hash's parameters, the constexpr flags."""
    from .joint_reference import drop_threshold

    args = (enc.stride(0), enc.stride(1), enc.stride(2), pred.stride(0), pred.stride(1), pred.stride(2),
            weight.stride(0), weight.stride(1))  # fmt: skip
    drop = (seed[0], seed[1], drop_threshold(dropout), 1.0 / (1.0 - dropout))
    meta = dict(ACT=ACTIVATIONS.index(activation), DROPOUT=dropout > 0, DROP_SHIFT=32 - DROP_BITS,
                HAS_BIAS=bias is not None, DT=TRITON_DTYPES[weight.dtype], PREC=precision)  # fmt: skip
    return args, drop, meta


def _launch(blk: dict) -> dict:
    return {k: blk[k] for k in ("num_warps", "num_stages")}


def joint_forward(
    enc: torch.Tensor,
    pred: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    activation: str,
    dropout: float,
    seed: tuple[int, int],
    loss_scale: float,
    rnna: bool,
    need_grad: bool,
    reduction: str = "none",
    precision: str = "ieee",
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The loss ([N] float32 for reduction "none", else the batch sum or mean) and the state ``joint_backward``
    takes (log-sum-exps, occupancies, log2 p).

    Args:
        enc: [N, T, H], pred: [N, U+1, H], weight: [V, H], bias: [V] or None, one float dtype, any strides.
        targets: [N, U] int32/int64 (unit stride along U); lengths: [N] int32/int64; all on enc's device.
        seed: two integers in [0, 2^31) (dropout's hash).
        precision: float32's products, "ieee" or "tf32x3".
    """
    N, T, H = enc.shape
    U1 = pred.shape[1]
    V = weight.shape[0]
    dev = enc.device
    n_cells = N * T * U1
    lse = _empty(n_cells, dtype=torch.float32, device=dev)
    lat = _empty(2 * n_cells, dtype=torch.float32, device=dev)
    aux = _empty(1 + 2 * N, dtype=torch.int32, device=dev)
    blk = _blocks(enc, "forward")
    n_tb, n_ub = triton.cdiv(T, blk["BT"]), triton.cdiv(U1, blk["BU"])
    strides, drop, meta = _common(enc, pred, weight, bias, dropout, seed, activation, precision)
    _joint_lattice_kernel[(N * n_tb * n_ub,)](
        enc, pred, weight, bias, targets, logit_lengths, target_lengths, lse, lat, aux, T, U1, V, H, n_tb, n_ub,
        _main_classes(V, blk), *strides, targets.stride(0), blank, *drop, RNA=rnna, BT=blk["BT"], BU=blk["BU"],
        BV=blk["BV"], BVT=blk["BVT"], BK=blk["BK"], **_launch(blk), **meta,
    )  # fmt: skip
    loss, logp = rnnt_recursions(lat, aux, logit_lengths, target_lengths, N, T, U1, loss_scale, rnna, need_grad,
                                 reduction)  # fmt: skip
    return loss, (lse, lat, logp)


def joint_backward(
    grad_out: torch.Tensor,
    enc: torch.Tensor,
    pred: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    lse: torch.Tensor,
    occ: torch.Tensor,
    logp: torch.Tensor,
    blank: int,
    activation: str,
    dropout: float,
    seed: tuple[int, int],
    fastemit_lambda: float,
    clamp: float,
    rnna: bool,
    reduction: str = "none",
    precision: str = "ieee",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients of sum(grad_out * loss) (reduction "none"; else of grad_out * the sum or batch mean) with
    respect to enc, pred, weight and bias, in their dtypes.

    Chunk by chunk of tiles (samples x labels, all frames; at most ``CHUNK_BYTES`` of logits' gradient): the
    logits' gradient of the chunk's tiles, then its products with the weight (into the encoder and predictor
    rows) and with the hidden vectors (into the weight and bias)."""
    N, T, H = enc.shape
    U1 = pred.shape[1]
    V = weight.shape[0]
    dev = enc.device
    strides, seeds, meta = _common(enc, pred, weight, bias, dropout, seed, activation, precision)
    gstride = grad_out.stride(0) if reduction == "none" else 0
    gscale = 1.0 / N if reduction == "mean" else 1.0
    common = {k: meta[k] for k in ("ACT", "DROPOUT", "DROP_SHIFT", "DT", "PREC")}
    b1, b2, b3 = _blocks(enc, "dlogits"), _blocks(enc, "rows"), _blocks(enc, "weight")
    BT = b1["BT"]
    n_tb = triton.cdiv(T, BT)
    nc, uc, s_ds = _chunks(N, U1, n_tb * BT, V, weight.element_size(), dev)
    ds = _empty(nc * n_tb * uc * BT, s_ds, dtype=weight.dtype, device=dev)
    flags = _empty(nc * n_tb * uc, dtype=torch.int32, device=dev)
    genc = torch.zeros(N, T, H, dtype=torch.float32, device=dev)
    gpred = torch.zeros(n_tb, N, U1, H, dtype=torch.float32, device=dev)
    # the weight's gradient: tiles of BV classes x BN features, about two programs per multiprocessor in all
    n_vk = triton.cdiv(V, b3["BV"]) * triton.cdiv(H, b3["BN"])
    groups = max(1, min(triton.cdiv(nc * n_tb * uc, b3["KT"]), triton.cdiv(2 * _sm_count(dev), n_vk)))
    gw = torch.zeros(groups, V, H, dtype=torch.float32, device=dev)
    gb = torch.zeros(groups, V, dtype=torch.float32, device=dev) if bias is not None else None
    state = (enc, pred, weight, bias, targets, logit_lengths, target_lengths, lse, occ, logp, grad_out)
    for n0 in range(0, N, nc):
        for u0 in range(0, U1, uc):
            ucc = min(uc, U1 - u0)
            rows = min(nc, N - n0) * n_tb
            _joint_dlogits_kernel[(rows * ucc,)](
                *state, ds, flags, gstride, gscale, n0, u0, ucc, T, U1, V, H, n_tb, _main_classes(V, b1), s_ds,
                *strides, targets.stride(0), blank, 1.0 + fastemit_lambda, max(clamp, 0.0), *seeds,
                HAS_BIAS=bias is not None, CLAMP=clamp > 0, RNA=rnna, BT=BT, BV=b1["BV"], BVT=b1["BVT"],
                BK=b1["BK"], **_launch(b1), **common,
            )  # fmt: skip
            _joint_grad_rows_kernel[(triton.cdiv(H, b2["BN"]), rows)](
                enc, pred, weight, ds, flags, genc, gpred, n0, u0, ucc, N, T, U1, V, H, n_tb, s_ds, *strides, *seeds,
                BT=BT, UB=b2["UB"], BN=b2["BN"], BK=b2["BK"], **_launch(b2), **common,
            )  # fmt: skip
            _joint_grad_weight_kernel[(n_vk, groups)](
                enc, pred, ds, flags, gw, gb, n0, u0, ucc, rows * ucc, groups, T, U1, V, H, n_tb, s_ds,
                *strides[:6], *seeds, WITH_BIAS=bias is not None, BT=BT, KT=b3["KT"], BV=b3["BV"], BN=b3["BN"],
                **_launch(b3), **common,
            )  # fmt: skip
    grad_b = None if bias is None else gb.sum(0).to(bias.dtype)
    return genc.to(enc.dtype), gpred.sum(0).to(pred.dtype), gw.sum(0).to(weight.dtype), grad_b


CHUNK_BYTES = 96 << 20  # the logits' gradient held at once in the backward (on a GPU)


def _main_classes(V: int, blk: dict) -> int:
    """The classes taken in whole chunks of BV; the rest (when few) go in chunks of BVT."""
    rest = V % blk["BV"]
    return V - rest if rest <= 2 * blk["BVT"] else V


def _chunks(N: int, U1: int, frames: int, V: int, esize: int, dev: torch.device) -> tuple[int, int, int]:
    """The backward's chunk: ``nc`` samples x ``uc`` labels (all frames), as many as ``CHUNK_BYTES`` holds
    (at least one sample's label), and the row stride of its logits' gradient (V rounded up to 16)."""
    s_ds = -(-V // 16) * 16
    budget = CHUNK_BYTES if dev.type == "cuda" else 4 * frames * s_ds * esize  # small chunks under the interpreter
    row = frames * s_ds * esize
    if N * row <= budget:
        return N, min(U1, budget // (N * row)), s_ds
    nc = max(1, budget // row)
    return -(-N // -(-N // nc)), 1, s_ds


def _sm_count(dev: torch.device) -> int:
    if dev.type != "cuda":
        return 2
    return torch.cuda.get_device_properties(dev).multi_processor_count
