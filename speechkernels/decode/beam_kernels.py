"""Triton kernel of the CTC prefix beam search (``ctc_beam_search`` without an LM or boosting): one program per
utterance, all of its frames in one launch.

A program holds its beam (K slots, padded to KP) in registers across the frames: each prefix's blank- and
token-ending log-sums and best alignments, its insertion bonuses, length, last token and a 64-bit hash of its
tokens (merges are found by hash: prefix k2 is prefix k1's child by its last token where k2's hash is k1's mixed
with that token and k2 is one token longer; distinct prefixes collide with probability about 2^-64). Each frame:
the stays (blank, repeat) and the merges of extensions into them, then the extensions in blocks of BC classes,
each block's best candidates moved into a running list of the K best packed keys (an order-preserving image of
the float32 score above the complement of the order of reach, so that the largest key is the best score, ties
to the candidate reached first, as the oracle ranks them) for as long as the block's best beats the list's worst
(an extension merged into a stay is dropped there: a merged stay ranks with its parent's extension's order),
then the survivors' state gathered from the old slots.
Tokens and frames are not copied per frame: a survivor that adds a token or a frame writes one node (previous
token node, token, previous frame node, frame) of an arena [N, T, KP, 4] int32; the N-best are read back along
the nodes at the end.

Memory traffic: the scores read once per frame (C values; twice with pruning: the frame's maximum first); the
arena written at most once per slot and frame. The work per frame is K x C candidate scores, a maximum per block
and one more per candidate that enters the list.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launch import launch, next_power_of_2
from .._outputs import kernel_output

BEAM_TILES = {"block_c": 256, "warps": 8, "wide": 32, "block_c_wide": 128, "block_arcs": 32}  # classes per block
# (a power of two; tests lower it) and warps; from "wide" slots up, "block_c_wide" classes per block and the fused
# terms' per-class vectors read per slot (loaded once per block below it: faster at beam 10, slower at beam 32 on
# the H100); the LM's arcs written per slot at once
_MIN_KEY = tl.constexpr(-9223372036854775807 - 1)  # below every candidate's key: an empty place
_MAX_KEY = tl.constexpr(9223372036854775807)  # above every key: the places past K, never replaced


@triton.jit
def _lae(a, b):
    """log(exp(a) + exp(b)), -inf where both are."""
    m = tl.maximum(a, b)
    lo = tl.minimum(a, b)
    safe = tl.where(m == float("-inf"), 0.0, m)
    return tl.where(m == float("-inf"), m, safe + tl.log(1.0 + tl.exp(lo - safe)))


@triton.jit
def _key(score, order):
    """int64 keys: float32 scores in order (-0.0 as +0.0), then the smaller order first."""
    bits = score.to(tl.int32, bitcast=True)
    k32 = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    k32 = tl.where(bits == -2147483648, 0, k32)
    return (k32.to(tl.int64) << 32) | (4294967295 - order.to(tl.int64))


@triton.jit
def _mix(h, c):
    """The hash of a prefix extended by token c."""
    h = (h ^ (c.to(tl.int64) + 1)) * -7046029254386353131  # 0x9E3779B97F4A7C15 as int64
    return h ^ ((h >> 29) & 34359738367)


@triton.jit
def _pick(sel, values):
    """values[k] for each row's selected k: sel [R, KP] one-hot (an all-false row gives 0)."""
    return tl.sum(tl.where(sel, values[None, :], 0), axis=1)


@triton.jit
def _extension_keys(cls, lp, ok, last, p_b, total, alive, fuse, o_k, C):
    """The keys [KP, len(cls)] of every slot's extension by the classes ``cls`` (log-probabilities ``lp``, usable
    where ``ok``; ``fuse`` the slots' LM and bonus terms with them): after a blank only where the class is the
    slot's last token; _MIN_KEY where impossible."""
    rep = cls[None, :] == last[:, None]
    e_p = tl.where(rep, p_b[:, None], total[:, None]) + lp[None, :]
    valid = alive[:, None] & ok[None, :] & (e_p > float("-inf"))
    return tl.where(valid, _key(e_p + fuse, o_k[:, None] * (C + 1) + 1 + cls[None, :]), _MIN_KEY)


@triton.jit
def _pack(stamp, value):
    """An override: the frame's stamp above a 32-bit value (a float32's bits or an int32)."""
    if value.dtype == tl.float32:
        value = value.to(tl.int32, bitcast=True)
    return (stamp.to(tl.int64) << 32) | (value.to(tl.int64) & 4294967295)


@triton.jit
def _lm_at(slot, cls, ok_cls, ok, base, p_ovl, C, uni_ptr, col_ptr, stamp):
    """log p_LM of class ``cls`` from slot ``slot``'s state (broadcastable; the classes' vectors read where
    ``ok_cls``, of cls's shape, the overrides where ``ok``): the frame's override where its arcs give one, else the
    root's unigram below the state's summed backoffs ``base``; and whether an arc gave it, and where."""
    col = tl.load(col_ptr + cls, mask=ok_cls, other=0)
    uni = tl.load(uni_ptr + cls, mask=ok_cls, other=0.0)
    at = slot * (C + 1) + col
    v = tl.load(p_ovl + at, mask=ok, other=0)
    hit = (v >> 32) == stamp
    return tl.where(hit, (v & 4294967295).to(tl.int32).to(tl.float32, bitcast=True), uni + base), hit, at


@triton.jit
def _boost_at(state, cls, ok_cls, ok, ns_s, gn_ptr, C, rg_ptr):
    """The boosting bonus of class ``cls`` from trie state ``state`` (node score ``ns_s``): the gain of the state it
    leads to, from the state's row of ``PhraseBooster.gain_next`` where ``ok`` (a slot off the root), else from
    the root's (the vector ``rg``, read where ``ok_cls``, of cls's shape), less ``ns_s``."""
    rg = tl.load(rg_ptr + cls, mask=ok_cls, other=0.0)
    g = tl.load(gn_ptr + state.to(tl.int64) * C + cls, mask=ok, other=0.0)
    return tl.where(ok, g, rg) - ns_s


@triton.jit
def _boost_step(state, cls, ok, ns_s, gn_ptr, bnx_ptr, C):
    """(the boosting bonus, the trie state it leads to) of class ``cls`` from trie state ``state`` (node score
    ``ns_s``), read where ``ok``."""
    at = state.to(tl.int64) * C + cls
    return tl.load(gn_ptr + at, mask=ok, other=0.0) - ns_s, tl.load(bnx_ptr + at, mask=ok, other=0).to(tl.int32)


@triton.jit
def _column(tile, o_d, j):
    """tile[:, j] of a [KP, D] tile (o_d: arange(D))."""
    return tl.sum(tl.where(o_d[None, :] == j, tile, 0), axis=1)


@triton.jit
def _scatter(p_ov, p_nx, stride, lo, cnt, token_ptr, value_ptr, next_ptr, add, stamp, o_k, BA: tl.constexpr):
    """Each slot's ``cnt`` arcs from ``lo`` written into its two override rows, stamped: value + ``add`` (float32)
    and the next state (int32)."""
    o_a = tl.arange(0, BA)[None, :]
    lo2, cnt2, add2 = lo[:, None], cnt[:, None], add[:, None]
    row = o_k[:, None] * stride
    for a0 in range(0, tl.max(cnt, 0), BA):
        ia = a0 + o_a
        m = ia < cnt2
        arc = lo2 + ia
        tok = tl.load(token_ptr + arc, mask=m, other=0).to(tl.int32)
        val = tl.load(value_ptr + arc, mask=m, other=0.0) + add2
        nxt = tl.load(next_ptr + arc, mask=m, other=0).to(tl.int32)
        tl.store(p_ov + row + tok, _pack(stamp, val), mask=m)
        tl.store(p_nx + row + tok, _pack(stamp, nxt), mask=m)


@triton.jit
def _arc_ranges(chain, live, start_ptr):
    """(first arc, count) of every state of a [KP, D] tile of states (none for the root or a dead slot)."""
    lo = tl.load(start_ptr + chain).to(tl.int32)
    cnt = tl.load(start_ptr + chain + 1).to(tl.int32) - lo
    return lo, tl.where((chain > 0) & live, cnt, 0)


@triton.jit
def _lm_overrides(lm_st, alive, p_ovl, p_nxl, C, stamp, chain_ptr, above_ptr, base_ptr, as_ptr, at_ptr, al_ptr, an_ptr,
                  o_k, DEPTH: tl.constexpr, DP: tl.constexpr, BA: tl.constexpr):  # fmt: skip
    """Each live slot's LM arcs along the backoff chain of its state ``lm_st`` written as the step's overrides
    (values [KP, C + 1] with the backoffs above them, next states), the least specific first; returns the states'
    summed backoffs to the root."""
    o_d = tl.arange(0, DP)
    at = lm_st[:, None] * (DEPTH + 1) + o_d[None, :]
    in_d = alive[:, None] & (o_d[None, :] <= DEPTH)
    chain = tl.load(chain_ptr + at, mask=in_d, other=0).to(tl.int32)
    above = tl.load(above_ptr + at, mask=in_d, other=0.0)
    base = tl.load(base_ptr + lm_st)
    lo, cnt = _arc_ranges(chain, in_d, as_ptr)
    for il in tl.static_range(1, DEPTH + 1):  # (the last level is the root's: no arcs)
        lvl = DEPTH - il
        lo_l, cnt_l, above_l = _column(lo, o_d, lvl), _column(cnt, o_d, lvl), _column(above, o_d, lvl)
        if tl.max(cnt_l, 0) > 0:
            _scatter(p_ovl, p_nxl, C + 1, lo_l, cnt_l, at_ptr, al_ptr, an_ptr, above_l, stamp, o_k, BA)
            tl.debug_barrier()
    return base


@triton.jit
def _overrides(lm_st, bs, alive, p_ovl, p_nxl, C, stamp, chain_ptr, above_ptr, base_ptr, as_ptr, at_ptr, al_ptr,
               an_ptr, ns_ptr, o_k, KP: tl.constexpr, LM: tl.constexpr, DEPTH: tl.constexpr, DP: tl.constexpr,
               BOOST: tl.constexpr, BA: tl.constexpr):  # fmt: skip
    """The step's LM overrides of every live slot (its arcs along the backoff chain of its state ``lm_st``) and its
    boosting terms (``bs``: its trie state; the bonuses come from the state's row of ``gain_next``): (the LM
    states' summed backoffs, the trie states' node scores, whether each slot is off the trie's root)."""
    base = tl.zeros((KP,), tl.float32)
    ns_s = tl.zeros((KP,), tl.float32)
    has_b = tl.zeros((KP,), tl.int32)
    if BOOST:
        ns_s = tl.load(ns_ptr + bs)
        has_b = ((bs > 0) & alive).to(tl.int32)
    if LM:
        base = _lm_overrides(lm_st, alive, p_ovl, p_nxl, C, stamp, chain_ptr, above_ptr, base_ptr, as_ptr, at_ptr,
                             al_ptr, an_ptr, o_k, DEPTH, DP, BA)  # fmt: skip
        tl.debug_barrier()  # (the overrides written before the step's reads)
    return base, ns_s, has_b


@triton.jit
def _take(run, keys, merged, parent, last, C, DROP: tl.constexpr):
    """The list ``run`` after the candidates ``keys`` (any shape) that beat its worst, best first: each replaces the
    worst; with DROP an extension merged into a stay (a (parent, class) of ``merged`` slots) is dropped instead."""
    o_r = tl.arange(0, run.shape[0])
    m = tl.max(keys)
    low = tl.min(run, 0)
    while m > low:
        keep = 1
        if DROP:
            order = 4294967295 - (m & 4294967295)
            hit = merged & (parent == order // (C + 1)) & (last == order % (C + 1) - 1)
            keep = 1 - tl.max(hit.to(tl.int32), 0)
        run = tl.where((o_r == tl.argmin(run, 0)) & (keep == 1), m, run)
        keys = tl.where(keys == m, _MIN_KEY, keys)
        m = tl.max(keys)
        low = tl.min(run, 0)
    return run


@triton.jit
def _ctc_beam_kernel(x_ptr, len_ptr, node_ptr, tok_ptr, frm_ptr, olen_ptr, score_ptr, ac_ptr, lm_ptr,
                     T, C, blank, bonus, prune,
                     ovl_ptr, nxl_ptr, lm_w, lm_start, chain_ptr, above_ptr, base_ptr, as_ptr, at_ptr, al_ptr, an_ptr,
                     uni_ptr, unext_ptr, col_ptr, end_ptr,
                     gn_ptr, bnx_ptr, rg_ptr, ns_ptr,
                     K: tl.constexpr, KP: tl.constexpr, B: tl.constexpr, BP: tl.constexpr, BC: tl.constexpr,
                     PRUNE: tl.constexpr, BT: tl.constexpr, LM: tl.constexpr, DEPTH: tl.constexpr,
                     DP: tl.constexpr, BOOST: tl.constexpr, BA: tl.constexpr,
                     WIDE: tl.constexpr):  # fmt: skip
    n = tl.program_id(0)
    L = tl.minimum(tl.maximum(tl.load(len_ptr + n).to(tl.int32), 0), T)
    o_k = tl.arange(0, KP)
    o_c = tl.arange(0, BC)
    in_k = o_k < K
    ninf = tl.full((KP,), float("-inf"), tl.float32)
    p_b = tl.where(o_k == 0, 0.0, ninf)  # log-sums of the alignments ending in a blank / the last token
    p_t = ninf
    b_b = p_b  # their most likely alignments
    b_t = ninf
    lmt = tl.zeros((KP,), tl.float32)  # the LM terms, insertion and boosting bonuses
    lm_st = tl.zeros((KP,), tl.int32) + lm_start  # LM and boosting states
    bs = tl.zeros((KP,), tl.int32)
    p_ovl = ovl_ptr + n.to(tl.int64) * KP * (C + 1)  # the frame's overrides: LM arcs [KP, C + 1]
    p_nxl = nxl_ptr + n.to(tl.int64) * KP * (C + 1)
    ln = tl.zeros((KP,), tl.int32)
    last = tl.full((KP,), -1, tl.int32)
    hsh = tl.zeros((KP,), tl.int64)
    alive = o_k == 0
    n_tok = tl.full((KP,), -1, tl.int32)  # arena nodes: the last token's, the frames of each kind's best
    n_fb = tl.full((KP,), -1, tl.int32)
    n_ft = tl.full((KP,), -1, tl.int32)
    p_node = node_ptr + n.to(tl.int64) * T * KP * 4
    row = x_ptr + n.to(tl.int64) * T * C
    for t in range(0, L):
        p_x = row + t * C
        limit = float("-inf")
        if PRUNE:  # the classes within `prune` of the frame's best
            top = tl.full((BC,), float("-inf"), tl.float32)
            for c0 in range(0, C, BC):
                top = tl.maximum(top, tl.load(p_x + c0 + o_c, mask=c0 + o_c < C, other=float("-inf")).to(tl.float32))
            limit = tl.max(top, 0) - prune
        total = _lae(p_b, p_t)
        best = tl.maximum(b_b, b_t)
        n_best = tl.where(b_b >= b_t, n_fb, n_ft)
        lp_blank = tl.load(p_x + blank).to(tl.float32)
        lp_last = tl.load(p_x + last, mask=last >= 0, other=float("-inf")).to(tl.float32)
        ok_last = (last >= 0) & (last != blank) & (lp_last >= limit)
        lp_last = tl.where(ok_last, lp_last, float("-inf"))
        # the stays
        s_pb = total + lp_blank
        s_bb = best + lp_blank
        s_pt = p_t + lp_last
        s_bt = b_t + lp_last
        s_nt = n_ft
        # the merges: slot j is slot i's child by its last token -> that extension of i joins j's stay
        child = (hsh[:, None] == _mix(hsh[None, :], last[:, None])) & (ln[:, None] == ln[None, :] + 1)
        child = child & alive[:, None] & alive[None, :]
        has_parent = tl.max(child.to(tl.int32), 1) > 0
        parent = tl.argmax(child.to(tl.int32), 1)
        sel_p = o_k[None, :] == parent[:, None]
        again = _pick(sel_p, last) == last  # the parent's last token is the child's: from its blank alignments
        m_p = tl.where(again, _pick(sel_p, p_b), _pick(sel_p, total)) + lp_last
        m_b = tl.where(again, _pick(sel_p, b_b), _pick(sel_p, best)) + lp_last
        m_src = tl.where(again, _pick(sel_p, n_fb), _pick(sel_p, n_best))
        merged = has_parent & (m_p > float("-inf"))
        first = (m_b > s_bt) | ((m_b == s_bt) & (parent < o_k))  # the extension reached the prefix first
        take = merged & first
        s_pt = tl.where(merged, _lae(s_pt, m_p), s_pt)
        s_bt = tl.where(take, m_b, s_bt)
        order_stay = o_k * (C + 1)
        order_stay = tl.where(merged, tl.minimum(order_stay, parent * (C + 1) + 1 + last), order_stay)
        run = tl.where(alive, _key(_lae(s_pb, s_pt) + lmt, order_stay), _MIN_KEY)
        run = tl.where(in_k, run, _MAX_KEY)
        # the fusion's terms: every slot's arcs along its backoff chain (LM) and failure chain (boosting) written
        # as the frame's overrides, the least specific first
        stamp = t + 1
        e_lm0 = lmt + bonus
        base, ns_s, has_b = _overrides(lm_st, bs, alive, p_ovl, p_nxl, C, stamp, chain_ptr, above_ptr, base_ptr,
                                       as_ptr, at_ptr, al_ptr, an_ptr, ns_ptr, o_k, KP, LM, DEPTH, DP, BOOST,
                                       BA)  # fmt: skip
        # the extensions, a block of classes at a time, into the running list of the K best keys
        for c0 in range(0, C, BC):
            cls = c0 + o_c
            lp = tl.load(p_x + cls, mask=cls < C, other=float("-inf")).to(tl.float32)
            ok_c = (cls < C) & (cls != blank) & (lp >= limit)
            fuse = e_lm0[:, None]
            use = alive[:, None] & ok_c[None, :]
            if WIDE:
                ok_v = use  # the per-class vectors read per slot
            else:
                ok_v = ok_c[None, :]  # once per block
            if LM:
                v, _, _ = _lm_at(o_k[:, None], cls[None, :], ok_v, use, base[:, None], p_ovl, C, uni_ptr,
                                 col_ptr, stamp)  # fmt: skip
                fuse = fuse + lm_w * v
            if BOOST:
                g = _boost_at(bs[:, None], cls[None, :], ok_v, use & (has_b > 0)[:, None], ns_s[:, None], gn_ptr, C,
                              rg_ptr)  # fmt: skip
                fuse = fuse + g
            keys = _extension_keys(cls, lp, ok_c, last, p_b, total, alive, fuse, o_k, C)
            run = _take(run, keys, merged, parent, last, C, True)
        # the K best in order of rank
        win = tl.full((KP,), _MIN_KEY, tl.int64)
        run = tl.where(in_k, run, _MIN_KEY)
        for r in range(K):
            m = tl.max(run, 0)
            win = tl.where(o_k == r, m, win)
            run = tl.where(run == m, _MIN_KEY, run)
        new_alive = win != _MIN_KEY
        order = 4294967295 - (win & 4294967295)
        src = tl.where(new_alive, order // (C + 1), 0).to(tl.int32)
        c_new = tl.where(new_alive, order % (C + 1) - 1, -1).to(tl.int32)
        # a merged stay ranks by its parent's extension's order: that (parent, class) names the child's stay
        match = merged[None, :] & (parent[None, :] == src[:, None]) & (last[None, :] == c_new[:, None])
        is_stay = tl.max(match.to(tl.int32), 1) > 0
        src = tl.where(is_stay, tl.argmax(match.to(tl.int32), 1), src).to(tl.int32)
        c_new = tl.where(is_stay, -1, c_new)
        ext = new_alive & (c_new >= 0)
        sel = o_k[None, :] == src[:, None]
        lp_c = tl.load(p_x + c_new, mask=ext, other=float("-inf")).to(tl.float32)
        again = _pick(sel, last) == c_new
        e_p = tl.where(again, _pick(sel, p_b), _pick(sel, total)) + lp_c
        e_b = tl.where(again, _pick(sel, b_b), _pick(sel, best)) + lp_c
        e_src = tl.where(again, _pick(sel, n_fb), _pick(sel, n_best))
        took = ~ext & (_pick(sel, take.to(tl.int32)) > 0)
        node = t * KP + o_k
        p_new = p_node + node * 4
        # a new token: its node (previous token node, token, previous frame node, frame); a merge that brought a
        # more likely alignment: a frame node
        tl.store(p_new, _pick(sel, n_tok), mask=ext)
        tl.store(p_new + 1, c_new, mask=ext)
        tl.store(p_new + 2, tl.where(ext, e_src, _pick(sel, m_src)), mask=ext | took)
        tl.store(p_new + 3, tl.zeros((KP,), tl.int32) + t, mask=ext | took)
        n_tok = tl.where(ext, node, _pick(sel, n_tok))
        n_ft = tl.where(ext | took, node, _pick(sel, s_nt))
        n_fb = tl.where(ext, -1, _pick(sel, n_best))
        p_b = tl.where(ext, float("-inf"), _pick(sel, s_pb))
        b_b = tl.where(ext, float("-inf"), _pick(sel, s_bb))
        p_t = tl.where(ext, e_p, _pick(sel, s_pt))
        b_t = tl.where(ext, e_b, _pick(sel, s_bt))
        lm_src = _pick(sel, lmt)
        e_lm = lm_src + bonus
        if LM:
            st_src = _pick(sel, lm_st)
            v, hit, at = _lm_at(src, c_new, ext, ext, _pick(sel, base), p_ovl, C, uni_ptr, col_ptr, stamp)
            e_lm = e_lm + lm_w * v
            nx = tl.where(hit, tl.load(p_nxl + at, mask=ext & hit, other=0) & 4294967295,
                          tl.load(unext_ptr + c_new, mask=ext, other=0)).to(tl.int32)  # fmt: skip
            lm_st = tl.where(ext, nx, st_src)
        if BOOST:
            bs_src = _pick(sel, bs)
            g, b_next = _boost_step(bs_src, c_new, ext, _pick(sel, ns_s), gn_ptr, bnx_ptr, C)
            e_lm = e_lm + g
            bs = tl.where(ext, b_next, bs_src)
        lmt = tl.where(ext, e_lm, lm_src)
        hsh = tl.where(ext, _mix(_pick(sel, hsh), c_new), _pick(sel, hsh))
        ln = _pick(sel, ln) + ext.to(tl.int32)
        last = tl.where(ext, c_new, _pick(sel, last))
        p_b = tl.where(new_alive, p_b, float("-inf"))
        p_t = tl.where(new_alive, p_t, float("-inf"))
        b_b = tl.where(new_alive, b_b, float("-inf"))
        b_t = tl.where(new_alive, b_t, float("-inf"))
        alive = new_alive
        tl.debug_barrier()  # the arena's nodes written before a later frame's reads
    # the N-best: by score, ties to the slot's rank
    acoustic = _lae(p_b, p_t)
    lm_fin = lmt
    if LM:
        lm_fin = lm_fin + lm_w * tl.load(end_ptr + lm_st)
    if BOOST:
        lm_fin = lm_fin + (-tl.load(ns_ptr + bs))
    score = acoustic + lm_fin
    run = tl.where(alive, _key(score, o_k), _MIN_KEY)
    o_b = tl.arange(0, BP)
    pick = tl.full((BP,), -1, tl.int32)
    for r in range(B):
        m = tl.max(run, 0)
        pick = tl.where((o_b == r) & (m != _MIN_KEY), (4294967295 - (m & 4294967295)).to(tl.int32), pick)
        run = tl.where(run == m, _MIN_KEY, run)
    ok = pick >= 0
    sel = o_k[None, :] == pick[:, None]
    m_b = o_b < B
    out = n * B + o_b
    length = tl.where(ok, _pick(sel, ln), 0)
    tl.store(olen_ptr + out, length.to(tl.int64), mask=m_b)
    tl.store(score_ptr + out, tl.where(ok, _pick(sel, score), float("-inf")), mask=m_b)
    tl.store(ac_ptr + out, tl.where(ok, _pick(sel, acoustic), float("-inf")), mask=m_b)
    tl.store(lm_ptr + out, tl.where(ok, _pick(sel, lm_fin), float("-inf")), mask=m_b)
    # tokens and frames: -1 everywhere, then along the nodes from the last token back
    o_t = tl.arange(0, BT)
    for t0 in range(0, T, BT):
        m_t = m_b[:, None] & (t0 + o_t < T)[None, :]
        p_o = out.to(tl.int64)[:, None] * T + t0 + o_t[None, :]
        tl.store(tok_ptr + p_o, tl.full((BP, BT), -1, tl.int64), mask=m_t)
        tl.store(frm_ptr + p_o, tl.full((BP, BT), -1, tl.int64), mask=m_t)
    tl.debug_barrier()
    cur_t = tl.where(ok, _pick(sel, n_tok), -1)
    cur_f = tl.where(ok, tl.where(_pick(sel, b_b) >= _pick(sel, b_t), _pick(sel, n_fb), _pick(sel, n_ft)), -1)
    for i in range(0, T):
        pos = length - 1 - i
        live = m_b & (pos >= 0)
        tok = tl.load(p_node + cur_t * 4 + 1, mask=live & (cur_t >= 0), other=-1)
        frm = tl.load(p_node + cur_f * 4 + 3, mask=live & (cur_f >= 0), other=-1)
        tl.store(tok_ptr + out.to(tl.int64) * T + pos, tok.to(tl.int64), mask=live)
        tl.store(frm_ptr + out.to(tl.int64) * T + pos, frm.to(tl.int64), mask=live)
        cur_t = tl.load(p_node + cur_t * 4, mask=live & (cur_t >= 0), other=-1)
        cur_f = tl.load(p_node + cur_f * 4 + 2, mask=live & (cur_f >= 0), other=-1)


def fusion_constants(lm, boosting) -> dict:
    """The kernels' fusion constexprs: LM (and its backoff chains' depth DEPTH, padded DP), BOOST."""
    return dict(
        LM=lm is not None,
        DEPTH=lm.depth if lm is not None else 0,
        DP=next_power_of_2(lm.depth + 1) if lm is not None else 1,
        BOOST=boosting is not None,
    )


def lm_arguments(lm, lm_weight: float, N: int, KP: int, C: int, x: torch.Tensor) -> tuple:
    """The kernels' LM arguments (``x``, on the device, fills the unused pointers): the step's override buffers
    (zero: no step's stamp) of N x KP slots over C classes, and the root's values per class (<unk>'s where the
    class has no unigram)."""
    if lm is None:
        return (x, x, 0.0, 0) + (x,) * 11
    dev = x.device
    ovl = torch.zeros(2, N, KP, C + 1, dtype=torch.int64, device=dev)
    col = torch.arange(C, device=dev)
    col[lm.unknown] = C
    return (ovl[0], ovl[1], float(lm_weight), int(lm.start), lm.chain, lm.above, lm.base, lm.arc_start,
            lm.arc_token, lm.arc_logp, lm.arc_next, lm.unigram[col], lm.unigram_next[col], col, lm.end)  # fmt: skip


def boost_arguments(boosting, N: int, KP: int, C: int, x: torch.Tensor) -> tuple:
    """The kernels' boosting arguments: the booster's ``gain_next`` and ``next`` [S, C], the root's row of
    ``gain_next`` and ``node_score`` (``x`` fills the unused pointers)."""
    if boosting is None:
        return (x,) * 4
    return (boosting.gain_next, boosting.next, boosting.gain_next[0], boosting.node_score)


def ctc_beam(
    x: torch.Tensor,
    lengths: torch.Tensor,
    beam_size: int,
    blank: int,
    token_insertion_bonus: float,
    nbest: int,
    prune_threshold: float | None,
    lm=None,
    lm_weight: float = 0.0,
    boosting=None,
):
    """The CTC prefix beam search of x [N, T, C] (contiguous, float32/16-bit; searched in float32) with
    ``lengths`` [N] (clamped to [0, T] here), fused with an ``NGramLM`` and a ``PhraseBooster`` over the C classes
    (on x's device) where given: (tokens [N, B, T], lengths [N, B], frames [N, B, T] int64; scores, acoustic, LM
    parts [N, B] float32) as ``beam_reference.ctc_beam_search_reference`` gives them. One launch, no host
    synchronisation."""
    N, T, C = x.shape
    dev = x.device
    K, B = beam_size, nbest
    KP, BP = max(2, next_power_of_2(K)), max(2, next_power_of_2(B))
    nodes = torch.empty(N, T, KP, 4, dtype=torch.int32, device=dev)
    tokens = kernel_output(N, B, T, dtype=torch.int64, device=dev)
    frames = kernel_output(N, B, T, dtype=torch.int64, device=dev)
    lens = kernel_output(N, B, dtype=torch.int64, device=dev)
    scores, acoustic, lm_out = kernel_output(3, N, B, dtype=torch.float32, device=dev).unbind(0)
    lm_args = lm_arguments(lm, lm_weight, N, KP, C, x)
    boost_args = boost_arguments(boosting, N, KP, C, x)
    wide = KP >= BEAM_TILES["wide"]
    bc = min(BEAM_TILES["block_c"], BEAM_TILES["block_c_wide"] if wide else BEAM_TILES["block_c"])
    launch(_ctc_beam_kernel)[(N,)](
        x,
        lengths,
        nodes,
        tokens,
        frames,
        lens,
        scores,
        acoustic,
        lm_out,
        T,
        C,
        blank,
        float(token_insertion_bonus),
        float(prune_threshold if prune_threshold is not None else 0.0),
        *lm_args,
        *boost_args,
        K=K,
        KP=KP,
        B=B,
        BP=BP,
        BC=min(bc, max(16, next_power_of_2(C))),
        PRUNE=prune_threshold is not None,
        BT=min(1024, max(16, next_power_of_2(T))),
        **fusion_constants(lm, boosting),
        BA=BEAM_TILES["block_arcs"],
        WIDE=wide,
        num_warps=BEAM_TILES["warps"],
    )
    return tokens, lens, frames, scores, acoustic, lm_out
