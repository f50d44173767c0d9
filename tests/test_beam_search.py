"""ctc_beam_search (the batched prefix beam search) against the one-utterance Python oracle
(speechkernels.decode.beam_reference.ctc_prefix_beam_search_reference), on the CPU and the GPU; views; refusals."""

from __future__ import annotations

import math

import pytest
import torch
from test_ngram import random_arpa

import speechkernels as sk
from speechkernels.decode.beam_reference import ctc_prefix_beam_search_reference
from speechkernels.decode.boosting import PhraseBooster
from speechkernels.decode.ngram import NGramLM


def case(seed: int, tmp_path, with_lm: bool):
    """A random batch: (log_probs [N, T, C] float64, lengths, settings), ragged lengths (a zero among them)."""
    g = torch.Generator().manual_seed(seed)
    N, T, C = 3, int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(2, 7, (1,), generator=g))
    K = int(torch.randint(1, 6, (1,), generator=g))
    kw = dict(
        beam_size=K,
        blank=int(torch.randint(0, C, (1,), generator=g)),
        nbest=int(torch.randint(1, K + 1, (1,), generator=g)),
        prune_threshold=2.0 if seed % 3 == 0 else None,
    )
    lp = (torch.randn(N, T, C, generator=g, dtype=torch.float64) * 2).log_softmax(-1)
    lengths = torch.randint(0, T + 1, (N,), generator=g)
    lengths[seed % N] = T
    if with_lm:
        random_arpa(tmp_path / "lm.arpa", C, 3, seed=seed)
        kw.update(lm=NGramLM.from_arpa(tmp_path / "lm.arpa", C), lm_weight=0.6, token_insertion_bonus=0.2)
        phrases = [torch.randint(0, C, (int(torch.randint(1, 4, (1,), generator=g)),), generator=g).tolist()
                   for _ in range(3)]  # fmt: skip
        kw.update(boosting=PhraseBooster(phrases, C, 1.5))
    return lp, lengths, kw


def on_cpu(hyp):
    return type(hyp)(*(None if v is None else v.cpu() for v in hyp))


def check_against_oracle(hyp, lp, lengths, kw, tol: float) -> None:
    """Every utterance's N-best as the oracle's: tokens, frames and order exactly, the scores to ``tol``; the
    slots the oracle has no hypothesis for empty (length 0, score -inf)."""
    settings = dict(kw)
    K = settings.pop("beam_size")
    for n in range(lp.shape[0]):
        ref = ctc_prefix_beam_search_reference(
            lp[n, : lengths[n]],
            K,
            settings.get("blank", 0),
            settings.get("lm"),
            settings.get("lm_weight", 0.0),
            settings.get("token_insertion_bonus", 0.0),
            settings.get("nbest", 1),
            settings.get("prune_threshold"),
            settings.get("boosting"),
        )
        for b in range(settings.get("nbest", 1)):
            L = int(hyp.lengths[n, b])
            if b >= len(ref):
                assert L == 0 and hyp.scores[n, b] == -math.inf, (n, b)
                continue
            h = ref[b]
            assert tuple(hyp.tokens[n, b, :L].tolist()) == h.tokens, (n, b)
            assert tuple(hyp.frames[n, b, :L].tolist()) == h.frames, (n, b)
            assert (hyp.tokens[n, b, L:] == -1).all() and (hyp.frames[n, b, L:] == -1).all()
            for got, want in ((hyp.scores, h.score), (hyp.acoustic, h.acoustic), (hyp.lm_scores, h.lm)):
                assert abs(float(got[n, b]) - want) <= tol * max(1.0, abs(want)), (n, b, float(got[n, b]), want)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("with_lm", [False, True])
def test_batched_search_is_the_python_oracle(tmp_path, seed, with_lm):
    """A batch of ragged utterances at once, in float64: the oracle's hypotheses, frames, scores and N-best order
    for each (beam 1 to 5, pruning, an LM and a bonus)."""
    lp, lengths, kw = case(seed, tmp_path, with_lm)
    hyp = sk.ctc_beam_search(lp, lengths, **kw)
    assert hyp.tokens.shape == (lp.shape[0], kw["nbest"], lp.shape[1]) and hyp.scores.dtype == torch.float64
    check_against_oracle(hyp, lp, lengths, kw, 1e-9)


@pytest.mark.parametrize("seed", [1, 4, 8])
def test_float32_search_matches_float64(tmp_path, seed):
    """float32 scores search in float32 (float32 scores out): the float64 oracle's hypotheses, scores to 1e-4."""
    lp, lengths, kw = case(seed, tmp_path, True)
    hyp = sk.ctc_beam_search(lp.float(), lengths, **kw)
    assert hyp.scores.dtype == torch.float32
    check_against_oracle(hyp, lp.float().double(), lengths, kw, 1e-4)


@pytest.mark.parametrize("seed", range(10))
def test_search_without_lm_on_every_path(path, tmp_path, seed):
    """float32 scores without an LM (the kernel's case on the interpreter and the GPU): the float64 oracle's
    hypotheses, frames and order, scores to 1e-4 (beam 1 to 5, pruning, bonuses, ragged batches)."""
    lp, lengths, kw = case(seed, tmp_path, False)
    kw["token_insertion_bonus"] = 0.25 * (seed % 3)
    hyp = sk.ctc_beam_search(lp.float().to(path.device), lengths, **kw)
    path.check_ran()
    assert hyp.tokens.device.type == path.device.type and hyp.scores.dtype == torch.float32
    check_against_oracle(on_cpu(hyp), lp.float().double(), lengths, kw, 1e-4)


@pytest.mark.parametrize("seed", range(8))
def test_search_with_lm_and_boosting_on_every_path(path, tmp_path, monkeypatch, seed):
    """float32 scores with a 3-gram LM (some tokens without a unigram, read as <unk>), an insertion bonus and
    boosted phrases (the kernel's overrides written a few arcs at a time): the float64 oracle's hypotheses,
    frames and order, scores to 1e-4."""
    if path.kernels:
        from speechkernels.decode import beam_kernels

        monkeypatch.setitem(beam_kernels.BEAM_TILES, "block_arcs", 2 if seed % 2 else 16)
    lp, lengths, kw = case(seed, tmp_path, True)
    C = lp.shape[2]
    random_arpa(tmp_path / "unk.arpa", C, 3, seed=seed, drop=seed % 2)
    kw["lm"] = NGramLM.from_arpa(tmp_path / "unk.arpa", C)
    g = torch.Generator().manual_seed(seed)
    phrases = [torch.randint(0, C, (int(torch.randint(1, 5, (1,), generator=g)),), generator=g).tolist()
               for _ in range(4)]  # fmt: skip
    kw["boosting"] = PhraseBooster(phrases, C, [0.5, 1.0, 1.5, 2.0])
    dev_kw = dict(kw, lm=kw["lm"].to(path.device), boosting=kw["boosting"].to(path.device))
    hyp = sk.ctc_beam_search(lp.float().to(path.device), lengths, **dev_kw)
    path.check_ran()
    assert hyp.tokens.device.type == path.device.type and hyp.scores.dtype == torch.float32
    check_against_oracle(on_cpu(hyp), lp.float().double(), lengths, kw, 1e-4)


@pytest.mark.parametrize("block", [16, 256])
@pytest.mark.parametrize("with_lm", [False, True])
def test_search_across_class_blocks(path, tmp_path, monkeypatch, block, with_lm):
    """More classes than a block (the kernel's running lists of the best across blocks) and wider beams, with
    and without an LM and boosting."""
    if path.kernels:
        from speechkernels.decode import beam_kernels

        monkeypatch.setitem(beam_kernels.BEAM_TILES, "block_c", block)
        monkeypatch.setitem(beam_kernels.BEAM_TILES, "wide", 8 if block == 16 else 32)  # both reads of the vectors
    g = torch.Generator().manual_seed(block)
    lp = (torch.randn(3, 12, 40, generator=g, dtype=torch.float64) * 3).log_softmax(-1)
    lengths = torch.tensor([12, 7, 10])
    kw = dict(beam_size=7, blank=3, nbest=4)
    dev_kw = dict(kw)
    if with_lm:
        random_arpa(tmp_path / "lm.arpa", 40, 4, seed=block)
        kw.update(lm=NGramLM.from_arpa(tmp_path / "lm.arpa", 40), lm_weight=0.5)
        kw["boosting"] = PhraseBooster([[5, 9, 5, 9], [9, 5], [30, 31, 32]], 40, 1.0)
        dev_kw = dict(kw, lm=kw["lm"].to(path.device), boosting=kw["boosting"].to(path.device))
    hyp = sk.ctc_beam_search(lp.float().to(path.device), lengths, **dev_kw)
    path.check_ran()
    check_against_oracle(on_cpu(hyp), lp.float().double(), lengths, kw, 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("seed", [0, 5])
def test_gpu_search_is_the_python_oracle(gpu, tmp_path, seed):
    lp, lengths, kw = case(seed, tmp_path, True)
    kw["lm"], kw["boosting"] = kw["lm"].to(gpu), kw["boosting"].to(gpu)
    hyp = sk.ctc_beam_search(lp.float().to(gpu), lengths.to(gpu), **kw)
    assert hyp.tokens.device.type == "cuda"
    kw["lm"], kw["boosting"] = kw["lm"].to("cpu"), kw["boosting"].to("cpu")
    check_against_oracle(on_cpu(hyp), lp.float().double(), lengths, kw, 1e-4)


def test_views_and_layouts(tmp_path):
    """Time-major, strided, offset and unbatched scores and lengths as a list decode as their contiguous copies."""
    lp, lengths, kw = case(2, tmp_path, True)
    want = sk.ctc_beam_search(lp, lengths, **kw)
    big = torch.zeros(lp.shape[1], lp.shape[0] + 1, lp.shape[2] * 2, dtype=lp.dtype)
    view = big[:, 1:, ::2]  # [T, N, C], offset and strided
    view.copy_(lp.transpose(0, 1))
    got = sk.ctc_beam_search(view, lengths.tolist(), batch_first=False, **kw)
    for a, b in zip(got, want, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)
    one = sk.ctc_beam_search(lp[0, : lengths[0]], None, **kw)
    assert torch.equal(one.tokens, want.tokens[0, :, : lengths[0]]) and torch.equal(one.scores, want.scores[0])


def test_an_empty_utterance_is_the_empty_hypothesis():
    hyp = sk.ctc_beam_search(torch.randn(2, 4, 3).log_softmax(-1), [0, 4], beam_size=3, nbest=2)
    assert hyp.lengths[0].tolist() == [0, 0] and hyp.scores[0, 0] == 0.0 and hyp.scores[0, 1] == -math.inf


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(beam_size=0), "beam_size"),
        (dict(beam_size=2.5), "beam_size"),
        (dict(beam_size=2, nbest=3), "nbest=3 is larger than beam_size=2"),
        (dict(beam_size=2, blank=5), r"blank=5 is outside \[0, C=5\)"),
        (dict(beam_size=2, lm_weight=math.inf), "lm_weight"),
        (dict(beam_size=2, token_insertion_bonus=math.nan), "token_insertion_bonus"),
        (dict(beam_size=2, prune_threshold=-1.0), "prune_threshold"),
        (dict(beam_size=2, lm="lm.arpa"), "lm must be an instance of NGramLM"),
        (dict(beam_size=2, boosting=[[1, 2]]), "boosting must be an instance of PhraseBooster"),
        (dict(beam_size=2, boosting=PhraseBooster([[1, 2]], 4)), "boosting has vocab_size=4 but log_probs has C=5"),
        (dict(beam_size=2, input_lengths=[4, 7]), "input_lengths"),
    ],
)
def test_bad_arguments(kw, match):
    kw = dict(kw)
    lengths = kw.pop("input_lengths", None)
    with pytest.raises(ValueError, match=match):
        sk.ctc_beam_search(torch.randn(2, 6, 5).log_softmax(-1), lengths, **kw)


def test_lm_of_another_vocabulary_is_refused(tmp_path):
    random_arpa(tmp_path / "lm.arpa", 4, 2, seed=0)
    lm = NGramLM.from_arpa(tmp_path / "lm.arpa", 4)
    with pytest.raises(ValueError, match="lm has vocab_size=4 but log_probs has C=5"):
        sk.ctc_beam_search(torch.randn(1, 3, 5).log_softmax(-1), None, 2, lm=lm)
