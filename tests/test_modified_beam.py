"""TransducerDecoder.beam_search(algorithm="modified"), icefall's modified_beam_search batched in PyTorch, against
the algorithm as icefall writes it (one utterance at a time, a dict of hypotheses keyed by their tokens, each
frame's top-K over all (hypothesis, output) pairs, merges by log-add into the first added), in plain Python over
float64 networks; beam 1 is greedy decoding at one symbol per frame."""

from __future__ import annotations

import math

import pytest
import torch
from test_decode_transducer import make_decoder
from test_ngram import random_arpa
from test_transducer_beam import prefix_logits

from speechkernels.decode.boosting import PhraseBooster
from speechkernels.decode.ngram import NGramLM


@torch.no_grad()
def icefall_modified(dec, x, L: int, K: int, lm=None, a=0.0, booster=None, b=0.0, norm=True):
    """[(tokens, frames, score)] of one utterance's hypotheses, best first (icefall's get_most_probable with its
    length norm: score / (context_size + tokens)); ties between equal proposals go to the earlier hypothesis,
    then the lower class."""
    blank = dec.blank
    joint_logits = prefix_logits(dec, x)

    # tokens -> [score, frames, lm state, boosting state] (insertion order: icefall's HypothesisList)
    hyps = {(): [0.0, (), lm.start if lm is not None else 0, 0]}
    for t in range(L):
        A = list(hyps.items())
        cands = []
        for i, (tokens, (score, _frames, ls, _bs)) in enumerate(A):
            lp = joint_logits(tokens, t).log_softmax(0).tolist()
            lm_row = lm.score(torch.tensor([ls]))[0][0].double().tolist() if lm is not None else None
            for v in range(len(lp)):
                s = score + lp[v] + (a * lm_row[v] if lm is not None and v != blank else 0.0)
                cands.append((-s, i, v))
        cands.sort()  # the best first; ties: the earlier hypothesis, then the lower class
        hyps = {}
        for neg, i, v in cands[:K]:
            tokens, (_, frames, ls, bs) = A[i]
            s = -neg
            if v != blank:
                if lm is not None:
                    ls = int(lm.score(torch.tensor([ls]))[1][0, v])
                if booster is not None:
                    bonus, nxt = booster.step(torch.tensor([bs]))
                    s += b * float(bonus[0, v])
                    bs = int(nxt[0, v])
                tokens, frames = tokens + (v,), frames + (t,)
            if tokens in hyps:
                hi, lo = max(hyps[tokens][0], s), min(hyps[tokens][0], s)
                hyps[tokens][0] = hi + math.log1p(math.exp(lo - hi))
            else:
                hyps[tokens] = [s, frames, ls, bs]
    out = []
    for tokens, (score, frames, _, bs) in hyps.items():
        if booster is not None:
            score += b * float(booster.end_scores(torch.tensor([bs]))[0])
        out.append((tokens, frames, score))
    cs = dec.context_size
    out.sort(key=lambda h: -(h[2] / (cs + len(h[0])) if norm else h[2]))  # stable: insertion order
    return out


@pytest.mark.parametrize("stateless", [0, 2])
@pytest.mark.parametrize("seed", range(3))
def test_beam_one_is_greedy_at_one_symbol_per_frame(stateless, seed):
    dec = make_decoder(seed, stateless=stateless, max_symbols=1, blank_bias=0.3 * seed).double()
    x = torch.randn(3, 9, 6, dtype=torch.float64)
    lengths = [9, 4, 0]
    want, _ = dec.greedy(x, lengths)
    got = dec.beam_search(x, lengths, 1, algorithm="modified")
    for n in range(3):
        L = int(want.lengths[n])
        assert int(got.lengths[n, 0]) == L
        assert got.tokens[n, 0, :L].tolist() == want.tokens[n, :L].tolist()
        assert got.frames[n, 0, :L].tolist() == want.frames[n, :L].tolist()


@pytest.mark.parametrize("fusion", ["none", "lm", "boost", "both"])
@pytest.mark.parametrize("stateless", [0, 3])
@pytest.mark.parametrize("seed", range(3))
def test_the_batch_is_icefalls_algorithm(tmp_path, fusion, stateless, seed):
    """Ragged batches, beams 2 to 4, nbest up to the beam, with and without the length norm: every utterance's
    N-best tokens, frames and scores (1e-9) as the one-utterance algorithm's."""
    V = 7
    dec = make_decoder(seed, stateless=stateless, blank=0 if stateless else None, blank_bias=0.5).double()
    g = torch.Generator().manual_seed(seed)
    K = 2 + seed % 3
    x = torch.randn(3, 8, 6, generator=g, dtype=torch.float64)
    lengths = [8, 5, 1 + seed]
    kw, oracle = {}, {}
    if fusion in ("lm", "both"):
        random_arpa(tmp_path / "lm.arpa", V, 3, seed=seed)
        lm = NGramLM.from_arpa(tmp_path / "lm.arpa", V)
        kw.update(lm=lm, lm_weight=0.4)
        oracle.update(lm=lm, a=0.4)
    if fusion in ("boost", "both"):
        booster = PhraseBooster([[1, 2], [2, 3, 1], [4]], V, [1.0, 2.0, 0.5])
        kw.update(boosting=booster, boosting_weight=0.7)
        oracle.update(booster=booster, b=0.7)
    norm = seed != 1
    got = dec.beam_search(x, lengths, K, nbest=K, score_norm=norm, algorithm="modified", **kw)
    for n, L in enumerate(lengths):
        want = icefall_modified(dec, x[n], L, K, norm=norm, **oracle)
        for b in range(K):
            n_tok = int(got.lengths[n, b])
            if b >= len(want):
                assert got.scores[n, b] == -math.inf and n_tok == 0
                continue
            tokens, frames, score = want[b]
            assert tuple(got.tokens[n, b, :n_tok].tolist()) == tokens, (n, b)
            assert tuple(got.frames[n, b, :n_tok].tolist()) == frames, (n, b)
            assert abs(float(got.scores[n, b]) - score) <= 1e-9 * max(1.0, abs(score)), (n, b)
            assert (got.tokens[n, b, n_tok:] == -1).all()


def test_refusals():
    tdt = make_decoder(1, durations=(0, 1, 2))
    with pytest.raises(ValueError, match="algorithm='modified'.*is for RNN-T"):
        tdt.beam_search(torch.randn(1, 3, 6), None, 2, algorithm="modified")
    with pytest.raises(ValueError, match="algorithm='greedy' must be 'malsd' or 'modified'"):
        make_decoder(1).beam_search(torch.randn(1, 3, 6), None, 2, algorithm="greedy")


@pytest.mark.gpu
def test_gpu_search_is_the_cpu_search(gpu, tmp_path):
    """The same search with the networks on the GPU (float64, an LM and boosting): the CPU's hypotheses."""
    dec = make_decoder(5, stateless=2, blank=0).double()
    random_arpa(tmp_path / "lm.arpa", 7, 3, seed=5)
    lm, booster = NGramLM.from_arpa(tmp_path / "lm.arpa", 7), PhraseBooster([[1, 2], [3]], 7, 1.0)
    x = torch.randn(3, 8, 6, dtype=torch.float64)
    kw = dict(nbest=3, algorithm="modified", lm_weight=0.3, boosting_weight=0.5)
    want = dec.beam_search(x, [8, 6, 3], 4, lm=lm, boosting=booster, **kw)
    got = dec.to(gpu).beam_search(x.to(gpu), [8, 6, 3], 4, lm=lm.to(gpu), boosting=booster.to(gpu), **kw)
    for a, b in zip(got, want, strict=True):
        if b is not None:
            assert a.device.type == "cuda"
            assert torch.allclose(a.cpu(), b, atol=1e-9) if b.dtype.is_floating_point else torch.equal(a.cpu(), b)


def test_views_search_as_copies():
    """Strided, transposed and offset encoder outputs and lengths as a list: the contiguous copy's hypotheses."""
    dec = make_decoder(4, stateless=2, blank=0)
    x = torch.randn(2, 7, 6)
    want = dec.beam_search(x, torch.tensor([7, 4]), 3, nbest=2, algorithm="modified")
    big = torch.zeros(7, 3, 12)
    view = big[:, 1:, ::2].transpose(0, 1)  # [2, 7, 6], offset, strided, transposed
    view.copy_(x)
    got = dec.beam_search(view, [7, 4], 3, nbest=2, algorithm="modified")
    for a, b in zip(got, want, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


@pytest.mark.parametrize("fusion", ["none", "lm", "boost", "both"])
@pytest.mark.parametrize("stateless", [0, 2])
def test_search_on_every_path(path, tmp_path, monkeypatch, fusion, stateless):
    """float32 networks on every path (the step kernel on the interpreter and the GPU): the float64 search's
    N-best tokens and frames, scores to 1e-4; ragged lengths, beams 3 and 4, the LSTM's fused cells on."""
    if path.kernels:
        from speechkernels.decode import transducer_beam_kernels

        monkeypatch.setattr(transducer_beam_kernels, "FUSED_CELL", True)
    V = 7
    seed = 3 + stateless
    dec = make_decoder(seed, stateless=stateless, blank=0 if stateless else None, blank_bias=0.5)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 8, 6, generator=g)
    lengths = [8, 5, 0]
    K = 3 + stateless % 2
    kw = dict(nbest=K, algorithm="modified")
    if fusion in ("lm", "both"):
        random_arpa(tmp_path / "lm.arpa", V, 3, seed=seed, drop=1)
        kw.update(lm=NGramLM.from_arpa(tmp_path / "lm.arpa", V), lm_weight=0.4)
    if fusion in ("boost", "both"):
        kw.update(boosting=PhraseBooster([[1, 2], [2, 3, 1], [4]], V, [1.0, 2.0, 0.5]), boosting_weight=0.7)
    want = dec.double().beam_search(x.double(), lengths, K, **kw)
    dev_kw = {k: v.to(path.device) if hasattr(v, "to") else v for k, v in kw.items()}
    got = dec.float().to(path.device).beam_search(x.to(path.device), lengths, K, **dev_kw)
    path.check_ran()
    for f in ("tokens", "lengths", "frames"):
        assert torch.equal(getattr(got, f).cpu(), getattr(want, f)), f
    assert got.durations is None
    for f in ("scores", "acoustic", "lm_scores"):
        a, b = getattr(got, f).cpu(), getattr(want, f)
        assert a.dtype == torch.float32 and torch.equal(a.isinf(), b.isinf()), f
        assert torch.allclose(a, b.float(), rtol=1e-4, atol=1e-4), (f, a, b)
