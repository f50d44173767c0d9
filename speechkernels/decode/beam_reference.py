"""CTC prefix beam search in plain Python over float64 values, one utterance at a time: the oracle of the batched
beam searches (readable first; a batch of a few utterances of tens of frames is what it is for).

Each hypothesis is a prefix (the tokens so far) with two acoustic log-probabilities, of its alignments ending in a
blank and in its last token. A frame extends every prefix by the blank (stays), by its last token (stays: a
repeat merges), and by every other token, or by its last token again after a blank (a new token); alignments that
reach the same prefix add up (prefix merging). A new token adds ``lm_weight`` times its LM log-probability from the
prefix's LM state and ``token_insertion_bonus``. Each frame keeps the ``beam_size`` best prefixes by total score
(acoustic log-sum plus the LM and bonus terms), ties to the prefix reached first (its parent's rank, then the blank
before the classes in order). At the end the LM's ``</s>`` term is added and the ``nbest`` best are returned
(ties: the beam's order).

Frames: each token's frame on the prefix's most likely alignment (the maximum, not the sum, tracked beside the
sums; where two alignments of a prefix are equally likely, the one the prefix already had).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .hypotheses import BeamHypotheses

NEG = -math.inf


def _logaddexp(a: float, b: float) -> float:
    if a == NEG:
        return b
    if b == NEG:
        return a
    m = max(a, b)
    return m + math.log(math.exp(a - m) + math.exp(b - m))


class BeamHypothesis(NamedTuple):
    """One result of a beam search: ``tokens`` and ``frames`` (tuples), ``score`` (acoustic + LM + bonus, the
    ranking), ``acoustic`` (the log-sum over the prefix's alignments), ``lm`` (the weighted LM terms and bonuses,
    ``</s>`` included)."""

    tokens: tuple[int, ...]
    frames: tuple[int, ...]
    score: float
    acoustic: float
    lm: float


class _Prefix:
    __slots__ = (
        "p_blank", "p_token", "best_blank", "best_token", "frames_blank", "frames_token", "lm", "state", "boost"
    )  # fmt: skip

    def __init__(self, lm: float, state: int | None, boost: int | None = None) -> None:
        self.p_blank = self.p_token = NEG  # log-sums of the alignments ending in a blank / in the last token
        self.best_blank = self.best_token = NEG  # the most likely alignment of each kind
        self.frames_blank: tuple[int, ...] = ()
        self.frames_token: tuple[int, ...] = ()
        self.lm, self.state, self.boost = lm, state, boost

    def add_blank(self, logp: float, best: float, frames: tuple[int, ...]) -> None:
        self.p_blank = _logaddexp(self.p_blank, logp)
        if best > self.best_blank:
            self.best_blank, self.frames_blank = best, frames

    def add_token(self, logp: float, best: float, frames: tuple[int, ...]) -> None:
        self.p_token = _logaddexp(self.p_token, logp)
        if best > self.best_token:
            self.best_token, self.frames_token = best, frames

    @property
    def acoustic(self) -> float:
        return _logaddexp(self.p_blank, self.p_token)

    @property
    def frames(self) -> tuple[int, ...]:
        return self.frames_blank if self.best_blank >= self.best_token else self.frames_token


def _entries(beam: dict):
    """entry(prefix, lm, state, boost): the prefix's hypothesis in ``beam``, made (with that LM total, LM state
    and boosting state) by its first reach."""

    def entry(prefix: tuple[int, ...], lm_total: float, state: int | None, boost: int | None) -> _Prefix:
        if prefix not in beam:
            beam[prefix] = _Prefix(lm_total, state, boost)
        return beam[prefix]

    return entry


def ctc_prefix_beam_search_reference(
    log_probs: torch.Tensor,
    beam_size: int,
    blank: int = 0,
    lm=None,
    lm_weight: float = 0.0,
    token_insertion_bonus: float = 0.0,
    nbest: int = 1,
    prune_threshold: float | None = None,
    boosting=None,
) -> list[BeamHypothesis]:
    """The ``nbest`` best hypotheses of one utterance's log-probabilities [T, C] (any float dtype; computed in
    float64), best first. ``lm``: an ``NGramLM`` over the C classes but the blank's index (token c of the LM is
    class c, the blank's column unused) or None. ``prune_threshold``: at each frame only the classes within it of
    the frame's best log-probability extend a prefix or repeat its last token (None: all). ``boosting``: a
    ``PhraseBooster`` over the C classes or None; its bonuses count with the LM's terms."""
    lp = log_probs.detach().double().cpu()
    T, C = lp.shape
    lm_cache: dict[int, tuple[list[float], list[int]]] = {}

    def lm_step(state: int) -> tuple[list[float], list[int]]:
        if state not in lm_cache:
            scores, nxt = lm.score(torch.tensor([state]))
            lm_cache[state] = (scores[0].double().tolist(), nxt[0].tolist())
        return lm_cache[state]

    boost_cache: dict[int, tuple[list[float], list[int]]] = {}

    def boost_step(state: int) -> tuple[list[float], list[int]]:
        if state not in boost_cache:
            scores, nxt = boosting.step(torch.tensor([state]))
            boost_cache[state] = (scores[0].double().tolist(), nxt[0].tolist())
        return boost_cache[state]

    start = _Prefix(0.0, lm.start if lm is not None else None, boosting.start if boosting is not None else None)
    start.p_blank, start.best_blank = 0.0, 0.0
    beam: dict[tuple[int, ...], _Prefix] = {(): start}
    for t in range(T):
        row = lp[t].tolist()
        top = max(row)
        classes = [c for c in range(C) if c != blank and (prune_threshold is None or row[c] >= top - prune_threshold)]
        nxt: dict[tuple[int, ...], _Prefix] = {}
        entry = _entries(nxt)
        for prefix, h in beam.items():
            total, best = h.acoustic, max(h.best_blank, h.best_token)
            # the blank: the prefix stays
            entry(prefix, h.lm, h.state, h.boost).add_blank(total + row[blank], best + row[blank], h.frames)
            last = prefix[-1] if prefix else None
            for c in classes:
                if c == last:  # a repeat of the last token merges into it; after a blank it is a new token
                    stay = entry(prefix, h.lm, h.state, h.boost)
                    stay.add_token(h.p_token + row[c], h.best_token + row[c], h.frames_token)
                    p_new, b_new = h.p_blank + row[c], h.best_blank + row[c]
                    frames = h.frames_blank + (t,)
                else:
                    p_new, b_new = total + row[c], best + row[c]
                    frames = h.frames + (t,)
                if p_new == NEG:
                    continue
                lm_total, state, boost = h.lm + token_insertion_bonus, h.state, h.boost
                if lm is not None:
                    scores, states = lm_step(h.state)
                    lm_total, state = lm_total + lm_weight * scores[c], states[c]
                if boosting is not None:
                    bonus, states = boost_step(h.boost)
                    lm_total, boost = lm_total + bonus[c], states[c]
                entry(prefix + (c,), lm_total, state, boost).add_token(p_new, b_new, frames)
        ranked = sorted(nxt.items(), key=lambda kv: -(kv[1].acoustic + kv[1].lm))  # stable: first reached first
        beam = dict(ranked[:beam_size])
    out = []
    for prefix, h in beam.items():
        lm_total = h.lm + (lm_weight * float(lm.end_scores(torch.tensor([h.state]))[0]) if lm is not None else 0.0)
        if boosting is not None:
            lm_total += float(boosting.end_scores(torch.tensor([h.boost]))[0])
        out.append(BeamHypothesis(prefix, h.frames, h.acoustic + lm_total, h.acoustic, lm_total))
    out.sort(key=lambda hyp: -hyp.score)  # stable: the beam's order
    return out[:nbest]


def _first_max(values: torch.Tensor, valid: torch.Tensor, order: torch.Tensor, k: int) -> torch.Tensor:
    """Per row, the indices of the k best valid candidates by value, ties to the smaller ``order``; invalid ones
    after every valid one (rows [R, M] -> [R, k])."""
    idx = torch.argsort(order, dim=1)
    idx = idx.gather(1, torch.argsort(values.gather(1, idx), dim=1, descending=True, stable=True))
    idx = idx.gather(1, torch.argsort((~valid).gather(1, idx).to(torch.int8), dim=1, stable=True))
    return idx[:, :k]


def ctc_beam_search_reference(
    log_probs: torch.Tensor,
    lengths: torch.Tensor,
    beam_size: int,
    blank: int = 0,
    lm=None,
    lm_weight: float = 0.0,
    token_insertion_bonus: float = 0.0,
    nbest: int = 1,
    prune_threshold: float | None = None,
    boosting=None,
) -> BeamHypotheses:
    """CTC prefix beam search of a batch in PyTorch operations (the CPU path, and in float64 the batched searches'
    oracle): ``ctc_prefix_beam_search_reference``'s hypotheses, scores, frames and order of ties for every
    utterance at once. log_probs [N, T, C] (computed in float64 for float64 input, else float32), lengths [N]
    (clamped to [0, T]).

    Each frame turns the beam's K prefixes into K stays (the blank, or a repeat of the last token) and K x C
    extensions; an extension that reaches a prefix already in the beam (a prefix's child by its last token) is
    merged into that prefix's stay; the K best survive, ranked by score, ties to the candidate reached first."""
    N, T, C = log_probs.shape
    dev = log_probs.device
    dt = torch.float64 if log_probs.dtype == torch.float64 else torch.float32
    K, i64 = beam_size, torch.int64
    neg = torch.tensor(NEG, dtype=dt, device=dev)
    lens = lengths.to(dev, i64).clamp(0, T)
    tok = torch.full((N, K, T), -1, dtype=i64, device=dev)
    f_blank, f_token = tok.clone(), tok.clone()  # frames of each prefix's most likely alignment of each kind
    ln = torch.zeros(N, K, dtype=i64, device=dev)
    p_blank = torch.full((N, K), NEG, dtype=dt, device=dev)
    p_blank[:, 0] = 0.0
    b_blank, p_token, b_token = p_blank.clone(), p_blank.clone().fill_(NEG), p_blank.clone().fill_(NEG)
    lm_total = torch.zeros(N, K, dtype=dt, device=dev)
    state = torch.full((N, K), lm.start if lm is not None else 0, dtype=i64, device=dev)
    boost = torch.full((N, K), boosting.start if boosting is not None else 0, dtype=i64, device=dev)
    alive = torch.zeros(N, K, dtype=torch.bool, device=dev)
    alive[:, 0] = True
    o_k, o_c = torch.arange(K, device=dev), torch.arange(C, device=dev)
    rows = torch.arange(N, device=dev)[:, None]
    for t in range(T):
        live = t < lens
        if not bool(live.any()):
            break
        lp = log_probs[:, t].to(dt)
        total, best = torch.logaddexp(p_blank, p_token), torch.maximum(b_blank, b_token)
        f_best = torch.where((b_blank >= b_token)[..., None], f_blank, f_token)
        last = torch.where(ln > 0, tok.gather(2, (ln - 1).clamp(min=0)[..., None])[..., 0], -1)
        allowed = (o_c != blank).expand(N, C)
        if prune_threshold is not None:  # the classes near the frame's best extend a prefix or repeat its last
            allowed = allowed & (lp >= lp.max(1, keepdim=True).values - prune_threshold)
        lp_last = torch.where(allowed.gather(1, last.clamp(min=0)) & (last >= 0), lp.gather(1, last.clamp(min=0)), neg)
        # the stays: the blank (from every alignment) and a repeat of the last token (from those ending in it)
        s_pb, s_bb = total + lp[:, blank, None], best + lp[:, blank, None]
        s_pt, s_bt, s_ft = p_token + lp_last, b_token + lp_last, f_token.clone()
        # the extensions by class c: after a blank only where c is the last token
        again = o_c == last[..., None]
        e_p = torch.where(again, p_blank[..., None], total[..., None]) + lp[:, None, :]
        e_b = torch.where(again, b_blank[..., None], best[..., None]) + lp[:, None, :]
        valid = alive[..., None] & allowed[:, None, :] & (e_p > NEG)
        if lm is not None:
            scores, nxt = lm.score(state.reshape(-1))
            e_lm = lm_total[..., None] + token_insertion_bonus + lm_weight * scores.to(dt).view(N, K, C)
            e_state = nxt.view(N, K, C)
        else:
            e_lm = (lm_total + token_insertion_bonus)[..., None].expand(N, K, C)
            e_state = state[..., None].expand(N, K, C)
        if boosting is not None:
            bonus, b_nxt = boosting.step(boost.reshape(-1))
            e_lm = e_lm + bonus.to(dt).view(N, K, C)
            e_boost = b_nxt.view(N, K, C)
        else:
            e_boost = boost[..., None].expand(N, K, C)
        # prefix k2 is prefix k1's child by its last token: merge that extension into k2's stay
        S = int(ln.max()) + 1
        pos = torch.arange(S, device=dev)
        same = (tok[:, :, None, :S] == tok[:, None, :, :S]) | (pos >= ln[:, None, :, None])
        child = same.all(3) & (ln[:, :, None] == ln[:, None, :] + 1) & alive[:, :, None] & alive[:, None, :]
        has_parent = child.any(2)
        parent = child.to(torch.int8).argmax(2)
        c_last = last.clamp(min=0)
        m_valid = has_parent & valid[rows, parent, c_last]
        m_p = torch.where(m_valid, e_p[rows, parent, c_last], neg)
        m_b = torch.where(m_valid, e_b[rows, parent, c_last], neg)
        p_last = torch.where(
            ln.gather(1, parent) > 0,
            tok.gather(1, parent[..., None].expand(N, K, T)).gather(
                2, (ln.gather(1, parent) - 1).clamp(min=0)[..., None]
            )[..., 0],
            -1,
        )
        m_src = torch.where((p_last == last)[..., None], f_blank.gather(1, parent[..., None].expand(N, K, T)),
                            f_best.gather(1, parent[..., None].expand(N, K, T)))  # fmt: skip
        m_f = m_src.scatter(2, ln.gather(1, parent)[..., None], t)
        first = (m_b > s_bt) | ((m_b == s_bt) & (parent < o_k))  # the extension reached the prefix first
        take = m_valid & first
        s_pt = torch.logaddexp(s_pt, m_p)
        s_ft = torch.where(take[..., None], m_f, s_ft)
        s_bt = torch.where(take, m_b, s_bt)
        n_m, k_m = m_valid.nonzero(as_tuple=True)  # (a row's slots without a parent point at slot 0: no write)
        valid[n_m, parent[n_m, k_m], c_last[n_m, k_m]] = False
        # rank the K stays and K x C extensions; the order of reach: (parent, -1 for the stay, else the class)
        order_stay = o_k * (C + 1)
        order_stay = torch.where(m_valid, torch.minimum(order_stay, parent * (C + 1) + 1 + c_last), order_stay)
        order_ext = (o_k[:, None] * (C + 1) + 1 + o_c[None, :]).expand(N, K, C)
        cand = torch.cat([torch.logaddexp(s_pb, s_pt) + lm_total, (e_p + e_lm).reshape(N, K * C)], 1)
        cand_valid = torch.cat([alive, valid.reshape(N, K * C)], 1)
        order = torch.cat([order_stay, order_ext.reshape(N, K * C)], 1)
        pick = _first_max(torch.where(cand_valid, cand, neg), cand_valid, order, K)
        n_valid = cand_valid.sum(1, keepdim=True)
        ext = pick >= K
        src = torch.where(ext, (pick - K) // C, pick)
        cls = torch.where(ext, (pick - K) % C, 0)
        # the survivors' state
        gather3 = src[..., None].expand(N, K, T)
        new_ln = ln.gather(1, src)
        new_tok = tok.gather(1, gather3)
        new_tok = torch.where(ext[..., None] & (torch.arange(T, device=dev) == new_ln[..., None]), cls[..., None],
                              new_tok)  # fmt: skip
        e_src_f = torch.where((last.gather(1, src) == cls)[..., None], f_blank.gather(1, gather3),
                              f_best.gather(1, gather3))  # fmt: skip
        e_f = e_src_f.scatter(2, new_ln[..., None], t)
        new = dict(
            tok=new_tok,
            ln=new_ln + ext.to(i64),
            p_blank=torch.where(ext, neg, s_pb.gather(1, src)),
            b_blank=torch.where(ext, neg, s_bb.gather(1, src)),
            f_blank=torch.where(ext[..., None], -1, f_best.gather(1, gather3)),
            p_token=torch.where(ext, e_p.reshape(N, -1).gather(1, src * C + cls), s_pt.gather(1, src)),
            b_token=torch.where(ext, e_b.reshape(N, -1).gather(1, src * C + cls), s_bt.gather(1, src)),
            f_token=torch.where(ext[..., None], e_f, s_ft.gather(1, gather3)),
            lm_total=torch.where(ext, e_lm.reshape(N, -1).gather(1, src * C + cls), lm_total.gather(1, src)),
            state=torch.where(ext, e_state.reshape(N, -1).gather(1, src * C + cls), state.gather(1, src)),
            boost=torch.where(ext, e_boost.reshape(N, -1).gather(1, src * C + cls), boost.gather(1, src)),
            alive=o_k[None, :] < n_valid,
        )
        keep = live[:, None]
        tok = torch.where(keep[..., None], new["tok"], tok)
        ln = torch.where(keep, new["ln"], ln)
        p_blank = torch.where(keep, new["p_blank"], p_blank)
        b_blank = torch.where(keep, new["b_blank"], b_blank)
        f_blank = torch.where(keep[..., None], new["f_blank"], f_blank)
        p_token = torch.where(keep, new["p_token"], p_token)
        b_token = torch.where(keep, new["b_token"], b_token)
        f_token = torch.where(keep[..., None], new["f_token"], f_token)
        lm_total = torch.where(keep, new["lm_total"], lm_total)
        state = torch.where(keep, new["state"], state)
        boost = torch.where(keep, new["boost"], boost)
        alive = torch.where(keep, new["alive"], alive)
    # the end: the LM's </s>, the N-best in the beam's order of ties
    acoustic = torch.logaddexp(p_blank, p_token)
    lm_final = lm_total + (lm_weight * lm.end_scores(state.reshape(-1)).to(dt).view(N, K) if lm is not None else 0.0)
    if boosting is not None:
        lm_final = lm_final + boosting.end_scores(boost.reshape(-1)).to(dt).view(N, K)
    score = torch.where(alive, acoustic + lm_final, neg)
    B = nbest  # at most K
    pick = _first_max(score, alive, o_k.expand(N, K), B)
    ok = alive.gather(1, pick)
    frames = torch.where((b_blank >= b_token)[..., None], f_blank, f_token)
    g3 = pick[..., None].expand(N, B, T)
    out = BeamHypotheses(
        tokens=torch.where(ok[..., None], tok.gather(1, g3), -1),
        lengths=torch.where(ok, ln.gather(1, pick), 0),
        frames=torch.where(ok[..., None], frames.gather(1, g3), -1),
        scores=torch.where(ok, score.gather(1, pick), neg),
        acoustic=torch.where(ok, acoustic.gather(1, pick), neg),
        lm_scores=torch.where(ok, lm_final.gather(1, pick), neg),
    )
    return out
