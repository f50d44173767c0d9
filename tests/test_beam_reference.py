"""The CTC prefix beam search's oracle (speechkernels.decode.beam_reference) against a brute force over every
alignment of short utterances, with and without an n-gram LM."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from test_ngram import random_arpa

from speechkernels.decode.beam_reference import ctc_prefix_beam_search_reference
from speechkernels.decode.boosting import PhraseBooster
from speechkernels.decode.ngram import NGramLM


def brute_force(lp: torch.Tensor, blank: int, lm=None, lm_weight=0.0, bonus=0.0, booster=None) -> dict:
    """Every label sequence of the alignments of lp [T, C]: (score, acoustic log-sum, frames of its most likely
    alignment), the score adding the LM's weighted log-probability (</s> included) and the bonus per token."""
    T, C = lp.shape
    sums: dict[tuple, float] = {}
    best: dict[tuple, tuple[float, tuple]] = {}
    for path in itertools.product(range(C), repeat=T):
        logp = sum(float(lp[t, c]) for t, c in enumerate(path))
        tokens, frames, prev = [], [], blank
        for t, c in enumerate(path):
            if c != blank and c != prev:
                tokens.append(c)
                frames.append(t)
            prev = c
        key = tuple(tokens)
        sums[key] = logp if key not in sums else max(sums[key], logp) + math.log1p(math.exp(-abs(sums[key] - logp)))
        if key not in best or logp > best[key][0]:
            best[key] = (logp, tuple(frames))
    out = {}
    for key, acoustic in sums.items():
        extra = bonus * len(key)
        if lm is not None:
            state = torch.tensor([lm.start])
            for c in key:
                scores, nxt = lm.score(state)
                extra += lm_weight * float(scores[0, c])
                state = nxt[:, c]
            extra += lm_weight * float(lm.end_scores(state)[0])
        if booster is not None:
            state = torch.tensor([booster.start])
            for c in key:
                gain, nxt = booster.step(state)
                extra += float(gain[0, c])
                state = nxt[:, c]
            extra += float(booster.end_scores(state)[0])
        out[key] = (acoustic + extra, acoustic, best[key][1])
    return out


@pytest.mark.parametrize("T, C, blank", [(1, 3, 0), (4, 3, 0), (5, 3, 2), (4, 4, 1)])
@pytest.mark.parametrize("with_lm", [False, True])
def test_an_unpruned_beam_is_the_brute_force(tmp_path, T, C, blank, with_lm):
    """A beam wide enough to keep every prefix: every label sequence's score (acoustic log-sum over its
    alignments, plus the LM and the bonus), the order of the N-best and each token's frame on the most likely
    alignment, as the brute force over all C^T alignments gives them."""
    g = torch.Generator().manual_seed(T * 10 + C + blank)
    lp = torch.randn(T, C, generator=g, dtype=torch.float64).mul(2).log_softmax(-1)
    lm, weight, bonus, booster = None, 0.0, 0.0, None
    if with_lm:
        random_arpa(tmp_path / "lm.arpa", C, 3, seed=T)
        lm, weight, bonus = NGramLM.from_arpa(tmp_path / "lm.arpa", C), 0.7, 0.3
        labels = [c for c in range(C) if c != blank]
        booster = PhraseBooster([labels[:2], labels[-1:], labels[:1] * 2], C, [0.8, 0.5, 1.1])
    want = brute_force(lp, blank, lm, weight, bonus, booster)
    got = ctc_prefix_beam_search_reference(
        lp,
        beam_size=10**6,
        blank=blank,
        lm=lm,
        lm_weight=weight,
        token_insertion_bonus=bonus,
        nbest=10**6,
        boosting=booster,
    )
    assert sorted(h.tokens for h in got) == sorted(want)
    for h in got:
        score, acoustic, frames = want[h.tokens]
        assert math.isclose(h.acoustic, acoustic, rel_tol=1e-9, abs_tol=1e-9), h.tokens
        assert math.isclose(h.score, score, rel_tol=1e-5, abs_tol=1e-5), h.tokens  # the LM's tables are float32
        assert h.frames == frames, h.tokens
    assert [h.tokens for h in got] == [k for k, _ in sorted(want.items(), key=lambda kv: (-kv[1][0], kv[0]))]


def test_a_narrow_beam_keeps_the_best_prefixes():
    """Beam 2 on a longer utterance: the results are among the brute force's sequences with their exact scores
    where no alignment of theirs was pruned away, best first, nbest of them; pruning by a threshold no class
    reaches changes nothing."""
    g = torch.Generator().manual_seed(3)
    lp = torch.randn(6, 3, generator=g, dtype=torch.float64).mul(3).log_softmax(-1)
    want = brute_force(lp, 0)
    got = ctc_prefix_beam_search_reference(lp, beam_size=2, nbest=2)
    assert len(got) == 2 and got[0].score >= got[1].score
    for h in got:
        assert h.tokens in want and h.acoustic <= want[h.tokens][1] + 1e-12  # a pruned prefix loses alignments
    assert got == ctc_prefix_beam_search_reference(lp, beam_size=2, nbest=2, prune_threshold=1e9)
    best = max(want.items(), key=lambda kv: kv[1][0])
    assert got[0].tokens == best[0]  # here the beam keeps the best sequence's alignments
