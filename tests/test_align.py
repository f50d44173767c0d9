"""CTC forced alignment: the CPU path against a brute-force best path, the Triton kernels against the CPU path (bit
for bit), torchaudio where it is importable, edge cases, checks, token spans.

CPU tests run the kernels through Triton's interpreter (TRITON_INTERPRET=1); tests marked gpu run on CUDA.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import optional_module
from hypothesis import given, settings
from hypothesis import strategies as st

import speechkernels as sk
from speechkernels.align import ctc_forced_align_reference

align_kernels = optional_module("speechkernels.align.kernels")  # None without Triton: its tests skip


def make_problem(seed, N, T, C, S, *, blank=0, device="cpu", dtype=torch.float32, ragged=True, repeats=0.3):
    """Log-probabilities [N, T, C], padded labels (junk past each length) with repeats, ragged lengths that leave
    every sample alignable."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, T, C, generator=g).mul(2).log_softmax(-1).to(dtype)
    il = torch.randint(max(T // 2, 1), T + 1, (N,), generator=g) if ragged else torch.full((N,), T)
    il[0] = T
    tl = torch.randint(0, S + 1, (N,), generator=g) if ragged else torch.full((N,), S)
    tl = torch.minimum(tl, il // 2)
    classes = torch.tensor([c for c in range(C) if c != blank])
    labels = classes[torch.randint(0, len(classes), (N, S), generator=g)]
    rep = torch.rand(N, S, generator=g) < repeats
    for j in range(1, S):
        labels[:, j] = torch.where(rep[:, j], labels[:, j - 1], labels[:, j])
    junk = torch.randint(-5, C + 5, (N, S), generator=g)
    padded = torch.where(torch.arange(S)[None, :] < tl[:, None], labels, junk)
    return x.to(device), padded.to(device), il.to(device), tl.to(device)


def reference(x, targets, il, tl, blank=0):
    return ctc_forced_align_reference(x.cpu(), targets.cpu(), il.cpu(), tl.cpu(), blank)


def assert_same(got, want):
    """Alignments and scores equal bit for bit (NaN where NaN)."""
    (a, s), (ra, rs) = got, want
    assert a.dtype == torch.int64 and s.dtype == rs.dtype
    assert torch.equal(a.cpu(), ra), (a.cpu() != ra).nonzero()[:5].tolist()
    assert torch.equal(s.cpu().isnan(), rs.isnan())
    assert torch.equal(torch.nan_to_num(s.cpu(), nan=0.0), torch.nan_to_num(rs, nan=0.0))


# ---------------------------------------------------------------------------------------------------------------
# the CPU path against every path of tiny lattices


def brute_force(lp, labels, blank):
    """The best path through the CTC lattice by enumeration (float64): (score, states) or (-inf, None)."""
    T = lp.shape[0]
    S = 2 * len(labels) + 1
    ext = [blank if s % 2 == 0 else labels[s // 2] for s in range(S)]
    best = (-math.inf, None)

    def walk(t, s, score, path):
        nonlocal best
        score += lp[t, ext[s]].item()
        path = path + [s]
        if t == T - 1:
            if s >= S - 2 and score > best[0]:
                best = (score, path)
            return
        for d in (0, 1, 2):
            if s + d < S and (d < 2 or (ext[s + d] != blank and ext[s + d] != ext[s])):
                walk(t + 1, s + d, score, path)

    for s0 in range(min(2, S)):
        walk(0, s0, 0.0, [])
    return best, ext


@pytest.mark.parametrize("blank", [0, 4])
def test_reference_is_the_best_path(blank):
    g = torch.Generator().manual_seed(1)
    for _ in range(150):
        T, L = int(torch.randint(1, 8, (), generator=g)), int(torch.randint(0, 4, (), generator=g))
        classes = [c for c in range(5) if c != blank]
        labels = [classes[i] for i in torch.randint(0, 4, (L,), generator=g).tolist()]
        lp = torch.randn(T, 5, generator=g, dtype=torch.float64).log_softmax(-1)
        (score, states), ext = brute_force(lp, labels, blank)
        ali, sc = ctc_forced_align_reference(
            lp[None], torch.tensor([labels + [1]]), torch.tensor([T]), torch.tensor([L]), blank
        )
        if states is None:  # too few frames for the labels and their repeats
            assert (ali == -1).all() and (sc == -math.inf).all()
        else:
            assert ali[0].tolist() == [ext[s] for s in states]
            assert sc.sum().item() == pytest.approx(score, abs=1e-12)
            assert torch.equal(sc[0], lp[torch.arange(T), ali[0]])


# ---------------------------------------------------------------------------------------------------------------
# the kernels against the CPU path, bit for bit

# (N, T, C, S, block, segment, blank): small blocks split a sample across programs (the wavefront), short
# segments give several anchors and fills per sample
KERNEL_CASES = [
    (2, 20, 6, 4, None, None, 0),
    (3, 40, 6, 12, 8, 16, 0),
    (2, 50, 5, 20, 8, 16, 4),
    (1, 70, 4, 30, 8, 32, 0),
]
GPU_CASES = [
    (16, 700, 40, 150, None, None, 0),
    (4, 1200, 30, 500, 32, None, 29),
    (3, 900, 50, 300, 32, 16, 0),
    (2, 3000, 33, 1400, None, 112, 0),
    (2, 2000, 20, 900, 64, 240, 0),
    (2, 2000, 20, 900, 128, 496, 0),
    (2, 1500, 20, 600, 256, None, 0),
]


@pytest.mark.kernels
@pytest.mark.parametrize("case", range(len(KERNEL_CASES)))
def test_kernels_match_reference(path, case):
    cases = GPU_CASES if path.device.type == "cuda" else KERNEL_CASES
    if case >= len(cases):
        pytest.skip("no such case here")
    N, T, C, S, block, segment, blank = cases[case]
    x, tg, il, tl = make_problem(case, N, T, C, S, blank=blank, device=path.device)
    got = align_kernels.ctc_align(x, tg, il, tl, blank, True, block=block, segment=segment)
    assert_same(got, reference(x, tg, il, tl, blank))


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(len(KERNEL_CASES), len(GPU_CASES)))
def test_kernels_match_reference_gpu(gpu, case):
    N, T, C, S, block, segment, blank = GPU_CASES[case]
    x, tg, il, tl = make_problem(case, N, T, C, S, blank=blank, device=gpu)
    got = align_kernels.ctc_align(x, tg, il, tl, blank, True, block=block, segment=segment)
    assert_same(got, reference(x, tg, il, tl, blank))


@pytest.mark.kernels
@settings(max_examples=8)
@given(
    N=st.integers(1, 3),
    T=st.integers(1, 40),
    S=st.integers(0, 14),
    blank_last=st.booleans(),
    seed=st.integers(0, 2**16),
    small=st.booleans(),
)
def test_kernels_match_reference_property(path, N, T, S, blank_last, seed, small):
    C = 6
    if path.device.type == "cuda":
        T, S = T * 50, S * 20
    blank = C - 1 if blank_last else 0
    x, tg, il, tl = make_problem(seed, N, T, C, S, blank=blank, device=path.device)
    kw = dict(block=8, segment=16) if small and path.device.type == "cpu" else {}
    got = align_kernels.ctc_align(x, tg, il, tl, blank, True, **kw)
    assert_same(got, reference(x, tg, il, tl, blank))


# ---------------------------------------------------------------------------------------------------------------
# the public function: forms of the arguments, dtypes, edge cases


@pytest.mark.kernels
def test_public_forms_agree(path):
    x, tg, il, tl = make_problem(3, 3, 30, 7, 8)
    want = reference(x, tg, il, tl)
    xd = x.to(path.device)
    assert_same(sk.ctc_forced_align(xd, tg, il, tl), want)
    assert_same(sk.ctc_forced_align(xd.transpose(0, 1), tg, il, tl, batch_first=False), want)
    assert_same(sk.ctc_forced_align(xd, tg.to(torch.int32).to(path.device), il.tolist(), tl.numpy()), want)
    cat = torch.cat([tg[n, : int(tl[n])] for n in range(3)] + [torch.tensor([2, 3])])
    assert_same(sk.ctc_forced_align(xd, cat, il, tl), want)
    # unbatched, default lengths
    a, s = sk.ctc_forced_align(xd[0], tg[0, : int(tl[0])])
    ra, rs = reference(x[:1], tg[:1], torch.tensor([30]), tl[:1])
    assert_same((a[None], s[None]), (ra, rs))
    # the CPU path (whatever device the kernels use) gives the same
    assert_same(sk.ctc_forced_align(x, tg, il, tl), want)


@pytest.mark.kernels
def test_half_precision(path):
    x, tg, il, tl = make_problem(4, 3, 25, 9, 7, dtype=torch.float16)
    dtypes = [torch.float16] + ([torch.bfloat16] if path.device.type == "cuda" else [])
    for dtype in dtypes:
        xd = x.to(dtype)
        got = sk.ctc_forced_align(xd.to(path.device), tg, il, tl)
        assert got[1].dtype == torch.float32
        assert_same(got, reference(xd, tg, il, tl))
        assert_same(sk.ctc_forced_align(xd, tg, il, tl), reference(xd, tg, il, tl))


def test_float64_takes_the_cpu_path():
    x, tg, il, tl = make_problem(5, 2, 20, 6, 5, dtype=torch.float64)
    a, s = sk.ctc_forced_align(x, tg, il, tl)
    assert s.dtype == torch.float64
    assert_same((a, s), reference(x, tg, il, tl))


@pytest.mark.kernels
def test_edge_cases(path):
    """One batch: a label sequence that needs every frame, one a frame short, no labels, no frames, a NaN the sample
    reads, NaN where it does not, +inf, zero-probability frames; each sample as it would be alone."""
    g = torch.Generator().manual_seed(7)
    N, T, C = 9, 12, 6
    x = torch.randn(N, T, C, generator=g).log_softmax(-1)
    tg = torch.tensor([[1, 1, 2, 2, 3, 3, 4, 4]] * 2 + [[1, 2, 3, 4, 5, 1, 2, 3]] * (N - 2))
    il = torch.tensor([12, 11, 12, 0, 12, 12, 9, 12, 12])
    tl = torch.tensor([8, 8, 0, 3, 4, 4, 4, 4, 4])  # 8 labels + 4 repeats = 12 frames exactly
    x[4, 5, 2] = math.nan  # read: label 2 of sample 4
    x[5, 5, 5] = math.nan  # not read: class 5 is not among sample 5's labels (1, 2, 3, 4)
    x[6, 10, 1] = math.nan  # not read: past sample 6's 9 frames
    x[7, 3, 0] = math.inf  # +inf: the blank
    x[8, :, 3] = -math.inf  # label 3 is impossible: no path
    want = reference(x, tg, il, tl)
    got = sk.ctc_forced_align(x.to(path.device), tg, il, tl)
    assert_same(got, want)
    a, s = want
    assert a[0].tolist() == [1, 0, 1, 2, 0, 2, 3, 0, 3, 4, 0, 4]  # forced: a blank between repeats only
    assert (a[1] == -1).all() and (s[1, :11] == -math.inf).all() and s[1, 11] == 0  # one frame short
    assert (a[2] == 0).all()  # no labels: all blank
    assert (a[3] == -1).all() and (s[3] == 0).all()  # no frames
    assert (a[4] == -1).all() and s[4].isnan().all()
    assert (a[5] >= 0).all() and s[5].isfinite().all()
    assert (a[6, :9] >= 0).all() and (a[6, 9:] == -1).all() and (s[6, 9:] == 0).all()
    assert (a[7] == -1).all() and s[7].isnan().all()
    assert (a[8] == -1).all() and (s[8] == -math.inf).all()
    for n in (0, 2, 5, 6):  # alone, the same
        alone = reference(x[n : n + 1], tg[n : n + 1], il[n : n + 1], tl[n : n + 1])
        assert_same((a[n : n + 1], s[n : n + 1]), alone)


@pytest.mark.kernels
def test_unchecked_values_agree(path):
    """validate=False: lengths past the tensors and labels outside [0, C) are clamped alike on every path."""
    x, tg, il, tl = make_problem(8, 3, 20, 6, 5)
    tg[0, 1], tg[1, 0] = 17, -4
    il[2], tl[2] = 25, 9
    want = sk.ctc_forced_align(x, tg, il, tl, validate=False)
    assert_same(sk.ctc_forced_align(x.to(path.device), tg, il, tl, validate=False), want)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(log_probs=torch.zeros(2, 3)), "unbatched targets"),
        (dict(log_probs=torch.zeros(4)), "log_probs must have 3 dimensions"),
        (dict(log_probs=torch.zeros(2, 10, 5, dtype=torch.int64)), "log_probs must be float"),
        (dict(targets=torch.ones(2, 3)), "targets must be int32 or int64"),
        (dict(targets=torch.ones(3, 3, dtype=torch.int64)), "targets has 3 rows"),
        (dict(targets=torch.ones(1, 2, 3, dtype=torch.int64)), r"targets must be \[N, S\]"),
        (dict(input_lengths=[10, 11]), r"input_lengths\[1\]=11 is outside"),
        (dict(input_lengths=[10]), "input_lengths has 1 entries"),
        (dict(input_lengths=[10.0, 9.0]), "input_lengths must hold integers"),
        (dict(target_lengths=[3, 4]), r"target_lengths\[1\]=4 is outside"),
        (dict(targets=torch.tensor([[1, 5, 2], [1, 1, 1]])), r"label 5 of sample 0 \(position 1\) is outside"),
        (dict(targets=torch.tensor([[1, 0, 2], [1, 1, 1]])), "equals blank=0"),
        (dict(blank=5), "blank=5 is outside"),
        (dict(blank=1.0), "blank must be an integer"),
        (dict(batch_first=1), "batch_first must be True or False"),
        (dict(validate="yes"), "validate must be True or False"),
        (dict(targets=torch.ones(6, dtype=torch.int64), target_lengths=None), "target_lengths is required"),
    ],
)
def test_bad_arguments(change, match):
    args = dict(
        log_probs=torch.zeros(2, 10, 5),
        targets=torch.ones(2, 3, dtype=torch.int64),
        input_lengths=[10, 9],
        target_lengths=[3, 2],
        blank=0,
        batch_first=True,
        validate=True,
    )
    args.update(change)
    with pytest.raises(ValueError, match=match):
        sk.ctc_forced_align(**args)


# ---------------------------------------------------------------------------------------------------------------
# torchaudio, where it is installed


def _torchaudio_align():
    try:
        from torchaudio.functional import forced_align
    except Exception:  # noqa: BLE001 - torchaudio missing, or built without its alignment op
        return None
    return forced_align


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_against_torchaudio(device):
    forced_align = _torchaudio_align()
    if forced_align is None:
        pytest.skip("torchaudio's forced_align is not importable")
    x, tg, il, tl = make_problem(9, 6, 200, 20, 40, ragged=True)
    a, s = sk.ctc_forced_align(x.to(device), tg, il, tl)
    for n in range(6):
        T_n, L = int(il[n]), int(tl[n])
        if L == 0:
            continue
        path, scores = forced_align(x[n : n + 1, :T_n].to(device), tg[n : n + 1, :L].to(device), blank=0)
        assert torch.equal(a[n, :T_n].cpu(), path[0].cpu().to(torch.int64))
        assert torch.allclose(s[n, :T_n].cpu(), scores[0].cpu().float())


# ---------------------------------------------------------------------------------------------------------------
# long inputs on the GPU


@pytest.mark.gpu
def test_long_input_gpu(gpu):
    """A sample split across many programs and anchors (the default plan): the CPU path's result."""
    x, tg, il, tl = make_problem(10, 1, 12000, 32, 3000, ragged=False, repeats=0.05)
    assert_same(sk.ctc_forced_align(x.to(gpu), tg, il, tl), reference(x, tg, il, tl))


@pytest.mark.gpu
def test_more_than_2_31_emissions_gpu(gpu):
    """Offsets past 2^31 elements: the labels and the blank in the last classes of a [2, 35000, 32768] float16
    tensor; the result equals the CPU path's on those classes alone."""
    N, T, C = 2, 35000, 32768
    assert N * T * C > 2**31
    x = torch.full((N, T, C), -30.0, dtype=torch.float16, device=gpu)
    g = torch.Generator(device="cpu").manual_seed(11)
    used = 8
    small = torch.randn(N, T, used, generator=g).log_softmax(-1).half()
    x[:, :, C - used :] = small.to(gpu)
    tg = torch.randint(1, used, (N, 300), generator=g)
    il, tl = torch.tensor([T, T - 5]), torch.tensor([300, 250])
    a, s = sk.ctc_forced_align(x, tg + C - used, il, tl, blank=C - used)
    ra, rs = reference(small, tg, il, tl, 0)
    assert torch.equal(a.cpu(), torch.where(ra >= 0, ra + C - used, -1))
    assert torch.equal(s.cpu(), rs)


# ---------------------------------------------------------------------------------------------------------------
# token spans


def spans_by_loop(tokens, scores, blank):
    """torchaudio's merge_tokens, as a loop: runs of one token other than the blank (and -1)."""
    out, t = [], 0
    tokens = tokens.tolist()
    while t < len(tokens):
        u = t
        while u < len(tokens) and tokens[u] == tokens[t]:
            u += 1
        if tokens[t] != blank and tokens[t] >= 0:
            out.append((tokens[t], t, u, scores[t:u].double().mean().item()))
        t = u
    return out


def test_token_spans_match_a_loop():
    g = torch.Generator().manual_seed(12)
    tokens = torch.randint(-1, 4, (5, 40), generator=g)
    tokens[0] = 0
    scores = torch.rand(5, 40, generator=g)
    sp = sk.ctc_token_spans(tokens, scores, blank=0)
    for n in range(5):
        want = spans_by_loop(tokens[n], scores[n], 0)
        assert int(sp.lengths[n]) == len(want)
        got = list(
            zip(sp.tokens[n].tolist(), sp.starts[n].tolist(), sp.ends[n].tolist(), sp.scores[n].tolist(), strict=False)
        )[: len(want)]
        for (tok, s0, e0, m), (tok2, s1, e1, m1) in zip(got, want, strict=True):
            assert (tok, s0, e0) == (tok2, s1, e1) and m == pytest.approx(m1, rel=1e-6)
        assert (sp.tokens[n, len(want) :] == -1).all() and (sp.scores[n, len(want) :] == 0).all()
    summed = sk.ctc_token_spans(tokens, scores, blank=0, reduce="sum")
    assert torch.allclose(summed.scores, sp.scores * (sp.ends - sp.starts))
    one = sk.ctc_token_spans(tokens[1], scores[1], blank=0)
    assert torch.equal(one.tokens, sp.tokens[1, : int(sp.lengths[1])]) and one.lengths.dim() == 0
    assert (sk.ctc_token_spans(tokens).scores == 0).all()


def test_token_spans_of_an_alignment_are_its_labels():
    x, tg, il, tl = make_problem(13, 4, 60, 8, 12)
    a, s = sk.ctc_forced_align(x, tg, il, tl)
    sp = sk.ctc_token_spans(a, s.exp())
    assert torch.equal(sp.lengths, tl)
    for n in range(4):
        L = int(tl[n])
        assert torch.equal(sp.tokens[n, :L], tg[n, :L])
        assert (sp.starts[n, 1:L] >= sp.ends[n, : L - 1]).all()


def test_token_spans_confine_nan():
    tokens = torch.tensor([[1, 1, 0, 2, 2, 0, 3]])
    scores = torch.tensor([[0.5, math.nan, 0.1, 0.2, 0.4, math.nan, -math.inf]])
    sp = sk.ctc_token_spans(tokens, scores)
    assert sp.scores[0, 0].isnan() and sp.scores[0, 1].item() == pytest.approx(0.3)
    assert sp.scores[0, 2].item() == -math.inf


@pytest.mark.parametrize(
    "args, match",
    [
        (dict(alignments=torch.zeros(3)), "alignments must hold tokens"),
        (dict(alignments=torch.zeros(1, 2, 3, dtype=torch.int64)), r"alignments must be \[N, T\]"),
        (dict(scores=torch.zeros(2, 5, dtype=torch.int64)), "scores must be a float tensor"),
        (dict(scores=torch.zeros(2, 4)), "scores has shape"),
        (dict(reduce="max"), "reduce must be one of"),
        (dict(blank=0.5), "blank must be an integer"),
    ],
)
def test_token_spans_bad_arguments(args, match):
    full = dict(alignments=torch.zeros(2, 5, dtype=torch.int64), scores=None)
    full.update(args)
    with pytest.raises(ValueError, match=match):
        sk.ctc_token_spans(**full)


def test_packed_choices_give_the_same_path(monkeypatch):
    """Long inputs keep the CPU path's per-frame choices packed 8 to a byte: the same path as unpacked."""
    x, tg, il, tl = make_problem(14, 3, 150, 9, 30)
    want = reference(x, tg, il, tl)
    from speechkernels.align import reference as ref_module

    monkeypatch.setattr(ref_module, "PACK_BYTES", 0)
    assert_same(reference(x, tg, il, tl), want)


@pytest.mark.kernels
def test_empty_batch_and_no_frames(path):
    cases = [((0, 10, 5), torch.zeros(0, 3, dtype=torch.int64)), ((2, 0, 5), torch.ones(2, 3, dtype=torch.int64))]
    for shape, tg in cases:
        a, s = sk.ctc_forced_align(torch.zeros(shape, device=path.device), tg, [shape[1]] * shape[0], [0] * shape[0])
        assert a.shape == s.shape == shape[:2] and a.dtype == torch.int64 and s.dtype == torch.float32
