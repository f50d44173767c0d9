"""Greedy CTC decoding against a frame-by-frame Python oracle and torch's argmax + unique_consecutive: tokens,
frames and scores for ragged lengths, every input layout, views, empty batches, NaN, and the refusals."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import speechkernels as sk
from speechkernels.decode import api as decode_api
from speechkernels.decode.reference import ctc_greedy_decode_reference


def oracle(x: torch.Tensor, lengths: list[int], blank: int, logits: bool):
    """One sample at a time, one frame at a time, in float64."""
    out = []
    for n, L in enumerate(lengths):
        lp = x[n].double().log_softmax(-1) if logits else x[n].double()
        tokens, frames, scores, prev = [], [], [], -1
        for t in range(L):
            c = int(torch.argmax(x[n, t]))
            if c != blank and c != prev:
                tokens.append(c)
                frames.append(t)
                scores.append(float(lp[t, c]))
            prev = c
        out.append((tokens, frames, scores))
    return out


def check(hyp, want, T):
    assert hyp.tokens.shape == hyp.frames.shape == hyp.scores.shape == (len(want), T)
    assert hyp.durations is None
    for n, (tokens, frames, scores) in enumerate(want):
        k = len(tokens)
        assert int(hyp.lengths[n]) == k
        assert hyp.tokens[n, :k].tolist() == tokens and (hyp.tokens[n, k:] == -1).all()
        assert hyp.frames[n, :k].tolist() == frames and (hyp.frames[n, k:] == -1).all()
        torch.testing.assert_close(
            hyp.scores[n, :k].double(), torch.tensor(scores, dtype=torch.float64), rtol=1e-6, atol=1e-6
        )
        assert (hyp.scores[n, k:] == 0).all()


@settings(deadline=None)
@given(
    N=st.integers(1, 4),
    T=st.integers(1, 30),
    C=st.integers(2, 6),
    logits=st.booleans(),
    seed=st.integers(0, 9999),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_matches_the_oracle(path, N, T, C, logits, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, T, C, generator=g, dtype=dtype) * 3  # few classes: repeats and blanks between them
    if not logits:
        x = x.log_softmax(-1)
    lengths = torch.randint(0, T + 1, (N,), generator=g)
    blank = int(torch.randint(0, C, (), generator=g))
    path.launches.clear()
    hyp = sk.ctc_greedy_decode(x.to(path.device), lengths, blank, logits=logits)
    assert hyp.scores.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert hyp.tokens.device.type == path.device.type
    check(
        hyp.__class__(*(v.cpu() if v is not None else None for v in hyp)), oracle(x, lengths.tolist(), blank, logits), T
    )
    assert bool(path.launches) == (path.name != "torch" and dtype == torch.float32)  # float64: the PyTorch path


@pytest.mark.parametrize("C", [3, 700, 2500])
def test_kernel_blocks_of_classes_and_frames(path, C):
    """Class counts past one block of classes, the first NaN of a frame, ties (the first index wins), -inf."""
    g = torch.Generator().manual_seed(C)
    x = torch.randn(2, 21, C, generator=g)
    x[0, 3, C - 1] = float("nan")
    x[0, 3, C // 2] = float("nan")
    x[1, 4] = float("-inf")
    x[1, 5, :] = 1.0  # a tie over every class: class 0
    x[1, 6, C - 2] = x[1, 6].max() + 1.0
    x[1, 6, C - 1] = x[1, 6, C - 2]
    want = oracle(x, [21, 19], 0, logits=True)
    path.launches.clear()
    hyp = sk.ctc_greedy_decode(x.to(path.device), [21, 19], logits=True)
    got = hyp.__class__(*(v.cpu() if v is not None else None for v in hyp))
    assert got.tokens[0].tolist()[: got.lengths[0]] == want[0][0]
    assert got.frames[1].tolist()[: got.lengths[1]] == want[1][1]
    finite = [k for k, v in enumerate(want[0][2]) if v == v]
    assert torch.isnan(got.scores[0, : got.lengths[0]]).sum() == len(want[0][2]) - len(finite)
    check(got.__class__(got.tokens[1:], got.lengths[1:], got.frames[1:], got.scores[1:]), want[1:], 21)
    assert bool(path.launches) == (path.name != "torch")


@pytest.mark.parametrize("logits", [False, True])
def test_compaction_across_blocks_of_frames(path, monkeypatch, logits):
    """The compaction in blocks of 16 frames (T = 70: four full blocks and a partial one): runs across block
    boundaries, a label, a blank and the same label (two tokens), a token at every frame, ragged lengths (0, T, a
    block's end and the next frame, in between) with classes past them that must be ignored; against the float64
    reference, tokens, frames, lengths and padding exactly, scores exactly for log-probabilities."""
    if decode_api.kernels is not None:
        monkeypatch.setattr(decode_api.kernels, "COMPACT_BLOCK_T", 16)
    N, T, C, blank = 6, 70, 4, 2
    g = torch.Generator().manual_seed(3)
    best = torch.randint(0, C, (N, T), generator=g)
    best[1] = torch.tensor([0, 1, 3])[torch.arange(T) % 3]  # no blank, no repeat: a token at every frame
    best[2, :33] = blank
    best[2, 12:21] = 1  # a run across frames 15 | 16
    best[2, 21:24] = torch.tensor([3, blank, 3])
    best[2, 30:33] = torch.tensor([3, 3, 0])  # the last live frame a token
    best[3, :17] = blank
    best[3, 14:17] = 3  # a run from the first block into the second frame past it (length 17)
    best[4] = blank
    best[4, 31:33] = 1  # runs across frames 31 | 32 and 47 | 48, the last frames a run
    best[4, 47:49] = 0
    best[4, 60:] = 3
    lengths = torch.tensor([0, T, 33, 17, T, 45])
    x = torch.randn(N, T, C, generator=g) + 6 * torch.nn.functional.one_hot(best, C)
    if not logits:
        x = x.log_softmax(-1)
    path.launches.clear()
    hyp = sk.ctc_greedy_decode(x.to(path.device), lengths.to(path.device), blank, logits=logits)
    want = ctc_greedy_decode_reference(x.double(), lengths, blank, logits)
    assert want.lengths.tolist()[:5] == [0, T, 5, 1, 3]
    for name in ("tokens", "lengths", "frames"):
        assert torch.equal(getattr(hyp, name).cpu(), getattr(want, name)), name
    assert hyp.scores.dtype == torch.float32
    tol = dict(rtol=1e-6, atol=1e-6) if logits else dict(rtol=0, atol=0)
    torch.testing.assert_close(hyp.scores.cpu().double(), want.scores, **tol)
    assert bool(path.launches) == (path.name != "torch")


def test_agrees_with_argmax_and_unique_consecutive():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 40, 5, generator=g).log_softmax(-1)
    hyp = sk.ctc_greedy_decode(x)
    for n in range(8):
        runs = torch.unique_consecutive(x[n].argmax(-1))
        want = runs[runs != 0].tolist()
        assert hyp.tokens[n, : hyp.lengths[n]].tolist() == want


def test_layouts_and_views_give_the_same_hypotheses(path):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 12, 4, generator=g).to(path.device)
    base = sk.ctc_greedy_decode(x, [12, 7, 0], 1, logits=True)
    time_first = sk.ctc_greedy_decode(x.transpose(0, 1), [12, 7, 0], 1, batch_first=False, logits=True)
    strided = torch.full((3, 12, 9), float("nan"), device=path.device)[..., ::2]
    strided[..., :4] = x
    viewed = sk.ctc_greedy_decode(strided[..., :4], torch.tensor([[12, 0], [7, 0], [0, 0]])[:, 0], 1, logits=True)
    for other in (time_first, viewed):
        for a, b in zip(base[:4], other[:4], strict=True):
            assert torch.equal(a, b)
    one = sk.ctc_greedy_decode(x[1], 7, 1, logits=True)
    assert int(one.lengths) == int(base.lengths[1]) and torch.equal(one.tokens, base.tokens[1])


def test_empty_inputs_and_nan():
    assert sk.ctc_greedy_decode(torch.zeros(0, 5, 3)).tokens.shape == (0, 5)
    hyp = sk.ctc_greedy_decode(torch.zeros(2, 0, 3))
    assert hyp.tokens.shape == (2, 0) and hyp.lengths.tolist() == [0, 0]
    x = torch.full((1, 3, 3), -5.0)
    x[0, 0, 2] = 0.0
    x[0, 1, 1] = float("nan")  # a NaN counts as the largest score (torch.argmax)
    x[0, 2, 0] = 0.0
    hyp = sk.ctc_greedy_decode(x)
    assert hyp.tokens[0, :2].tolist() == [2, 1] and torch.isnan(hyp.scores[0, 1])


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((torch.zeros(2, 5, 3), [5, 6]), {}, r"input_lengths\[1\]=6 is outside \[0, T=5\]"),
        ((torch.zeros(2, 5, 3), [5, -1]), {}, r"input_lengths\[1\]=-1 is outside"),
        ((torch.zeros(2, 5, 3), [5]), {}, "input_lengths has 1 entries but the batch size is 2"),
        ((torch.zeros(2, 5, 3), None, 3), {}, r"blank=3 is outside \[0, C=3\)"),
        ((torch.zeros(5, 3, 2, 1),), {}, "log_probs must have 3 dimensions"),
        ((torch.zeros(2, 5, 3, dtype=torch.long),), {}, "log_probs"),
        ((torch.zeros(2, 5, 3), [5.0, 5.0]), {}, "input_lengths must hold integers"),
        ((torch.zeros(2, 5, 3),), {"logits": "yes"}, "logits"),
        ((torch.zeros(2, 5, 3),), {"batch_first": 2}, "batch_first"),
        ((torch.zeros(2, 5, 3),), {"validate": None}, "validate"),
        ((torch.zeros(2, 5, 3), None, 1.5), {}, "blank"),
    ],
)
def test_bad_arguments_are_refused_naming_them(args, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        sk.ctc_greedy_decode(*args, **kwargs)


def test_unchecked_lengths_are_clamped():
    x = torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(2)).log_softmax(-1)
    a = sk.ctc_greedy_decode(x, [9, -3], validate=False)
    b = sk.ctc_greedy_decode(x, [6, 0])
    for u, v in zip(a[:4], b[:4], strict=True):
        assert torch.equal(u, v)


@pytest.mark.parametrize("logits", [False, True])
def test_special_values_across_blocks_of_classes(path, monkeypatch, logits):
    """Ties (-0.0 with +0.0, equal values in different blocks of classes), infinities and NaNs of either sign: the
    first maximum, a NaN counting as the largest (torch.argmax), with the kernel's blocks of classes lowered to 4."""
    if path.name != "torch":
        monkeypatch.setitem(decode_api.kernels.CTC_TILES, "block_c", 4)
    nan, inf = float("nan"), float("inf")
    rows = [
        [-1.0, -0.0, -3.0, -2.0, 0.0, -0.0, -5.0, 0.0, -1.0, -7.0],  # -0.0 first: ties with the later +0.0
        [-9.0, -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, -1.0],  # tie across the last block
        [-inf] * 10,  # all -inf: class 0
        [-2.0, -inf, inf, -1.0, -3.0, inf, 0.0, -1.0, -2.0, -4.0],  # +inf twice
        [-2.0, -1.0, -3.0, -4.0, -5.0, -6.0, inf, -8.0, -nan, nan],  # a NaN of each sign: the first
        [-2.0, -1.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0, -9.0, nan],  # a NaN in the last class
        [3.0, 1.0, 2.0, 3.0, 0.0, -1.0, 1.0, 2.0, 3.0, 3.0],  # the maximum in the first class, ties after
    ]
    x = torch.tensor(rows)[None]
    x[0, 4, 8] = -x[0, 4, 9].abs()  # a NaN with its sign bit set
    hyp = sk.ctc_greedy_decode(x.to(path.device), blank=9, logits=logits)
    best = x[0].argmax(-1)
    assert best.tolist() == [1, 8, 0, 2, 8, 9, 0]
    want = ctc_greedy_decode_reference(x.double(), torch.tensor([7]), 9, logits)
    assert torch.equal(hyp.tokens.cpu(), want.tokens) and torch.equal(hyp.frames.cpu(), want.frames)
    got, ref = hyp.scores.cpu().double(), want.scores
    assert torch.equal(got.isnan(), ref.isnan())
    assert torch.allclose(got.nan_to_num(), ref.nan_to_num(), rtol=1e-6, atol=1e-6)
    assert len(path.launches) == (path.name != "torch")
