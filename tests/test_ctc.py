"""CTC loss: the Triton kernels against the float64 reference, the reference against torch, checks, edge cases.

CPU tests run the kernels through Triton's interpreter (TRITON_INTERPRET=1); tests marked gpu run on CUDA.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import check_compiled_matches_eager, check_graph_replay_matches_eager, count_calls

import speechkernels as sk
from speechkernels import _outputs as utils
from speechkernels.ctc import api as ctc_api
from speechkernels.ctc import reference as ctc_reference
from speechkernels.ctc.reference import ctc_loss_reference, ctc_losses_reference

kernels = ctc_api.kernels  # None without Triton: its tests skip

F32 = (torch.float32, 1e-5, 1e-5)  # dtype, loss rtol, gradient atol
F16 = (torch.float16, 1e-2, 2e-3)
BF16 = (torch.bfloat16, 1e-2, 1e-2)


def make_problem(seed, T, N, C, S, *, blank=0, device="cpu", dtype=torch.float32, scale=2.0, impossible=False):
    """Random activations, label sequences with repeats, ragged lengths; padding holds junk the loss must ignore."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(T, N, C, generator=g) * scale).to(dtype)
    il = torch.randint(max(T // 2, 0), T + 1, (N,), generator=g)
    il[0] = T
    tl = torch.randint(0, S + 1, (N,), generator=g)
    if not impossible:  # keep every sample alignable: L + repeats <= T_n
        tl = torch.minimum(tl, il // 2)
    classes = torch.tensor([c for c in range(C) if c != blank])
    labels = classes[torch.randint(0, len(classes), (N, S), generator=g)]
    rep = torch.rand(N, S, generator=g) < 0.3  # repeated labels exercise the no-skip rule
    for j in range(1, S):
        labels[:, j] = torch.where(rep[:, j], labels[:, j - 1], labels[:, j])
    junk = torch.randint(-5, C + 5, (N, S), generator=g)
    padded = torch.where(torch.arange(S)[None, :] < tl[:, None], labels, junk)
    return x.to(device), padded.to(device), il.to(device), tl.to(device)


def concatenated(padded, tl, extra=3):
    parts = [padded[n, : int(tl[n])] for n in range(padded.shape[0])]
    tail = torch.full((extra,), 1, dtype=padded.dtype, device=padded.device)  # trailing entries are ignored
    return torch.cat(parts + [tail])


def reference(x, padded, il, tl, blank, reduction, logits, zero_infinity=False):
    xr = x.detach().to(torch.float64).cpu().requires_grad_()
    out = ctc_loss_reference(xr, padded.cpu(), il.cpu(), tl.cpu(), blank, reduction, zero_infinity, logits=logits)
    return xr, out


@pytest.fixture(params=["grid", "fused"])
def emission_path(request, monkeypatch):
    """Both forward paths: the grid-wide emission kernel, and the emissions inside the recursion kernel."""
    fused = request.param == "fused"
    monkeypatch.setattr(kernels, "use_small_forward", lambda *args: fused)
    return request.param


def compare(
    x,
    padded,
    il,
    tl,
    *,
    blank=0,
    reduction="none",
    logits=True,
    layout="padded",
    tol=F32,
    zero_infinity=False,
    batch_first=False,
    seed=0,
):
    dtype, rtol, atol = tol
    targets = padded if layout == "padded" else concatenated(padded, tl)
    xin = x.detach().transpose(0, 1).contiguous() if batch_first else x.detach().clone()
    xin.requires_grad_()
    out = sk.ctc_loss(xin, targets, il, tl, blank, reduction, zero_infinity, batch_first=batch_first, logits=logits)
    xr, ref = reference(x, padded, il, tl, blank, reduction, logits, zero_infinity)
    torch.testing.assert_close(out.detach().cpu().double(), ref.detach(), rtol=rtol, atol=1e-4, equal_nan=True)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    (out * g.to(out.device, out.dtype)).sum().backward()
    (ref * g).sum().backward()
    grad = xin.grad.transpose(0, 1) if batch_first else xin.grad
    assert grad.dtype == dtype
    torch.testing.assert_close(grad.cpu().double(), xr.grad, rtol=0, atol=atol, equal_nan=True)
    return out, grad


# ---------------------------------------------------------------------------------------------------------------
# the reference


@pytest.mark.parametrize("seed", range(3))
def test_reference_matches_torch(seed):
    T, N, C, S = 15, 4, 6, 6
    x, padded, il, tl = make_problem(seed, T, N, C, S, dtype=torch.float64)
    lp = x.log_softmax(-1).requires_grad_()
    ours = ctc_losses_reference(lp, padded, il, tl, 0)
    theirs = torch.nn.functional.ctc_loss(lp, padded, il, tl, reduction="none")
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    # torch's gradient is the gradient through log_softmax (torch issue 52241): compare that way
    xr = x.clone().requires_grad_()
    g = torch.randn(N, dtype=torch.float64)
    (ctc_loss_reference(xr, padded, il, tl, reduction="none", logits=True) * g).sum().backward()
    xt = x.clone().requires_grad_()
    (torch.nn.functional.ctc_loss(xt.log_softmax(-1), padded, il, tl, reduction="none") * g).sum().backward()
    torch.testing.assert_close(xr.grad, xt.grad, rtol=1e-10, atol=1e-12)


def test_reference_gradcheck():
    x, padded, il, tl = make_problem(7, 8, 3, 5, 4, dtype=torch.float64, scale=1.0)
    lp = x.clone().requires_grad_()  # unnormalised scores: the gradient is still the exact derivative
    assert torch.autograd.gradcheck(lambda v: ctc_losses_reference(v, padded, il, tl, 0), (lp,))


def test_reference_is_cpu_path_for_float64():
    x, padded, il, tl = make_problem(3, 10, 3, 5, 4, dtype=torch.float64)
    out = sk.ctc_loss(x, padded, il, tl, reduction="sum")
    theirs = torch.nn.functional.ctc_loss(x, padded, il, tl, reduction="sum")
    torch.testing.assert_close(out, theirs)


# ---------------------------------------------------------------------------------------------------------------
# the PyTorch path (the scaled recursion) against the log-space reference


def _awkward_problem(seed, logits, dtype):
    """Ragged lengths, junk labels, impossible samples, and (by seed) NaN and infinite scores at frames read and
    not read, and wide score ranges."""
    g = torch.Generator().manual_seed(seed)
    T, N, C, S = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((1, 30), (1, 6), (2, 9), (0, 10)))
    x = torch.randn(T, N, C, generator=g, dtype=torch.float64) * (1 + 3 * float(torch.rand(1, generator=g)))
    if not logits:
        x = x.log_softmax(-1)
    tg = torch.randint(-2, C + 2, (N, S), generator=g)
    il, tl = torch.randint(0, T + 1, (N,), generator=g), torch.randint(0, S + 1, (N,), generator=g)
    if seed % 7 == 0:
        x[0, 0, 1 % C] = math.nan
    if seed % 5 == 0:
        x[min(1, T - 1), -1, 0] = -math.inf
    if seed % 4 == 0:
        x[-1] = math.nan  # past some samples' input lengths
    if seed % 11 == 0:
        x = x * 300
    if seed % 13 == 0:
        x[0, 0, 0] = math.inf
    return x.to(dtype), tg, il, tl


@pytest.mark.parametrize("logits", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cpu_path_matches_reference(logits, dtype):
    """Loss, gradient and where NaN and inf appear, against the log-space reference on the same (float64) scores:
    float64 to 1e-9; float32 within its log_softmax's rounding."""
    tol = 1e-9 if dtype == torch.float64 else 2e-6
    for seed in range(60):
        x, tg, il, tl = _awkward_problem(seed, logits, dtype)
        ref_loss, ref_grad = ctc_reference._reference_on(x.double(), tg, il, tl, 0, True, logits)
        loss, grad = ctc_reference.ctc_forward_backward_scaled(x, tg, il, tl, 0, True, logits)
        assert grad.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
        torch.testing.assert_close(loss, ref_loss, rtol=tol, atol=tol, equal_nan=True)
        torch.testing.assert_close(grad.double(), ref_grad, rtol=0, atol=tol, equal_nan=True)


def test_cpu_path_recomputes_what_it_cannot_scale(monkeypatch):
    """Normalised every few frames, the scaled recursion hands nothing to the log-space reference. Never
    normalised, uniform scores over 1000 frames and 300 labels count more alignments than float64 holds (about
    1e367): the check must see it and hand those samples over, and the results are the reference's either way."""
    real = ctc_reference.ctc_forward_backward_reference
    calls = count_calls(
        monkeypatch, ctc_reference, "ctc_forward_backward_reference", record=lambda lp, *args, **kwargs: lp.shape[1]
    )
    x, padded, il, tl = make_problem(3, 300, 3, 6, 40, dtype=torch.float64)
    lp = x.log_softmax(-1)
    uniform = torch.zeros(1000, 2, 5, dtype=torch.float64).log_softmax(-1)
    long_labels = torch.randint(1, 5, (2, 300), generator=torch.Generator().manual_seed(0))
    long_args = (long_labels, torch.tensor([1000, 1000]), torch.tensor([300, 290]), 0)
    for every, problem, handed in ((8, (lp, padded, il, tl, 0), []), (10**6, (uniform, *long_args), [2])):
        monkeypatch.setattr(ctc_reference, "NORMALISE_EVERY", every)
        calls.clear()
        loss, grad = ctc_reference.ctc_forward_backward_scaled(*problem)
        assert calls == handed
        ref_loss, ref_grad = real(*problem)
        assert torch.isfinite(ref_loss).all()
        torch.testing.assert_close(loss, ref_loss, rtol=1e-11, atol=0)
        torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-11)


def test_cpu_path_keeps_at_most_its_scratch_budget(monkeypatch):
    """The buffers kept between calls stay within SCRATCH_BYTES (a call that needs more gets fresh ones), and the
    results do not depend on it."""
    x, padded, il, tl = make_problem(8, 40, 3, 6, 8, dtype=torch.float64)
    lp = x.log_softmax(-1)
    ref = ctc_reference.ctc_forward_backward_reference(lp, padded, il, tl, 0)
    for budget in (0, 20_000, 10**9):
        monkeypatch.setattr(ctc_reference, "SCRATCH_BYTES", budget)
        monkeypatch.setattr(ctc_reference, "_SCRATCH", ctc_reference._Scratch())
        for _ in range(2):
            loss, grad = ctc_reference.ctc_forward_backward_scaled(lp, padded, il, tl, 0)
            torch.testing.assert_close(loss, ref[0], rtol=1e-11, atol=0)
            torch.testing.assert_close(grad, ref[1], rtol=0, atol=1e-11)
        kept = sum(b.numel() * b.dtype.itemsize for b in ctc_reference._SCRATCH.buffers.values())
        assert kept <= budget and (kept > 0) == (budget > 0)


@pytest.mark.parametrize("logits", [True, False])
@pytest.mark.parametrize("layout", ["padded", "concatenated"])
def test_cpu_path_public_api(monkeypatch, logits, layout):
    """ctc_loss on the PyTorch path (no Triton) in float32, through autograd, against the float64 reference."""
    monkeypatch.setattr(ctc_api, "kernels", None)
    for seed in range(3):
        x, padded, il, tl = make_problem(seed, 13, 4, 7, 5)
        compare(x, padded, il, tl, logits=logits, layout=layout, seed=seed)
    x, padded, il, tl = make_problem(4, 9, 3, 5, 4, impossible=True)
    for reduction in ("none", "sum", "mean"):
        compare(x, padded, il, tl, logits=logits, reduction=reduction, zero_infinity=True)


# ---------------------------------------------------------------------------------------------------------------
# the Triton kernels: one body on the CPU (interpreter) and on the GPU (the path fixture, tests marked kernels)


@pytest.mark.kernels
@pytest.mark.parametrize("logits", [True, False])
@pytest.mark.parametrize("layout", ["padded", "concatenated"])
@pytest.mark.parametrize("seed", range(2))
def test_kernels_match_reference(path, emission_path, logits, layout, seed):
    g = torch.Generator().manual_seed(100 + seed)
    T, N, C = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((1, 14), (1, 5), (2, 9)))
    S = int(torch.randint(1, 8, (1,), generator=g))
    blank = int(torch.randint(0, C, (1,), generator=g))
    x, padded, il, tl = make_problem(seed, T, N, C, S, blank=blank, device=path.device)
    compare(x, padded, il, tl, blank=blank, logits=logits, layout=layout, seed=seed)
    assert path.launches


@pytest.mark.kernels
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_kernels_reductions(path, reduction):
    x, padded, il, tl = make_problem(11, 9, 3, 6, 4, device=path.device)
    compare(x, padded, il, tl, reduction=reduction)
    theirs = torch.nn.functional.ctc_loss(x.log_softmax(-1), padded, il, tl, reduction=reduction)
    ours = sk.ctc_loss(x, padded, il, tl, reduction=reduction, logits=True)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert path.launches


@pytest.mark.kernels
def test_kernels_unnormalised_log_probs(path, emission_path):
    """logits=False on scores that are not log-probabilities: the gradient is the exact derivative."""
    x, padded, il, tl = make_problem(12, 10, 3, 5, 4, device=path.device, scale=3.0)
    compare(x + 1.5, padded, il, tl, logits=False)
    assert path.launches


@pytest.mark.kernels
def test_kernels_edge_cases(path, emission_path):
    # T = 1; empty labels; a label sequence of repeats that needs blanks between; input length 0
    T, N, C = 6, 6, 4
    x = torch.randn(T, N, C, generator=torch.Generator().manual_seed(5)).to(path.device)
    padded = torch.tensor([[1, 2, 3], [2, 2, 2], [1, 1, 0], [3, 0, 0], [1, 2, 1], [2, 0, 0]])
    il = torch.tensor([6, 5, 3, 1, 0, 1])
    tl = torch.tensor([3, 3, 2, 1, 0, 0])
    compare(x, padded, il, tl, logits=True)
    compare(x[:1], padded, torch.ones(N, dtype=torch.long), torch.tensor([1, 1, 0, 1, 0, 0]), logits=False)
    assert path.launches


@pytest.mark.kernels
def test_kernels_impossible_samples(path, emission_path):
    """No alignment: infinite loss (or zero with zero_infinity), zero gradient, never NaN."""
    T, N, C = 5, 4, 5
    x = torch.randn(T, N, C, generator=torch.Generator().manual_seed(6)).to(path.device).requires_grad_()
    padded = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 2, 3, 4, 1, 2], [1, 2, 0, 0, 0, 0], [3, 3, 0, 0, 0, 0]])
    il = torch.tensor([4, 5, 1, 3])  # 3 repeats need 5 frames; 6 labels > T; 2 labels in 1 frame; [3,3] fits in 3
    tl = torch.tensor([3, 6, 2, 2])
    for logits in (True, False):
        loss = sk.ctc_loss(x, padded, il, tl, reduction="none", logits=logits)
        assert torch.isinf(loss[:3]).all() and torch.isfinite(loss[3])
        (grad,) = torch.autograd.grad(loss, x, grad_outputs=torch.ones_like(loss))
        assert not grad.isnan().any()
        assert (grad[:, :3] == 0).all()
        zl = sk.ctc_loss(x, padded, il, tl, reduction="sum", zero_infinity=True, logits=logits)
        torch.testing.assert_close(zl, loss[3])
        (zg,) = torch.autograd.grad(zl, x)
        assert (zg[:, :3] == 0).all() and not zg.isnan().any()
    compare(x.detach(), padded, il, tl, zero_infinity=True, reduction="mean")
    assert path.launches


@pytest.mark.kernels
def test_kernels_nan_stays_in_its_sample(path, emission_path):
    x, padded, il, tl = make_problem(8, 8, 3, 5, 3, device=path.device)
    x[2, 1, 3] = math.nan
    x.requires_grad_()
    loss = sk.ctc_loss(x, padded, il, tl, reduction="none", logits=True)
    assert loss[1].isnan() and torch.isfinite(loss[[0, 2]]).all()
    loss.sum().backward()
    assert x.grad[: int(il[1]), 1].isnan().all()
    assert torch.isfinite(x.grad[:, [0, 2]]).all()
    assert path.launches


@pytest.mark.kernels
def test_kernels_layouts_and_argument_forms(path, emission_path):
    x, padded, il, tl = make_problem(9, 9, 3, 6, 4, device=path.device)
    compare(x, padded, il, tl, batch_first=True, reduction="sum")
    ref = sk.ctc_loss(x, padded, il, tl, reduction="none", logits=True)
    for tgt in (padded.int(), concatenated(padded, tl).int()):
        out = sk.ctc_loss(x, tgt, il.tolist(), tl.tolist(), reduction="none", logits=True)
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
    module = sk.CTCLoss(reduction="none", logits=True)
    torch.testing.assert_close(module(x, padded, il, tl), ref, rtol=0, atol=0)
    unbatched = sk.ctc_loss(x[:, 0], padded[0, : int(tl[0])], il[0:1], tl[0:1], reduction="none", logits=True)
    torch.testing.assert_close(unbatched, ref[0], rtol=1e-6, atol=1e-6)
    assert path.launches


@pytest.mark.kernels
def test_kernels_float16(path, emission_path):
    x, padded, il, tl = make_problem(10, 10, 3, 7, 4, device=path.device, dtype=torch.float16)
    compare(x, padded, il, tl, tol=F16)
    assert path.launches


@pytest.mark.kernels
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_kernels_split_recursion_and_blocks_agree(path, reduction):
    """alpha and beta as one launch or two give the same bits; the gradient kernel's block choices agree."""
    x, padded, il, tl = make_problem(15, 40, 3, 9, 12, device=path.device)
    args = (x, padded, il, tl, 0, True, True, True, True, False, reduction)
    out_a, state_a, _ = kernels.ctc_forward(*args, split_recursion=False)
    out_b, state_b, _ = kernels.ctc_forward(*args, split_recursion=True)
    assert torch.equal(out_a, out_b)
    for a, b in zip(state_a, state_b, strict=True):  # unwritten table slots are NaN
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    g = torch.rand(() if reduction == "mean" else 3, generator=torch.Generator().manual_seed(16)).to(path.device)
    base = kernels.ctc_backward(g, x, *state_a, 0, True)
    # the row block and warps change no sum; the label block changes the order of the repeated classes' sums
    assert torch.equal(kernels.ctc_backward(g, x, *state_a, 0, True, block_c=32, warps=2), base)
    chunked = kernels.ctc_backward(g, x, *state_a, 0, True, block_c=16, warps=1, block_k=4)
    torch.testing.assert_close(chunked, base, rtol=0, atol=1e-6)
    ref = reference(x, padded, il, tl, 0, reduction, True)[1]
    torch.testing.assert_close(out_a.double().cpu(), ref.detach(), rtol=1e-5, atol=1e-5)


def _wave_blocks(device) -> list[tuple[int, int]]:
    """Wavefront shapes for the tests: several programs per sample at the tests' sizes (small lanes under the
    interpreter), and the production shape on the GPU."""
    return [(4, 1)] if device.type == "cpu" else [(32, 1), kernels.WAVE_BLOCK]


def _same_bits(a, b):
    return torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) if a.is_floating_point() else torch.equal(a, b)


@pytest.mark.kernels
@pytest.mark.parametrize(
    "case", ["ragged", "edges", "nan", "concatenated_no_grad", "log_probs_sum", "zero_infinity_mean"]
)
def test_kernels_wavefront_equals_one_program(path, case, monkeypatch):
    """The wavefront (each sample's lanes split across programs) gives the one-program path's loss, log p and
    occupancy table bit for bit: ragged lengths, repeats, a last blank that starts a program (L a multiple of
    the block), empty label sequences, no frames, impossible samples, NaN, both target layouts and reductions."""
    monkeypatch.setattr(utils, "POISON_OUTPUTS", True)  # unwritten table slots are NaN in both
    gpu = path.device.type == "cuda"
    logits, need_grad, layout, reduction, zero_infinity = True, True, "padded", "none", False
    if case == "edges":
        T, N, C, S = 20, 6, 5, 12
        g = torch.Generator().manual_seed(5)
        x = torch.randn(T, N, C, generator=g)
        padded = torch.randint(1, C, (N, S), generator=g)
        padded[5, 3] = padded[5, 2]
        tl = torch.tensor([8, 4, 0, 12, 11, 8])  # 8: a multiple of the block (4)
        il = torch.tensor([20, 0, 7, 11, 20, 9])  # no frames; fewer frames than labels
        if gpu:
            T, S = 300, 260
            x = torch.randn(T, N, C, generator=g)
            padded = torch.randint(1, C, (N, S), generator=g)
            tl = torch.tensor([128, 40, 0, 256, 200, 64])
            il = torch.tensor([300, 0, 7, 200, 300, 150])
        x, padded, il, tl = (v.to(path.device) for v in (x, padded, il, tl))
    else:
        T, S = (24, 10) if not gpu else (400, 300)
        x, padded, il, tl = make_problem(31, T, 4, 7, S, device=path.device)
        if case == "nan":
            x[T // 3, 1, int(padded[1, 0])] = math.nan  # a label's score of sample 1
        if case == "concatenated_no_grad":
            layout, need_grad = "concatenated", False
        if case == "log_probs_sum":
            logits, reduction = False, "sum"
        if case == "zero_infinity_mean":
            tl[2], il[2] = S, S - 2  # fewer frames than labels: impossible
            padded[2] = torch.arange(S, device=path.device) % 6 + 1
            reduction, zero_infinity = "mean", True
    targets = padded if layout == "padded" else concatenated(padded, tl)
    args = (x, targets, il, tl, 0, layout == "padded", logits, need_grad, True, zero_infinity, reduction)
    out_a, state_a, _ = kernels.ctc_forward(*args, fuse_emission=False, wave=None)
    for shape in _wave_blocks(path.device):
        out_b, state_b, _ = kernels.ctc_forward(*args, fuse_emission=False, wave=shape)
        assert _same_bits(out_a, out_b), (shape, out_a, out_b)
        for name, a, b in zip(("weights", "logp", "lse", "table", "meta", "srt"), state_a, state_b, strict=True):
            assert _same_bits(a, b), (shape, name)
    if case == "nan":
        assert math.isnan(out_a[1]) and not out_a[[0, 2, 3]].isnan().any()
    if case == "zero_infinity_mean":
        assert state_a[1][2] == -math.inf and torch.isfinite(out_a)


@pytest.mark.kernels
def test_kernels_wavefront_public_api(path, monkeypatch):
    """The loss and gradient through ctc_loss with the wavefront chosen, against the float64 reference."""
    block = _wave_blocks(path.device)[0]
    monkeypatch.setattr(kernels, "wave_shape", lambda *args: block)
    monkeypatch.setattr(kernels, "use_small_forward", lambda *args: False)
    T, S = (24, 10) if path.device.type == "cpu" else (300, 140)
    x, padded, il, tl = make_problem(32, T, 3, 6, S, device=path.device)
    for reduction in ("none", "mean"):
        compare(x, padded, il, tl, reduction=reduction, logits=True)
    compare(x, padded, il, tl, layout="concatenated", logits=False)
    assert path.launches


@pytest.mark.parametrize("text", ["150x1", "150x1x28x0", "150xax28", "1x2x3x4x5"])
def test_bench_rows_refuses_bad_values(text):
    """bench ctc --rows: TxNxC or TxNxCxS of positive integers, else an error naming --rows."""
    from speechkernels.bench.ctc import parse_row

    assert parse_row("150x1x28") == (150, 1, 28, 150) and parse_row("1200x16x32x600") == (1200, 16, 32, 600)
    with pytest.raises(SystemExit, match="--rows"):
        parse_row(text)


@pytest.mark.skipif(kernels is None, reason="needs Triton")
def test_wave_shape_choice():
    """One program per sample for short label sequences and for batches that would not run at once."""
    assert kernels.wave_shape(1, 200, 132) is None
    assert kernels.wave_shape(1, 1321, 132) == kernels.WAVE_BLOCK
    assert kernels.wave_shape(64, 1500, 132) == kernels.WAVE_BLOCK
    assert kernels.wave_shape(128, 1500, 132) is None


@pytest.mark.kernels
def test_kernels_long_labels_chunked_scan(path, emission_path):
    """More labels than one scan chunk (64), with repeated classes spread over several chunks."""
    T, N, C, S = 150, 2, 5, 70
    x, _, _, _ = make_problem(13, T, N, C, S, device=path.device)
    padded = torch.randint(1, C, (N, S), generator=torch.Generator().manual_seed(14))
    tl = torch.tensor([70, 66])
    il = torch.tensor([150, 140])
    compare(x, padded, il, tl, logits=True)
    assert path.launches


# ---------------------------------------------------------------------------------------------------------------
# argument checks (both paths)


def _bad_cases(C=5):
    T, N = 6, 2
    x = torch.randn(T, N, C)
    tg = torch.tensor([[1, 2, 3], [2, 3, 4]])
    il, tl = torch.tensor([6, 6]), torch.tensor([3, 2])
    yield "input_lengths\\[1\\]=7", (x, tg, torch.tensor([6, 7]), tl), {}
    yield "input_lengths\\[0\\]=-1", (x, tg, torch.tensor([-1, 6]), tl), {}
    yield r"target_lengths\[1\]=4 is outside \[0, targets.shape\[1\]=3\]", (x, tg, il, torch.tensor([3, 4])), {}
    yield "target_lengths\\[0\\]=-2", (x, tg, il, torch.tensor([-2, 2])), {}
    yield (
        r"target_lengths\[1\]=3 runs past the 5 concatenated targets",
        (x, tg.reshape(-1)[:5], il, torch.tensor([3, 3])),
        {},
    )
    yield "label 7 of sample 1", (x, torch.tensor([[1, 2, 3], [2, 7, 4]]), il, tl), {}
    yield "label -1 of sample 0", (x, torch.tensor([[1, -1, 3], [2, 3, 4]]), il, tl), {}
    yield "label 0 of sample 1 \\(position 1\\) equals blank", (x, torch.tensor([[1, 2, 3], [2, 0, 4]]), il, tl), {}
    yield "label 2 of sample 0 \\(position 1\\) equals blank", (x, tg.reshape(-1)[:5], il, tl), {"blank": 2}
    yield "batch size", (x, tg, torch.tensor([6, 6, 6]), tl), {}
    yield "targets has 1 rows", (x, tg[:1], il, tl), {}
    yield "float16, bfloat16, float32 or float64", (x.long(), tg, il, tl), {}
    yield "int32 or int64", (x, tg.float(), il, tl), {}
    yield "blank=5", (x, tg, il, tl), {"blank": 5}
    yield "reduction", (x, tg, il, tl), {"reduction": "avg"}
    yield "4 dimensions|3 dimensions", (x[None], tg, il, tl), {}


@pytest.mark.parametrize("case", list(_bad_cases()), ids=lambda c: c[0][:20])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_bad_arguments_raise_value_error(case, dtype):
    match, (x, tg, il, tl), kwargs = case
    if x.dtype.is_floating_point:
        x = x.to(dtype)
    with pytest.raises(ValueError, match=match):
        sk.ctc_loss(x, tg, il, tl, **kwargs)


@pytest.mark.kernels
def test_bad_arguments_raise_value_error_in_kernels(path):
    """The same content checks through the kernels' path (float32)."""
    for match, tensors, kwargs in _bad_cases():
        x, tg, il, tl = (t.to(path.device) for t in tensors)
        if not x.dtype.is_floating_point:
            continue
        with pytest.raises(ValueError, match=match):
            sk.ctc_loss(x, tg, il, tl, **kwargs)
    assert path.launches


# ---------------------------------------------------------------------------------------------------------------
# GPU only: larger sizes, half precision, determinism, graphs, 64-bit offsets


def _gpu_problem(seed, T, N, C, S, dtype=torch.float32, blank=0):
    x, padded, il, tl = make_problem(seed, T, N, C, S, device="cuda", dtype=dtype, blank=blank)
    return x, padded, il, tl


@pytest.mark.gpu
@pytest.mark.parametrize("logits", [True, False])
@pytest.mark.parametrize("layout", ["padded", "concatenated"])
@pytest.mark.parametrize("shape", [(150, 16, 28, 60), (300, 8, 500, 150), (50, 64, 5000, 20), (1, 4, 7, 3)])
def test_gpu_matches_reference(gpu, logits, layout, shape):
    T, N, C, S = shape
    x, padded, il, tl = _gpu_problem(sum(shape), T, N, C, S, blank=C // 2)
    compare(x, padded, il, tl, logits=logits, layout=layout, blank=C // 2)


@pytest.mark.gpu
@pytest.mark.parametrize("tol", [F16, BF16], ids=["float16", "bfloat16"])
def test_gpu_half_precision(gpu, tol):
    x, padded, il, tl = _gpu_problem(21, 120, 8, 300, 40, dtype=tol[0])
    compare(x, padded, il, tl, logits=True, tol=tol)


@pytest.mark.gpu
def test_gpu_long_labels(gpu):
    """Label sequences of 4096 (one program holds 8192 states)."""
    T, N, C, S = 4400, 2, 40, 4096
    x, _, _, _ = _gpu_problem(22, T, N, C, S)
    padded = torch.randint(1, C, (N, S), device="cuda", generator=torch.Generator(device="cuda").manual_seed(22))
    tl = torch.tensor([4096, 3000], device="cuda")
    il = torch.tensor([4400, 4400], device="cuda")
    out, _ = compare(x, padded, il, tl, logits=True)
    assert torch.isfinite(out).all()


@pytest.mark.gpu
def test_gpu_deterministic(gpu):
    x, padded, il, tl = _gpu_problem(23, 200, 32, 1000, 80)
    results = []
    for _ in range(3):
        xi = x.clone().requires_grad_()
        loss = sk.ctc_loss(xi, padded, il, tl, reduction="none", logits=True)
        loss.sum().backward()
        results.append((loss.detach(), xi.grad))
    for loss, grad in results[1:]:
        assert torch.equal(loss, results[0][0]) and torch.equal(grad, results[0][1])


@pytest.mark.gpu
def test_gpu_cuda_graph_capture(gpu):
    x, padded, il, tl = _gpu_problem(24, 100, 8, 50, 30)
    check_graph_replay_matches_eager(lambda v: sk.ctc_loss(v, padded, il, tl, logits=True, validate=False), x)


@pytest.mark.gpu
def test_gpu_more_than_2_31_elements(gpu):
    """T*N*C > 2^31 (float16): the batch's losses equal those of its two halves computed separately."""
    T, N, C, S = 1100, 4, 500_000, 30
    assert T * N * C > 2**31
    g = torch.Generator(device="cuda").manual_seed(26)
    x = torch.randn(T, N, C, device="cuda", dtype=torch.float16, generator=g)
    padded = torch.randint(1, C, (N, S), device="cuda", generator=g)
    il = torch.tensor([1100, 900, 1000, 1100], device="cuda")
    tl = torch.tensor([30, 25, 12, 30], device="cuda")
    x.requires_grad_()
    loss = sk.ctc_loss(x, padded, il, tl, reduction="none", logits=True)
    loss.sum().backward()
    grad_last = x.grad[:, 3].clone()
    x.grad = None
    halves = []
    for sl in (slice(0, 2), slice(2, 4)):
        xh = x.detach()[:, sl].clone().requires_grad_()
        lh = sk.ctc_loss(xh, padded[sl], il[sl], tl[sl], reduction="none", logits=True)
        lh.sum().backward()
        halves.append((lh.detach(), xh.grad))
    torch.testing.assert_close(loss.detach(), torch.cat([halves[0][0], halves[1][0]]), rtol=0, atol=0)
    torch.testing.assert_close(grad_last, halves[1][1][:, 1], rtol=0, atol=0)


@pytest.mark.kernels
@pytest.mark.parametrize("logits", [True, False])
def test_kernels_through_torch_compile(path, logits):
    """The torch.library op (fake shapes, autograd registration) under torch.compile's tracing: whole graph, with
    inductor on the GPU."""
    x, padded, il, tl = make_problem(31, 9, 3, 6, 4, device=path.device)

    def f(v):
        return sk.ctc_loss(v if logits else v.log_softmax(-1), padded, il, tl, logits=logits, validate=False) * 2.0

    check_compiled_matches_eager(f, x, backend="aot_eager" if path.device.type == "cpu" else "inductor")
    assert path.launches
