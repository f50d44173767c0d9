"""CTC prefix beam search in plain Python over float64 values, one utterance at a time: the oracle of the batched
beam searches (readable first; a batch of a few utterances of tens of frames is what it is for).

Each hypothesis is a prefix (the tokens so far) with two acoustic log-probabilities, of its alignments ending in a
blank and in its last token. A frame extends every prefix by the blank (stays), by its last token (stays: a
repeat merges), and by every other token, or by its last token again after a blank (a new token); alignments that
reach the same prefix add up (prefix merging). A new token adds ``lm_weight`` times its LM log-probability from the
prefix's LM state and ``token_insertion_bonus``. Each frame keeps the ``beam_size`` best prefixes by total score
(acoustic log-sum plus the LM and bonus terms), ties to the smaller token sequence. At the end the LM's ``</s>``
term is added and the ``nbest`` best are returned.

Frames: each token's frame on the prefix's most likely alignment (the maximum, not the sum, tracked beside the
sums; where two alignments of a prefix are equally likely, the one the prefix already had).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

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
    __slots__ = ("p_blank", "p_token", "best_blank", "best_token", "frames_blank", "frames_token", "lm", "state")

    def __init__(self, lm: float, state: int | None) -> None:
        self.p_blank = self.p_token = NEG  # log-sums of the alignments ending in a blank / in the last token
        self.best_blank = self.best_token = NEG  # the most likely alignment of each kind
        self.frames_blank: tuple[int, ...] = ()
        self.frames_token: tuple[int, ...] = ()
        self.lm, self.state = lm, state

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
    """entry(prefix, lm, state): the prefix's hypothesis in ``beam``, made (with that LM total and state) by its
    first reach."""

    def entry(prefix: tuple[int, ...], lm_total: float, state: int | None) -> _Prefix:
        if prefix not in beam:
            beam[prefix] = _Prefix(lm_total, state)
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
) -> list[BeamHypothesis]:
    """The ``nbest`` best hypotheses of one utterance's log-probabilities [T, C] (any float dtype; computed in
    float64), best first. ``lm``: an ``NGramLM`` over the C classes but the blank's index (token c of the LM is
    class c, the blank's column unused) or None. ``prune_threshold``: at each frame only the classes within it of
    the frame's best log-probability extend a prefix (None: all)."""
    lp = log_probs.detach().double().cpu()
    T, C = lp.shape
    lm_cache: dict[int, tuple[list[float], list[int]]] = {}

    def lm_step(state: int) -> tuple[list[float], list[int]]:
        if state not in lm_cache:
            scores, nxt = lm.score(torch.tensor([state]))
            lm_cache[state] = (scores[0].double().tolist(), nxt[0].tolist())
        return lm_cache[state]

    start = _Prefix(0.0, lm.start if lm is not None else None)
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
            entry(prefix, h.lm, h.state).add_blank(total + row[blank], best + row[blank], h.frames)
            last = prefix[-1] if prefix else None
            for c in classes:
                if c == last:  # a repeat of the last token merges into it; after a blank it is a new token
                    entry(prefix, h.lm, h.state).add_token(h.p_token + row[c], h.best_token + row[c], h.frames_token)
                    p_new, b_new = h.p_blank + row[c], h.best_blank + row[c]
                    frames = h.frames_blank + (t,)
                else:
                    p_new, b_new = total + row[c], best + row[c]
                    frames = h.frames + (t,)
                if p_new == NEG:
                    continue
                lm_total, state = h.lm + token_insertion_bonus, h.state
                if lm is not None:
                    scores, states = lm_step(h.state)
                    lm_total, state = lm_total + lm_weight * scores[c], states[c]
                entry(prefix + (c,), lm_total, state).add_token(p_new, b_new, frames)
        ranked = sorted(nxt.items(), key=lambda kv: (-(kv[1].acoustic + kv[1].lm), kv[0]))
        beam = dict(ranked[:beam_size])
    out = []
    for prefix, h in beam.items():
        lm_total = h.lm + (lm_weight * float(lm.end_scores(torch.tensor([h.state]))[0]) if lm is not None else 0.0)
        out.append(BeamHypothesis(prefix, h.frames, h.acoustic + lm_total, h.acoustic, lm_total))
    out.sort(key=lambda hyp: (-hyp.score, hyp.tokens))
    return out[:nbest]
