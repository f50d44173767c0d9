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

BEAM_TILES = {"block_c": 512, "warps": 4, "top": False}  # classes per block (a power of two; tests lower it), warps,
# whether the extensions are taken from the frame's best 2K + 2 classes (else from every class; off until measured)
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
def _extension_keys(cls, lp, ok, last, p_b, total, alive, lmt, bonus, o_k, C):
    """The keys [KP, len(cls)] of every slot's extension by the classes ``cls`` (log-probabilities ``lp``, usable
    where ``ok``): after a blank only where the class is the slot's last token; _MIN_KEY where impossible."""
    rep = cls[None, :] == last[:, None]
    e_p = tl.where(rep, p_b[:, None], total[:, None]) + lp[None, :]
    valid = alive[:, None] & ok[None, :] & (e_p > float("-inf"))
    return tl.where(valid, _key(e_p + lmt[:, None] + bonus, o_k[:, None] * (C + 1) + 1 + cls[None, :]), _MIN_KEY)


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
                     K: tl.constexpr, KP: tl.constexpr, B: tl.constexpr, BP: tl.constexpr, BC: tl.constexpr,
                     PRUNE: tl.constexpr, BT: tl.constexpr, TOP: tl.constexpr):  # fmt: skip
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
    lmt = tl.zeros((KP,), tl.float32)  # insertion bonuses
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
        if TOP > 0:
            # the frame's TOP best classes (no blank, none pruned): every row's K best extensions are among them
            # (TOP >= 2K: a row loses at most its last token and its children in the beam from the list)
            top_c = tl.full((TOP,), _MIN_KEY, tl.int64)
            for c0 in range(0, C, BC):
                cls = c0 + o_c
                lp = tl.load(p_x + cls, mask=cls < C, other=float("-inf")).to(tl.float32)
                kc = tl.where((cls < C) & (cls != blank) & (lp >= limit), _key(lp, cls), _MIN_KEY)
                top_c = _take(top_c, kc, merged, parent, last, C, False)
            ok_j = top_c != _MIN_KEY
            cls = tl.where(ok_j, 4294967295 - (top_c & 4294967295), 0).to(tl.int32)
            lp = tl.load(p_x + cls, mask=ok_j, other=float("-inf")).to(tl.float32)
            keys = _extension_keys(cls, lp, ok_j, last, p_b, total, alive, lmt, bonus, o_k, C)
            run = _take(run, keys, merged, parent, last, C, True)
        else:
            # the extensions, a block of classes at a time, into the running list of the K best keys
            for c0 in range(0, C, BC):
                cls = c0 + o_c
                lp = tl.load(p_x + cls, mask=cls < C, other=float("-inf")).to(tl.float32)
                ok_c = (cls < C) & (cls != blank) & (lp >= limit)
                keys = _extension_keys(cls, lp, ok_c, last, p_b, total, alive, lmt, bonus, o_k, C)
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
        lmt = _pick(sel, lmt) + tl.where(ext, bonus, 0.0)
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
    score = acoustic + lmt
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
    tl.store(lm_ptr + out, tl.where(ok, _pick(sel, lmt), float("-inf")), mask=m_b)
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


def ctc_beam(
    x: torch.Tensor,
    lengths: torch.Tensor,
    beam_size: int,
    blank: int,
    token_insertion_bonus: float,
    nbest: int,
    prune_threshold: float | None,
):
    """The CTC prefix beam search of x [N, T, C] (contiguous, float32/16-bit; searched in float32) with
    ``lengths`` [N] (clamped to [0, T] here): (tokens [N, B, T], lengths [N, B], frames [N, B, T] int64; scores,
    acoustic, LM parts [N, B] float32) as ``beam_reference.ctc_beam_search_reference`` gives them. One launch, no
    host synchronisation."""
    N, T, C = x.shape
    dev = x.device
    K, B = beam_size, nbest
    KP, BP = max(2, next_power_of_2(K)), max(2, next_power_of_2(B))
    nodes = torch.empty(N, T, KP, 4, dtype=torch.int32, device=dev)
    tokens = kernel_output(N, B, T, dtype=torch.int64, device=dev)
    frames = kernel_output(N, B, T, dtype=torch.int64, device=dev)
    lens = kernel_output(N, B, dtype=torch.int64, device=dev)
    scores, acoustic, lm = kernel_output(3, N, B, dtype=torch.float32, device=dev).unbind(0)
    launch(_ctc_beam_kernel)[(N,)](
        x,
        lengths,
        nodes,
        tokens,
        frames,
        lens,
        scores,
        acoustic,
        lm,
        T,
        C,
        blank,
        float(token_insertion_bonus),
        float(prune_threshold if prune_threshold is not None else 0.0),
        K=K,
        KP=KP,
        B=B,
        BP=BP,
        BC=min(BEAM_TILES["block_c"], max(16, next_power_of_2(C))),
        PRUNE=prune_threshold is not None,
        BT=min(1024, max(16, next_power_of_2(T))),
        TOP=next_power_of_2(2 * K + 2) if BEAM_TILES["top"] else 0,
        num_warps=BEAM_TILES["warps"],
    )
    return tokens, lens, frames, scores, acoustic, lm
