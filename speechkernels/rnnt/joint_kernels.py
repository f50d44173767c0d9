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
def _pre(p_e, p_p, m_row, k, m_k, s_eh, s_ph, BU: tl.constexpr):
    """enc + pred of the tile's cells for features k: [BM, BK] float32, 0 off the cells and past H. A tile of one
    label (BU = 1) has one predictor row (``p_p`` a scalar): loaded once and broadcast."""
    m = m_row[:, None] & m_k[None, :]
    e = tl.load(p_e[:, None] + k[None, :] * s_eh, mask=m, other=0.0).to(tl.float32)
    if BU == 1:
        p = tl.load(p_p + k * s_ph, mask=m_k, other=0.0).to(tl.float32)[None, :]
    else:
        p = tl.load(p_p[:, None] + k[None, :] * s_ph, mask=m, other=0.0).to(tl.float32)
    return e + p, m


@triton.jit
def _hidden(p_e, p_p, m_row, cell, k, m_k, s_eh, s_ph, seed_lo, seed_hi, threshold, drop_scale,
            ACT: tl.constexpr, DROPOUT: tl.constexpr, DROP_SHIFT: tl.constexpr, BU: tl.constexpr):  # fmt: skip
    """The hidden vectors' features k: dropout(act(enc + pred)), [BM, BK] float32, 0 off the cells."""
    x, m = _pre(p_e, p_p, m_row, k, m_k, s_eh, s_ph, BU)
    h = _act(x, ACT)
    if DROPOUT:
        h = tl.where(_keep(cell, k, seed_lo, seed_hi, threshold, DROP_SHIFT), h * drop_scale, 0.0)
    return tl.where(m, h, 0.0)


@triton.jit
def _hidden_grad(p_e, p_p, m_row, cell, k, m_k, s_eh, s_ph, seed_lo, seed_hi, threshold, drop_scale,
                 ACT: tl.constexpr, DROPOUT: tl.constexpr, DROP_SHIFT: tl.constexpr, BU: tl.constexpr):  # fmt: skip
    """d h / d (enc + pred) for features k: act' times dropout's mask and scale, [BM, BK] float32."""
    x, m = _pre(p_e, p_p, m_row, k, m_k, s_eh, s_ph, BU)
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
                    DROPOUT, DROP_SHIFT, BU)  # fmt: skip
        w = tl.load(w_ptr + v[None, :] * s_wv + k[:, None] * s_wh, mask=m_k[:, None] & m_v[None, :], other=0.0)
        acc = _mma(h, w, acc, DT, PREC)
    if HAS_BIAS:
        acc += tl.load(b_ptr + v, mask=m_v, other=0.0).to(tl.float32)[None, :]
    return acc


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
        o_v = tl.arange(0, BV)
        for v0 in range(0, V, BV):
            v = v0 + o_v
            m_v = v < V
            acc = _logits(p_e, p_p, m_row, cell, w_ptr, b_ptr, v, m_v, H, s_eh, s_ph, s_wv, s_wh, seed_lo, seed_hi,
                          threshold, drop_scale, ACT, DROPOUT, DROP_SHIFT, HAS_BIAS, DT, PREC, BM, BV,
                          BK, BU)  # fmt: skip
            x2 = tl.where(m_v[None, :], acc * _log2e(), float("-inf"))
            m_new = tl.maximum(b_m, tl.max(x2, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            b_s = b_s * tl.exp2(b_m - m_safe) + tl.sum(tl.exp2(x2 - m_safe[:, None]), axis=1)
            b_m = m_new
            x_blank += tl.sum(tl.where(v[None, :] == blank, acc, 0.0), axis=1)
            x_label += tl.sum(tl.where(v[None, :] == lab[:, None], acc, 0.0), axis=1)
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


@triton.jit
def _piece_dh(acc, d, w_ptr, v, m_v, k, c1, s_wv, s_wh, DT: tl.constexpr, PREC: tl.constexpr):
    """acc + the logits' gradient d [BM, BV] times the weight's rows v, features k (< c1): [BM, PW]."""
    w = tl.load(w_ptr + v[:, None] * s_wv + k[None, :] * s_wh, mask=m_v[:, None] & (k < c1)[None, :], other=0.0)
    return _mma(d, w, acc, DT, PREC)


@triton.jit
def _piece_dw(acc, d_t, p_e, p_p, m_row, cell, k, c1, s_eh, s_ph, seed_lo, seed_hi, threshold, drop_scale,
              ACT: tl.constexpr, DROPOUT: tl.constexpr, DROP_SHIFT: tl.constexpr, BU: tl.constexpr, DT: tl.constexpr,
              PREC: tl.constexpr):  # fmt: skip
    """acc + the logits' gradient transposed d_t [BV, BM] times the tile's hidden features k (< c1): [BV, PW]."""
    h = _hidden(p_e, p_p, m_row, cell, k, k < c1, s_eh, s_ph, seed_lo, seed_hi, threshold, drop_scale, ACT, DROPOUT,
                DROP_SHIFT, BU)  # fmt: skip
    return _mma(d_t, h, acc, DT, PREC)


@triton.jit
def _add_rows(acc, k, c1, t, u0, m_row, cell, p_e, p_p, p_genc, p_gpred, T, H, s_eh, s_ph, seed_lo, seed_hi,
              threshold, drop_scale, ACT: tl.constexpr, DROPOUT: tl.constexpr, DROP_SHIFT: tl.constexpr,
              BU: tl.constexpr):  # fmt: skip
    """A tile's hidden-vector gradient (features k) times d h / d (enc + pred), added to its encoder rows (one per
    cell: a tile is one label's frames) and, summed over the frames, to its predictor row."""
    m_k = k < c1
    f = _hidden_grad(p_e, p_p, m_row, cell, k, m_k, s_eh, s_ph, seed_lo, seed_hi, threshold, drop_scale, ACT,
                     DROPOUT, DROP_SHIFT, BU)  # fmt: skip
    # (where, not a product: a NaN weight leaves the rows of cells without edges alone)
    part = tl.where(m_row[:, None], acc * f, 0.0)
    p = p_genc + t[:, None].to(tl.int64) * H + k[None, :]
    m = (t < T)[:, None] & m_k[None, :]
    tl.store(p, tl.load(p, mask=m) + part, mask=m)
    q = p_gpred + u0 * H + k
    tl.store(q, tl.load(q, mask=m_k) + tl.sum(part, axis=0), mask=m_k)


@triton.jit(do_not_specialize=["seed_lo", "seed_hi", "threshold"])
def _joint_grad_hidden_kernel(
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
    genc_ptr,  # [G_U, N, T, H] float32 in/out (zeroed): the encoder rows' gradient per group of labels
    gpred_ptr,  # [G_T, N, U+1, H] float32 in/out (zeroed): the predictor rows' per group of frame blocks
    gloss_stride,
    gscale,
    c0,  # this launch's slice of features: [c0, c1)
    c1,
    N,
    T,
    U1,
    V,
    H,
    n_tb,
    G_T,
    G_U,
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
    BU: tl.constexpr,
    BV: tl.constexpr,
    BK: tl.constexpr,
    PW: tl.constexpr,  # the slice's features: NP pieces of PW
    NP: tl.constexpr,
):
    """Program (n, frame group, label group): tiles (t-block, u) with t-block = gt mod G_T and u = gu mod G_U. A
    tile's logits are made once per class chunk; their gradient times the weight's slice accumulates over the
    classes in registers (one [BM, PW] accumulator per piece of PW features); then once per tile it is added to the
    rows the program owns."""
    tl.static_assert(BU == 1)
    tl.static_assert(NP <= 5)
    BM: tl.constexpr = BT * BU
    pid = tl.program_id(0)
    per_n = G_T * G_U
    n = pid // per_n
    gt = (pid - n * per_n) // G_U
    gu = pid - n * per_n - gt * G_U
    n = n.to(tl.int64)
    o_v = tl.arange(0, BV)
    o_p = tl.arange(0, PW)
    p_genc = genc_ptr + (gu * N + n) * T * H
    p_gpred = gpred_ptr + (gt * N + n) * U1 * H
    for tb in range(gt, n_tb, G_T):
        for ub in range(gu, U1, G_U):
            _n, t0, u0, T_n, U_n, live = _tile(n * n_tb * U1 + tb * U1 + ub, n_tb, U1, il_ptr, tl_ptr, T, U1, BT,
                                               BU)  # fmt: skip
            if live:
                t, u, m_row, cell, p_e, p_p = _tile_cells(n, t0, u0, T_n, U_n, T, U1, enc_ptr, pred_ptr, s_en, s_et,
                                                          s_pn, s_pu, BT, BU)  # fmt: skip
                m_row, occ_b, occ_e, lse, g, work = _tile_state(n, t, u, m_row, cell, lse_ptr, occ_ptr, logp_ptr,
                                                                gloss_ptr, gloss_stride, gscale, fastemit_scale, T,
                                                                U1, RNA)  # fmt: skip
                if work:
                    lab, _has_label = _labels(tgt_ptr, stride_tg, n, u, m_row, U_n, V)
                    # one accumulator per piece of PW features: each piece's operand is loaded on its own (a
                    # whole slice's operand in registers at once spills)
                    acc0 = tl.zeros([BM, PW], tl.float32)
                    acc1 = tl.zeros([BM, PW], tl.float32)
                    acc2 = tl.zeros([BM, PW], tl.float32)
                    acc3 = tl.zeros([BM, PW], tl.float32)
                    acc4 = tl.zeros([BM, PW], tl.float32)
                    for v0 in range(0, V, BV):
                        v = v0 + o_v
                        m_v = v < V
                        x = _logits(p_e, p_p, m_row, cell, w_ptr, b_ptr, v, m_v, H, s_eh, s_ph, s_wv, s_wh, seed_lo,
                                    seed_hi, threshold, drop_scale, ACT, DROPOUT, DROP_SHIFT, HAS_BIAS, DT, PREC, BM,
                                    BV, BK, BU)  # fmt: skip
                        d = _dlogits(x, v, m_v, m_row, lse, occ_b, occ_e, lab, g, blank, clamp, CLAMP).to(DT)
                        acc0 = _piece_dh(acc0, d, w_ptr, v, m_v, c0 + o_p, c1, s_wv, s_wh, DT, PREC)
                        if NP > 1:
                            acc1 = _piece_dh(acc1, d, w_ptr, v, m_v, c0 + PW + o_p, c1, s_wv, s_wh, DT, PREC)
                        if NP > 2:
                            acc2 = _piece_dh(acc2, d, w_ptr, v, m_v, c0 + 2 * PW + o_p, c1, s_wv, s_wh, DT, PREC)
                        if NP > 3:
                            acc3 = _piece_dh(acc3, d, w_ptr, v, m_v, c0 + 3 * PW + o_p, c1, s_wv, s_wh, DT, PREC)
                        if NP > 4:
                            acc4 = _piece_dh(acc4, d, w_ptr, v, m_v, c0 + 4 * PW + o_p, c1, s_wv, s_wh, DT, PREC)
                    rows = (t, u0, m_row, cell, p_e, p_p, p_genc, p_gpred, T, H, s_eh, s_ph, seed_lo, seed_hi,
                            threshold, drop_scale)  # fmt: skip
                    _add_rows(acc0, c0 + o_p, c1, *rows, ACT, DROPOUT, DROP_SHIFT, BU)
                    if NP > 1:
                        _add_rows(acc1, c0 + PW + o_p, c1, *rows, ACT, DROPOUT, DROP_SHIFT, BU)
                    if NP > 2:
                        _add_rows(acc2, c0 + 2 * PW + o_p, c1, *rows, ACT, DROPOUT, DROP_SHIFT, BU)
                    if NP > 3:
                        _add_rows(acc3, c0 + 3 * PW + o_p, c1, *rows, ACT, DROPOUT, DROP_SHIFT, BU)
                    if NP > 4:
                        _add_rows(acc4, c0 + 4 * PW + o_p, c1, *rows, ACT, DROPOUT, DROP_SHIFT, BU)


@triton.jit(do_not_specialize=["seed_lo", "seed_hi", "threshold"])
def _joint_grad_weight_kernel(
    enc_ptr,
    pred_ptr,
    w_ptr,
    b_ptr,
    tgt_ptr,
    il_ptr,
    tl_ptr,
    lse_ptr,
    occ_ptr,
    logp_ptr,
    gloss_ptr,
    gw_ptr,  # [R, V, H] float32 out: the weight's gradient per group of tiles
    gb_ptr,  # [R, V] float32 out (HAS_BIAS and WITH_BIAS): the bias's
    gloss_stride,
    gscale,
    c0,
    c1,
    T,
    U1,
    V,
    H,
    n_tb,
    n_ub,
    n_tiles,
    R,
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
    BU: tl.constexpr,
    BV: tl.constexpr,
    BK: tl.constexpr,
    PW: tl.constexpr,
    NP: tl.constexpr,
    WITH_BIAS: tl.constexpr,  # this launch also sums the bias's gradient (the first slice's)
):
    """Program (class chunk, group r): tiles i = r mod R (strided, so that skipped tiles spread evenly). A tile's
    logits against the chunk's classes are made once; their gradient against the slice's hidden features
    accumulates in registers, one [BV, PW] accumulator per piece of PW features."""
    tl.static_assert(NP <= 5)
    BM: tl.constexpr = BT * BU
    i_v = tl.program_id(0)
    r = tl.program_id(1)
    v = i_v * BV + tl.arange(0, BV)
    m_v = v < V
    o_p = tl.arange(0, PW)
    acc0 = tl.zeros([BV, PW], tl.float32)
    acc1 = tl.zeros([BV, PW], tl.float32)
    acc2 = tl.zeros([BV, PW], tl.float32)
    acc3 = tl.zeros([BV, PW], tl.float32)
    acc4 = tl.zeros([BV, PW], tl.float32)
    acc_bias = tl.zeros([BV], tl.float32)
    for i in range(r, n_tiles, R):
        n, t0, u0, T_n, U_n, live = _tile(i, n_tb, n_ub, il_ptr, tl_ptr, T, U1, BT, BU)
        if live:
            t, u, m_row, cell, p_e, p_p = _tile_cells(n, t0, u0, T_n, U_n, T, U1, enc_ptr, pred_ptr, s_en, s_et,
                                                      s_pn, s_pu, BT, BU)  # fmt: skip
            m_row, occ_b, occ_e, lse, g, work = _tile_state(n, t, u, m_row, cell, lse_ptr, occ_ptr, logp_ptr,
                                                            gloss_ptr, gloss_stride, gscale, fastemit_scale, T, U1,
                                                            RNA)  # fmt: skip
            if work:
                lab, _has_label = _labels(tgt_ptr, stride_tg, n, u, m_row, U_n, V)
                x = _logits(p_e, p_p, m_row, cell, w_ptr, b_ptr, v, m_v, H, s_eh, s_ph, s_wv, s_wh, seed_lo,
                            seed_hi, threshold, drop_scale, ACT, DROPOUT, DROP_SHIFT, HAS_BIAS, DT, PREC, BM, BV,
                            BK, BU)  # fmt: skip
                d = _dlogits(x, v, m_v, m_row, lse, occ_b, occ_e, lab, g, blank, clamp, CLAMP)
                if WITH_BIAS:
                    acc_bias += tl.sum(d, axis=0)
                d_t = tl.trans(d.to(DT))
                hid = (p_e, p_p, m_row, cell)
                rest = (s_eh, s_ph, seed_lo, seed_hi, threshold, drop_scale)
                acc0 = _piece_dw(acc0, d_t, *hid, c0 + o_p, c1, *rest, ACT, DROPOUT, DROP_SHIFT, BU, DT, PREC)
                if NP > 1:
                    acc1 = _piece_dw(acc1, d_t, *hid, c0 + PW + o_p, c1, *rest, ACT, DROPOUT, DROP_SHIFT, BU, DT, PREC)
                if NP > 2:
                    acc2 = _piece_dw(acc2, d_t, *hid, c0 + 2 * PW + o_p, c1, *rest, ACT, DROPOUT, DROP_SHIFT, BU, DT,
                                     PREC)  # fmt: skip
                if NP > 3:
                    acc3 = _piece_dw(acc3, d_t, *hid, c0 + 3 * PW + o_p, c1, *rest, ACT, DROPOUT, DROP_SHIFT, BU, DT,
                                     PREC)  # fmt: skip
                if NP > 4:
                    acc4 = _piece_dw(acc4, d_t, *hid, c0 + 4 * PW + o_p, c1, *rest, ACT, DROPOUT, DROP_SHIFT, BU, DT,
                                     PREC)  # fmt: skip
    p_out = gw_ptr + (r * V + v.to(tl.int64))[:, None] * H
    _store_piece(p_out, acc0, c0 + o_p, c1, m_v)
    if NP > 1:
        _store_piece(p_out, acc1, c0 + PW + o_p, c1, m_v)
    if NP > 2:
        _store_piece(p_out, acc2, c0 + 2 * PW + o_p, c1, m_v)
    if NP > 3:
        _store_piece(p_out, acc3, c0 + 3 * PW + o_p, c1, m_v)
    if NP > 4:
        _store_piece(p_out, acc4, c0 + 4 * PW + o_p, c1, m_v)
    if WITH_BIAS:
        tl.store(gb_ptr + r * V + v, acc_bias, mask=m_v)


@triton.jit
def _store_piece(p_out, acc, k, c1, m_v):
    tl.store(p_out + k[None, :], acc, mask=m_v[:, None] & (k < c1)[None, :])


# ---------------------------------------------------------------------------------------------------------------
# launchers

TUNING: dict | None = None  # block sizes that replace _blocks' (sweeps)
FLOAT32_PRECISION = "ieee"  # float32 inputs' products: "ieee" or "tf32x3"
TRITON_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def _blocks(enc: torch.Tensor, kernel: str) -> dict:
    """Tile sizes per kernel ("forward", "hidden", "weight"): BT x BU cells, BV classes per logits chunk, BK
    features per product step, MAXW features per slice of the gradient kernels' accumulators; small ones under
    the interpreter (CPU tests)."""
    if not enc.is_cuda:
        blk = dict(BT=4, BU=4, BV=16, BK=16, MAXW=48, PW=16, num_warps=4, num_stages=1)
        if kernel != "forward":
            blk.update(BT=16, BU=1)
    elif kernel == "forward":
        blk = dict(BT=128, BU=1, BV=256, BK=64, num_warps=8, num_stages=3)
    else:  # from sweeps on an H100 (benchmarks/NOTES.md): 128 classes a chunk suit the hidden kernel, 64 the weight's
        blk = dict(BT=64, BU=1, BV=128 if kernel == "hidden" else 64, BK=64, MAXW=640, PW=128, num_warps=8,
                   num_stages=1)  # fmt: skip
    if enc.is_cuda and enc.element_size() == 4:
        # float32 tiles of the weight fill the shared memory sooner
        blk.update(dict(BV=128, num_stages=2) if kernel == "forward" else dict(BV=32, MAXW=128))
    if TUNING and kernel in TUNING:
        blk.update(TUNING[kernel])
    return blk


def _slices(H: int, maxw: int, pw: int) -> list[tuple[int, int, int]]:
    """The features of the gradient kernels' accumulators, as slices [c0, c1) of equal widths of at most ``maxw``
    features, each held as NP pieces of ``pw`` (NP <= 5). Each slice is a launch that makes the logits again."""
    maxw = min(maxw, 5 * pw)
    count = -(-H // maxw)
    width = -(-H // (pw * count)) * pw
    return [(c0, min(H, c0 + width), -(-min(width, H - c0) // pw)) for c0 in range(0, H, width)]


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
        *strides, targets.stride(0), blank, *drop, RNA=rnna, BT=blk["BT"], BU=blk["BU"], BV=blk["BV"],
        BK=blk["BK"], **_launch(blk), **meta,
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
    respect to enc, pred, weight and bias, in their dtypes."""
    N, T, H = enc.shape
    U1 = pred.shape[1]
    V = weight.shape[0]
    dev = enc.device
    strides, drop, meta = _common(enc, pred, weight, bias, dropout, seed, activation, precision)
    gstride = grad_out.stride(0) if reduction == "none" else 0
    gscale = 1.0 / N if reduction == "mean" else 1.0
    tail = (targets.stride(0), blank, 1.0 + fastemit_lambda, max(clamp, 0.0), *drop)
    meta.update(CLAMP=clamp > 0, RNA=rnna)
    sms = _sm_count(dev)
    state = (enc, pred, weight, bias, targets, logit_lengths, target_lengths, lse, occ, logp, grad_out)

    # the hidden vectors' gradient, into the encoder and predictor rows: per sample, groups of frame blocks x
    # groups of labels, about four programs per multiprocessor in all; each group's partial rows summed after
    blk = _blocks(enc, "hidden")
    n_tb = triton.cdiv(T, blk["BT"])
    g_t = min(n_tb, max(1, triton.cdiv(4 * sms, N)))
    g_u = min(U1, max(1, triton.cdiv(4 * sms, N * g_t)))
    genc = torch.zeros(g_u, N, T, H, dtype=torch.float32, device=dev)
    gpred = torch.zeros(g_t, N, U1, H, dtype=torch.float32, device=dev)
    for c0, c1, n_p in _slices(H, blk["MAXW"], blk["PW"]):
        _joint_grad_hidden_kernel[(N * g_t * g_u,)](
            *state, genc, gpred, gstride, gscale, c0, c1, N, T, U1, V, H, n_tb, g_t, g_u, *strides, *tail,
            BT=blk["BT"], BU=blk["BU"], BV=blk["BV"], BK=blk["BK"], PW=blk["PW"], NP=n_p,
            **_launch(blk), **meta,
        )  # fmt: skip

    # the weight's and bias's: per class chunk, groups of tiles (strided), partial sums added after
    blk = _blocks(enc, "weight")
    n_tb, n_ub = triton.cdiv(T, blk["BT"]), triton.cdiv(U1, blk["BU"])
    n_tiles = N * n_tb * n_ub
    n_v = triton.cdiv(V, blk["BV"])
    groups = min(n_tiles, max(1, triton.cdiv(2 * sms, n_v)))
    gw = _empty(groups, V, H, dtype=torch.float32, device=dev)
    gb = _empty(groups, V, dtype=torch.float32, device=dev) if bias is not None else None
    for c0, c1, n_p in _slices(H, blk["MAXW"], blk["PW"]):
        _joint_grad_weight_kernel[(n_v, groups)](
            *state, gw, gb, gstride, gscale, c0, c1, T, U1, V, H, n_tb, n_ub, n_tiles, groups, *strides, *tail,
            BT=blk["BT"], BU=blk["BU"], BV=blk["BV"], BK=blk["BK"], PW=blk["PW"], NP=n_p,
            WITH_BIAS=bias is not None and c0 == 0, **_launch(blk), **meta,
        )  # fmt: skip
    grad_b = None if bias is None else gb.sum(0).to(bias.dtype)
    return genc.sum(0).to(enc.dtype), gpred.sum(0).to(pred.dtype), gw.sum(0).to(weight.dtype), grad_b


def _sm_count(dev: torch.device) -> int:
    if dev.type != "cuda":
        return 2
    return torch.cuda.get_device_properties(dev).multi_processor_count
