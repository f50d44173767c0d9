"""Greedy transducer decoding (TransducerDecoder) against a per-utterance float64 oracle written with torch's own
modules (nn.LSTM, nn.Conv1d, nn.Linear): RNN-T and TDT, LSTM and stateless prediction networks, ragged lengths,
max_symbols_per_frame, chunked decoding, the constructors from NeMo's, icefall's and this library's modules, views,
empty batches and the refusals."""

from __future__ import annotations

import copy
import types

import pytest
import torch
from helpers import count_calls
from hypothesis import given, settings
from hypothesis import strategies as st

import speechkernels as sk
from speechkernels.decode import api as decode_api


@pytest.fixture(autouse=True)
def _the_kernel_ran(request):
    """On the kernels' paths a test that takes ``path`` checks at its end that the kernel ran."""
    path = request.getfixturevalue("path") if "path" in request.fixturenames else None
    yield
    assert path is None or not path.kernels or path.launches, "the kernel did not run"


def make_decoder(
    seed,
    *,
    V=7,
    E=6,
    P=5,
    J=8,
    layers=2,
    durations=None,
    stateless=0,
    activation="relu",
    blank=None,
    max_symbols=3,
    blank_bias=1.5,
    lstm_bias=True,
    dtype=torch.float32,
    device="cpu",
) -> sk.TransducerDecoder:
    """A random model; the blank's logit raised by ``blank_bias`` so that about one frame in two to four emits."""
    torch.manual_seed(seed)
    D = len(durations) if durations else 0
    blank = V - 1 if blank is None else blank
    embedding = torch.nn.Embedding(V, P)
    lstm = conv = None
    if stateless:
        conv = torch.nn.Conv1d(P, P, stateless, groups=P if P % 2 else 2, bias=False) if stateless > 1 else None
    else:
        lstm = torch.nn.LSTM(P, P + 1, layers, bias=lstm_bias)
    H = P if stateless else P + 1
    enc, pred, out = torch.nn.Linear(E, J), torch.nn.Linear(H, J), torch.nn.Linear(J, V + D)
    with torch.no_grad():
        for m in (enc, pred, out):
            m.weight.mul_(2.0)
        out.bias[blank] += blank_bias
    dec = sk.TransducerDecoder(
        embedding,
        enc,
        pred,
        out,
        lstm=lstm,
        conv=conv,
        context_size=max(stateless, 1),
        activation=activation,
        blank=blank,
        durations=durations,
        max_symbols_per_frame=max_symbols,
    )
    return dec.to(device=device, dtype=dtype)


@torch.no_grad()
def oracle(dec: sk.TransducerDecoder, x: torch.Tensor, lengths: list[int]):
    """One utterance at a time, one joint evaluation at a time, in float64, with the modules themselves."""
    m = copy.deepcopy(dec).cpu().double()
    act = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}[dec.activation]
    V, blank, K = dec.vocab_size, dec.blank, dec.context_size
    out = []
    for n, L in enumerate(lengths):
        xs = x[n].cpu().double()
        history = [-1] * (K - 1) + [blank]
        lstm_state = None

        def prediction(token, history):
            nonlocal lstm_state
            if m.lstm is not None:
                y, lstm_state = m.lstm(m.embedding(torch.tensor([[token]]))[:, 0][None], lstm_state)
                return y[0, 0]
            ctx = torch.tensor(history[-K:])
            e = m.embedding(ctx.clamp(min=0)) * (ctx >= 0)[:, None].double()
            return e[-1] if m.conv is None else torch.relu(m.conv(e.T[None]))[0, :, 0]

        g = m.pred(prediction(blank, history))
        t, tokens, frames, durs, scores, at_frame = 0, [], [], [], [], 0
        while t < L:
            logits = m.out(act(m.enc(xs[t]) + g))
            label = int(logits[:V].argmax())
            d = dec.durations[int(logits[V:].argmax())] if dec.durations else int(label == blank)
            if label == blank:
                t += max(d, 1)
                at_frame = 0
                continue
            tokens.append(label), frames.append(t), durs.append(d)
            scores.append(float(logits[:V].log_softmax(0)[label]))
            history.append(label)
            g = m.pred(prediction(label, history))
            at_frame = at_frame + 1 if d == 0 else 0
            if at_frame >= dec.max_symbols_per_frame:
                d, at_frame = 1, 0
            t += d
        out.append((tokens, frames, durs, scores))
    return out


def check(hyp, want, dec, T, score_tol=1e-5):
    S = T * dec.max_symbols_per_frame
    assert hyp.tokens.shape == hyp.frames.shape == hyp.scores.shape == (len(want), S)
    assert (hyp.durations is None) == (dec.durations is None)
    for n, (tokens, frames, durs, scores) in enumerate(want):
        k = len(tokens)
        assert int(hyp.lengths[n]) == k, n
        assert hyp.tokens[n, :k].tolist() == tokens and (hyp.tokens[n, k:] == -1).all()
        assert hyp.frames[n, :k].tolist() == frames and (hyp.frames[n, k:] == -1).all()
        if dec.durations:
            assert hyp.durations[n, :k].tolist() == durs and (hyp.durations[n, k:] == -1).all()
        torch.testing.assert_close(
            hyp.scores[n, :k].double().cpu(), torch.tensor(scores, dtype=torch.float64), rtol=score_tol, atol=score_tol
        )
        assert (hyp.scores[n, k:] == 0).all()


def decodes_alike(path, monkeypatch, dec, x, lengths, value: dict, base: dict | None = None):
    """With TILES updated by ``value``: the oracle's hypotheses, and the hypotheses and state of TILES as they are
    (or updated by ``base``); the hypotheses."""
    tk = decode_api.transducer_kernels
    for name, v in (base or {}).items():
        monkeypatch.setitem(tk.TILES, name, v)
    dec._plans.reset()  # the plans read TILES when made
    want, want_state = dec.greedy(x.to(path.device), lengths)
    for name, v in value.items():
        monkeypatch.setitem(tk.TILES, name, v)
    dec._plans.reset()
    hyp, state = dec.greedy(x.to(path.device), lengths)
    check(hyp, oracle(dec, x, lengths.tolist()), dec, x.shape[1])
    same_decodes(hyp, state, want, want_state)
    return hyp


def settings_agree(path, monkeypatch, seed, value: dict, base: dict, tiles: dict | None = None, N=18, **model):
    """A random model (``make_decoder(seed, **model)``) and batch (N rows of up to 10 frames) under TILES updated by
    ``tiles``: ``decodes_alike(value, base)``, and the state's chunks join as the whole."""
    for name, v in (tiles or {}).items():
        monkeypatch.setitem(decode_api.transducer_kernels.TILES, name, v)
    dec = make_decoder(seed, device=path.device, **model)
    g = torch.Generator().manual_seed(seed + N)
    x = torch.randn(N, 10, 6, generator=g)
    lengths = torch.randint(0, 11, (N,), generator=g)
    hyp = decodes_alike(path, monkeypatch, dec, x, lengths, value, base)
    chunks_join(path, dec, x, lengths, hyp, 4)
    path.check_ran()


def same_decodes(hyp, state, want, want_state):
    """Two decodes of one batch agree: the hypotheses (scores within rounding) and the returned states."""
    for name in ("tokens", "lengths", "frames", "durations"):
        a, b = getattr(hyp, name), getattr(want, name)
        assert (a is None and b is None) or torch.equal(a, b), name
    torch.testing.assert_close(hyp.scores, want.scores)
    assert torch.equal(state.time_jumps, want_state.time_jumps)
    for a, b in zip((*state.predictor, state.output), (*want_state.predictor, want_state.output), strict=True):
        torch.testing.assert_close(a, b)


KINDS = [
    dict(),
    dict(durations=[0, 1, 2, 3]),
    dict(durations=[1, 2, 4]),
    dict(stateless=2, activation="tanh"),
    dict(stateless=1, durations=[0, 2]),
    dict(stateless=3, activation="sigmoid", layers=1),
    dict(layers=1, max_symbols=1),
    dict(durations=[0, 1], max_symbols=1, blank=0),
]


@settings(deadline=None, max_examples=25)
@given(
    kind=st.sampled_from(KINDS),
    N=st.integers(1, 4),
    T=st.integers(1, 12),
    seed=st.integers(0, 9999),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    bias=st.sampled_from([-1.0, 1.5, 4.0]),
)
def test_matches_the_oracle(path, kind, N, T, seed, dtype, bias):
    if decode_api.transducer_kernels is not None:
        dtype = torch.float32  # the kernel's dtypes (float64 goes to the PyTorch path)
    dec = make_decoder(seed, blank_bias=bias, dtype=dtype, device=path.device, **kind)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, T, 6, generator=g)
    lengths = torch.randint(0, T + 1, (N,), generator=g)
    hyp, state = dec.greedy(x.to(path.device, dtype), lengths)
    check(hyp, oracle(dec, x, lengths.tolist()), dec, T)
    assert hyp.scores.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert state.frames.tolist() == lengths.tolist()
    assert (state.time_jumps >= 0).all()


@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_chunks_decode_as_the_whole(path, kind):
    dec = make_decoder(3, device=path.device, **kind)
    g = torch.Generator().manual_seed(1)
    N, T = 5, 30
    x = torch.randn(N, T, 6, generator=g).to(path.device)
    lengths = torch.tensor([30, 17, 0, 1, 29])
    whole, end = dec.greedy(x, lengths)
    state, parts, t0 = None, [], 0
    for t1 in (4, 5, 13, 22, 30):
        chunk_lengths = (lengths - t0).clamp(0, t1 - t0)
        hyp, state = dec.greedy(x[:, t0:t1], chunk_lengths, state)
        parts.append(hyp)
        t0 = t1
    for n in range(N):
        for field in ("tokens", "frames", "scores") + (("durations",) if dec.durations else ()):
            got = torch.cat([getattr(h, field)[n, : h.lengths[n]] for h in parts])
            want = getattr(whole, field)[n, : whole.lengths[n]]
            if field == "scores":  # the chunks' products round differently
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            else:
                assert torch.equal(got, want), (n, field)
    assert torch.equal(state.frames, end.frames) and torch.equal(state.time_jumps, end.time_jumps)
    torch.testing.assert_close(state.output, end.output)


@pytest.mark.kernels
@pytest.mark.parametrize("window", [1, 3])
@pytest.mark.parametrize("kind", [k for k in KINDS if not k.get("stateless")], ids=str)
def test_the_step_route_matches_the_oracle(path, kind, window, monkeypatch):
    """Float32 LSTM networks from GREEDY_STEP_ROWS utterances up decode through the beam search's steps at one
    hypothesis (the joint at ``window`` frames a step): the oracle's hypotheses, chunk by chunk as whole, from a
    given state too."""
    from speechkernels.decode import transducer_beam_kernels as tbk

    monkeypatch.setattr(decode_api, "GREEDY_STEP_ROWS", 3)
    monkeypatch.setattr(tbk, "GREEDY_WINDOW", window)
    calls = count_calls(monkeypatch, tbk, "greedy_search")
    dec = make_decoder(17, device=path.device, **kind)
    g = torch.Generator().manual_seed(17)
    x = torch.randn(3, 10, 6, generator=g)
    lengths = [10, 6, 0]
    whole, end = dec.greedy(x.to(path.device), lengths)
    assert len(calls) == 1
    if path.kernels and tbk.KEEP_SEARCH:
        assert dec._plans.beam[1].window == window
    check(whole, oracle(dec, x, lengths), dec, 10)
    hyp, state = dec.greedy(x[:, :4].to(path.device), [4, 4, 0])
    rest, state = dec.greedy(x[:, 4:].to(path.device), [6, 2, 0], state)
    assert len(calls) == 3
    for n in range(3):
        for field in ("tokens", "frames") + (("durations",) if dec.durations else ()):
            got = torch.cat([getattr(h, field)[n, : h.lengths[n]] for h in (hyp, rest)])
            assert torch.equal(got, getattr(whole, field)[n, : whole.lengths[n]]), (n, field)
    assert torch.equal(state.frames, end.frames) and torch.equal(state.time_jumps, end.time_jumps)
    dec.greedy(x[:2].to(path.device), [10, 6])  # fewer utterances: the one-launch kernel
    assert len(calls) == 3


def test_views_decode_as_copies(path):
    dec = make_decoder(5, durations=[0, 1, 2], device=path.device)
    base = torch.randn(9, 3, 6, device=path.device)
    x = base.transpose(0, 1)[:, 1:]  # [3, 8, 6], strided over the batch and offset
    lengths = torch.tensor([8, 5, 2, 7, 1], device=path.device)[::2]
    a, _ = dec.greedy(x, lengths)
    b, _ = dec.greedy(x.contiguous(), lengths.contiguous())
    for u, v in zip(a, b, strict=True):
        assert torch.equal(u, v)
    # a state of views (initial_state expands one utterance's), and a strided one (every other of a batch of 6)
    c, _ = dec.greedy(x, lengths, dec.initial_state(3))
    for name in ("tokens", "lengths", "frames", "durations"):
        assert torch.equal(getattr(a, name), getattr(c, name)), name
    # the start computed inside the kernel, or given: the same up to rounding
    torch.testing.assert_close(a.scores, c.scores, rtol=1e-6, atol=1e-6)
    _, wide = dec.greedy(torch.cat([x, x], 0)[[0, 3, 1, 4, 2, 5]], torch.cat([lengths, lengths])[[0, 3, 1, 4, 2, 5]])
    strided = sk.TransducerState(
        tuple(t[:, ::2] if t.dim() == 3 else t[::2] for t in wide.predictor),
        wide.output[::2],
        wide.time_jumps[::2],
        wide.frames[::2],
    )
    _, whole = dec.greedy(x, lengths)
    d, _ = dec.greedy(x, lengths, strided)
    e, _ = dec.greedy(
        x,
        lengths,
        sk.TransducerState(
            *(tuple(t.contiguous() for t in v) if isinstance(v, tuple) else v.contiguous() for v in strided[:4])
        ),
    )
    for u, v in zip(d, e, strict=True):
        assert torch.equal(u, v)


@pytest.mark.parametrize("kind", [dict(durations=[0, 1, 2]), dict(stateless=2)], ids=str)
def test_weights_changed_between_calls(path, kind, monkeypatch):
    """The decoder keeps what a call derives from its networks (the kernel's launch plans) between calls: each
    decode follows the networks as they are at the call, whether their values changed in place (through
    ``.data`` too), a tensor or a layer was replaced, or the networks moved; two calls in a row agree."""
    dec = make_decoder(21, device=path.device, **kind)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 9, 6, generator=g)
    lengths = [9, 4, 7]

    def decode_and_check(x=x):
        for _ in range(2):  # the second call reuses what the first kept
            hyp, _ = dec.greedy(x.to(path.device, next(dec.parameters()).dtype), lengths)
            check(hyp, oracle(dec, x, lengths), dec, 9)

    decode_and_check()
    if path.kernels:  # batches of ever new shapes: the decoder keeps at most MAX_PLANS plans, the latest
        monkeypatch.setattr(decode_api.transducer_kernels, "MAX_PLANS", 2)
        for T in (9, 3, 4, 5):
            dec.greedy(torch.randn(1, T, 6, device=path.device), validate=False)
        assert [key[:2] for key in dec._plans] == [(1, 4), (1, 5)]
    with torch.no_grad():
        dec.out.weight.data.mul_(-1.5)  # in place, no version counter bump
        dec.embedding.weight.data[:, 0] += 2.0
    decode_and_check()
    dec.enc.weight.data = torch.randn_like(dec.enc.weight)  # a new tensor under the same parameter
    decode_and_check()
    dec.pred.weight.data = dec.pred.weight.data.t().contiguous().t()  # the same values, a transposed layout
    decode_and_check()
    dec.out = torch.nn.Linear(8, dec.out.out_features).to(path.device)  # a layer replaced
    decode_and_check()
    copy.deepcopy(dec).greedy(x.to(path.device), lengths)  # a copy decodes too (nothing kept is copied)
    dec.double()
    decode_and_check()


def test_empty(path):
    dec = make_decoder(0, durations=[0, 1], device=path.device)
    hyp, state = dec.greedy(torch.zeros(0, 5, 6, device=path.device))
    assert hyp.tokens.shape == (0, 15) and state.frames.shape == (0,)
    hyp, state = dec.greedy(torch.zeros(2, 0, 6, device=path.device))
    assert hyp.tokens.shape == (2, 0) and hyp.lengths.tolist() == [0, 0] and state.frames.tolist() == [0, 0]
    x = torch.randn(3, 4, 6, device=path.device)  # and a batch whose utterances are all empty
    hyp, state = dec.greedy(x, [0, 0, 0])
    assert hyp.lengths.tolist() == [0, 0, 0] and (hyp.tokens == -1).all() and state.frames.tolist() == [0, 0, 0]


def nemo_modules(V=6, P=5, J=7, D=3, dropout=True, activation=torch.nn.ReLU):
    """Stand-ins with the attributes of NeMo's RNNTDecoder and RNNTJoint (the blank is the last class)."""
    decoder = torch.nn.Module()
    decoder.prediction = torch.nn.ModuleDict(
        {"embed": torch.nn.Embedding(V, P, padding_idx=V - 1), "dec_rnn": torch.nn.Module()}
    )
    decoder.prediction["dec_rnn"].lstm = torch.nn.LSTM(P, P, 2)
    decoder.blank_idx = V - 1
    joint = torch.nn.Module()
    joint.enc, joint.pred = torch.nn.Linear(4, J), torch.nn.Linear(P, J)
    layers = [activation()] + ([torch.nn.Dropout(0.1)] if dropout else []) + [torch.nn.Linear(J, V + D)]
    joint.joint_net = torch.nn.Sequential(*layers)
    joint.num_classes_with_blank, joint.num_extra_outputs = V + D, D  # (NeMo's count: the durations included)
    return decoder, joint


def test_from_nemo():
    torch.manual_seed(0)
    decoder, joint = nemo_modules()
    dec = sk.TransducerDecoder.from_nemo(decoder, joint, durations=[0, 1, 2])
    assert (dec.blank, dec.vocab_size, dec.durations, dec.activation) == (5, 6, (0, 1, 2), "relu")
    assert dec.lstm is decoder.prediction["dec_rnn"].lstm and dec.out is joint.joint_net[-1]
    x, lengths = torch.randn(3, 9, 4), [9, 4, 6]
    hyp, _ = dec.greedy(x, lengths)
    check(hyp, oracle(dec, x, lengths), dec, 9)
    rnnt = sk.TransducerDecoder.from_nemo(*nemo_modules(D=0, dropout=False, activation=torch.nn.Tanh))
    assert rnnt.durations is None and rnnt.activation == "tanh" and rnnt.max_symbols_per_frame == 10


def test_from_nemo_refusals():
    decoder, joint = nemo_modules()
    with pytest.raises(ValueError, match="needs durations"):
        sk.TransducerDecoder.from_nemo(decoder, joint)
    with pytest.raises(ValueError, match="durations has 2 entries but joint.num_extra_outputs=3"):
        sk.TransducerDecoder.from_nemo(decoder, joint, durations=[0, 1])
    del decoder.prediction["dec_rnn"].lstm
    with pytest.raises(ValueError, match=r"decoder has no decoder\.prediction\[dec_rnn\]\.lstm"):
        sk.TransducerDecoder.from_nemo(decoder, joint, durations=[0, 1, 2])
    decoder, joint = nemo_modules()
    joint.joint_net = torch.nn.Sequential(torch.nn.GELU(), torch.nn.Linear(7, 9))
    with pytest.raises(ValueError, match="unsupported layout.*GELU"):
        sk.TransducerDecoder.from_nemo(decoder, joint, durations=[0, 1, 2])
    decoder, joint = nemo_modules()
    joint.num_classes_with_blank = 6  # the tokens alone
    with pytest.raises(ValueError, match=r"num_classes_with_blank=6 \(tokens with the blank, and 3 durations\) but "
                       r"joint_net's last Linear has 9 rows"):  # fmt: skip
        sk.TransducerDecoder.from_nemo(decoder, joint, durations=[0, 1, 2])
    decoder, joint = nemo_modules()
    del joint.num_classes_with_blank
    with pytest.raises(ValueError, match="joint has no joint.num_classes_with_blank"):
        sk.TransducerDecoder.from_nemo(decoder, joint, durations=[0, 1, 2])


def test_from_icefall():
    """icefall's Decoder (context 2, grouped conv, blank 0) and Joiner (tanh): one symbol per frame."""
    torch.manual_seed(1)
    decoder = types.SimpleNamespace(
        embedding=torch.nn.Embedding(9, 8),
        conv=torch.nn.Conv1d(8, 8, 2, groups=2, bias=False),
        context_size=2,
        blank_id=0,
    )
    joiner = types.SimpleNamespace(
        encoder_proj=torch.nn.Linear(4, 6), decoder_proj=torch.nn.Linear(8, 6), output_linear=torch.nn.Linear(6, 9)
    )
    with torch.no_grad():
        joiner.output_linear.weight.mul_(3)
    dec = sk.TransducerDecoder.from_icefall(decoder, joiner)
    assert (dec.blank, dec.max_symbols_per_frame, dec.activation, dec.durations) == (0, 1, "tanh", None)
    x, lengths = torch.randn(4, 11, 4), [11, 3, 0, 10]
    hyp, _ = dec.greedy(x, lengths)
    want = oracle(dec, x, lengths)
    check(hyp, want, dec, 11)
    for _, frames, _, _ in want:  # at most one symbol per frame
        assert len(set(frames)) == len(frames)
    del decoder.blank_id
    with pytest.raises(ValueError, match="decoder has no decoder.blank_id"):
        sk.TransducerDecoder.from_icefall(decoder, joiner)


def test_from_joint():
    torch.manual_seed(2)
    joint = sk.TDTJointLoss(4, 6, 8, 10, durations=[0, 1, 2, 3])
    predictor = sk.LSTMPredictor(10, 5, 6, num_layers=2)
    dec = sk.TransducerDecoder.from_joint(joint, predictor)
    assert (dec.blank, dec.vocab_size, dec.durations) == (9, 10, (0, 1, 2, 3))
    x = torch.randn(2, 7, 4)
    hyp, _ = dec.greedy(x)
    check(hyp, oracle(dec, x, [7, 7]), dec, 7)
    # the predictor's training outputs are the decoder's prediction network states, start symbol first
    targets = torch.tensor([[3, 1, 4], [2, -1, -1]])
    seq = predictor(targets)
    w = dec.weights()
    state = dec.initial_state(2)
    torch.testing.assert_close(seq[:, 0], state.output)
    out, _ = decode_api.transducer_greedy_reference.__globals__["predict"](w, targets[:, 0], state.predictor)
    torch.testing.assert_close(seq[:, 1], out)
    rnnt = sk.TransducerDecoder.from_joint(sk.RNNTJointLoss(4, 6, 8, 10, blank=0), sk.StatelessPredictor(10, 6, 2))
    assert rnnt.blank == 0 and rnnt.durations is None and rnnt.context_size == 2
    with pytest.raises(ValueError, match="multi-blank"):
        sk.TransducerDecoder.from_joint(sk.MultiblankJointLoss(4, 6, 8, 10, big_blank_durations=[2]), predictor)


def test_stateless_predictor_matches_the_decoder():
    torch.manual_seed(3)
    predictor = sk.StatelessPredictor(7, 8, context_size=3, blank=0)
    dec = sk.TransducerDecoder.from_joint(sk.RNNTJointLoss(4, 8, 5, 7, blank=0), predictor)
    targets = torch.tensor([[3, 1, 4, 6]])
    seq = predictor(targets)
    state = dec.initial_state(1)
    torch.testing.assert_close(seq[:, 0], state.output)
    predict = decode_api.transducer_greedy_reference.__globals__["predict"]
    ctx = state.predictor
    for u in range(4):
        out, ctx = predict(dec.weights(), targets[:, u], ctx)
        torch.testing.assert_close(seq[:, u + 1], out)


def test_refusals():
    dec = make_decoder(0, durations=[0, 1])
    x = torch.randn(2, 5, 6)
    with pytest.raises(ValueError, match=r"encoder_out must be \[N, T, E=6\]"):
        dec.greedy(torch.randn(2, 5, 7))
    with pytest.raises(ValueError, match=r"encoder_lengths\[1\]=6 is outside \[0, T=5\]"):
        dec.greedy(x, [5, 6])
    with pytest.raises(ValueError, match="encoder_lengths has 3 entries"):
        dec.greedy(x, [5, 5, 5])
    with pytest.raises(ValueError, match="encoder_out must be float16"):
        dec.greedy(x.long())
    with pytest.raises(ValueError, match="state must be a TransducerState"):
        dec.greedy(x, state=(1, 2))
    _, state = dec.greedy(x)
    with pytest.raises(ValueError, match=r"state.predictor must be \(2, 3, 6\)"):
        dec.greedy(torch.randn(3, 5, 6), state=state)
    with pytest.raises(ValueError, match="validate must be True or False"):
        dec.greedy(x, validate=1)
    e, lin = torch.nn.Embedding(5, 4), torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match=r"blank=5 is outside \[-V, V\) for the V=5"):
        sk.TransducerDecoder(e, lin, lin, torch.nn.Linear(4, 5), blank=5)
    with pytest.raises(ValueError, match="durations must be distinct"):
        sk.TransducerDecoder(e, lin, lin, torch.nn.Linear(4, 7), durations=[0, 0])
    with pytest.raises(ValueError, match="max_symbols_per_frame must be >= 1"):
        sk.TransducerDecoder(e, lin, lin, torch.nn.Linear(4, 5), max_symbols_per_frame=0)
    with pytest.raises(ValueError, match="pred.in_features=3 does not match"):
        sk.TransducerDecoder(e, lin, torch.nn.Linear(3, 4), torch.nn.Linear(4, 5))
    with pytest.raises(ValueError, match="activation must be one of"):
        sk.TransducerDecoder(e, lin, lin, torch.nn.Linear(4, 5), activation="gelu")
    with pytest.raises(ValueError, match="share one dtype"):
        sk.TransducerDecoder(e, lin, lin, torch.nn.Linear(4, 5).double())
    with pytest.raises(ValueError, match="batch_size must be >= 0"):
        dec.initial_state(-1)


def test_predictor_refusals():
    with pytest.raises(ValueError, match="vocab_size must be >= 1"):
        sk.LSTMPredictor(0, 4, 4)
    with pytest.raises(ValueError, match=r"blank=9 is outside \[-V, V\)"):
        sk.LSTMPredictor(5, 4, 4, blank=9)
    with pytest.raises(ValueError, match="context_size must be >= 1"):
        sk.StatelessPredictor(5, 8, context_size=0)
    with pytest.raises(ValueError, match=r"targets must be an integer tensor \[N, U\]"):
        sk.LSTMPredictor(5, 4, 4)(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="joint has no enc"):
        sk.TransducerDecoder.from_joint(torch.nn.Linear(2, 2), sk.LSTMPredictor(5, 4, 4))


@pytest.mark.parametrize("kind", [dict(durations=[0, 1, 2]), dict(stateless=2)], ids=str)
def test_a_batch_past_the_small_tiles(path, kind):
    """More rows than the kernel's FMA tiles take (tensor-core tiles), ragged."""
    dec = make_decoder(11, device=path.device, **kind)
    g = torch.Generator().manual_seed(4)
    N, T = 19, 7
    x = torch.randn(N, T, 6, generator=g)
    lengths = torch.randint(0, T + 1, (N,), generator=g)
    hyp, _ = dec.greedy(x.to(path.device), lengths)
    check(hyp, oracle(dec, x, lengths.tolist()), dec, T)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("kind", [{}, dict(durations=[0, 1, 2, 3]), dict(stateless=2, activation="tanh")], ids=str)
@pytest.mark.parametrize("N", [3, 9])  # the kernel's FMA tiles, tensor-core tiles
def test_bfloat16_networks_decide_as_float64_but_near_ties(monkeypatch, device, kind, N):
    """bfloat16 weights (on the GPU the kernel with its 16-bit states, projections and logits; on the CPU the
    PyTorch path, the interpreter having no bfloat16): every utterance equals the float64 oracle, or its first
    decision that differs is a near-tie (the float64 gap below 2^-7 of the largest logit)."""
    from speechkernels.bench.decode import first_divergence, utterances

    launches = []
    if decode_api.transducer_kernels is not None:
        count_calls(monkeypatch, decode_api.transducer_kernels, "transducer_greedy", launches)
    dec = make_decoder(3, J=40, P=20, dtype=torch.bfloat16, device=device, **kind)
    g = torch.Generator().manual_seed(N)
    T = 10
    x = torch.randn(N, T, 6, generator=g)
    lengths = torch.randint(0, T + 1, (N,), generator=g)
    hyp, _ = dec.greedy(x.to(device, torch.bfloat16), lengths)
    assert bool(launches) == (device == "cuda")
    ours = utterances(hyp)
    equal = 0
    for n, (tokens, frames, durations, _scores) in enumerate(oracle(dec, x, lengths.tolist())):
        same = ours[n][0] == tokens and ours[n][1] == frames
        if same and (dec.durations is None or ours[n][2] == durations):
            equal += 1
            continue
        div = first_divergence(dec, x[n].to(device), int(lengths[n]), ours[n])
        assert div is not None and div["margin"] is not None and div["margin"] < 2.0**-7, (n, div)
    assert equal >= N - 1, equal


def test_blank_duration_margins():
    """The bench's replay where ours parts from float64 inside a run of TDT blanks (their durations are not in a
    hypothesis): per float64 blank frame, its duration's margin over the best one landing elsewhere in the range."""
    from speechkernels.bench.decode import skip_margins

    D = torch.tensor([0.1, 0.5, 0.45, -1.0], dtype=torch.float64)  # durations 0..3; float64 takes 1 (lands on 3)
    assert skip_margins([(2, D, 1.0)], [0, 1, 2, 3], 4, 6) == [pytest.approx(0.05)]  # 2 and 3 land on 4 and 5
    assert skip_margins([(2, D, 2.0)], [0, 1, 2, 3], 5, 6) == [pytest.approx(0.75)]  # only 3 lands in [5, 6]
    assert skip_margins([(2, D, 1.0)], [0, 1, 2, 3], 0, 3) == []  # 0 lands where 1 does: no other path
    assert skip_margins([(2, D, 1.0), (3, D.flip(0), 1.0)], [0, 1, 2, 3], 4, 9) == [pytest.approx(0.05)] * 2


def test_replay_of_a_hypothesis_that_parts_inside_blanks():
    """The bench's float64 replay: float64's own hypothesis replays to None; one whose first label comes a frame
    later than float64's parts at that label or at an earlier blank's duration, with a margin."""
    from speechkernels.bench.decode import first_divergence

    dec = make_decoder(5, dtype=torch.float64, durations=[0, 1, 2, 3])
    g = torch.Generator().manual_seed(2)
    T, seen = 12, 0
    x = torch.randn(6, T, 6, generator=g, dtype=torch.float64)
    for n, (tokens, frames, durations, _) in enumerate(oracle(dec, x, [T] * 6)):
        assert first_divergence(dec, x[n], T, (tokens, frames, durations)) is None
        if tokens and frames[0] + 1 < T and (len(frames) == 1 or frames[1] > frames[0] + 1):
            later = [frames[0] + 1, *frames[1:]]
            div = first_divergence(dec, x[n], T, (tokens, later, durations))
            assert div["what"] in ("label", "label, or an earlier blank's duration", "blank duration"), div
            assert div["margin"] is not None and div["margin"] >= 0, div
            seen += 1
    assert seen > 0


SPLITS = [("lstm", {}), ("lstm", dict(durations=[0, 1, 2, 3], layers=3)), ("lstm", dict(lstm_bias=False, layers=1))]
SPLITS += [("joint", {}), ("joint", dict(durations=[0, 1, 2, 3])), ("joint", dict(stateless=2, activation="tanh"))]


@pytest.mark.kernels
@pytest.mark.parametrize("split, kind", SPLITS, ids=str)
def test_split_over_k(path, monkeypatch, split, kind):
    """Tensor-core tiles split over ranges of K, forced on small models with K blocks of 16: the LSTM layers' (the
    input's and the own output's columns concatenated; four ranges of 6 blocks, one straddling the input and the
    output, one empty; partial gates summed in a fixed order after a barrier) and the joint's (three ranges of a
    joint width of 40; partial logits summed likewise, in tiles of 4 rows)."""
    monkeypatch.setitem(decode_api.transducer_kernels.TILES, "dot_bk", 16)
    if split == "lstm":
        monkeypatch.setitem(decode_api.transducer_kernels.TILES, "dot_lstm_splits_min", 4)
        dec, seed = make_decoder(13, P=40, device=path.device, **kind), 6
    else:
        monkeypatch.setitem(decode_api.transducer_kernels.TILES, "dot_joint_splits_min", 3)
        monkeypatch.setitem(decode_api.transducer_kernels.TILES, "dot_sum_rows", 4)  # the sums' row blocks
        dec, seed = make_decoder(12, J=40, device=path.device, **kind), 5
    g = torch.Generator().manual_seed(seed)
    N, T = 9, 8
    x = torch.randn(N, T, 6, generator=g)
    lengths = torch.randint(0, T + 1, (N,), generator=g)
    hyp, _ = dec.greedy(x.to(path.device), lengths)
    check(hyp, oracle(dec, x, lengths.tolist()), dec, T)
    path.check_ran()


WINDOW_KINDS = [{}, dict(durations=[0, 1, 2, 3]), dict(durations=[1, 2, 4]), dict(stateless=2, activation="tanh")]
WINDOW_KINDS += [dict(max_symbols=1, layers=1), dict(durations=[0, 2], max_symbols=2, blank=0)]


@pytest.mark.kernels
@pytest.mark.parametrize("kind", WINDOW_KINDS, ids=str)
@pytest.mark.parametrize("N, spec", [(3, 3), (18, 4), (18, 2)])  # FMA tiles; tensor-core tiles
def test_a_window_of_frames(path, monkeypatch, kind, N, spec):
    """TILES["window"]: the joint at SPEC frames of each row per step (the prediction network's output fixed), the
    decision walking them as the label-looping rule does: the oracle's hypotheses and state, and those of one frame
    per step, at ragged lengths (windows past an utterance's end) and from a state."""
    dec = make_decoder(21, device=path.device, **kind)
    g = torch.Generator().manual_seed(N + spec)
    T = 11
    x = torch.randn(N, T, 6, generator=g)
    lengths = torch.randint(0, T + 1, (N,), generator=g)
    hyp = decodes_alike(path, monkeypatch, dec, x, lengths, {"window": spec}, {"window": 1})
    chunks_join(path, dec, x, lengths, hyp, 5)
    path.check_ran()


@pytest.mark.kernels
@pytest.mark.parametrize("kind", [dict(stateless=2, activation="tanh"), dict(stateless=3, durations=[0, 2])], ids=str)
@pytest.mark.parametrize("N", [3, 18])  # FMA tiles; tensor-core tiles
def test_stateless_input_formed_by_the_owners(path, monkeypatch, kind, N):
    """TILES["stateless_input"]: a stateless network's input formed once per emitting row by its owner program
    before the projection: the oracle's hypotheses and state, those of the projection's own gathers, chunk by
    chunk as whole."""
    settings_agree(path, monkeypatch, 23, {"stateless_input": True}, {"stateless_input": False}, N=N, **kind)


@pytest.mark.kernels
@pytest.mark.parametrize("kind", [{}, dict(durations=[0, 1, 2, 3]), dict(stateless=2, activation="tanh"),
                                  dict(activation="sigmoid", layers=1)], ids=str)  # fmt: skip
@pytest.mark.parametrize("spec", [1, 4])
def test_joint_hidden_formed_once(path, monkeypatch, kind, spec):
    """TILES["hidden_pairs"] (tensor-core tiles): the joint's hidden layer of each (row, frame) pair formed once per
    step, in column tiles narrower than the joint, before the products: the oracle's hypotheses and state, those
    of the hidden layer formed in the products' K loops, chunk by chunk as whole."""
    tiles = {"window": spec, "hidden_cols": 16}
    settings_agree(path, monkeypatch, 25, {"hidden_pairs": 1}, {"hidden_pairs": None}, tiles, J=40, **kind)


@pytest.mark.kernels
@pytest.mark.parametrize("kind", [{}, dict(durations=[0, 1, 2, 3]), dict(stateless=2, activation="tanh")], ids=str)
def test_float32_products_of_split_operands(path, monkeypatch, kind):
    """TILES["split_f32"] (tensor-core tiles, float32): the joint's hidden layer and a stateless network's input
    stored in TF32 halves as they are formed, the weights split in the kernel: the oracle's hypotheses and state,
    those of the operands split in the K loops, chunk by chunk as whole."""
    tiles = {"hidden_pairs": 1, "window": 2}
    settings_agree(path, monkeypatch, 27, {"split_f32": True}, {"split_f32": False}, tiles, J=40, P=36, **kind)


@pytest.mark.kernels
@pytest.mark.parametrize("kind", [{}, dict(durations=[0, 1, 2, 3]), dict(stateless=2, activation="tanh")], ids=str)
def test_projection_split_over_k(path, monkeypatch, kind):
    """TILES["dot_proj_splits"] (with the joint's hidden layer formed once): the projection's tiles over ranges of
    K, their partial sums added by the hidden layer's phase (the first with the bias; a state's projection as the
    first): the oracle's hypotheses and state, those of one range, chunk by chunk as whole."""
    three, one = ({"dot_proj_splits": n, "dot_proj_splits_min": n} for n in (3, 1))
    settings_agree(path, monkeypatch, 29, three, one, {"hidden_pairs": 1}, J=20, P=70, **kind)


@pytest.mark.kernels
@pytest.mark.parametrize("kind", [{}, dict(durations=[0, 1, 2, 3], layers=3), dict(layers=1, activation="sigmoid")],
                         ids=str)  # fmt: skip
@pytest.mark.parametrize("splits", [1, 2])
def test_float32_lstm_products_of_split_operands(path, monkeypatch, kind, splits):
    """TILES["split_f32_lstm"] (tensor-core tiles, float32): an LSTM's weights and embedding split in TF32 halves
    in the kernel, each hidden state stored with its halves by its cell, the layers' products (in one range of K or
    split) and the projection over them: the oracle's hypotheses and state, those of the operands split in the K
    loops, chunk by chunk as whole."""
    value, base = ({"split_f32_lstm": on} for on in (True, False))
    tiles = {"dot_lstm_splits_min": splits, "window": 2}
    settings_agree(path, monkeypatch, 31, value, base, tiles, J=40, P=36, **kind)


def chunks_join(path, dec, x, lengths, whole, cut):
    """Decoding frames [0, cut) and then the rest from the state gives ``whole``'s tokens and frames."""
    first, state = dec.greedy(x[:, :cut].to(path.device), lengths.clamp(max=cut))
    rest, _ = dec.greedy(x[:, cut:].to(path.device), (lengths - cut).clamp(min=0), state)
    for n in range(x.shape[0]):
        a, b = int(first.lengths[n]), int(rest.lengths[n])
        for name in ("tokens", "frames"):
            joined = getattr(first, name)[n, :a].tolist() + getattr(rest, name)[n, :b].tolist()
            assert joined == getattr(whole, name)[n, : int(whole.lengths[n])].tolist(), (n, name)


COMPACT_KINDS = [{}, dict(durations=[0, 1, 2, 3], layers=3), dict(stateless=2, activation="tanh"), "lstm splits"]


@pytest.mark.kernels
@pytest.mark.parametrize("kind", COMPACT_KINDS, ids=str)
@pytest.mark.parametrize("N", [3, 18])  # FMA tiles; tensor-core tiles of 16 rows (two row blocks)
def test_prediction_network_over_the_emitting_rows(path, monkeypatch, kind, N):
    """TILES["compact"]: the prediction network's tiles cover only the rows that emitted (listed by the decision),
    the others' hidden states carried apart: the oracle's hypotheses, and the hypotheses and final state of the
    tiles over every row."""
    tk = decode_api.transducer_kernels
    P = 5
    if kind == "lstm splits":  # with the LSTM's K split (partial gates summed over the listed rows)
        monkeypatch.setitem(tk.TILES, "dot_bk", 16)
        monkeypatch.setitem(tk.TILES, "dot_lstm_splits_min", 4)
        kind, P = {}, 40
    dec = make_decoder(17, P=P, device=path.device, **kind)
    g = torch.Generator().manual_seed(N)
    T = 10
    x = torch.randn(N, T, 6, generator=g)
    lengths = torch.randint(0, T + 1, (N,), generator=g)
    decodes_alike(path, monkeypatch, dec, x, lengths, {"compact": True})


@pytest.mark.parametrize("kind", [dict(layers=3, lstm_bias=False), dict(layers=4, durations=[0, 1, 2])], ids=str)
@pytest.mark.parametrize("N", [3, 18])
def test_lstm_layouts(path, kind, N):
    """An LSTM without biases, and the deepest one the kernel takes (its layers read where they are)."""
    dec = make_decoder(8, device=path.device, **kind)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(N, 6, 6, generator=g)
    lengths = torch.randint(0, 7, (N,), generator=g)
    hyp, _ = dec.greedy(x.to(path.device), lengths)
    check(hyp, oracle(dec, x, lengths.tolist()), dec, 6)


@pytest.mark.parametrize("dev", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_an_lstm_deeper_than_the_kernel_takes(dev, monkeypatch):
    """More LSTM layers than the kernel's MAX_LAYERS: the PyTorch path, the same results."""
    kernels = decode_api.transducer_kernels
    if dev == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if kernels is not None:
        monkeypatch.setattr(kernels, "transducer_greedy", lambda *a, **k: pytest.fail("the kernel ran"))
    dec = make_decoder(9, layers=(kernels.MAX_LAYERS if kernels else 4) + 1, device=dev)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 5, 6, generator=g)
    hyp, _ = dec.greedy(x.to(dev), [5, 2, 4])
    check(hyp, oracle(dec, x, [5, 2, 4]), dec, 5)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", [dict(durations=[0, 1, 2, 3]), dict(stateless=2), dict(layers=1)], ids=str)
@pytest.mark.parametrize("N", [2, 9])
@pytest.mark.parametrize("step_route", [False, True])
def test_captured_in_a_cuda_graph(kind, N, step_route, monkeypatch):
    """A decode with validate=False (no host synchronisation) captured in a CUDA graph gives, replay after replay
    on new encoder outputs and lengths copied into the captured inputs, the eager decode's hypotheses (with the
    step route on, the eager decode takes it and the capture the one-launch kernel)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if step_route:
        monkeypatch.setattr(decode_api, "GREEDY_STEP_ROWS", 1)
    dec = make_decoder(13, device="cuda", **kind)
    T = 11
    x = torch.randn(N, T, 6, device="cuda")
    lengths = torch.full((N,), T, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up: compilation and first allocations outside the capture
            dec.greedy(x, lengths, validate=False)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured, _ = dec.greedy(x, lengths, validate=False)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        x.copy_(torch.randn(N, T, 6, generator=g))
        lengths.copy_(torch.randint(0, T + 1, (N,), generator=g))
        graph.replay()
        want, _ = dec.greedy(x.clone(), lengths.clone())
        for name in ("tokens", "lengths", "frames", "durations"):
            a, b = getattr(captured, name), getattr(want, name)
            assert (a is None and b is None) or torch.equal(a, b), (seed, name)
        torch.testing.assert_close(captured.scores, want.scores)


@pytest.mark.gpu
@pytest.mark.parametrize("step_route", [False, True])
def test_threads_decoding_on_one_stream(step_route, monkeypatch):
    """Threads decoding with one decoder on one stream (each call zeroes its scratch, then launches; two threads'
    calls interleave; on the step route the decoder's kept search is held by one call at a time): every call gets
    the hypotheses it gets alone."""
    import threading

    if step_route:
        monkeypatch.setattr(decode_api, "GREEDY_STEP_ROWS", 1)
    dec = make_decoder(31, device="cuda", durations=[0, 1, 2])
    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(3, 12, 6, generator=g).cuda() for _ in range(16)]
    want = [dec.greedy(x)[0] for x in xs]
    got = [None] * len(xs)

    def work(k: int) -> None:
        for _ in range(5):
            got[k] = dec.greedy(xs[k], validate=False)[0]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        for name in ("tokens", "lengths", "frames", "durations"):
            assert torch.equal(getattr(a, name), getattr(b, name)), (k, name)


def test_scratch_pieces_of_mixed_dtypes():
    """The kernel's scratch: pieces of 16-, 32- and 64-bit dtypes carved from one 32-bit allocation, each the size
    asked in its own elements, starting 64-byte aligned, none overlapping another."""
    tk = decode_api.transducer_kernels
    if tk is None:
        pytest.skip("Triton missing")
    sizes, dtypes = (7, 5, 3, 33, 1), (torch.bfloat16, torch.float32, torch.int64, torch.bfloat16)
    pieces = tk._Layout(torch.int32, [(n,) for n in sizes], dtypes).carve(torch.zeros, "cpu")[1]
    base = pieces[-1].untyped_storage().data_ptr()
    spans = []
    for p, n, d in zip(pieces, sizes, (*dtypes, torch.int32), strict=True):
        assert p.dtype == d and p.numel() == n and p.untyped_storage().data_ptr() == base
        assert p.data_ptr() % 64 == 0
        spans.append((p.data_ptr(), p.data_ptr() + n * d.itemsize))
    spans.sort()
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False))
    pieces[0].fill_(1.5)  # a 16-bit piece written leaves its neighbours zero
    assert pieces[0].tolist() == [1.5] * 7 and not pieces[1].any() and not pieces[2].any()
