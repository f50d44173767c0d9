"""Greedy transducer decoding with shallow fusion (``TransducerDecoder.greedy(lm=..., boosting=...)``): NeMo's
label-looping rule (the joint alone decides whether a frame emits, the fused scores pick the label among the
non-blank classes) against a plain-Python oracle, on every path against the float64 reference, chunk by chunk,
and the refusals."""

from __future__ import annotations

import pytest
import torch
from test_decode_transducer import make_decoder
from test_ngram import random_arpa
from test_transducer_beam import prefix_logits

import speechkernels as sk
from speechkernels.decode.boosting import PhraseBooster
from speechkernels.decode.ngram import NGramLM
from speechkernels.decode.reference import transducer_greedy_reference

PHRASES = ([[1, 2], [3, 1, 2], [0], [4, 4]], [1.0, 0.5, 2.0, 1.5])


def fusion(tmp_path, seed: int, V: int = 7, lm: bool = True, boosting: bool = True) -> dict:
    kw = {}
    if lm:
        random_arpa(tmp_path / "lm.arpa", V, 3, seed=seed, drop=seed % 2)
        kw.update(lm=NGramLM.from_arpa(tmp_path / "lm.arpa", V), lm_weight=0.3 + 0.2 * (seed % 3))
    if boosting:
        kw.update(boosting=PhraseBooster(PHRASES[0], V, PHRASES[1]), boosting_weight=0.6)
    return kw


@torch.no_grad()
def oracle(dec, x, L: int, lm=None, lm_weight=0.0, boosting=None, boosting_weight=1.0):
    """One utterance in plain Python: at frame t the joint's argmax; a blank moves t by 1 (TDT: its argmax
    duration, at least 1); otherwise the label is the first maximum over the non-blank classes of logit +
    lm_weight log p_LM + boosting_weight bonus, emitted at t (its log-softmax the score), t moves by its duration
    (RNN-T: 0), and after max_symbols labels at one frame by 1. Returns (tokens, frames, scores, durations)."""
    blank, durs, ms = dec.blank, dec.durations, dec.max_symbols_per_frame
    D = len(durs) if durs else 0
    V = dec.out.out_features - D
    logits_at = prefix_logits(dec, x)
    tokens, frames, scores, durations = [], [], [], []
    lm_s = torch.tensor([lm.start]) if lm is not None else None
    b_s = torch.tensor([boosting.start]) if boosting is not None else None
    t = at = 0
    while t < L:
        logits = logits_at(tuple(tokens), t)
        best = int(logits[:V].argmax())
        dur = durs[int(logits[V:].argmax())] if durs else (0 if best != blank else 1)
        if best == blank:
            t += max(dur, 1)
            at = 0
            continue
        fused = logits[:V].clone()
        if lm is not None:
            lp, nxt = lm.score(lm_s)
            fused += lm_weight * lp[0].double()
        if boosting is not None:
            bonus, b_nxt = boosting.step(b_s)
            fused += boosting_weight * bonus[0].double()
        fused[blank] = float("-inf")
        label = int(fused.argmax())
        tokens.append(label)
        frames.append(t)
        scores.append(float(logits[:V].log_softmax(0)[label]))
        durations.append(dur)
        if lm is not None:
            lm_s = nxt[:, label]
        if boosting is not None:
            b_s = b_nxt[:, label]
        at = at + 1 if dur == 0 else 0
        if at >= ms:
            t, at = t + 1, 0
        else:
            t += dur
    return tokens, frames, scores, durations


@pytest.mark.parametrize("durations", [None, (0, 1, 2, 3)])
@pytest.mark.parametrize("seed", range(4))
def test_the_reference_is_the_oracle(tmp_path, durations, seed):
    """The batched reference in float64 decodes each utterance as the plain-Python oracle does (an LM, boosting,
    both; max_symbols reached; an empty utterance)."""
    dec = make_decoder(seed, durations=durations, max_symbols=2, blank_bias=0.5 * (seed % 3)).double()
    kw = fusion(tmp_path, seed, lm=seed != 1, boosting=seed >= 1)
    x = torch.randn(3, 9, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    lengths = [9, 5, 0]
    hyp, state = dec.greedy(x, lengths, **kw)
    for n, L in enumerate(lengths):
        tokens, frames, scores, durs = oracle(dec, x[n], L, **kw)
        k = int(hyp.lengths[n])
        assert hyp.tokens[n, :k].tolist() == tokens
        assert hyp.frames[n, :k].tolist() == frames
        assert torch.allclose(hyp.scores[n, :k], torch.tensor(scores, dtype=torch.float64))
        if durations:
            assert hyp.durations[n, :k].tolist() == durs
    for name in ("lm", "boosting"):
        states = getattr(state, f"{name}_states")
        assert (states is None) == (name not in kw)


def test_fusion_picks_labels_not_frames(tmp_path):
    """With a heavy LM every label is the LM's most likely non-blank token from the LM state its labels reached,
    and the first emission is where plain greedy decoding's is (the joint alone decides whether a frame emits)."""
    dec = make_decoder(3, max_symbols=2, blank_bias=0.5).double()
    kw = fusion(tmp_path, 3, boosting=False)
    lm = kw["lm"]
    x = torch.randn(2, 12, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    plain, _ = dec.greedy(x)
    hyp, _ = dec.greedy(x, lm=lm, lm_weight=1e3)
    for n in range(2):
        k = int(hyp.lengths[n])
        assert k > 1 and int(plain.lengths[n]) > 0
        assert int(hyp.frames[n, 0]) == int(plain.frames[n, 0])
        state = torch.tensor([lm.start])
        for token in hyp.tokens[n, :k].tolist():
            lp, nxt = lm.score(state)
            lp[0, dec.blank] = float("-inf")
            assert token == int(lp[0].argmax())
            state = nxt[:, token]


@pytest.mark.parametrize("durations", [None, (0, 1, 2)])
def test_zero_weights_are_plain_greedy(path, tmp_path, durations):
    """An LM and a booster of weight 0 change nothing: the fused path's tokens, frames, durations and scores are
    plain greedy decoding's (on the kernel paths: the step kernel against the one-launch decoder)."""
    dec = make_decoder(5, durations=durations, max_symbols=3).to(path.device)
    x = torch.randn(4, 11, 6, generator=torch.Generator().manual_seed(5)).to(path.device)
    lengths = [11, 7, 1, 0]
    kw = {k: v.to(path.device) if hasattr(v, "to") else v for k, v in fusion(tmp_path, 5).items()}
    kw.update(lm_weight=0.0, boosting_weight=0.0)
    plain, _ = dec.greedy(x, lengths)
    hyp, _ = dec.greedy(x, lengths, **kw)
    path.check_ran()
    for f in ("tokens", "lengths", "frames", "durations"):
        a, b = getattr(hyp, f), getattr(plain, f)
        assert (a is None) == (b is None)
        assert a is None or torch.equal(a, b), f
    assert torch.allclose(hyp.scores, plain.scores, atol=1e-5)


@pytest.mark.parametrize("durations", [None, (0, 1, 2, 3)])
@pytest.mark.parametrize("seed", range(4))
def test_every_path_is_the_float64_reference(path, tmp_path, monkeypatch, durations, seed):
    """float32 networks on every path (the step kernel on the interpreter and the GPU): the float64 reference's
    tokens, frames and durations, scores to 1e-4, the fusion states it ends in; LM arcs written a few at a time
    and the LSTM's fused cells and the joint at a window of 3 frames a step on odd seeds, a stateless prediction
    network on seed 3."""
    if path.kernels:
        from speechkernels.decode import transducer_beam_kernels

        monkeypatch.setitem(transducer_beam_kernels.STEP_TILES, "block_arcs", 2 if seed % 2 else 16)
        monkeypatch.setitem(transducer_beam_kernels.STEP_TILES, "block_c", 4 if seed % 2 else 256)
        monkeypatch.setattr(transducer_beam_kernels, "FUSED_CELL", seed % 2 == 1)
        monkeypatch.setattr(transducer_beam_kernels, "GREEDY_WINDOW", 3 if seed % 2 else 1)
    dec = make_decoder(seed, durations=durations, max_symbols=2, blank_bias=0.3 * seed, stateless=2 * (seed == 3))
    kw = fusion(tmp_path, seed, lm=seed != 1, boosting=seed != 2)
    x = torch.randn(3, 9, 6, generator=torch.Generator().manual_seed(seed))
    lengths = [9, 4, 0]
    want, want_state = dec.double().greedy(x.double(), lengths, **kw)
    dev_kw = {k: v.to(path.device) if hasattr(v, "to") else v for k, v in kw.items()}
    hyp, state = dec.float().to(path.device).greedy(x.to(path.device), lengths, **dev_kw)
    path.check_ran()
    for f in ("tokens", "lengths", "frames", "durations"):
        a, b = getattr(hyp, f), getattr(want, f)
        assert (a is None) == (b is None), f
        assert a is None or (a.dtype == torch.int64 and torch.equal(a.cpu(), b)), f
    assert hyp.scores.dtype == torch.float32
    assert torch.allclose(hyp.scores.cpu(), want.scores.float(), atol=1e-4)
    for f in ("time_jumps", "frames", "lm_states", "boosting_states"):
        a, b = getattr(state, f), getattr(want_state, f)
        assert (a is None) == (b is None), f
        assert a is None or torch.equal(a.cpu(), b), f


@pytest.mark.parametrize("durations", [None, (0, 1, 2, 3)])
def test_chunks_decode_as_the_whole(path, tmp_path, durations):
    """Decoding in chunks, each call with the previous state (the LM's and the booster's states in it), gives
    the whole utterance's tokens, frames and durations."""
    dec = make_decoder(7, durations=durations, max_symbols=2, blank_bias=0.3).to(path.device)
    kw = {k: v.to(path.device) if hasattr(v, "to") else v for k, v in fusion(tmp_path, 7).items()}
    x = torch.randn(2, 14, 6, generator=torch.Generator().manual_seed(7)).to(path.device)
    whole, _ = dec.greedy(x, **kw)
    first, state = dec.greedy(x[:, :6], **kw)
    second, _ = dec.greedy(x[:, 6:], state=state, **kw)
    for n in range(2):
        a, b = int(first.lengths[n]), int(second.lengths[n])
        assert a + b == int(whole.lengths[n])
        for f in ("tokens", "frames") + (("durations",) if durations else ()):
            joined = torch.cat((getattr(first, f)[n, :a], getattr(second, f)[n, :b]))
            assert torch.equal(joined, getattr(whole, f)[n, : a + b]), f


def test_views_decode_as_copies(path, tmp_path):
    """encoder_out as a strided, offset view and the state's fusion states as views: the copies' results."""
    dec = make_decoder(2, durations=(0, 1, 2)).to(path.device)
    kw = {k: v.to(path.device) if hasattr(v, "to") else v for k, v in fusion(tmp_path, 2).items()}
    base = torch.randn(9, 3, 20, generator=torch.Generator().manual_seed(2)).to(path.device)
    x = base[1:, :, 4:10].transpose(0, 1)  # [3, 8, 6], not contiguous, offset
    _, state = dec.greedy(x[:, :3].contiguous(), **kw)
    wide = torch.stack((state.lm_states, state.lm_states), 1)
    state = state._replace(lm_states=wide[:, 1])
    hyp, _ = dec.greedy(x, [8, 5, 2], state=state, **kw)
    want, _ = dec.greedy(x.contiguous(), [8, 5, 2], state=state._replace(lm_states=wide[:, 1].clone()), **kw)
    for f in ("tokens", "lengths", "frames", "durations", "scores"):
        assert torch.equal(getattr(hyp, f), getattr(want, f)), f


def test_refusals(tmp_path):
    dec = make_decoder(1)
    x = torch.randn(2, 5, 6)
    kw = fusion(tmp_path, 1)
    with pytest.raises(ValueError, match="lm has vocab_size=9 but the decoder has 7 classes"):
        random_arpa(tmp_path / "big.arpa", 9, 2, seed=1)
        dec.greedy(x, lm=NGramLM.from_arpa(tmp_path / "big.arpa", 9))
    with pytest.raises(ValueError, match="boosting must be an instance of PhraseBooster"):
        dec.greedy(x, boosting=[[1, 2]])
    with pytest.raises(ValueError, match="lm_weight"):
        dec.greedy(x, lm=kw["lm"], lm_weight=float("nan"))
    with pytest.raises(ValueError, match="boosting_weight"):
        dec.greedy(x, boosting=kw["boosting"], boosting_weight=float("inf"))
    _, state = dec.greedy(x, **kw)
    with pytest.raises(ValueError, match=r"state.lm_states must be None or \[2\] int64"):
        dec.greedy(x, state=state._replace(lm_states=state.lm_states.int()), **kw)
    bad = state.boosting_states.clone()
    bad[1] = 10**6
    with pytest.raises(ValueError, match=r"state.boosting_states: states\[1\]=1000000 is outside"):
        dec.greedy(x, state=state._replace(boosting_states=bad), **kw)


def test_the_reference_function_alone():
    """``transducer_greedy_reference`` without fusion arguments is unchanged (plain greedy decoding)."""
    dec = make_decoder(4)
    x = torch.randn(2, 6, 6)
    w = dec.weights()
    hyp, state = transducer_greedy_reference(
        w, x, torch.tensor([6, 3]), dec.initial_state(2), dec.blank, None, dec.max_symbols_per_frame
    )
    want, _ = dec.greedy(x, [6, 3])
    assert torch.equal(hyp.tokens, want.tokens) and state.lm_states is None
    assert isinstance(state, sk.TransducerState)


@pytest.mark.gpu
@pytest.mark.parametrize("durations", [None, (0, 1, 2, 3)])
def test_gpu_bfloat16_and_graphs(gpu, tmp_path, monkeypatch, durations):
    """bfloat16 networks on the GPU: the PyTorch path's hypotheses on the same device (scores to float32's
    rounding); float32 with the CUDA graphs off: the replayed steps' results."""
    from speechkernels.decode import api, transducer_beam_kernels

    dec = make_decoder(13, V=20, durations=durations, max_symbols=2, blank=0).to(gpu)
    x = torch.randn(4, 30, 6, generator=torch.Generator().manual_seed(13)).to(gpu)
    random_arpa(tmp_path / "lm.arpa", 20, 3, seed=13)
    kw = dict(lm=NGramLM.from_arpa(tmp_path / "lm.arpa", 20).to(gpu), lm_weight=0.3)
    kw.update(boosting=PhraseBooster([[1, 2], [5, 5, 3]], 20, 1.5).to(gpu), boosting_weight=0.5)
    replayed, _ = dec.greedy(x, [30, 22, 9, 1], **kw)
    monkeypatch.setattr(transducer_beam_kernels, "GRAPHS", False)
    eager, _ = dec.greedy(x, [30, 22, 9, 1], **kw)
    for a, b in zip(replayed, eager, strict=True):
        assert b is None or torch.equal(a, b)
    dec = dec.to(torch.bfloat16)
    got, _ = dec.greedy(x, [30, 22, 9, 1], **kw)
    monkeypatch.setattr(api, "transducer_beam_kernels", None)
    want, _ = dec.greedy(x, [30, 22, 9, 1], **kw)
    for a, b in zip(got, want, strict=True):
        if b is not None:
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-5) if b.dtype.is_floating_point else torch.equal(a, b)


@pytest.mark.gpu
def test_gpu_more_slots_than_one_block(gpu, tmp_path):
    """More slots than the compact step's block of its active-slot check (1,100 utterances at K = 1, the long
    ones last): the search runs until the last utterance ends, each one the float64 reference's."""
    dec = make_decoder(17, V=9, max_symbols=2, blank=0, blank_bias=0.5)
    N = 1100
    x = torch.randn(N, 7, 6, generator=torch.Generator().manual_seed(17))
    lengths = [1 + (n % 2) for n in range(1030)] + [7] * (N - 1030)
    kw = fusion(tmp_path, 2, V=9, boosting=False)
    want, _ = dec.double().greedy(x.double(), lengths, **kw)
    dev_kw = {k: v.to(gpu) if hasattr(v, "to") else v for k, v in kw.items()}
    got, _ = dec.float().to(gpu).greedy(x.to(gpu), lengths, **dev_kw)
    assert int(want.lengths[1030:].sum()) > 2 * int(want.lengths[:1030].max())  # (tokens past frame 2)
    for f in ("tokens", "lengths", "frames"):
        assert torch.equal(getattr(got, f).cpu(), getattr(want, f)), f
    assert torch.allclose(got.scores.cpu(), want.scores.float(), atol=1e-4)
