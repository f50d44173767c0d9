"""The transducer beam search's PyTorch path (speechkernels.decode.transducer_beam, NeMo's malsd_batch semantics):
beam 1 is greedy decoding; a beam wide enough to keep every hypothesis sums every alignment of each label sequence
(a brute force over the alignments of tiny models); the LM's fusion as written."""

from __future__ import annotations

import math
import random

import pytest
import torch
from helpers import count_calls
from test_decode_transducer import make_decoder
from test_ngram import random_arpa

from speechkernels.decode.boosting import PhraseBooster
from speechkernels.decode.networks import predict, start_state
from speechkernels.decode.ngram import NGramLM
from speechkernels.decode.transducer_beam import transducer_beam_search_reference


@torch.no_grad()
def search(dec, x, lengths, K, **kw):
    w = dec.weights()
    return transducer_beam_search_reference(
        w, x, torch.tensor(lengths), K, dec.blank, dec.durations, dec.max_symbols_per_frame, **kw
    )


@pytest.mark.parametrize("durations", [None, (0, 1, 2, 3)])
@pytest.mark.parametrize("seed", range(4))
def test_beam_one_is_greedy(durations, seed):
    """Beam 1: greedy decoding's tokens, frames and durations (max_symbols included where no forced blank's best
    duration is above 1: the next test)."""
    dec = make_decoder(seed, durations=durations, max_symbols=2, blank_bias=0.5 * seed).double()
    x = torch.randn(3, 9, 6, dtype=torch.float64)
    lengths = [9, 4, 0]
    want, _ = dec.greedy(x, lengths)
    got = search(dec, x, lengths, 1)
    for n in range(3):
        L = int(want.lengths[n])
        assert int(got.lengths[n, 0]) == L
        assert got.tokens[n, 0, :L].tolist() == want.tokens[n, :L].tolist()
        assert got.frames[n, 0, :L].tolist() == want.frames[n, :L].tolist()
        if durations:
            assert got.durations[n, 0, :L].tolist() == want.durations[n, :L].tolist()
        # the score: the sum of the path's log-probabilities (labels and blanks), here all labels' at least
        assert float(got.scores[n, 0]) <= float(want.scores[n, :L].sum()) + 1e-9


def test_beam_one_at_max_symbols_moves_as_malsd():
    """TDT beam 1 parts from greedy decoding at max_symbols alone: there greedy moves one frame, while malsd's slot
    proposes the blank with its best pair's duration (at least 1) and moves by it, as NeMo's malsd_batch does."""
    dec = make_decoder(10, V=6, durations=(0, 1, 2, 3), max_symbols=2, blank_bias=-1.0).double()
    with torch.no_grad():  # labels of duration 0 first, duration 2 close
        dec.out.bias[6] += 3.0
        dec.out.bias[8] += 2.9
    x = torch.randn(4, 12, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(10))
    want, _ = dec.greedy(x, [12, 12, 9, 5])
    got = search(dec, x, [12, 12, 9, 5], 1)
    for n in range(3):  # the others: greedy's
        L = int(want.lengths[n])
        assert got.tokens[n, 0, :L].tolist() == want.tokens[n, :L].tolist()
        assert got.frames[n, 0, :L].tolist() == want.frames[n, :L].tolist()
    # utterance 3: two labels at frame 0, then greedy moves to frame 1, malsd's forced blank by 2 to frame 2
    assert want.frames[3, :3].tolist() == [0, 0, 1]
    assert got.frames[3, 0, :3].tolist() == [0, 0, 2]


def prefix_logits(dec, x):
    """logits(tokens, t): the joint's outputs [V (+ D)] for the prediction network after ``tokens`` (a tuple) at
    frame t of one utterance's encoder outputs x [T, E], the prediction network's steps cached per prefix."""
    w = dec.weights()
    enc = torch.nn.functional.linear(x, w.enc_w, w.enc_b)
    act = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}[w.activation]
    st = start_state(w, 1, dec.blank, x.device)
    cache = {(): (st.output, st.predictor)}

    def pred(prefix):
        if prefix not in cache:
            cache[prefix] = predict(w, torch.tensor([prefix[-1]]), pred(prefix[:-1])[1])
        return cache[prefix]

    def logits(tokens: tuple, t: int) -> torch.Tensor:
        g = torch.nn.functional.linear(pred(tokens)[0], w.pred_w, w.pred_b)[0]
        return torch.nn.functional.linear(act(enc[t] + g), w.out_w, w.out_b)

    return logits


@torch.no_grad()
def exhaustive(dec, x, L: int, lm=None, a=0.0, booster=None, b=0.0) -> dict:
    """The search without a beam, step by step in plain Python: every hypothesis advances by one symbol (a label
    stays at its frame or moves by its duration; a blank moves by one or its duration, at least 1; after
    max_symbols labels at a frame only the blank, TDT with the best duration's log-probability, moving by the best
    (output, duration) pair's duration, at least 1; a finished one stays), then hypotheses with the same tokens
    (TDT: at the same frame) merge into the most likely, which keeps its frame and count, with the log-sum of
    their scores; an LM and a booster fused as the module describes. Returns {(tokens, frame): score} at the end."""
    blank, durs, ms = dec.blank, dec.durations, dec.max_symbols_per_frame
    D = len(durs) if durs else 0
    V = dec.out.out_features - D
    joint_logits = prefix_logits(dec, x)

    hyps = [((), 0, 0, 0.0)]  # tokens, frame, labels at the frame, score
    while any(t < L for _, t, _, _ in hyps):
        nxt = []
        for tokens, t, at, score in hyps:
            if t >= L:
                nxt.append((tokens, t, at, score))
                continue
            logits = joint_logits(tokens, t)
            lp = logits[:V].log_softmax(0)
            if lm is not None or booster is not None:
                fused = lp + (a + b) * torch.log1p(-lp[blank].exp().clamp(max=0.99))
                for table, weight in ((lm, a), (booster, b)):
                    if table is not None:
                        state = torch.tensor([table.start])
                        for c in tokens:
                            state = (table.score if table is lm else table.step)(state)[1][:, c]
                        fused = fused + weight * (table.score if table is lm else table.step)(state)[0][0].double()
                fused[blank] = (1 + a + b) * lp[blank]
                lp = fused
            lp = lp.tolist()
            dlp = logits[V:].log_softmax(0).tolist() if D else [0.0]
            step = [max(d, 1) for d in durs] if D else [1]
            if at >= ms:
                pairs = [lp[v] + dlp[d] for v in range(V) for d in range(len(dlp))]
                d_best = max(range(len(pairs)), key=lambda i: (pairs[i], -i)) % len(dlp)
                nxt.append((tokens, t + step[d_best], 0, score + lp[blank] + max(dlp)))
                continue
            for v in range(V):
                for d in range(len(dlp)):
                    if v == blank:
                        nxt.append((tokens, t + step[d], 0, score + lp[v] + dlp[d]))
                    else:
                        move = durs[d] if D else 0
                        nxt.append((tokens + (v,), t + move, 0 if move else at + 1, score + lp[v] + dlp[d]))
        groups: dict = {}
        for h in nxt:
            groups.setdefault((h[0], h[1]) if D else h[0], []).append(h)
        hyps = []
        for group in groups.values():
            best = max(group, key=lambda h: h[3])
            total = max(h[3] for h in group)
            total += math.log(sum(math.exp(h[3] - total) for h in group))
            hyps.append((best[0], best[1], best[2], total))
    return {(tokens, t): score for tokens, t, _, score in hyps}


@pytest.mark.parametrize("durations", [None, (0, 1, 2)])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("fusion", [False, True])
def test_a_wide_beam_is_the_search_without_a_beam(tmp_path, durations, seed, fusion):
    """Beam 256 on tiny models (3 outputs, 2 frames, 2 labels per frame at most) keeps every hypothesis (at most
    81 proposals a step): the same hypotheses and scores as the step-by-step search without a beam, ranked."""
    dec = make_decoder(seed, V=3, durations=durations, max_symbols=2, blank_bias=0.0).double()
    x = torch.randn(1, 2, 6, dtype=torch.float64)
    kw, fused = {}, {}
    if fusion:  # a bigram LM and a booster over the 3 classes (the blank, 2, unused by both)
        random_arpa(tmp_path / "lm.arpa", 3, 2, seed=seed)
        lm, booster = NGramLM.from_arpa(tmp_path / "lm.arpa", 3), PhraseBooster([[0, 1], [1, 1]], 3, [0.7, 1.3])
        kw = dict(lm=lm, lm_weight=0.4, boosting=booster, boosting_weight=0.8)
        fused = dict(lm=lm, a=0.4, booster=booster, b=0.8)
    want = exhaustive(dec, x[0], 2, **fused)
    got = search(dec, x, [2], 256, nbest=256, score_norm=False, **kw)
    live = int((got.scores[0] > -math.inf).sum())
    assert live == len(want)
    found = sorted(
        (tuple(got.tokens[0, b, : got.lengths[0, b]].tolist()), float(got.scores[0, b])) for b in range(live)
    )
    expected = sorted((tokens, score) for (tokens, _), score in want.items())  # TDT: a sequence at each end frame
    assert [k for k, _ in found] == [k for k, _ in expected]
    assert [v for _, v in found] == pytest.approx([v for _, v in expected], abs=1e-9)
    assert got.scores[0, :live].tolist() == sorted(got.scores[0, :live].tolist(), reverse=True)


def test_lm_fusion_changes_the_ranking_as_written(tmp_path):
    """With an LM of weight a: beam 1's first step picks argmax of the fused scores (labels: log p + a log(1 -
    p(blank)) + a log p_LM; blank: (1 + a) log p(blank))."""
    dec = make_decoder(0, V=5, max_symbols=1, blank_bias=0.0).double()
    random_arpa(tmp_path / "lm.arpa", 5, 2, seed=1)
    lm = NGramLM.from_arpa(tmp_path / "lm.arpa", 5)
    x = torch.randn(1, 1, 6, dtype=torch.float64)
    w = dec.weights()
    st = start_state(w, 1, dec.blank, x.device)
    g = torch.nn.functional.linear(st.output, w.pred_w, w.pred_b)
    enc = torch.nn.functional.linear(x[0, 0], w.enc_w, w.enc_b)
    lp = torch.nn.functional.linear(torch.relu(enc + g[0]), w.out_w, w.out_b).log_softmax(0)
    a = 2.0
    lm_lp, _ = lm.score(torch.tensor([lm.start]))
    fused = lp + a * torch.log1p(-lp[dec.blank].exp().clamp(max=0.99)) + a * lm_lp[0].double()
    fused[dec.blank] = (1 + a) * lp[dec.blank]
    got = search(dec, x, [1], 1, lm=lm, lm_weight=a)
    first = int(got.tokens[0, 0, 0]) if int(got.lengths[0, 0]) else dec.blank
    assert first == int(fused.argmax())


def test_the_public_method(tmp_path):
    """TransducerDecoder.beam_search: the reference's hypotheses; beam 1 is greedy; refusals name the argument."""
    dec = make_decoder(3, durations=(0, 1, 2, 3), max_symbols=2)
    x = torch.randn(2, 7, 6)
    got = dec.beam_search(x, [7, 5], 3, nbest=2)
    with torch.no_grad():
        want = search(dec, x, [7, 5], 3, nbest=2)
    for a, b in zip(got, want, strict=True):  # (the kernel's log-softmaxes round as they do)
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5) if a.dtype.is_floating_point else torch.equal(a, b)
    one = dec.beam_search(x, [7, 5], 1)
    greedy, _ = dec.greedy(x, [7, 5])
    for n in range(2):
        L = int(greedy.lengths[n])
        assert one.tokens[n, 0, :L].tolist() == greedy.tokens[n, :L].tolist()
    random_arpa(tmp_path / "lm.arpa", 6, 2, seed=0)
    bad_lm = NGramLM.from_arpa(tmp_path / "lm.arpa", 6)
    for kw, match in [
        (dict(beam_size=0), "beam_size"),
        (dict(beam_size=2, nbest=3), "nbest=3 is larger than beam_size=2"),
        (dict(lm_weight=float("nan")), "lm_weight"),
        (dict(lm=bad_lm), "lm has vocab_size=6 but the decoder has 7 classes"),
        (dict(lm="x"), "lm must be an instance of NGramLM"),
        (dict(encoder_lengths=[8, 1]), "encoder_lengths"),
        (dict(boosting_weight=float("inf")), "boosting_weight"),
        (dict(boosting=[[1, 2]]), "boosting must be an instance of PhraseBooster"),
        (dict(boosting=PhraseBooster([[1]], 5)), "boosting has vocab_size=5 but the decoder has 7 classes"),
    ]:
        with pytest.raises(ValueError, match=match):
            dec.beam_search(x, **kw)
    with pytest.raises(ValueError, match=r"encoder_out must be \[N, T, E=6\]"):
        dec.beam_search(torch.randn(2, 7, 5))


@pytest.mark.gpu
@pytest.mark.parametrize("durations", [None, (0, 1, 2, 3)])
def test_gpu_search_is_the_cpu_search(gpu, durations):
    """The same search with the networks on the GPU (float64): the CPU's hypotheses and scores."""
    dec = make_decoder(5, durations=durations, max_symbols=2).double()
    x = torch.randn(3, 8, 6, dtype=torch.float64)
    want = dec.beam_search(x, [8, 6, 3], 4, nbest=3)
    got = dec.to(gpu).beam_search(x.to(gpu), [8, 6, 3], 4, nbest=3)
    for a, b in zip(got, want, strict=True):
        if b is not None:
            assert a.device.type == "cuda"
            assert torch.allclose(a.cpu(), b, atol=1e-9) if b.dtype.is_floating_point else torch.equal(a.cpu(), b)


def test_views_search_as_copies():
    """Strided, transposed and offset encoder outputs and lengths as a list: the contiguous copy's hypotheses."""
    dec = make_decoder(4, max_symbols=2)
    x = torch.randn(2, 7, 6)
    want = dec.beam_search(x, torch.tensor([7, 4]), 3, nbest=2)
    big = torch.zeros(7, 3, 12)
    view = big[:, 1:, ::2].transpose(0, 1)  # [2, 7, 6], offset, strided, transposed
    view.copy_(x)
    got = dec.beam_search(view, [7, 4], 3, nbest=2)
    for a, b in zip(got, want, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


def check_against_oracle(hyp, want, tol: float) -> None:
    """The same N-best as the float64 reference ``want``: tokens, frames, durations, lengths exactly (-1 past the
    lengths), scores and their parts to ``tol``."""
    for f in ("tokens", "lengths", "frames", "durations"):
        a, b = getattr(hyp, f), getattr(want, f)
        assert (a is None) == (b is None), f
        if a is not None:
            assert a.dtype == torch.int64 and torch.equal(a.cpu(), b), f
    for f in ("scores", "acoustic", "lm_scores"):
        a, b = getattr(hyp, f).cpu(), getattr(want, f)
        assert a.dtype == torch.float32 and torch.equal(a.isinf(), b.isinf()), f
        assert torch.allclose(a, b.float(), rtol=tol, atol=tol), (f, a, b)


@pytest.mark.parametrize("durations", [None, (0, 1, 2, 3)])
@pytest.mark.parametrize("seed", range(6))
def test_search_on_every_path(path, tmp_path, monkeypatch, durations, seed):
    """TransducerDecoder.beam_search in float32 on every path (the step kernel on the interpreter and the GPU):
    the float64 reference's N-best; beams 1-4 (max_symbols reached, an empty utterance), an LM (some tokens
    without a unigram: <unk>) from seed 2, boosting from seed 4, its arcs written a few at a time; the LSTM's fused
    cells on odd seeds."""
    if path.kernels:
        from speechkernels.decode import transducer_beam_kernels

        monkeypatch.setitem(transducer_beam_kernels.STEP_TILES, "block_arcs", 2 if seed % 2 else 16)
        monkeypatch.setattr(transducer_beam_kernels, "FUSED_CELL", seed % 2 == 1)  # both prediction steps
    dec = make_decoder(seed, durations=durations, max_symbols=2, blank_bias=0.5 * (seed % 3))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 9, 6, generator=g)
    lengths = [9, 4, 0]
    K = 1 + seed % 4
    kw = dict(nbest=K)
    if seed >= 2:
        random_arpa(tmp_path / "lm.arpa", 7, 3, seed=seed, drop=seed % 2)
        kw.update(lm=NGramLM.from_arpa(tmp_path / "lm.arpa", 7), lm_weight=0.4)
    if seed >= 4:
        booster = PhraseBooster([[1, 2], [3, 1, 2], [0], [4, 4]], 7, [1.0, 0.5, 2.0, 1.5])
        kw.update(boosting=booster, boosting_weight=0.7)
    with torch.no_grad():
        want = search(dec.double(), x.double(), lengths, K, **kw)
    dev_kw = {k: v.to(path.device) if hasattr(v, "to") else v for k, v in kw.items()}
    hyp = dec.float().to(path.device).beam_search(x.to(path.device), lengths, K, **dev_kw)
    path.check_ran()
    check_against_oracle(hyp, want, 1e-4)


@pytest.mark.kernels
@pytest.mark.parametrize("durations", [None, (0, 2, 1)])
def test_search_across_class_blocks(path, tmp_path, monkeypatch, durations):
    """More classes than a block (each slot's running list of its best labels across blocks), beams wider than
    the classes' proposals need, the blank first, an LM and boosting; the products in linear_tf32x3, the LSTM
    (without biases) in its fused cells."""
    from speechkernels.decode import transducer_beam_kernels

    monkeypatch.setitem(transducer_beam_kernels.STEP_TILES, "block_c", 16)
    monkeypatch.setattr(transducer_beam_kernels, "TF32X3", True)  # the products in the search's own kernel
    monkeypatch.setattr(transducer_beam_kernels, "FUSED_CELL", True)
    dec = make_decoder(7, V=40, durations=durations, max_symbols=3, blank=0, blank_bias=2.0, lstm_bias=False)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 8, 6, generator=g)
    random_arpa(tmp_path / "lm.arpa", 40, 4, seed=7)
    kw = dict(nbest=3, lm=NGramLM.from_arpa(tmp_path / "lm.arpa", 40), lm_weight=0.3)
    kw["boosting"] = PhraseBooster([[5, 9, 5, 9], [9, 5], [30, 31, 32]], 40, 1.0)
    with torch.no_grad():
        want = search(dec.double(), x.double(), [8, 6], 5, **kw)
    dev_kw = {k: v.to(path.device) if hasattr(v, "to") else v for k, v in kw.items()}
    hyp = dec.float().to(path.device).beam_search(x.to(path.device), [8, 6], 5, **dev_kw)
    path.check_ran()
    check_against_oracle(hyp, want, 1e-4)


@pytest.mark.kernels
@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("durations", [None, (0, 2, 1)])
def test_compact_step_is_the_full_step(path, tmp_path, monkeypatch, layers, durations):
    """COMPACT (the LSTM layers and the projection over the slots that took a label, each slot's recurrent terms
    made with its state) gives the values of the step over every slot bit for bit: beam search with an LM and
    greedy decoding with it, one and three layers (the later layers' compact cells)."""
    from speechkernels.decode import transducer_beam_kernels

    monkeypatch.setattr(transducer_beam_kernels, "TF32X3", True)
    monkeypatch.setattr(transducer_beam_kernels, "FUSED_CELL", True)
    dec = make_decoder(3 + layers, V=12, layers=layers, durations=durations, max_symbols=3, blank_bias=0.5)
    dec = dec.float().to(path.device)
    x = torch.randn(3, 9, 6, generator=torch.Generator().manual_seed(layers)).to(path.device)
    random_arpa(tmp_path / "lm.arpa", 12, 3, seed=layers)
    kw = dict(lm=NGramLM.from_arpa(tmp_path / "lm.arpa", 12).to(path.device), lm_weight=0.4)
    got = {}
    for compact in (True, False):
        monkeypatch.setattr(transducer_beam_kernels, "COMPACT", compact)
        got[compact] = (
            dec.beam_search(x, [9, 5, 7], 4, nbest=2, **kw),
            dec.greedy(x, [9, 5, 7], **kw)[0],
        )
        path.check_ran()
    for a, b in zip(got[True], got[False], strict=True):
        for u, v in zip(a, b, strict=True):
            assert (u is None) == (v is None)
            assert u is None or torch.equal(u, v)


@pytest.mark.kernels
def test_fused_joint_is_the_torch_joint(path, tmp_path, monkeypatch):
    """FUSED_JOINT (the joint's relu input formed in its product's kernel) gives the values of torch's operations
    bit for bit: beam search with an LM, greedy decoding with it and without (the step route)."""
    from speechkernels.decode import api as decode_api
    from speechkernels.decode import transducer_beam_kernels as tbk

    for switch in ("TF32X3", "FUSED_CELL", "COMPACT"):
        monkeypatch.setattr(tbk, switch, True)
    monkeypatch.setattr(decode_api, "GREEDY_STEP_ROWS", 1)
    dec = make_decoder(13, V=12, durations=(0, 2, 1), max_symbols=3, blank_bias=0.5).to(path.device)
    x = torch.randn(3, 9, 6, generator=torch.Generator().manual_seed(13)).to(path.device)
    random_arpa(tmp_path / "lm.arpa", 12, 3, seed=13)
    kw = dict(lm=NGramLM.from_arpa(tmp_path / "lm.arpa", 12).to(path.device), lm_weight=0.4)
    calls = count_calls(
        monkeypatch, tbk, "linear_group", record=lambda products, *a: isinstance(products[0][0], tbk.JointInput)
    )
    got = {}
    for fused in (True, False):
        monkeypatch.setattr(tbk, "FUSED_JOINT", fused)
        calls.clear()
        got[fused] = (
            dec.beam_search(x, [9, 5, 7], 3, nbest=2, **kw),
            dec.greedy(x, [9, 5, 7], **kw)[0],
            dec.greedy(x, [9, 5, 7])[0],
        )
        path.check_ran()
        assert any(calls) == fused
    for a, b in zip(got[True], got[False], strict=True):
        for u, v in zip(a, b, strict=True):
            assert (u is None) == (v is None)
            assert u is None or torch.equal(u, v)


@pytest.mark.gpu
@pytest.mark.parametrize("durations", [None, (0, 1, 2, 3)])
def test_gpu_graph_replay_is_the_eager_search(gpu, tmp_path, monkeypatch, durations):
    """On the GPU the steps after the first few replay as a CUDA graph: the eager steps' results, bit for bit (long
    utterances of different lengths, an LM and boosting)."""
    from speechkernels.decode import transducer_beam_kernels

    dec = make_decoder(11, V=30, durations=durations, max_symbols=3, blank=0, blank_bias=1.0).to(gpu)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(5, 60, 6, generator=g).to(gpu)
    random_arpa(tmp_path / "lm.arpa", 30, 3, seed=11)
    kw = dict(nbest=2, lm=NGramLM.from_arpa(tmp_path / "lm.arpa", 30).to(gpu), lm_weight=0.3)
    kw["boosting"] = PhraseBooster([[5, 9], [9, 5, 7], [20]], 30, 1.0).to(gpu)
    lengths = [60, 41, 7, 0, 59]
    replayed = dec.beam_search(x, lengths, 4, **kw)
    monkeypatch.setattr(transducer_beam_kernels, "GRAPHS", False)
    eager = dec.beam_search(x, lengths, 4, **kw)
    assert int(eager.lengths.max()) > 30
    for a, b in zip(replayed, eager, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


@pytest.mark.kernels
@pytest.mark.parametrize("bias", [False, True])
def test_the_products_kernel(path, bias):
    """linear_tf32x3 (the float32 networks' products of the GPU search): torch.nn.functional.linear's values in
    float64 to float32's precision, for shapes that are no multiple of its tiles and a batch of rows (134: the
    tiles above ``LINEAR_TILES["few"]`` rows; the grouped test below takes the tiles at or below it)."""
    from speechkernels.decode.transducer_beam_kernels import linear_tf32x3, tf32_split

    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 67, 45, generator=g)
    w = torch.randn(70, 45, generator=g)
    b = torch.randn(70, generator=g) if bias else None
    wt = w.t().contiguous().to(path.device).t()  # (a transposed view: read through a contiguous copy)
    got = linear_tf32x3(x.to(path.device), wt, None if b is None else b.to(path.device))
    presplit = linear_tf32x3(x.to(path.device), wt, None if b is None else b.to(path.device), tf32_split(wt))
    path.check_ran(False)  # (not a registered launcher: the search's products)
    want = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
    assert got.shape == (2, 67, 70) and got.dtype == torch.float32
    assert torch.allclose(got.cpu().double(), want, rtol=1e-5, atol=1e-4)
    assert torch.equal(presplit, got)


@pytest.mark.kernels
def test_the_products_kernel_grouped(path):
    """linear_group: independent products of the same rows (other K and N, with and without a bias) three to a
    launch, each the same values as alone; rows that differ in number refused (67 rows: the few rows' tiles)."""
    from speechkernels.decode.transducer_beam_kernels import linear_group, linear_tf32x3

    g = torch.Generator().manual_seed(5)
    shapes = [(45, 70, True), (33, 64, False), (45, 129, True), (20, 7, True)]
    xs = [torch.randn(67, k, generator=g).to(path.device) for k, _, _ in shapes]
    ws = [torch.randn(n, k, generator=g).to(path.device) for k, n, _ in shapes]
    bs = [torch.randn(n, generator=g).to(path.device) if b else None for _, n, b in shapes]
    got = linear_group([(x, w, b, None) for x, w, b in zip(xs, ws, bs, strict=True)])
    path.check_ran(False)
    for x, w, b, out in zip(xs, ws, bs, got, strict=True):
        assert torch.equal(out, linear_tf32x3(x, w, b))
        want = torch.nn.functional.linear(x.cpu().double(), w.cpu().double(), None if b is None else b.cpu().double())
        assert torch.allclose(out.cpu().double(), want, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="product 1 has x of shape"):
        linear_group([(xs[0], ws[0], None, None), (xs[1][:5], ws[1], None, None)])


def test_tf32_split():
    """tf32_split: hi has TF32's 10 mantissa bits (rounded to nearest, ties away from zero), hi + lo is the weight
    exactly; inf and NaN kept in hi, and the largest float32 (which would round to inf)."""
    pytest.importorskip("triton")  # (the kernels' module)
    from speechkernels.decode.transducer_beam_kernels import tf32_split

    w = torch.randn(50, 33, generator=torch.Generator().manual_seed(4)) * 1e3
    w[0, :4] = torch.tensor([float("inf"), float("-inf"), float("nan"), torch.finfo(torch.float32).max])
    w[1, :2] = torch.tensor([1 + 2**-11, -(1 + 3 * 2**-11)])  # (a tie: away from zero; above: up)
    hi, lo = tf32_split(w.t())
    assert hi.is_contiguous() and hi.shape == (33, 50)
    hi, lo = hi.t(), lo.t()
    finite = torch.isfinite(w)
    rounded = finite & (w.abs() < 3e38)
    assert not (hi.view(torch.int32) & 0x1FFF)[rounded].any()  # (the 13 bits TF32 drops)
    assert torch.equal((hi + lo)[finite], w[finite])
    assert ((w - hi).abs() <= w.abs() * 2**-11)[finite].all()
    assert hi[1, 0] == 1 + 2**-10 and hi[1, 1] == -(1 + 2 * 2**-10)
    assert torch.isinf(hi[0, 0]) and torch.isinf(hi[0, 1]) and torch.isnan(hi[0, 2]) and hi[0, 3] == w[0, 3]


@pytest.mark.kernels
def test_tf32_split_kernel(path):
    """tf32_split_into (the search's weights split each call in one launch): tf32_split's bits, NaN, inf and the
    largest float32 included, from a transposed view and over more than one block."""
    from speechkernels.decode.transducer_beam_kernels import tf32_split, tf32_split_into

    w = torch.randn(70, 61, generator=torch.Generator().manual_seed(6)) * 1e3
    w[0, :4] = torch.tensor([float("inf"), float("-inf"), float("nan"), torch.finfo(torch.float32).max])
    w[1, :3] = torch.tensor([1 + 2**-11, -(1 + 3 * 2**-11), -torch.finfo(torch.float32).max])
    wt = w.to(path.device).t()
    hi, lo = torch.full((2, 61, 70), 7.0, device=path.device)
    tf32_split_into(wt, hi, lo)
    path.check_ran(False)
    want_hi, want_lo = tf32_split(w.t())
    assert torch.equal(hi.cpu().view(torch.int32), want_hi.view(torch.int32))
    nan = want_lo.isnan()  # (inf - inf, NaN - NaN: a NaN whose payload is the machine's)
    assert torch.equal(lo.cpu().isnan(), nan) and nan.sum() == 3
    assert torch.equal(lo.cpu().view(torch.int32)[~nan], want_lo.view(torch.int32)[~nan])


@pytest.mark.gpu
@pytest.mark.parametrize("durations", [None, (0, 1, 2, 3), "modified"])
def test_gpu_bfloat16_networks_search_as_the_pytorch_path(gpu, tmp_path, monkeypatch, durations):
    """bfloat16 networks on the GPU (the step kernel reads their joint's outputs as they are): the PyTorch path's
    hypotheses on the same device, scores to float32 rounding; malsd (RNN-T, TDT) and icefall's search."""
    from speechkernels.decode import api

    modified = durations == "modified"
    dec = make_decoder(13, V=20, durations=None if modified else durations, max_symbols=2, stateless=2 * modified,
                       blank=0).to(gpu, torch.bfloat16)  # fmt: skip
    x = torch.randn(4, 30, 6, generator=torch.Generator().manual_seed(13)).to(gpu)
    random_arpa(tmp_path / "lm.arpa", 20, 3, seed=13)
    kw = dict(nbest=2, lm=NGramLM.from_arpa(tmp_path / "lm.arpa", 20).to(gpu), lm_weight=0.3)
    kw["algorithm"] = "modified" if modified else "malsd"
    got = dec.beam_search(x, [30, 22, 9, 1], 3, **kw)
    monkeypatch.setattr(api, "transducer_beam_kernels", None)
    want = dec.beam_search(x, [30, 22, 9, 1], 3, **kw)
    for a, b in zip(got, want, strict=True):
        if b is not None:
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-5) if b.dtype.is_floating_point else torch.equal(a, b)


@pytest.mark.kernels
def test_a_kept_search_serves_the_next_calls(path, tmp_path, monkeypatch):
    """KEEP_SEARCH: the last configuration's buffers (and, on the GPU, its graph) serve the next call of the same
    configuration with other encoder outputs and lengths, each call giving a fresh search's hypotheses; another
    configuration in between replaces it."""
    from speechkernels.decode import transducer_beam_kernels as tbk

    dec = make_decoder(5, V=8, durations=(0, 1, 2), max_symbols=2, blank_bias=1.0).to(path.device)
    random_arpa(tmp_path / "lm.arpa", 8, 3, seed=5)
    lm = NGramLM.from_arpa(tmp_path / "lm.arpa", 8).to(path.device)
    g = torch.Generator().manual_seed(5)
    calls = [(torch.randn(3, 6, 6, generator=g).to(path.device), [6, 4, 2], dict(lm=lm, lm_weight=0.4))
             for _ in range(2)]  # fmt: skip
    calls.insert(1, (calls[0][0], [6, 6, 6], {}))  # another configuration (no LM)
    calls.append(calls[1])
    monkeypatch.setattr(tbk, "KEEP_SEARCH", False)
    fresh = [dec.beam_search(x, lengths, 3, nbest=2, **kw) for x, lengths, kw in calls]
    monkeypatch.setattr(tbk, "KEEP_SEARCH", True)
    monkeypatch.setattr(tbk, "_KEPT", {})
    kept = [dec.beam_search(x, lengths, 3, nbest=2, **kw) for x, lengths, kw in calls]
    path.check_ran()
    assert dec._plans.beam is not None and not tbk._KEPT  # the decoder's own
    for a, b in zip(kept, fresh, strict=True):
        for u, v in zip(a, b, strict=True):
            assert torch.equal(u, v)
    # weights changed in place (an optimiser's step) keep their places: the kept search reads their new values
    with torch.no_grad():
        for p in dec.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g).to(p.device))
    x, lengths, kw = calls[0]  # (with the LM)
    got = dec.beam_search(x, lengths, 3, nbest=2, **kw)
    assert dec._plans.beam is not None
    cpu_lm = NGramLM.from_arpa(tmp_path / "lm.arpa", 8)
    want = search(dec.double().cpu(), x.double().cpu(), lengths, 3, nbest=2, lm=cpu_lm, lm_weight=kw["lm_weight"])
    check_against_oracle(got, want, 1e-4)


@pytest.mark.kernels
@pytest.mark.parametrize("algorithm", ["malsd", "modified", "greedy"])
def test_a_kept_search_serves_fewer_frames(path, monkeypatch, algorithm):
    """A kept search holds its frames rounded up to FRAME_BLOCK: a call with as many frames or fewer (the rest of
    the configuration the same) reuses its buffers and graph and gets a fresh search's hypotheses; a call with
    more replaces it. Greedy decoding at GREEDY_STEP_ROWS utterances runs the same steps."""
    from speechkernels.decode import api as decode_api
    from speechkernels.decode import transducer_beam_kernels as tbk

    monkeypatch.setattr(tbk, "FRAME_BLOCK", 4)
    monkeypatch.setattr(decode_api, "GREEDY_STEP_ROWS", 1)
    modified = algorithm == "modified"
    dec = make_decoder(8, V=8, durations=None if modified else (0, 1, 2), max_symbols=2, stateless=2 if modified
                       else 0, blank=0, blank_bias=0.5).to(path.device)  # fmt: skip
    g = torch.Generator().manual_seed(8)
    x = torch.randn(3, 9, 6, generator=g).to(path.device)

    def decode(T):
        lengths = [T, max(T - 3, 0), T // 2]
        if algorithm == "greedy":
            return dec.greedy(x[:, :T], lengths)[0]
        return dec.beam_search(x[:, :T], lengths, 2, nbest=2, algorithm=algorithm)

    frames = [5, 3, 8, 9, 6]
    monkeypatch.setattr(tbk, "KEEP_SEARCH", False)
    fresh = [decode(T) for T in frames]
    monkeypatch.setattr(tbk, "KEEP_SEARCH", True)
    kept, searches = [], []
    for T in frames:
        kept.append(decode(T))
        searches.append(dec._plans.beam[1])
    path.check_ran()
    assert [s.T for s in searches] == [8, 8, 8, 12, 12]
    assert searches[0] is searches[1] is searches[2] and searches[3] is searches[4]
    for a, b in zip(kept, fresh, strict=True):
        for u, v in zip(a, b, strict=True):
            assert (u is None and v is None) or torch.equal(u, v)


@pytest.mark.parametrize("durations", [None, (0, 1)])
def test_beams_wider_than_the_proposals(path, durations):
    """Fewer (label, duration) proposals per slot than the beam (padded with impossible ones) and batches whose
    utterances are all empty, on every path: the float64 search's N-best; icefall's search likewise."""
    x = torch.randn(2, 6, 6, generator=torch.Generator().manual_seed(3))
    for lengths in ([6, 3], [0, 0]):
        dec = make_decoder(3, V=3, durations=durations, max_symbols=2, blank_bias=0.3)
        with torch.no_grad():
            want = search(dec.double(), x.double(), lengths, 8, nbest=8)
        got = dec.float().to(path.device).beam_search(x.to(path.device), lengths, 8, nbest=8)
        path.check_ran()
        path.reset()
        check_against_oracle(got, want, 1e-4)
        icefall = make_decoder(3, V=3, stateless=2, blank=0)
        want = icefall.double().beam_search(x.double(), lengths, 5, nbest=5, algorithm="modified")
        got = icefall.float().to(path.device).beam_search(x.to(path.device), lengths, 5, nbest=5, algorithm="modified")
        path.check_ran()
        path.reset()
        check_against_oracle(got, want, 1e-4)


@pytest.mark.parametrize("algorithm", ["malsd", "modified"])
def test_nan_stays_in_its_utterance(path, algorithm):
    """NaN encoder outputs in one utterance: it has no hypotheses (lengths 0, scores -inf, tokens -1), the others
    are those of the batch without it, on every path."""
    dec = make_decoder(3, durations=None if algorithm == "modified" else (0, 1, 2), max_symbols=2,
                       stateless=2 if algorithm == "modified" else 0, blank=0)  # fmt: skip
    x = torch.randn(3, 6, 6, generator=torch.Generator().manual_seed(3))
    clean = dec.to(path.device).beam_search(x[[0, 2]].to(path.device), [6, 4], 3, nbest=2, algorithm=algorithm)
    x[1, 2] = float("nan")
    got = dec.beam_search(x.to(path.device), [6, 6, 4], 3, nbest=2, algorithm=algorithm)
    path.check_ran()
    assert (got.lengths[1] == 0).all() and (got.scores[1] == -math.inf).all() and (got.tokens[1] == -1).all()
    for a, b in zip(got, clean, strict=True):  # (the products of a batch of another size round as they do)
        if b is not None:
            a = a[[0, 2]]
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-5) if b.is_floating_point() else torch.equal(a, b)


@pytest.mark.parametrize("seed", range(12))
def test_random_configurations_on_every_path(path, tmp_path, monkeypatch, seed):
    """Random searches in float32 on every path: malsd (RNN-T, TDT) or icefall's, LSTM or stateless networks, the
    blank first or last, ragged lengths (0 included), beams 1-6, nbest, either ranking, an LM and a booster or not,
    and on the kernel paths the switches and tiles drawn too: the float64 search's N-best."""
    rng = random.Random(seed)
    if path.kernels:
        from speechkernels.decode import transducer_beam_kernels as tbk

        monkeypatch.setattr(tbk, "TF32X3", rng.random() < 0.5)
        monkeypatch.setattr(tbk, "FUSED_CELL", rng.random() < 0.5)
        monkeypatch.setattr(tbk, "COMPACT", rng.random() < 0.7)
        monkeypatch.setattr(tbk, "FUSED_JOINT", random.Random(seed + 1000).random() < 0.5)  # (the draws above kept)
        monkeypatch.setitem(tbk.STEP_TILES, "block_c", rng.choice([16, 256]))
        monkeypatch.setitem(tbk.STEP_TILES, "block_arcs", rng.choice([2, 32]))
    algorithm = rng.choice(["malsd", "modified"])
    V = rng.choice([5, 9, 17, 33])
    durations = None
    if algorithm == "malsd" and rng.random() < 0.5:
        durations = tuple(rng.sample(range(5), rng.randint(2, 4)))
    dec = make_decoder(seed, V=V, durations=durations, stateless=rng.choice([0, 2]), blank=rng.choice([0, V - 1]),
                       max_symbols=rng.randint(1, 3), blank_bias=rng.uniform(0, 2),
                       activation=rng.choice(["relu", "tanh"]))  # fmt: skip
    N, T = rng.randint(1, 4), rng.randint(1, 12)
    x = torch.randn(N, T, 6, generator=torch.Generator().manual_seed(seed))
    lengths = [rng.randint(0, T) for _ in range(N)]
    K = rng.randint(1, 6)
    kw = dict(nbest=rng.randint(1, K), algorithm=algorithm, score_norm=rng.random() < 0.7)
    if rng.random() < 0.6:
        random_arpa(tmp_path / "lm.arpa", V, rng.randint(2, 4), seed=seed, drop=rng.randint(0, 2))
        kw.update(lm=NGramLM.from_arpa(tmp_path / "lm.arpa", V), lm_weight=rng.uniform(0, 0.8))
    if rng.random() < 0.5:
        phrases = [[rng.randrange(V) for _ in range(rng.randint(1, 4))] for _ in range(rng.randint(1, 5))]
        kw.update(boosting=PhraseBooster(phrases, V, rng.uniform(0.2, 2)), boosting_weight=rng.uniform(0.2, 1.5))
    with torch.no_grad():
        want = dec.double().beam_search(x.double(), lengths, K, **kw)
    dev_kw = {k: v.to(path.device) if hasattr(v, "to") else v for k, v in kw.items()}
    hyp = dec.float().to(path.device).beam_search(x.to(path.device), lengths, K, **dev_kw)
    path.check_ran()
    check_against_oracle(hyp, want, 1e-4)
