"""Triton kernels of the transducer beam search (``TransducerDecoder.beam_search``, NeMo's ``malsd_batch`` rules as
``transducer_beam.transducer_beam_search_reference`` writes them): the search's decisions on the GPU, the networks
in PyTorch.

A step is the reference's: the joint of every slot at its frame (PyTorch: the same operations), then one launch of
``_malsd_step_kernel``, one program per utterance, that takes the K x (V + D) joint outputs and the beam's state
and does everything else of the step in registers: each slot's log-softmaxes, the fused LM and boosting terms (the
slot's LM arcs along its backoff chain written as the step's stamped overrides of the root's values, the
boosting bonuses read from the slot's trie state's row of ``PhraseBooster.gain_next``, as the CTC beam kernel
does), each slot's K best labels (packed keys, a
running list per slot over blocks of classes), for TDT their K best (label, duration) pairs, the K x K proposals
with the finished and max_symbols rules, the K best of them, the survivors' state, and the merges (the same
token hash, last token, length, TDT frame). It writes the slots' parents and labels, from which PyTorch advances
the prediction network (the same operations as the reference), and one history entry per slot (parent, label or
-1, frame, duration): the tokens are read back along the parents at the end (``_malsd_backtrack``), not copied per
step. No host synchronisation but a check every ``CHECK_EVERY`` steps of whether a slot is still active (a step
after the last does nothing: its entries keep every slot); on the GPU the chunks of steps replay one CUDA graph.

icefall's ``modified_beam_search`` (``transducer_beam.modified_beam_search_reference``) is the same kernel with
MODIFIED: every utterance at the step's frame, every hypothesis leaving it; the K best of all (hypothesis, class)
pairs in flat order; the LM's term on labels only and boosting's after the selection; merges into the first of
each group in the selection's order.

Switches (module constants, each on since its A/B on the H100, benchmarks/notes/decode.md): ``TF32X3`` (float32
networks' products in ``_linear_kernel``), ``FUSED_CELL`` (each LSTM layer's step in ``_lstm_cell_kernel``),
``KEEP_SEARCH`` (a decoder keeps its last configuration's buffers and graph for the next call).
"""

from __future__ import annotations

import contextlib
import threading
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .._launch import cdiv, launch, next_power_of_2
from .._outputs import kernel_output
from .._transducer.activations import activation_fn
from .beam_kernels import (
    _MAX_KEY,
    _MIN_KEY,
    _boost_at,
    _boost_step,
    _key,
    _lm_at,
    _overrides,
    _pick,
    boost_arguments,
    fusion_constants,
    lm_arguments,
)
from .hypotheses import BeamHypotheses, Hypotheses, TransducerState, compact, fusion_start
from .networks import input_gates_table, predict, search_start
from .transducer_kernels import _INTERPRETER, _sigmoid, _tanh, _tf32_hi

STEP_TILES = {"block_c": 256, "warps": 4, "wide": 8, "block_c_wide": 64, "warps_wide": 8, "block_arcs": 64}
# classes per block (a power of two; tests lower it) and warps; from "wide" slots up (padded), fewer classes per
# block and more warps (Triton 3.6's ptxas for sm_90: at beam 8 with 256 classes and 4 warps the TDT variants spill
# 636-768 bytes, with 64 and 8 none, nor at beam 16); the LM's arcs written per slot at once
CHECK_EVERY = 4  # steps between the host's checks for an active slot
TF32X3 = True  # float32 networks' products in _linear_kernel (three TF32 products each) rather than torch's
# (cuBLAS's float32 SIMT kernels); the tests run both
COMPACT = True  # with TF32X3 and FUSED_CELL: the LSTM layers and the projection over the slots that took a
# label only (compact_lstm_step), each slot's recurrent terms made with its state
FUSED_CELL = True  # float32 LSTM networks: each layer's cell, the parents' gathers and the selection by label in
# _lstm_cell_kernel (one launch a layer) rather than torch's ~12 operations
FUSED_JOINT = True  # with COMPACT, relu joints: the joint's input (the slots' frames' encoder rows plus their
# prediction outputs, relu) formed in the joint's product (``_linear_tile``'s JOINT) rather than by three torch
# operations a step (the same values). H200, one process, interleaved (10fe2d9, ms, on / off): greedy through the
# steps tdt-128x15 13.37 / 13.90, rnnt-128x15 26.33 / 27.23; beam 4 20.54 / 20.60 and 35.96 / 36.69; identical
LINEAR_TILES = {"few": 128, "plain": (64, 32, 64), "joint": (64, 16, 64), "many": (64, 64, 32)}  # _linear_kernel's
# (BM, BN, BK): up to "few" rows (greedy's steps), the joint's product and the others ("plain": the same BK, so
# that a joint formed in the kernel sums as one formed before it), above ("many", beam searches' 4 x 128 slots:
# no tile of 69 swept beat it at 512 rows, 242 registers, no spills; 64 x 128 spill). At 128 rows (H200, 20
# launches in one CUDA graph, us, 64 x 64 x 32 first): the joint [128, 640] x [640, 1030] 17.1 -> 11.8, a layer's
# two 2560-column products over 26-60 listed rows 17.9-18.1 -> 13.5-13.8, the last layer's 2560 + 640 13.3 -> 12.1
GREEDY_WINDOW = dict(rnnt=2, tdt=1)  # greedy decoding through the steps with the fused joint: the joint at this
# many frames of each utterance a step (``_greedy_step_kernel``'s F; the one-launch kernel's window), by kind of
# model (an int: every kind). H200, float32, 128 x 15 s, eager ms (greedy_variants): rnnt 23.42 (1) / 19.43 (2) /
# 19.90 (4); tdt 11.78 (1) / 12.68 (2): a TDT model's blanks jump frames already; identical tokens
GRAPHS = True  # on the GPU, chunks of CHECK_EVERY steps replayed as one CUDA graph (captured once per call)
_WARM: set = set()  # the configurations whose kernel has run (compiled): their first chunk is captured at once
KEEP_SEARCH = True  # a decoder keeps its last configuration's buffers and CUDA graph for the next call (the
# capture paid once), until its weights change place or layout (``api._Plans``); without a decoder's plans, in
# _KEPT (the last one)
_KEPT: dict = {}
FRAME_BLOCK = 64  # a search's frame capacity: the call's T rounded up to a multiple of this, so that calls with
# fewer frames (and otherwise the same configuration) reuse its buffers and CUDA graph


@triton.jit
def _score_of(key):
    """The float32 score of a packed key (``beam_kernels._key``'s map is its own inverse on the high word)."""
    k32 = (key >> 32).to(tl.int32)
    return (k32 ^ ((k32 >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _order_of(key):
    return (4294967295 - (key & 4294967295)).to(tl.int32)


@triton.jit
def _take_per_row(run, keys):
    """Each row's list ``run`` [R, J] after the row's candidates ``keys`` [R, BC] that beat its worst (distinct
    keys per row)."""
    o_j = tl.arange(0, run.shape[1])
    m = tl.max(keys, 1)
    low = tl.min(run, 1)
    while tl.max((m > low).to(tl.int32), 0) > 0:
        upd = m > low
        pos = tl.argmin(run, 1)
        run = tl.where(upd[:, None] & (o_j[None, :] == pos[:, None]), m[:, None], run)
        keys = tl.where(upd[:, None] & (keys == m[:, None]), _MIN_KEY, keys)
        m = tl.max(keys, 1)
        low = tl.min(run, 1)
    return run


@triton.jit
def _sorted_per_row(run, K: tl.constexpr, KP: tl.constexpr):
    """Each row's K largest keys of ``run`` [R, J] (distinct but for _MIN_KEY), largest first: [R, KP], _MIN_KEY
    past them."""
    o_r = tl.arange(0, KP)
    out = tl.full((run.shape[0], KP), _MIN_KEY, tl.int64)
    for r in range(K):
        m = tl.max(run, 1)
        out = tl.where(o_r[None, :] == r, m[:, None], out)
        run = tl.where(run == m[:, None], _MIN_KEY, run)
    return out


@triton.jit
def _lse(x, axis: tl.constexpr):
    """torch.logsumexp's: log(sum(exp(x - m))) + m, m the maximum (0 where infinite)."""
    m = tl.max(x, axis)
    m = tl.where((m == float("inf")) | (m == float("-inf")), 0.0, m)
    return tl.log(tl.sum(tl.exp(x - tl.expand_dims(m, axis)), axis)) + m


@triton.jit
def _linear_tile(a_ptr, wh_ptr, wl_ptr, b_ptr, out_ptr, M, N, K, tile, idx_ptr, cnt_ptr, BIAS: tl.constexpr,
                 IDX: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, enc_ptr=None, frm_ptr=None,
                 JOINT: tl.constexpr = False, PER: tl.constexpr = 1):  # fmt: skip
    """Tile ``tile`` (row blocks first) of out [M, N] = a [M, K] @ w [N, K]^T + b [N] (float32, contiguous) as
    three TF32 products on the tensor cores (about float32's precision): w given split as w = wh + wl
    (``tf32_split``), a split here; per block of K the products a_lo wh + a_hi wl + a_hi wh summed from zero, then
    added to the float32 sum (Triton's tf32x3 rule). The bias is added after the sum as torch's addmm does. IDX:
    only the rows idx[:cnt[0]] of a and out (the tiles past them do nothing); a row's result does not depend on
    its place in the tile. JOINT: a is the joint's input relu(enc [frm [m]] + a [m // PER]) (enc [rows, K], frm [M]
    int64), formed here (float32's sum, then relu, as torch's operations: NaN stays NaN)."""
    n_m = tl.cdiv(M, BM)
    o_m = (tile % n_m) * BM + tl.arange(0, BM)
    o_n = (tile // n_m) * BN + tl.arange(0, BN)
    o_k = tl.arange(0, BK)
    if IDX:
        n_rows = tl.load(cnt_ptr)
        ok_m = o_m < n_rows
        rows = tl.load(idx_ptr + o_m, mask=ok_m, other=0).to(tl.int64)
    else:
        n_rows = M
        ok_m = o_m < M
        rows = o_m.to(tl.int64)
    if (tile % n_m) * BM < n_rows:
        acc = tl.zeros((BM, BN), tl.float32)
        a_rows = rows
        if JOINT:
            p_e = enc_ptr + tl.load(frm_ptr + rows, mask=ok_m, other=0)[:, None] * K
            a_rows = rows // PER
        for k0 in range(0, K, BK):
            kk = k0 + o_k
            m_a = ok_m[:, None] & (kk < K)[None, :]
            a = tl.load(a_ptr + a_rows[:, None] * K + kk[None, :], mask=m_a, other=0.0)
            if JOINT:
                a = tl.load(p_e + kk[None, :], mask=m_a, other=0.0) + a
                a = tl.where(a < 0.0, 0.0, a)
            m_w = (o_n < N)[None, :] & (kk < K)[:, None]
            p_w = o_n[None, :].to(tl.int64) * K + kk[:, None]
            w_hi = tl.load(wh_ptr + p_w, mask=m_w, other=0.0)
            w_lo = tl.load(wl_ptr + p_w, mask=m_w, other=0.0)
            if _INTERPRETER:  # (a row's sums in one order wherever it sits: numpy's products depend on it)
                acc += tl.sum(a[:, :, None] * (w_hi + w_lo)[None, :, :], axis=1)
            else:
                a_hi = _tf32_hi(a)
                part = tl.dot(a - a_hi, w_hi, tl.zeros((BM, BN), tl.float32), input_precision="tf32")
                part = tl.dot(a_hi, w_lo, part, input_precision="tf32")
                acc += tl.dot(a_hi, w_hi, part, input_precision="tf32")
        if BIAS:
            acc = acc + tl.load(b_ptr + o_n, mask=o_n < N, other=0.0)[None, :]
        m = ok_m[:, None] & (o_n < N)[None, :]
        tl.store(out_ptr + rows[:, None] * N + o_n[None, :], acc, mask=m)


@triton.jit
def _linear_kernel(a0, wh0, wl0, b0, o0, N0, K0, a1, wh1, wl1, b1, o1, N1, K1, a2, wh2, wl2, b2, o2, N2, K2, M,
                   idx_ptr, cnt_ptr, enc_ptr, frm_ptr, G: tl.constexpr, BIAS0: tl.constexpr, BIAS1: tl.constexpr,
                   BIAS2: tl.constexpr, IDX: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   JOINT: tl.constexpr, PER: tl.constexpr):  # fmt: skip
    """G (1-3) independent products of M rows in one launch (``_linear_tile``): the programs take the first's
    tiles, then the second's, then the third's; JOINT: the first's input is the joint's (``JointInput``)."""
    tile = tl.program_id(0)
    n_m = tl.cdiv(M, BM)
    t0 = n_m * tl.cdiv(N0, BN)
    t1 = n_m * tl.cdiv(N1, BN)
    if tile < t0:
        _linear_tile(a0, wh0, wl0, b0, o0, M, N0, K0, tile, idx_ptr, cnt_ptr, BIAS0, IDX, BM, BN, BK, enc_ptr,
                     frm_ptr, JOINT, PER)  # fmt: skip
    elif G > 1:
        if tile < t0 + t1:
            _linear_tile(a1, wh1, wl1, b1, o1, M, N1, K1, tile - t0, idx_ptr, cnt_ptr, BIAS1, IDX, BM, BN, BK)
        elif G > 2:
            _linear_tile(a2, wh2, wl2, b2, o2, M, N2, K2, tile - t0 - t1, idx_ptr, cnt_ptr, BIAS2, IDX, BM, BN, BK)


def tf32_split(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``weight`` as (hi, lo), contiguous: hi rounded to TF32 (``_tf32_hi``'s rule; kept as it is where
    that is not finite), lo = weight - hi (exact)."""
    w = weight.contiguous()
    hi = ((w.view(torch.int32) + 0x1000) & -8192).view(torch.float32)
    hi = torch.where(torch.isfinite(hi), hi, w)
    return hi, w - hi


@triton.jit
def _split_kernel(w_ptr, hi_ptr, lo_ptr, n, BLOCK: tl.constexpr):
    """``tf32_split`` of n contiguous float32 values in one launch (the same bits)."""
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    w = tl.load(w_ptr + o, mask=m, other=0.0)
    hi = ((w.to(tl.int32, bitcast=True) + 0x1000) & -8192).to(tl.float32, bitcast=True)
    hi = tl.where((hi == hi) & (tl.abs(hi) != float("inf")), hi, w)
    tl.store(hi_ptr + o, hi, mask=m)
    tl.store(lo_ptr + o, w - hi, mask=m)


def tf32_split_into(weight: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor) -> None:
    """``tf32_split(weight)`` written into hi and lo (contiguous, weight's shape) by one launch."""
    w = weight.contiguous()
    n = w.numel()
    launch(_split_kernel)[(cdiv(n, 4096),)](w, hi, lo, n, BLOCK=4096)


def linear_tf32x3(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  split: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:  # fmt: skip
    """torch.nn.functional.linear of float32 operands through ``_linear_kernel`` (x [..., K]); ``split``:
    ``tf32_split(weight)`` if already made (the search's weights, split once per call)."""
    out = linear_group([(x.reshape(-1, x.shape[-1]), weight, bias, split)])[0]
    return out.view(*x.shape[:-1], out.shape[1])


class JointInput(NamedTuple):
    """The joint's input relu(enc [frm] + g [m // per]) as ``linear_group``'s first product's x, formed in the
    kernel: enc [rows, K], frm [M] int64 (rows of enc), g [M / per, K], float32, contiguous."""

    enc: torch.Tensor
    frm: torch.Tensor
    g: torch.Tensor
    per: int = 1


def linear_group(
    products: list[tuple], outs: list[torch.Tensor] | None = None, rows: tuple[torch.Tensor, torch.Tensor] | None = None
) -> list[torch.Tensor]:
    """``linear_tf32x3`` of each (x [M, K_i], weight, bias or None, split or None), all of M rows, three to a
    launch: independent products share the machine's waves (tiles by ``LINEAR_TILES``). ``outs``: the outputs
    [M, N_i] (contiguous) to write, else new ones; ``rows`` (idx, count): only the rows idx[:count[0]] of each x
    and output (device values: the launch covers M rows, the tiles past count do nothing). The first product's x
    may be a ``JointInput``."""
    outs = list(outs) if outs is not None else [None] * len(products)
    for at in range(0, len(products), 3):
        args, flags = [], {}
        joint = products[at][0] if isinstance(products[at][0], JointInput) else None
        M = (joint.frm if joint is not None else products[at][0]).shape[0]
        tiles_of = ("joint" if joint is not None else "plain") if M <= LINEAR_TILES["few"] else "many"
        BM, BN, BK = LINEAR_TILES[tiles_of]
        tiles = 0
        for g, (x, weight, bias, split) in enumerate(products[at : at + 3]):
            rows_x = M
            if isinstance(x, JointInput):
                if x is not joint:
                    raise ValueError(f"linear_group: product {at + g}'s x is a JointInput (only the first's may be)")
                x, rows_x = x.g, M // x.per
            if x.dim() != 2 or x.shape[0] != rows_x:
                raise ValueError(f"linear_group: product {at + g} has x of shape {tuple(x.shape)}, not [{rows_x}, K]")
            a = x.contiguous()
            w_hi, w_lo = split if split is not None else tf32_split(weight)
            if outs[at + g] is None:
                outs[at + g] = torch.empty(M, w_hi.shape[0], dtype=torch.float32, device=x.device)
            args += [a, w_hi, w_lo, bias if bias is not None else w_hi, outs[at + g], w_hi.shape[0], a.shape[1]]
            flags[f"BIAS{g}"] = bias is not None
            tiles += cdiv(M, BM) * cdiv(w_hi.shape[0], BN)
        G = len(flags)
        args += args[:7] * (3 - G)
        flags.update({f"BIAS{g}": False for g in range(G, 3)})
        idx, count = rows if rows is not None else (args[0], args[0])
        enc, frm = (joint.enc.contiguous(), joint.frm.contiguous()) if joint is not None else (args[0], args[0])
        launch(_linear_kernel)[(tiles,)](
            *args, M, idx, count, enc, frm, G=G, **flags, IDX=rows is not None, BM=BM, BN=BN, BK=BK,
            JOINT=joint is not None, PER=joint.per if joint is not None else 1, num_warps=4, num_stages=3,
        )  # fmt: skip
    return outs


class _SplitLinear:
    """``linear_tf32x3`` over a search's float32 weights split once per call (``refresh``, before the call's first
    product: their current values, into the same buffers, which a captured graph reads)."""

    def __init__(self, weights: list[torch.Tensor]):
        self.weights = weights
        new = lambda w: torch.empty(w.shape, dtype=w.dtype, device=w.device)  # noqa: E731
        self.splits = {w.data_ptr(): (new(w), new(w)) for w in weights}

    def refresh(self) -> None:
        for w in self.weights:
            tf32_split_into(w, *self.splits[w.data_ptr()])

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return linear_tf32x3(x, weight, bias, self.splits.get(weight.data_ptr()))

    def group(self, products: list[tuple], outs=None, rows=None) -> list[torch.Tensor]:
        """``linear_group`` of (x, weight, bias) with the weights' splits (``outs``, ``rows``: its own)."""
        return linear_group([(x, w, b, self.splits.get(w.data_ptr())) for x, w, b in products], outs, rows)


@triton.jit
def _gates_cell(p_x, p_g, c_par, m, H):
    """An LSTM cell from its input term's and recurrent term's gate rows (i, f, g, o at 0, H, 2H, 3H) and c."""
    g_i = tl.load(p_x, mask=m, other=0.0) + tl.load(p_g, mask=m, other=0.0)
    g_f = tl.load(p_x + H, mask=m, other=0.0) + tl.load(p_g + H, mask=m, other=0.0)
    g_g = tl.load(p_x + 2 * H, mask=m, other=0.0) + tl.load(p_g + 2 * H, mask=m, other=0.0)
    g_o = tl.load(p_x + 3 * H, mask=m, other=0.0) + tl.load(p_g + 3 * H, mask=m, other=0.0)
    c_new = _sigmoid(g_f) * c_par + _sigmoid(g_i) * _tanh(g_g)
    return _sigmoid(g_o) * _tanh(c_new), c_new


@triton.jit
def _lstm_cell_kernel(x_ptr, hh_ptr, lab_ptr, row_ptr, islab_ptr, h_ptr, c_ptr, h_out_ptr, c_out_ptr, new_ptr, H,
                      TABLE: tl.constexpr, BH: tl.constexpr):  # fmt: skip
    """One LSTM layer of the search's step for slot i (program 0) and units of block program 1: gates = the input
    term (TABLE: row lab[i] of the per-token table, else row i) + the recurrent term of the parent's row row[i]
    (hh: h @ W_hh^T + b_hh of every slot, before the step: the parent's row of it is the product of the parent's h);
    the new (h, c) from the parent's; h_out, c_out [i]: the new state where islab[i], else the parent's; new [i]: the
    new h (the next layer's input)."""
    i = tl.program_id(0)
    o_h = tl.program_id(1) * BH + tl.arange(0, BH)
    m = o_h < H
    r = tl.load(row_ptr + i)
    x_row = tl.load(lab_ptr + i) if TABLE else i
    c_par = tl.load(c_ptr + r * H + o_h, mask=m, other=0.0)
    h_par = tl.load(h_ptr + r * H + o_h, mask=m, other=0.0)
    h_new, c_new = _gates_cell(x_ptr + x_row * 4 * H + o_h, hh_ptr + r * 4 * H + o_h, c_par, m, H)
    lab = (tl.zeros((BH,), tl.int32) + tl.load(islab_ptr + i).to(tl.int32)) != 0
    tl.store(new_ptr + i * H + o_h, h_new, mask=m)
    tl.store(h_out_ptr + i * H + o_h, tl.where(lab, h_new, h_par), mask=m)
    tl.store(c_out_ptr + i * H + o_h, tl.where(lab, c_new, c_par), mask=m)


def lstm_step(w, table, lab, row, islab, state_in, state_out, linear, recurrent=None) -> None:
    """The prediction network's step of the search for float32 LSTM networks: ``state_out`` (h, c [L, NK, H]) from
    ``state_in`` through ``_lstm_cell_kernel`` per layer (``table``: the first layer's input term per token;
    ``recurrent``: each layer's h @ W_hh^T + b_hh of ``state_in`` if already computed)."""
    h, c = state_in
    h_out, c_out = state_out
    NK, H = h.shape[1], h.shape[2]
    x = None
    for layer, (w_ih, w_hh, b_ih, b_hh) in enumerate(w.lstm):
        hh = recurrent[layer] if recurrent is not None else linear(h[layer], w_hh, b_hh)
        xt = table if layer == 0 else linear(x, w_ih, b_ih)
        x = torch.empty(NK, H, dtype=torch.float32, device=h.device)
        launch(_lstm_cell_kernel)[(NK, cdiv(H, 128))](
            xt, hh, lab, row, islab.view(torch.uint8), h[layer], c[layer], h_out[layer], c_out[layer], x, H,
            TABLE=layer == 0, BH=128, num_warps=4,
        )  # fmt: skip


@triton.jit
def _first_cell_kernel(tab_ptr, rec_ptr, lab_ptr, row_ptr, islab_ptr, h_ptr, c_ptr, g_ptr, h_out_ptr, c_out_ptr,
                       rec_out_ptr, g_out_ptr, list_ptr, cnt_ptr, cnt_next_ptr, t_ptr, len_ptr, go_ptr, step_ptr,
                       NK, K, H, J, L, BH: tl.constexpr, BS: tl.constexpr):  # fmt: skip
    """The compact step's first launch, slot i (program 0), units or columns of block program 1. A slot that took
    a label: the first layer's new (h, c) (gates = table row lab[i] + the parent's recurrent term, rec[0] row
    row[i]) into h_out[0], c_out[0] row i, and i appended to list (count cnt[0]); the later layers, the recurrent
    terms and the projection are computed for the listed slots only. Any other slot: its parent's rows of every
    layer's h, c and recurrent term and of the projection g copied to row i. Program (0, 0) zeroes cnt_next[0]
    (the next step's count), counts the step (step[0] + 1) and writes go[0] for the next one: whether a slot is
    inside its utterance (t [NK]: the slots' frames, len [N]). Layouts: h, c [L, NK, H], rec [L, NK, 4H],
    g [NK, J]."""
    i = tl.program_id(0)
    b = tl.program_id(1)
    o = b * BH + tl.arange(0, BH)
    m = o < H
    r = tl.load(row_ptr + i).to(tl.int64)
    if tl.load(islab_ptr + i) != 0:
        x_row = tl.load(lab_ptr + i)
        c_par = tl.load(c_ptr + r * H + o, mask=m, other=0.0)
        h_new, c_new = _gates_cell(tab_ptr + x_row * 4 * H + o, rec_ptr + r * 4 * H + o, c_par, m, H)
        tl.store(h_out_ptr + i * H + o, h_new, mask=m)
        tl.store(c_out_ptr + i * H + o, c_new, mask=m)
        if b == 0:
            tl.store(list_ptr + tl.atomic_add(cnt_ptr, 1), i)
    else:
        for layer in range(L):
            at = layer * NK * H
            tl.store(h_out_ptr + at + i * H + o, tl.load(h_ptr + at + r * H + o, mask=m), mask=m)
            tl.store(c_out_ptr + at + i * H + o, tl.load(c_ptr + at + r * H + o, mask=m), mask=m)
            for q in range(4):
                p = 4 * at + q * H + o
                tl.store(rec_out_ptr + p + i * 4 * H, tl.load(rec_ptr + p + r * 4 * H, mask=m), mask=m)
        tl.store(g_out_ptr + i * J + o, tl.load(g_ptr + r * J + o, mask=o < J), mask=o < J)
    if i == 0 and b == 0:
        tl.store(cnt_next_ptr, 0)
        tl.store(step_ptr, tl.load(step_ptr) + 1)
        inside = tl.zeros((BS,), tl.int32)
        for s0 in range(0, NK, BS):
            o_s = s0 + tl.arange(0, BS)
            m_s = o_s < NK
            t = tl.load(t_ptr + o_s, mask=m_s, other=0)
            inside += (m_s & (t < tl.load(len_ptr + o_s // K, mask=m_s, other=0))).to(tl.int32)
        tl.store(go_ptr, (tl.max(inside, 0) > 0).to(tl.uint8))


@triton.jit
def _next_cell_kernel(x_ptr, rec_ptr, row_ptr, h_ptr, c_ptr, h_out_ptr, c_out_ptr, list_ptr, cnt_ptr, H,
                      BH: tl.constexpr):  # fmt: skip
    """The compact step's later LSTM layer for the listed slots (program 0: the list's entry e < cnt[0]; units of
    block program 1): gates = x row i (this layer's input term, of the slot's new lower h) + the parent's
    recurrent term (rec row row[i]); the new (h, c) from the parent's c into row i of h_out, c_out (this layer's
    [NK, H])."""
    e = tl.program_id(0)
    if e < tl.load(cnt_ptr):
        o = tl.program_id(1) * BH + tl.arange(0, BH)
        m = o < H
        i = tl.load(list_ptr + e).to(tl.int64)
        r = tl.load(row_ptr + i).to(tl.int64)
        c_par = tl.load(c_ptr + r * H + o, mask=m, other=0.0)
        h_new, c_new = _gates_cell(x_ptr + i * 4 * H + o, rec_ptr + r * 4 * H + o, c_par, m, H)
        tl.store(h_out_ptr + i * H + o, h_new, mask=m)
        tl.store(c_out_ptr + i * H + o, c_new, mask=m)


def compact_lstm_step(w, table, lab, row, islab, state_in, state_out, g_in, g_out, listing, counts, linear,
                      progress) -> None:  # fmt: skip
    """The prediction network's step of the search over the slots that took a label only (float32 LSTM networks,
    ``linear`` a ``_SplitLinear``): state_in / state_out (h, c [L, NK, H], rec [L, NK, 4H]: each slot's h @ W_hh^T +
    b_hh, made with its state) and g_in / g_out (the projection [NK, J]); the other slots take their parents'
    rows. listing [NK] and counts (this step's count, the next step's: both zero at the search's start, each
    zeroed by the step before its use) are scratch. The same values as ``lstm_step`` and the projection of every
    slot: the same products row by row. ``progress`` (t [NK] int32, lengths [N] int32, go [] bool, step [1]
    int32): the step counted and the next step's go flag written in the first launch."""
    h, c, rec = state_in
    h_out, c_out, rec_out = state_out
    L, NK, H = h.shape
    J = g_in.shape[1]
    t, lengths, go, step = progress
    launch(_first_cell_kernel)[(NK, cdiv(max(H, J), 128))](
        table, rec, lab, row, islab.view(torch.uint8), h, c, g_in, h_out, c_out, rec_out, g_out, listing, counts[0],
        counts[1], t, lengths, go.view(torch.uint8), step, NK, NK // lengths.shape[0], H, J, L, BH=128,
        BS=min(1024, next_power_of_2(NK)), num_warps=4,
    )  # fmt: skip
    rows = (listing, counts[0])
    for layer, (_, w_hh, _, b_hh) in enumerate(w.lstm):
        if layer + 1 < len(w.lstm):
            w_ih, _, b_ih, _ = w.lstm[layer + 1]
            x = torch.empty(NK, 4 * H, dtype=torch.float32, device=h.device)
            linear.group([(h_out[layer], w_hh, b_hh), (h_out[layer], w_ih, b_ih)], [rec_out[layer], x], rows)
            launch(_next_cell_kernel)[(NK, cdiv(H, 128))](
                x, rec[layer + 1], row, h[layer + 1], c[layer + 1], h_out[layer + 1], c_out[layer + 1], listing,
                counts[0], H, BH=128, num_warps=4,
            )  # fmt: skip
        else:
            linear.group([(h_out[layer], w_hh, b_hh), (h_out[layer], w.pred_w, w.pred_b)], [rec_out[layer], g_out],
                         rows)  # fmt: skip


@triton.jit
def _log_softmaxes(rows, active, V, KP: tl.constexpr, BC: tl.constexpr, D: tl.constexpr, DD: tl.constexpr):
    """The slots' log-softmax over the V token classes of their joint outputs ``rows`` (the maximum and the log of
    the sum, in blocks of BC classes; 0 for slots not ``active``) and over the D durations (the log-probabilities
    [KP, DD], -inf past D)."""
    ninf = float("-inf")
    o_c = tl.arange(0, BC)
    mx = tl.full((KP,), ninf, tl.float32)
    for c0 in range(0, V, BC):
        m = active[:, None] & (c0 + o_c < V)[None, :]
        xv = tl.load(rows[:, None] + c0 + o_c[None, :], mask=m, other=ninf).to(tl.float32)
        mx = tl.maximum(mx, tl.max(xv, 1))
    mx = tl.where(active, mx, 0.0)
    se = tl.zeros((KP,), tl.float32)
    for c0 in range(0, V, BC):
        m = active[:, None] & (c0 + o_c < V)[None, :]
        xv = tl.load(rows[:, None] + c0 + o_c[None, :], mask=m, other=ninf).to(tl.float32)
        se += tl.sum(tl.exp(xv - mx[:, None]), 1)
    ls = tl.log(tl.where(active, se, 1.0))
    return mx, ls, _duration_lps(rows, active, V, KP, D, DD)


@triton.jit
def _duration_lps(rows, active, V, KP: tl.constexpr, D: tl.constexpr, DD: tl.constexpr):
    """The slots' log-softmax over the D durations of their joint outputs ``rows`` ([KP, DD], -inf past D; zeros
    without durations)."""
    ninf = float("-inf")
    o_d = tl.arange(0, DD)
    dlp = tl.zeros((KP, DD), tl.float32)
    if D > 0:
        m_d = active[:, None] & (o_d < D)[None, :]
        xd = tl.load(rows[:, None] + V + o_d[None, :], mask=m_d, other=ninf).to(tl.float32)
        dmx = tl.where(active, tl.max(xd, 1), 0.0)
        dls = tl.log(tl.where(active, tl.sum(tl.exp(xd - dmx[:, None]), 1), 1.0))
        dlp = tl.where(m_d, (xd - dmx[:, None]) - dls[:, None], ninf)
    return dlp


@triton.jit
def _duration_of(dlp, dur_ptr, active, D: tl.constexpr, DD: tl.constexpr):
    """The duration of the slots' most probable duration class (the first of equal ones)."""
    o_d = tl.arange(0, DD)
    d_key = tl.where((o_d < D)[None, :], _key(dlp, o_d[None, :]), _MIN_KEY)
    return tl.load(dur_ptr + _order_of(tl.max(d_key, 1)), mask=active, other=0)


@triton.jit
def _malsd_step_kernel(x_ptr, len_ptr, go_ptr, step_ptr, dur_ptr, sf_ptr, si_ptr, hsh_ptr, hist_ptr,
                       row_ptr, lab_ptr, islab_ptr, frm_ptr,
                       NK, T, V, W, blank, max_symbols, fusion, one_fusion, b_w,
                       ovl_ptr, nxl_ptr, lm_w, lm_start, chain_ptr, above_ptr, base_ptr, as_ptr, at_ptr, al_ptr, an_ptr,
                       uni_ptr, unext_ptr, col_ptr, end_ptr,
                       gn_ptr, bnx_ptr, rg_ptr, ns_ptr,
                       K: tl.constexpr, KP: tl.constexpr, BC: tl.constexpr, D: tl.constexpr, DD: tl.constexpr,
                       LM: tl.constexpr, DEPTH: tl.constexpr, DP: tl.constexpr, BOOST: tl.constexpr,
                       BA: tl.constexpr, MODIFIED: tl.constexpr):  # fmt: skip
    n = tl.program_id(0)
    o_k = tl.arange(0, KP)
    o_c = tl.arange(0, BC)
    in_k = o_k < K
    ninf = float("-inf")
    L = tl.load(len_ptr + n).to(tl.int32)
    step = tl.load(step_ptr)
    if MODIFIED:  # the utterance is at frame `step`: it changes while inside
        go = (tl.zeros((KP,), tl.int32) + step) < L
    else:  # a slot of the batch is active: the step is one of the search's (a vector: the interpreter masks
        # with vectors only)
        go = (tl.zeros((KP,), tl.int32) + tl.load(go_ptr).to(tl.int32)) != 0
    stamp = step + 1
    at_s = n * K + o_k  # the slots' state: [2, N, K] float32 (score, acoustic), [6, N, K] int32
    score = tl.load(sf_ptr + at_s, mask=in_k, other=ninf)
    acoustic = tl.load(sf_ptr + NK + at_s, mask=in_k, other=ninf)
    t = tl.load(si_ptr + at_s, mask=in_k, other=0)
    at_frame = tl.load(si_ptr + NK + at_s, mask=in_k, other=0)
    n_lab = tl.load(si_ptr + 2 * NK + at_s, mask=in_k, other=0)
    last = tl.load(si_ptr + 3 * NK + at_s, mask=in_k, other=-1)
    lm_st = tl.load(si_ptr + 4 * NK + at_s, mask=in_k, other=0)
    bs = tl.load(si_ptr + 5 * NK + at_s, mask=in_k, other=0)
    hsh = tl.load(hsh_ptr + at_s, mask=in_k, other=0)
    active = in_k & (t < L)
    rows = x_ptr + at_s.to(tl.int64) * W  # the slots' joint outputs
    mx, ls, dlp = _log_softmaxes(rows, active, V, KP, BC, D, DD)
    lp_blank = (tl.load(rows + blank, mask=active, other=0.0).to(tl.float32) - mx) - ls
    o_d = tl.arange(0, DD)
    d_max = tl.zeros((KP,), tl.float32)
    if D > 0:
        d_max = tl.max(dlp, 1)
    # the fusion's terms: the blank's, each label's log(1 - p(blank)), the step's overrides
    f_blank = lp_blank
    l1p = tl.zeros((KP,), tl.float32)
    if (LM or BOOST) and not MODIFIED:  # (icefall's: the labels' LM term only; boosting after the selection)
        p_b = tl.minimum(tl.exp(lp_blank), 0.99)
        l1p = fusion * tl.log(1.0 - p_b)
        f_blank = one_fusion * lp_blank
    p_ovl = ovl_ptr + n.to(tl.int64) * KP * (V + 1)
    p_nxl = nxl_ptr + n.to(tl.int64) * KP * (V + 1)
    base, ns_s, has_b = _overrides(lm_st, bs, active, p_ovl, p_nxl, V, stamp, chain_ptr, above_ptr, base_ptr, as_ptr,
                                   at_ptr, al_ptr, an_ptr, ns_ptr, o_k, KP, LM, DEPTH, DP, BOOST, BA)  # fmt: skip
    # each slot's K best labels (fused scores; ties: the lower class), a block of classes at a time
    o_r = tl.arange(0, KP)
    run = tl.where(o_r[None, :] < K, tl.full((KP, KP), _MIN_KEY, tl.int64), _MAX_KEY)  # past K: never replaced
    for c0 in range(0, V, BC):
        cls = c0 + o_c
        ok_c = cls < V
        use = active[:, None] & ok_c[None, :]
        xv = tl.load(rows[:, None] + cls[None, :], mask=use, other=0.0).to(tl.float32)
        f = (xv - mx[:, None]) - ls[:, None]
        if LM or BOOST:
            f = f + l1p[:, None]
            if LM:
                v, _, _ = _lm_at(o_k[:, None], cls[None, :], ok_c[None, :], use, base[:, None], p_ovl, V, uni_ptr,
                                 col_ptr, stamp)  # fmt: skip
                f = f + lm_w * v
            if BOOST and not MODIFIED:
                g = _boost_at(bs[:, None], cls[None, :], ok_c[None, :], use & (has_b > 0)[:, None], ns_s[:, None],
                              gn_ptr, V, rg_ptr)  # fmt: skip
                f = f + b_w * g
            f = tl.where(cls[None, :] == blank, f_blank[:, None], f)
        run = _take_per_row(run, tl.where(use, _key(f, cls[None, :]), _MIN_KEY))
    top = _sorted_per_row(tl.where(o_r[None, :] < K, run, _MIN_KEY), K, KP)  # [slot, rank]
    ok_t = top != _MIN_KEY
    lab = tl.where(ok_t, _order_of(top), -1)
    val = tl.where(ok_t, _score_of(top), ninf)
    d_i = tl.zeros((KP, KP), tl.int32)
    if D > 0:  # the K best (label, duration) pairs: among the K best labels' (ties: the lower label, duration)
        pv = val[:, :, None] + dlp[:, None, :]
        po = lab[:, :, None] * D + o_d[None, None, :]
        ok_p = ok_t[:, :, None] & (o_d < D)[None, None, :]
        pk = tl.reshape(tl.where(ok_p, _key(pv, po), _MIN_KEY), (KP, KP * DD))
        top = _sorted_per_row(pk, K, KP)
        ok_t = top != _MIN_KEY
        po = _order_of(top)
        lab = tl.where(ok_t, po // D, -1)
        d_i = tl.where(ok_t, po % D, 0)
        val = tl.where(ok_t, _score_of(top), ninf)
    lp_lab = tl.load(rows[:, None] + lab, mask=active[:, None] & ok_t, other=0.0).to(tl.float32) - mx[:, None]
    top_ac = tl.where(ok_t, lp_lab - ls[:, None], ninf)
    if D > 0:
        top_ac = top_ac + tl.sum(tl.where(o_d[None, None, :] == d_i[:, :, None], dlp[:, None, :], 0.0), 2)
    # the K x K proposals: finished slots propose themselves, slots at max_symbols the blank only (malsd)
    first = o_r[None, :] == 0
    cand = score[:, None] + val
    cand_ac = acoustic[:, None] + top_ac
    if not MODIFIED:
        done = (~active)[:, None]
        cand = tl.where(done, tl.where(first, score[:, None], ninf), cand)
        cand_ac = tl.where(done, tl.where(first, acoustic[:, None], ninf), cand_ac)
        lab = tl.where(done, -1, lab)
        full = (active & (at_frame >= max_symbols))[:, None]
        forced = score + f_blank
        forced_ac = acoustic + lp_blank
        if D > 0:
            forced = forced + d_max
            forced_ac = forced_ac + d_max
        cand = tl.where(full, tl.where(first, forced[:, None], ninf), cand)
        cand_ac = tl.where(full, tl.where(first, forced_ac[:, None], ninf), cand_ac)
        lab = tl.where(full, blank, lab)
        d_first = tl.sum(tl.where(first, d_i, 0), 1)
        d_i = tl.where(full, d_first[:, None], d_i)
    # the K best of them (ties: the earlier slot, then the earlier proposal; icefall's: the lower class)
    present = in_k[:, None] & (o_r < K)[None, :]
    if MODIFIED:
        keys = tl.where(present, _key(cand, o_k[:, None] * V + lab), _MIN_KEY)
    else:
        keys = tl.where(present, _key(cand, o_k[:, None] * K + o_r[None, :]), _MIN_KEY)
    par = o_k
    label = tl.full((KP,), -1, tl.int32)
    dur_i = tl.zeros((KP,), tl.int32)
    new_score = tl.full((KP,), ninf, tl.float32)
    new_ac = tl.full((KP,), ninf, tl.float32)
    for i in range(K):
        m = tl.max(tl.max(keys, 1), 0)
        hit = keys == m  # (distinct orders)
        now = o_k == i
        par = tl.where(now, _order_of(m) // (V if MODIFIED else K), par)
        label = tl.where(now, tl.max(tl.max(tl.where(hit, lab, -2), 1), 0), label)
        dur_i = tl.where(now, tl.max(tl.max(tl.where(hit, d_i, -1), 1), 0), dur_i)
        new_score = tl.where(now, tl.max(tl.max(tl.where(hit, cand, ninf), 1), 0), new_score)
        new_ac = tl.where(now, tl.max(tl.max(tl.where(hit, cand_ac, ninf), 1), 0), new_ac)
        keys = tl.where(hit, _MIN_KEY, keys)
    # the survivors' state, from their parents'
    sel = o_k[None, :] == par[:, None]
    is_ext = label >= 0
    is_blank = label == blank
    is_lab = is_ext & ~is_blank
    if MODIFIED:
        is_lab = is_lab & (new_score > ninf)
    t_par = _pick(sel, t)
    if D > 0:
        stp = tl.load(dur_ptr + dur_i, mask=in_k, other=0)
        stp = tl.where(is_blank, tl.maximum(stp, 1), stp)
    else:
        stp = is_blank.to(tl.int32)
    stp = tl.where(is_ext, stp, 0)
    k_par = _pick(sel, n_lab)
    if D > 0:
        n_at = tl.where(is_ext & (stp > 0), 0, _pick(sel, at_frame) + is_lab.to(tl.int32))
    else:
        n_at = tl.where(is_blank, 0, _pick(sel, at_frame) + is_lab.to(tl.int32))
    n_t = t_par + stp
    if MODIFIED:  # every hypothesis leaves the frame
        n_t = t_par + 1
    n_n = k_par + is_lab.to(tl.int32)
    h_par = _pick(sel, hsh)
    n_h = tl.where(is_lab, h_par * 6364136223846793005 + 1 + label.to(tl.int64), h_par)
    n_last = tl.where(is_lab, label, _pick(sel, last))
    n_lm = _pick(sel, lm_st)
    if LM:
        _, hit_l, at_l = _lm_at(par, label, is_lab, is_lab, 0.0, p_ovl, V, uni_ptr, col_ptr, stamp)
        nx = tl.where(hit_l, tl.load(p_nxl + at_l, mask=is_lab & hit_l, other=0) & 4294967295,
                      tl.load(unext_ptr + label, mask=is_lab, other=0)).to(tl.int32)  # fmt: skip
        n_lm = tl.where(is_lab, nx, n_lm)
    n_bs = _pick(sel, bs)
    if BOOST:
        bonus, b_next = _boost_step(n_bs, label, is_lab, _pick(sel, ns_s), gn_ptr, bnx_ptr, V)
        n_bs = tl.where(is_lab, b_next, n_bs)
        if MODIFIED:  # icefall adds its context graph's score after the selection
            new_score = tl.where(is_lab, new_score + b_w * bonus, new_score)
    # the merges: the same tokens (TDT: at the same frame) -> the first most likely slot, the log-sum of scores
    same = (n_h[:, None] == n_h[None, :]) & (n_last[:, None] == n_last[None, :]) & (n_n[:, None] == n_n[None, :])
    if D > 0:
        same = same & (n_t[:, None] == n_t[None, :])
    same = same & in_k[None, :]
    if MODIFIED:  # icefall's: into the first of the group in the selection's order
        same = same & (new_score > ninf)[None, :]
        surv = tl.min(tl.where(same & (o_r[None, :] <= o_k[:, None]), o_r[None, :], KP), 1)
        keep = (surv == o_k) & (new_score > ninf)
        group = tl.where(same, new_score[None, :], ninf)
    else:  # NeMo's: into the first most likely
        group = tl.where(same, new_score[None, :], ninf)
        g_max = tl.max(group, 1)
        surv = tl.min(tl.where(group == g_max[:, None], o_r[None, :], KP), 1)
        surv = tl.where(g_max == ninf, 0, surv)  # (a group of empty slots: the first slot, as an argmax of -inf)
        keep = surv == o_k
    merged = tl.sum(same.to(tl.int32), 1) > 1
    total = _lse(group, 1)
    total_ac = _lse(tl.where(same, new_ac[None, :], ninf), 1)
    if MODIFIED:  # (icefall's: the log-sum of every group, one alone too)
        new_score = tl.where(keep, total, ninf)
        new_ac = tl.where(keep, total_ac, ninf)
    else:
        new_score = tl.where(keep, tl.where(merged, total, new_score), ninf)
        new_ac = tl.where(keep, tl.where(merged, total_ac, new_ac), ninf)
    # a step past the search's end keeps every slot
    sv = in_k & go
    tl.store(sf_ptr + at_s, new_score, mask=sv)
    tl.store(sf_ptr + NK + at_s, new_ac, mask=sv)
    tl.store(si_ptr + at_s, n_t, mask=sv)
    tl.store(si_ptr + NK + at_s, n_at, mask=sv)
    tl.store(si_ptr + 2 * NK + at_s, n_n, mask=sv)
    tl.store(si_ptr + 3 * NK + at_s, n_last, mask=sv)
    tl.store(si_ptr + 4 * NK + at_s, n_lm, mask=sv)
    tl.store(si_ptr + 5 * NK + at_s, n_bs, mask=sv)
    tl.store(hsh_ptr + at_s, n_h, mask=sv)
    par = tl.where(go, par, o_k)
    is_lab = is_lab & go
    p_h = hist_ptr + step.to(tl.int64) * 4 * NK + at_s
    tl.store(p_h, par, mask=in_k)
    tl.store(p_h + NK, tl.where(is_lab, label, -1), mask=in_k)
    tl.store(p_h + 2 * NK, t_par, mask=in_k)
    tl.store(p_h + 3 * NK, stp, mask=in_k)
    # for the prediction network and the next step's joint: the parents' rows, the labels, the frames
    tl.store(row_ptr + at_s, (n * K + par).to(tl.int64), mask=in_k)
    tl.store(lab_ptr + at_s, tl.maximum(label, 0).to(tl.int64), mask=in_k)
    tl.store(islab_ptr + at_s, is_lab, mask=in_k)
    t_next = tl.where(go, n_t, t)
    if MODIFIED:  # the next frame, every utterance's
        t_next = tl.zeros((KP,), tl.int32) + step + 1
        L = T
    tl.store(frm_ptr + at_s, (n * T + tl.minimum(t_next, tl.maximum(L - 1, 0))).to(tl.int64), mask=in_k)


@triton.jit
def _greedy_step_kernel(x_ptr, len_ptr, go_ptr, step_ptr, dur_ptr, sf_ptr, si_ptr, hsh_ptr, hist_ptr,
                        row_ptr, lab_ptr, islab_ptr, frm_ptr,
                        NK, T, V, W, blank, max_symbols, fusion, one_fusion, b_w,
                        ovl_ptr, nxl_ptr, lm_w, lm_start, chain_ptr, above_ptr, base_ptr, as_ptr, at_ptr, al_ptr,
                        an_ptr, uni_ptr, unext_ptr, col_ptr, end_ptr,
                        gn_ptr, bnx_ptr, rg_ptr, ns_ptr,
                        K: tl.constexpr, KP: tl.constexpr, BC: tl.constexpr, D: tl.constexpr, DD: tl.constexpr,
                        LM: tl.constexpr, DEPTH: tl.constexpr, DP: tl.constexpr, BOOST: tl.constexpr,
                        BA: tl.constexpr, MODIFIED: tl.constexpr, F: tl.constexpr = 1):  # fmt: skip
    """One step of greedy decoding with shallow fusion (``transducer_greedy_reference``'s rules; the arguments are
    ``_malsd_step_kernel``'s, K = 1): utterance n's joint argmax decides whether its frame emits, the label is the
    argmax of logit + lm_w log p_LM + b_w bonus over the non-blank classes (ties: the lower class); the history
    entry holds the label's log-softmax (float32 bits), the label or -1, the frame, the duration. F > 1: the joint
    outputs are those of F frames t .. t + F - 1 of the utterance (rows n F + f), the step's decisions the walk
    through them from t (a blank moves on by its duration, at least 1) to the first frame whose argmax is not the
    blank, decided as above, or out of the window (then no label, t past the blanks); frm gets the F rows of the
    next step's window."""
    n = tl.program_id(0)
    o_k = tl.arange(0, KP)
    o_c = tl.arange(0, BC)
    in_k = o_k < K
    L = tl.load(len_ptr + n).to(tl.int32)
    step = tl.load(step_ptr)
    go = (tl.zeros((KP,), tl.int32) + tl.load(go_ptr).to(tl.int32)) != 0
    stamp = step + 1
    at_s = n * K + o_k
    t = tl.load(si_ptr + at_s, mask=in_k, other=0)
    at_frame = tl.load(si_ptr + NK + at_s, mask=in_k, other=0)
    n_lab = tl.load(si_ptr + 2 * NK + at_s, mask=in_k, other=0)
    lm_st = tl.load(si_ptr + 4 * NK + at_s, mask=in_k, other=0)
    bs = tl.load(si_ptr + 5 * NK + at_s, mask=in_k, other=0)
    active = in_k & (t < L)
    walk = tl.zeros((KP,), tl.int32)  # the window's frames walked past (blanks)
    if F > 1:
        going = active
        for fo in tl.static_range(F):  # (not f: the class loop below carries an f of its own)
            here = going & (walk == fo)
            r_f = x_ptr + (at_s * F + fo).to(tl.int64) * W
            b_f = tl.full((KP,), _MIN_KEY, tl.int64)
            for c0 in range(0, V, BC):
                cls = c0 + o_c
                use = here[:, None] & (cls < V)[None, :]
                xv = tl.load(r_f[:, None] + cls[None, :], mask=use, other=0.0).to(tl.float32)
                b_f = tl.maximum(b_f, tl.max(tl.where(use, _key(xv, cls[None, :]), _MIN_KEY), 1))
            passed = here & (_order_of(b_f) == blank)
            d_f = tl.zeros((KP,), tl.int32)
            if D > 0:
                d_f = _duration_of(_duration_lps(r_f, passed, V, KP, D, DD), dur_ptr, passed, D, DD)
            walk = tl.where(passed, walk + tl.maximum(d_f, 1), walk)
            at_frame = tl.where(passed, 0, at_frame)
            going = going & passed & (walk < L - t)
        # the frame decided below: the walk's stop inside the window and the utterance, else none
        active = active & (walk < F) & (walk < L - t)
        t = t + walk
    rows = x_ptr + (at_s * F + walk).to(tl.int64) * W
    mx, ls, dlp = _log_softmaxes(rows, active, V, KP, BC, D, DD)
    p_ovl = ovl_ptr + n.to(tl.int64) * KP * (V + 1)
    p_nxl = nxl_ptr + n.to(tl.int64) * KP * (V + 1)
    base, ns_s, has_b = _overrides(lm_st, bs, active, p_ovl, p_nxl, V, stamp, chain_ptr, above_ptr, base_ptr, as_ptr,
                                   at_ptr, al_ptr, an_ptr, ns_ptr, o_k, KP, LM, DEPTH, DP, BOOST, BA)  # fmt: skip
    # the joint's argmax (the first of equal logits) and the fused argmax over the non-blank classes
    best = tl.full((KP,), _MIN_KEY, tl.int64)
    fused = tl.full((KP,), _MIN_KEY, tl.int64)
    for c0 in range(0, V, BC):
        cls = c0 + o_c
        ok_c = cls < V
        use = active[:, None] & ok_c[None, :]
        xv = tl.load(rows[:, None] + cls[None, :], mask=use, other=0.0).to(tl.float32)
        best = tl.maximum(best, tl.max(tl.where(use, _key(xv, cls[None, :]), _MIN_KEY), 1))
        f = xv
        if LM:
            v, _, _ = _lm_at(o_k[:, None], cls[None, :], ok_c[None, :], use, base[:, None], p_ovl, V, uni_ptr, col_ptr,
                             stamp)  # fmt: skip
            f = f + lm_w * v
        if BOOST:
            g = _boost_at(bs[:, None], cls[None, :], ok_c[None, :], use & (has_b > 0)[:, None], ns_s[:, None], gn_ptr,
                          V, rg_ptr)  # fmt: skip
            f = f + b_w * g
        f_key = tl.where(use & (cls != blank)[None, :], _key(f, cls[None, :]), _MIN_KEY)
        fused = tl.maximum(fused, tl.max(f_key, 1))
    emit = active & (_order_of(best) != blank) & (fused != _MIN_KEY)
    label = tl.where(emit, _order_of(fused), blank)
    lp = tl.load(rows + label, mask=active, other=0.0).to(tl.float32) - mx - ls
    if D > 0:  # the duration's argmax (the first of equal ones)
        dur = _duration_of(dlp, dur_ptr, active, D, DD)
        stp = tl.where(emit, dur, tl.maximum(dur, 1))
    else:
        dur = (~emit).to(tl.int32)
        stp = dur
    n_at = tl.where(emit & (stp == 0), at_frame + 1, 0)
    stp = tl.where(n_at >= max_symbols, 1, stp)
    n_at = tl.where(n_at >= max_symbols, 0, n_at)
    n_t = tl.where(active, t + stp, t)
    n_lm = lm_st
    if LM:
        _, hit_l, at_l = _lm_at(o_k, label, emit, emit, 0.0, p_ovl, V, uni_ptr, col_ptr, stamp)
        nx = tl.where(hit_l, tl.load(p_nxl + at_l, mask=emit & hit_l, other=0) & 4294967295,
                      tl.load(unext_ptr + label, mask=emit, other=0)).to(tl.int32)  # fmt: skip
        n_lm = tl.where(emit, nx, n_lm)
    n_bs = bs
    if BOOST:
        _, b_next = _boost_step(bs, label, emit, ns_s, gn_ptr, bnx_ptr, V)
        n_bs = tl.where(emit, b_next, n_bs)
    sv = in_k & go
    tl.store(si_ptr + at_s, n_t, mask=sv)
    tl.store(si_ptr + NK + at_s, n_at, mask=sv)
    tl.store(si_ptr + 2 * NK + at_s, n_lab + emit.to(tl.int32), mask=sv)
    tl.store(si_ptr + 4 * NK + at_s, n_lm, mask=sv)
    tl.store(si_ptr + 5 * NK + at_s, n_bs, mask=sv)
    emit = emit & go
    p_h = hist_ptr + step.to(tl.int64) * 4 * NK + at_s
    tl.store(p_h, lp.to(tl.int32, bitcast=True), mask=in_k)
    tl.store(p_h + NK, tl.where(emit, label, -1), mask=in_k)
    tl.store(p_h + 2 * NK, t, mask=in_k)
    tl.store(p_h + 3 * NK, dur, mask=in_k)
    tl.store(row_ptr + at_s, at_s.to(tl.int64), mask=in_k)
    tl.store(lab_ptr + at_s, label.to(tl.int64), mask=in_k)
    tl.store(islab_ptr + at_s, emit, mask=in_k)
    t_next = tl.where(go, n_t, t - walk)
    for fo in tl.static_range(F):
        tl.store(frm_ptr + at_s * F + fo, (n * T + tl.minimum(t_next + fo, tl.maximum(L - 1, 0))).to(tl.int64),
                 mask=in_k)  # fmt: skip


@triton.jit
def _malsd_backtrack(hist_ptr, order_ptr, ok_ptr, nlab_ptr, steps_ptr, tok_ptr, frm_ptr, dur_ptr, NK, S, K,
                     B: tl.constexpr, BP: tl.constexpr, BS: tl.constexpr, TDT: tl.constexpr):  # fmt: skip
    """Each of utterance n's B hypotheses' tokens, frames and durations [S] (-1 past its length) along the
    history's parents from the last step back."""
    n = tl.program_id(0)
    o_b = tl.arange(0, BP)
    m_b = o_b < B
    out = (n * B + o_b).to(tl.int64)
    ok = tl.load(ok_ptr + out, mask=m_b, other=0) != 0
    cur = tl.load(order_ptr + out, mask=m_b, other=0).to(tl.int32)
    pos = tl.where(ok & m_b, tl.load(nlab_ptr + n * K + cur, mask=m_b, other=0), 0)
    o_s = tl.arange(0, BS)
    for s0 in range(0, S, BS):
        m = m_b[:, None] & (s0 + o_s < S)[None, :]
        p_o = out[:, None] * S + s0 + o_s[None, :]
        tl.store(tok_ptr + p_o, tl.full((BP, BS), -1, tl.int64), mask=m)
        tl.store(frm_ptr + p_o, tl.full((BP, BS), -1, tl.int64), mask=m)
        if TDT:
            tl.store(dur_ptr + p_o, tl.full((BP, BS), -1, tl.int64), mask=m)
    tl.debug_barrier()
    steps = tl.load(steps_ptr)
    for i in range(0, steps):
        if tl.max(pos, 0) > 0:
            p_h = hist_ptr + (steps - 1 - i).to(tl.int64) * 4 * NK + n * K + cur
            lab = tl.load(p_h + NK, mask=m_b, other=-1)
            put = m_b & (lab >= 0) & (pos > 0)
            pos = pos - put.to(tl.int32)
            at = out * S + pos
            tl.store(tok_ptr + at, lab.to(tl.int64), mask=put)
            tl.store(frm_ptr + at, tl.load(p_h + 2 * NK, mask=put, other=0).to(tl.int64), mask=put)
            if TDT:
                tl.store(dur_ptr + at, tl.load(p_h + 3 * NK, mask=put, other=0).to(tl.int64), mask=put)
            cur = tl.load(p_h, mask=m_b, other=0)


class _Search:
    """The search's device buffers for one configuration (networks, shapes, fusion), its step chunk and, on the
    GPU, the chunk's CUDA graph; ``start`` fills the buffers for a call, ``run`` searches."""

    def __init__(self, w, N, T, K, blank, durations, max_symbols, lm, lm_weight, boosting, boosting_weight, enc,
                 modified, greedy=False):  # fmt: skip

        dev = enc.device
        KP = max(2, next_power_of_2(K))
        wide = KP >= STEP_TILES["wide"]
        D = len(durations) if durations else 0
        V = w.out_w.shape[0] - D
        NK = N * K
        self.refs = (w, lm, boosting)  # (kept alive: the graph holds their addresses)
        # T: the frame capacity (enc_rows' rows per utterance, the kernels' row stride); a call may bring fewer
        self.N, self.T, self.K, self.NK, self.dev = N, T, K, NK, dev
        self.steps_max = T * (1 if modified else max_symbols + 1) + CHECK_EVERY + 1  # an active slot has one
        # symbol a step: at most max_symbols labels and a blank per frame (icefall's: one a frame)
        self.sf = torch.empty(2, NK, dtype=torch.float32, device=dev)
        self.si = torch.empty(6, NK, dtype=torch.int32, device=dev)
        self.starts = (lm.start if lm is not None else 0, boosting.start if boosting is not None else 0)
        self.hsh = torch.empty(NK, dtype=torch.int64, device=dev)
        self.hist = torch.empty(self.steps_max, 4, NK, dtype=torch.int32, device=dev)
        self.row = torch.empty(NK, dtype=torch.int64, device=dev)
        self.lab = torch.empty(NK, dtype=torch.int64, device=dev)
        self.islab = torch.empty(NK, dtype=torch.bool, device=dev)
        self.step = torch.empty(1, dtype=torch.int32, device=dev)
        self.go = torch.empty((), dtype=torch.bool, device=dev)
        self.checks = None  # (run's: a device flag, two pinned host flags, two events)
        self.lens = torch.empty(N, dtype=torch.int32, device=dev)
        self.table = input_gates_table(w)
        self.linear = torch.nn.functional.linear
        if TF32X3 and w.out_w.dtype == torch.float32:  # (the weights the steps multiply by, split once per call)
            self.linear = _SplitLinear([w.out_w, w.pred_w, *(t for layer in w.lstm or () for t in layer[:2])])
        self.fused = FUSED_CELL and not w.stateless and w.embedding.dtype == torch.float32 and CHECK_EVERY % 2 == 0
        self.compact = self.fused and COMPACT and isinstance(self.linear, _SplitLinear)
        self.fused_joint = self.compact and FUSED_JOINT and w.activation == "relu"
        # the joint's frames per slot and step (its outputs: rows slot x window + frame offset; the frames' rows)
        window = GREEDY_WINDOW if isinstance(GREEDY_WINDOW, int) else GREEDY_WINDOW["tdt" if D else "rnnt"]
        self.window = max(1, window) if greedy and self.fused_joint else 1
        self.frm = torch.empty(NK * self.window, dtype=torch.int64, device=dev)
        # (zeroed: the frames past a shorter call's T are read by slots past their utterance's end, ignored there)
        self.enc_rows = torch.zeros(N * T, w.enc_w.shape[0], dtype=enc.dtype, device=dev)
        dur = torch.tensor(durations if durations else [0], dtype=torch.int32, device=dev)
        fusion = (lm_weight if lm is not None else 0.0) + (boosting_weight if boosting is not None else 0.0)
        self.lm_args = lm_arguments(lm, lm_weight, N, KP, V, self.sf)
        self.boost_args = boost_arguments(boosting, N, KP, V, self.sf)
        consts = dict(
            K=K,
            KP=KP,
            BC=min(
                STEP_TILES["block_c_wide" if wide else "block_c"], STEP_TILES["block_c"], max(16, next_power_of_2(V))
            ),
            D=D,
            DD=max(2, next_power_of_2(max(D, 1))),
            **fusion_constants(lm, boosting),
            BA=STEP_TILES["block_arcs"],
            MODIFIED=modified,
            num_warps=STEP_TILES["warps_wide" if wide else "warps"],
            **({"F": self.window} if greedy else {}),
        )
        self.step_args = (
            dur, self.sf, self.si, self.hsh, self.hist, self.row, self.lab, self.islab, self.frm, NK, T, V, V + D,
            blank, max_symbols, float(fusion), float(1 + fusion), float(boosting_weight),
            *self.lm_args, *self.boost_args,
        )  # fmt: skip
        self.consts = consts
        # what the kernels' specialisations depend on (a capture must not be the first launch of one)
        shapes = tuple(tuple(t.shape) for t in (w.enc_w, w.pred_w, w.out_w, w.embedding))
        self.config = (dev, enc.dtype, N, T, K, max_symbols, shapes, len(w.lstm or ()), TF32X3, FUSED_CELL, COMPACT,
                       FUSED_JOINT, greedy, tuple(sorted(consts.items())))  # fmt: skip
        self.kernel = _greedy_step_kernel if greedy else _malsd_step_kernel
        self.w, self.lm, self.boosting = w, lm, boosting  # (held: the key's ids stay theirs)
        self.pred_state = self.out = self.g = None
        self.halves = self.recs = self.gs = None
        if self.compact:  # compact_lstm_step's listing and counts
            self.listing = torch.empty(NK, dtype=torch.int32, device=dev)
            self.counts = torch.zeros(2, 1, dtype=torch.int32, device=dev)
        self.graph = None
        self.lock, self.done = threading.Lock(), None

    @contextlib.contextmanager
    def held(self):
        """The search's buffers for one call, from its start to its results' reads: one thread at a time, and on the
        GPU after the previous call's reads on whatever stream they were made."""
        with self.lock:
            cuda = self.dev.type == "cuda"
            if cuda and self.done is not None:
                torch.cuda.current_stream(self.dev).wait_event(self.done)
            yield
            if cuda:
                self.done = torch.cuda.Event()
                self.done.record(torch.cuda.current_stream(self.dev))

    def start(self, enc, lengths, pred_state, out, g, score, frames=None, lm_states=None, boosting_states=None):
        """The buffers at the search's start for these encoder outputs [N, T, J] and lengths (clamped); greedy
        decoding's (K = 1) may start from each utterance's frame and LM and booster states."""
        N, K, NK, dev = self.N, self.K, self.NK, self.dev
        self.enc_rows.view(N, self.T, -1)[:, : enc.shape[1]].copy_(enc)
        self.lens.copy_(lengths)
        self.sf.copy_(torch.stack((score, score)).reshape(2, NK))
        self.si.zero_()
        self.si[3] = -1
        self.si[4], self.si[5] = self.starts
        for i, v in ((0, frames), (4, lm_states), (5, boosting_states)):
            if v is not None:
                self.si[i].copy_(v)
        self.hsh.zero_()
        self.row.copy_(torch.arange(NK, device=dev))
        self.lab.zero_()
        self.islab.zero_()
        F = self.window  # (each slot's F frames from its own)
        at = self.si[0].view(N, K, 1) + torch.arange(F, dtype=self.si.dtype, device=dev)
        at = torch.minimum(at, (self.lens[:, None, None] - 1).clamp(min=0))
        self.frm.copy_((torch.arange(N, device=dev)[:, None, None] * self.T + at).reshape(NK * F))
        self.step.zero_()
        if self.table is not None:  # the weights' current values (changed in place since the last call?)
            self.table.copy_(input_gates_table(self.w))
        if isinstance(self.linear, _SplitLinear):
            self.linear.refresh()
        if self.lm_args[0] is not self.sf:  # the LM's overrides: no step's stamp (the next states' rows are read
            self.lm_args[0].zero_()  # only where these hit)
        if self.pred_state is None:  # the steps' state, updated in place
            self.pred_state = tuple(s.clone() for s in pred_state)
            self.out, self.g = out.clone(), g.clone()
            if self.fused:  # the state's two halves (the reference's out is the last layer's h)
                self.halves = (self.pred_state, tuple(torch.empty_like(s) for s in self.pred_state))
            if self.compact:  # and the recurrent terms' and the projection's
                h = self.pred_state[0]
                self.recs = tuple(torch.empty(h.shape[0], h.shape[1], 4 * h.shape[2], dtype=h.dtype, device=h.device)
                                  for _ in range(2))  # fmt: skip
                self.gs = (self.g, torch.empty_like(self.g))
        else:
            for a, b in zip((*self.pred_state, self.out, self.g), (*pred_state, out, g), strict=True):
                a.copy_(b)
        if self.fused and isinstance(self.linear, _SplitLinear):  # the projection as the steps make it (the
            self.g.copy_(self.linear(self.pred_state[0][-1], self.w.pred_w, self.w.pred_b))  # output: the last h)
        if self.compact:  # each slot's recurrent terms, made with its state
            h = self.pred_state[0]
            self.linear.group([(h[i], w_hh, b_hh) for i, (_, w_hh, _, b_hh) in enumerate(self.w.lstm)],
                              list(self.recs[0]))  # fmt: skip
            self.counts.zero_()
            self.inside(self.go)  # (the first step's)

    def chunk(self, act) -> None:
        """CHECK_EVERY steps: the reference's operations on the networks (or the fused cells), the kernel for the
        rest."""
        w, linear, N = self.w, self.linear, self.N
        g, out, pred_state, row, lab, islab = self.g, self.out, self.pred_state, self.row, self.lab, self.islab
        parity = 0  # (from one half of the state's buffers to the other: CHECK_EVERY is even)
        for _ in range(CHECK_EVERY):
            if not self.compact:  # (which counts the steps and writes go in its own launch)
                self.inside(self.go)
            recurrent = None
            if self.compact and self.fused_joint:
                joint = JointInput(self.enc_rows, self.frm, self.gs[parity], self.window)
                logits = linear.group([(joint, w.out_w, w.out_b)])[0]
            elif self.compact:
                logits = linear(act(self.enc_rows[self.frm] + self.gs[parity]), w.out_w, w.out_b)
            elif self.fused and isinstance(linear, _SplitLinear):  # the joint's and the recurrent terms' products
                h = self.halves[parity][0]  # (of the state before the step) in one launch
                logits, *recurrent = linear.group(
                    [(act(self.enc_rows[self.frm] + g), w.out_w, w.out_b),
                     *((h[i], w_hh, b_hh) for i, (_, w_hh, _, b_hh) in enumerate(w.lstm))]
                )  # fmt: skip
            else:
                logits = linear(act(self.enc_rows[self.frm] + g), w.out_w, w.out_b)
            launch(self.kernel)[(N,)](
                logits, self.lens, self.go.view(torch.uint8), self.step, *self.step_args, **self.consts
            )
            if self.compact:
                p, q = parity, 1 - parity
                compact_lstm_step(w, self.table, lab, row, islab, (*self.halves[p], self.recs[p]),
                                  (*self.halves[q], self.recs[q]), self.gs[p], self.gs[q], self.listing,
                                  (self.counts[p], self.counts[q]), linear,
                                  (self.si[0], self.lens, self.go, self.step))  # fmt: skip
                parity = q
                continue
            self.step.add_(1)
            if self.fused:
                lstm_step(w, self.table, lab, row, islab, self.halves[parity], self.halves[1 - parity], linear,
                          recurrent)  # fmt: skip
                parity = 1 - parity
                g.copy_(linear(self.halves[parity][0][-1], w.pred_w, w.pred_b))
                continue
            pred_par = tuple(s[:, row] if s.dim() == 3 else s[row] for s in pred_state)
            new_out, new_state = predict(w, lab, pred_par, self.table, linear)
            m = islab[:, None]
            out.copy_(torch.where(m, new_out, out[row]))
            for s_, n_, p in zip(pred_state, new_state, pred_par, strict=True):
                s_.copy_(torch.where(m if n_.dim() == 2 else m[None], n_, p))
            g.copy_(linear(out, w.pred_w, w.pred_b))

    def inside(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """Whether a slot is still inside its utterance: a device flag (into ``out`` if given)."""
        return torch.any(self.si[0].view(self.N, self.K) < self.lens[:, None], out=out)

    def active(self) -> bool:
        """``inside`` read on the host (a synchronisation)."""
        return bool(self.inside())

    def run(self, act) -> None:
        """The steps until no slot is active: a first chunk eager where the kernels have not run (compiles them,
        which a capture cannot), then chunks replayed from one CUDA graph on the GPU (captured once per search),
        each chunk's check read after the next chunk is queued (the GPU never waits for the host's check; the one
        chunk queued past the end takes no-op steps: no slot active, hist rows with no label)."""
        graphs = GRAPHS and self.dev.type == "cuda" and not torch.cuda.is_current_stream_capturing()
        done = 0
        if not (graphs and self.config in _WARM):
            self.chunk(act)
            _WARM.add(self.config)
            done = CHECK_EVERY
        if not self.active():
            return
        pending = None  # the last chunk's check (its index in checks' host flags and events)
        while done + CHECK_EVERY <= self.steps_max:
            if self.graph is None and graphs:
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph):
                    self.chunk(act)
            if self.graph is not None:
                self.graph.replay()
            else:
                self.chunk(act)
            done += CHECK_EVERY
            if not graphs:
                if not self.active():
                    break
                continue
            if self.checks is None:
                self.checks = (torch.empty((), dtype=torch.bool, device=self.dev),
                               torch.empty(2, dtype=torch.bool, pin_memory=True),
                               (torch.cuda.Event(), torch.cuda.Event()))  # fmt: skip
            live, host, events = self.checks
            at = (done // CHECK_EVERY) % 2
            self.inside(live)
            host[at].copy_(live, non_blocking=True)
            events[at].record()
            if pending is not None:
                events[pending].synchronize()
                if not bool(host[pending]):
                    break
            pending = at


def malsd_search(w, x: torch.Tensor, lengths: torch.Tensor, beam_size: int, blank: int, durations, max_symbols: int,
                 *options, plans=None):  # fmt: skip
    """``transducer_beam_search_reference``'s search (the same arguments, ``options`` its nbest, lm, lm_weight,
    score_norm, boosting, boosting_weight in order; the same results) with its decisions in
    ``_malsd_step_kernel``: networks of a kernel dtype, x on the GPU or under the interpreter. With KEEP_SEARCH
    the last configuration's buffers and graph serve the next call of the same configuration: kept in ``plans``
    (an object with a ``beam`` attribute: the decoder's, dropped with its weights) or else in _KEPT."""
    return _search(False, w, x, lengths, beam_size, blank, durations, max_symbols, *options, plans=plans)


def modified_search(w, x: torch.Tensor, lengths: torch.Tensor, beam_size: int, blank: int, *options, plans=None):
    """``modified_beam_search_reference``'s search (icefall's ``modified_beam_search``; the same arguments and
    results) with its decisions in ``_malsd_step_kernel`` (MODIFIED)."""
    return _search(True, w, x, lengths, beam_size, blank, None, 1, *options, plans=plans)


def greedy_search(w, x: torch.Tensor, lengths: torch.Tensor, state, blank: int, durations, max_symbols: int, lm,
                  lm_weight: float, boosting, boosting_weight: float, plans=None):  # fmt: skip
    """``transducer_greedy_reference`` with an LM or a booster fused (the same arguments and results) with each
    step's decisions in ``_greedy_step_kernel``: the beam search's buffers, networks and CUDA graphs at K = 1."""
    N, T, _ = x.shape
    dev = x.device
    S = T * max_symbols
    enc = torch.nn.functional.linear(x.to(w.enc_w.dtype).contiguous(), w.enc_w, w.enc_b)  # (a view: its copy's)
    lengths = lengths.to(dev, torch.int64).clamp(0, T)
    search = _kept_search(False, True, w, N, T, 1, blank, durations, max_symbols, lm, lm_weight, boosting,
                          boosting_weight, enc, plans)  # fmt: skip
    g = torch.nn.functional.linear(state.output, w.pred_w, w.pred_b)
    zero = torch.zeros(N, 1, dtype=torch.float32, device=dev)
    fusion_states = (
        fusion_start(lm, state.lm_states, N, dev),
        fusion_start(boosting, state.boosting_states, N, dev),
    )
    with search.held(), torch.no_grad():
        search.start(enc, lengths, state.predictor, state.output, g, zero, state.time_jumps, *fusion_states)
        search.run(activation_fn(w.activation))
        hist, si = search.hist, search.si
        live = torch.arange(hist.shape[0], device=dev)[None, :] < search.step
        label = hist[:, 1].T
        emit = (label >= 0) & live
        n_out, tokens, frames, scores, durs = compact(
            emit, (label.long(), -1), (hist[:, 2].T.long(), -1), (hist[:, 0].T.view(torch.float32), 0.0),
            (hist[:, 3].T.long(), -1),
        )  # fmt: skip
        t = si[0].long()
        lm_states = si[4].long() if lm is not None else state.lm_states
        boosting_states = si[5].long() if boosting is not None else state.boosting_states
        pred = tuple(p.clone() for p in search.pred_state)
        out = pred[0][-1] if search.fused else search.out.clone()
    frames = torch.where(frames >= 0, frames + state.frames[:, None], -1)
    hyp = Hypotheses(tokens[:, :S], n_out, frames[:, :S], scores[:, :S], durs[:, :S] if durations else None)
    return hyp, TransducerState(
        pred,
        out,
        t - lengths,
        state.frames + lengths,
        lm_states,
        boosting_states,
    )


def _kept_search(modified, greedy, w, N, T, K, blank, durations, max_symbols, lm, lm_weight, boosting,
                 boosting_weight, enc, plans) -> _Search:  # fmt: skip
    """The ``_Search`` of this configuration: the one the decoder (``plans``) or _KEPT keeps if its frame capacity
    holds T frames, or a new one (T rounded up to a multiple of FRAME_BLOCK)."""
    key = (id(w), id(lm), id(boosting), N, K, blank, durations, max_symbols, float(lm_weight),
           float(boosting_weight), enc.device, enc.dtype, w.activation, modified, greedy, TF32X3, FUSED_CELL, COMPACT,
           FUSED_JOINT, CHECK_EVERY, GRAPHS, str(GREEDY_WINDOW), tuple(STEP_TILES.items()),
           tuple(LINEAR_TILES.items()))  # fmt: skip
    kept = (plans.beam if plans is not None else _KEPT.get("beam")) if KEEP_SEARCH else None
    search = kept[1] if kept is not None and kept[0] == key and kept[1].T >= T else None
    if search is None:
        T = cdiv(T, FRAME_BLOCK) * FRAME_BLOCK
        if plans is not None:  # the old buffers go before the new ones come
            plans.beam = None
        _KEPT.clear()
        search = _Search(w, N, T, K, blank, durations, max_symbols, lm, lm_weight, boosting, boosting_weight, enc,
                         modified, greedy)  # fmt: skip
        if KEEP_SEARCH and plans is not None:
            plans.beam = (key, search)
        elif KEEP_SEARCH:
            _KEPT["beam"] = (key, search)
    return search


def _search(modified, w, x, lengths, K, blank, durations, max_symbols, B=1, lm=None, lm_weight=0.0, score_norm=True,
            boosting=None, boosting_weight=1.0, plans=None):  # fmt: skip
    N, T, _ = x.shape
    dev = x.device
    BP = max(2, next_power_of_2(B))
    D = len(durations) if durations else 0
    S = T if modified else T * max_symbols
    enc, act, lengths, wd, ninf, pred_state, out, g, score = search_start(w, x, lengths, K, blank)
    search = _kept_search(modified, False, w, N, T, K, blank, durations, max_symbols, lm, lm_weight, boosting,
                          boosting_weight, enc, plans)  # fmt: skip
    with search.held(), torch.no_grad():  # (the results read the search's buffers)
        search.start(enc, lengths, pred_state, out, g, score)
        search.run(act)
        sf, si, hist, step, NK = search.sf, search.si, search.hist, search.step, search.NK
        score, acoustic = sf[0].view(N, K), sf[1].view(N, K)
        n_lab = si[2].view(N, K).to(torch.int64)
        if modified and boosting is not None:  # a pending partial match taken back
            score = score + boosting_weight * boosting.end_scores(si[5].to(torch.int64)).to(wd).view(N, K)
        norm = (n_lab + (w.context_size if modified else 1)).to(wd)
        rank = score / norm if score_norm else score
        order = torch.sort(rank, dim=1, descending=True, stable=True).indices[:, :B]
        ok = score.gather(1, order) > float("-inf")
        tokens = kernel_output(N, B, S, dtype=torch.int64, device=dev)
        frames = kernel_output(N, B, S, dtype=torch.int64, device=dev)
        durs = kernel_output(N, B, S, dtype=torch.int64, device=dev) if D else tokens
        launch(_malsd_backtrack)[(N,)](
            hist, order.contiguous(), ok.contiguous(), si[2], step, tokens, frames, durs, NK, S, K,
            B=B, BP=BP, BS=min(1024, max(16, next_power_of_2(S))), TDT=D > 0,
        )  # fmt: skip
        return BeamHypotheses(
            tokens=tokens,
            lengths=torch.where(ok, n_lab.gather(1, order), 0),
            frames=frames,
            scores=torch.where(ok, score.gather(1, order), ninf),
            acoustic=torch.where(ok, acoustic.gather(1, order), ninf),
            lm_scores=torch.where(ok, (score - acoustic).gather(1, order), ninf),
            durations=durs if D else None,
        )
