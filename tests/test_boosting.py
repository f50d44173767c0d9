"""PhraseBooster's automaton against a brute force over the token sequence read so far: the bonus summed along
a sequence is the full bonus of every phrase occurrence in it plus the provisional bonus of its longest suffix
that begins a phrase; ``end_scores`` takes the provisional part back."""

from __future__ import annotations

import pytest
import torch

from speechkernels.decode.boosting import PhraseBooster


def prefix_score(tokens: tuple, phrases: list, weights: list) -> float:
    """Each token of a phrase prefix earns the largest weight of the phrases that begin with the prefix so far."""
    return sum(max(w for p, w in zip(phrases, weights, strict=True) if p[: j + 1] == tokens[: j + 1]) for j in
               range(len(tokens)))  # fmt: skip


def brute_force(seq: list, phrases: list, weights: list) -> tuple[float, float]:
    """(the bonus of seq read so far, its provisional part)."""
    starts = {p[:j] for p in phrases for j in range(1, len(p) + 1)}
    full = 0.0
    for i in range(len(seq)):
        for p in set(phrases):
            if len(p) <= i + 1 and tuple(seq[i + 1 - len(p) : i + 1]) == p:
                full += prefix_score(p, phrases, weights)
    pending = 0.0
    for k in range(len(seq), 0, -1):  # the longest suffix that begins a phrase
        if tuple(seq[len(seq) - k :]) in starts:
            pending = prefix_score(tuple(seq[len(seq) - k :]), phrases, weights)
            break
    return full + pending, pending


@pytest.mark.parametrize("seed", range(8))
def test_bonus_along_random_sequences_is_the_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    V = 3 + seed % 3
    phrases = [tuple(torch.randint(0, V, (int(torch.randint(1, 5, (1,), generator=g)),), generator=g).tolist())
               for _ in range(1 + seed % 5)]  # fmt: skip
    weights = [0.5 + float(torch.rand((), generator=g)) for _ in phrases]
    booster = PhraseBooster(phrases, V, weights)
    for _ in range(6):
        seq = torch.randint(0, V, (12,), generator=g).tolist()
        state, total = torch.tensor([booster.start]), 0.0
        for i, t in enumerate(seq):
            bonus, nxt = booster.step(state)
            total += float(bonus[0, t])
            state = nxt[:, t]
            want, pending = brute_force(seq[: i + 1], phrases, weights)
            assert total == pytest.approx(want, abs=1e-5), (phrases, seq[: i + 1])
            assert float(booster.end_scores(state)[0]) == pytest.approx(-pending, abs=1e-5)


def test_a_phrase_is_paid_one_token_at_a_time():
    """No token earns more than its own bonus before the phrase completes; the completion keeps the whole."""
    booster = PhraseBooster([[1, 2, 3]], 5, 2.0)
    state, got = torch.tensor([0]), []
    for t in (1, 2, 4):
        bonus, nxt = booster.step(state)
        got.append(float(bonus[0, t]))
        state = nxt[:, t]
    assert got == [2.0, 2.0, -4.0]
    state, got = torch.tensor([0]), 0.0
    for t in (1, 2, 3, 0):
        bonus, nxt = booster.step(state)
        got += float(bonus[0, t])
        state = nxt[:, t]
    assert got == 6.0


@pytest.mark.parametrize(
    "phrases, weights, match",
    [
        ([[1], []], 1.0, r"phrases\[1\] is empty"),
        ([[1, 7]], 1.0, r"phrases\[0\]\[1\]=7 is outside \[0, vocab_size=5\)"),
        ([[1]], 0.0, r"weights\[0\]=0.0 must be positive"),
        ([[1]], [1.0, 2.0], "weights has 2 values for 1 phrases"),
    ],
)
def test_bad_phrases(phrases, weights, match):
    with pytest.raises(ValueError, match=match):
        PhraseBooster(phrases, 5, weights)


def test_bad_vocabulary():
    with pytest.raises(ValueError, match="vocab_size must be at least 1, got 0"):
        PhraseBooster([[0]], 0)


def test_bad_states():
    booster = PhraseBooster([[1, 2]], 4)
    with pytest.raises(ValueError, match=r"states\[1\]=3 is outside \[0, num_states=3\)"):
        booster.step(torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="states must be an integer tensor"):
        booster.end_scores(torch.tensor([0.0]))
