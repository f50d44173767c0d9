"""RNN-T loss: the float64 reference against brute-force path enumeration and gradcheck, FastEmit and clamp on
hand-checked cases, the public function's argument checks and edge cases, torchaudio where importable."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from helpers import check_batch_halves, check_compiled_matches_eager, check_graph_replay_matches_eager, count_calls

import speechkernels as sk
from speechkernels._transducer import checks as transducer_checks
from speechkernels._transducer.options import TransducerOptions
from speechkernels.rnnt import api as rnnt_api
from speechkernels.rnnt import reference as rnnt_reference
from speechkernels.rnnt.reference import rnnt_forward_backward_reference, rnnt_losses_reference

kernels = rnnt_api.kernels  # None without Triton: its tests skip

F32 = (torch.float32, 1e-5, 1e-5)  # dtype, loss rtol, gradient atol
F16 = (torch.float16, 1e-2, 2e-3)


def make_problem(seed, N, T, U, V, *, blank=None, dtype=torch.float64, device="cpu"):
    """Random scores, ragged lengths (the first sample uses the full lattice), labels avoiding the blank."""
    g = torch.Generator().manual_seed(seed)
    blank = V - 1 if blank is None else blank
    x = torch.randn(N, T, U + 1, V, generator=g, dtype=torch.float64).to(dtype)
    il = torch.randint(1, T + 1, (N,), generator=g)
    il[0] = T
    tl = torch.randint(0, U + 1, (N,), generator=g)
    tl[0] = U
    classes = torch.tensor([c for c in range(V) if c != blank])
    targets = classes[torch.randint(0, len(classes), (N, U), generator=g)]
    return x.to(device), targets.to(device), il.to(device), tl.to(device), blank


def brute_force_nll(lp, targets, il, tl, blank, rnnt_type):
    """-log p(y | x) by enumerating every path of one sample (lp: [T, U+1, V] log-probabilities)."""
    T_n, U_n = int(il), int(tl)
    steps = T_n + U_n if rnnt_type == "rnnt" else T_n
    paths = []
    for labels_at in itertools.combinations(range(steps), U_n):
        t = u = 0
        score = torch.zeros((), dtype=torch.float64)
        ok = True
        for k in range(steps):
            if t >= T_n:
                ok = False
                break
            if k in labels_at:
                score = score + lp[t, u, targets[u]]
                u += 1
                t += rnnt_type == "rna"
            else:
                score = score + lp[t, u, blank]
                t += 1
        if ok and t == T_n and u == U_n:
            paths.append(score)
    return -torch.logsumexp(torch.stack(paths), 0) if paths else torch.tensor(math.inf, dtype=torch.float64)


# ---------------------------------------------------------------------------------------------------------------
# the reference


@pytest.mark.parametrize("rnnt_type", ["rnnt", "rna"])
@pytest.mark.parametrize("seed", range(3))
def test_reference_matches_brute_force(rnnt_type, seed):
    g = torch.Generator().manual_seed(seed)
    N, T, U, V = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((1, 5), (1, 6), (0, 4), (2, 7)))
    x, targets, il, tl, blank = make_problem(seed, N, T, U, V, blank=int(torch.randint(0, V, (1,), generator=g)))
    loss, _ = rnnt_forward_backward_reference(x, targets, il, tl, blank, rnnt_type=rnnt_type, need_grad=False)
    lp = x.log_softmax(-1)
    expected = torch.stack([brute_force_nll(lp[n], targets[n], il[n], tl[n], blank, rnnt_type) for n in range(N)])
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rnnt_type", ["rnnt", "rna"])
@pytest.mark.parametrize("fused", [True, False])
def test_reference_gradcheck(rnnt_type, fused):
    x, targets, il, tl, blank = make_problem(3, 3, 4, 2, 5)
    if rnnt_type == "rna":
        il = torch.maximum(il, tl)  # keep every sample possible (finite differences of +inf are meaningless)
    x = (x if fused else x.log_softmax(-1)).detach().requires_grad_()

    def f(v):
        return rnnt_losses_reference(
            v, targets, il, tl, TransducerOptions(blank, fused_log_softmax=fused, rnnt_type=rnnt_type)
        )

    assert torch.autograd.gradcheck(f, (x,))


def test_fastemit_and_clamp_by_hand():
    """T=1, one label: the only path emits the label at (0, 0), then the blank at (0, 1)."""
    V, blank, y, lam = 4, 3, 1, 0.25
    x = torch.randn(1, 1, 2, V, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    targets, il, tl = torch.tensor([[y]]), torch.tensor([1]), torch.tensor([1])
    lp = x.log_softmax(-1)
    nll = -(lp[0, 0, 0, y] + lp[0, 0, 1, blank])
    # log-prob input: the gradient is -1 on the two edges the path takes; FastEmit scales the label edge's
    loss, grad = rnnt_forward_backward_reference(lp, targets, il, tl, blank, False, fastemit_lambda=lam)
    torch.testing.assert_close(loss, (1 + lam) * nll[None])
    expected = torch.zeros_like(lp)
    expected[0, 0, 0, y] = -(1 + lam)
    expected[0, 0, 1, blank] = -1.0
    torch.testing.assert_close(grad, expected)
    # fused log_softmax: softmax times the node's total gradient minus the edges' (here each node has one edge)
    _, grad = rnnt_forward_backward_reference(x, targets, il, tl, blank, True, fastemit_lambda=lam)
    p = x.softmax(-1)
    expected_logits = torch.stack([(1 + lam) * p[0, 0, 0], p[0, 0, 1]])[None, None]
    expected_logits[0, 0, 0, y] -= 1 + lam
    expected_logits[0, 0, 1, blank] -= 1.0
    torch.testing.assert_close(grad, expected_logits)
    _, clamped = rnnt_forward_backward_reference(x, targets, il, tl, blank, True, fastemit_lambda=lam, clamp=0.2)
    torch.testing.assert_close(clamped, expected_logits.clamp(-0.2, 0.2))
    assert (clamped.abs() == 0.2).any()


# ---------------------------------------------------------------------------------------------------------------
# the public function


def _awkward_problem(seed, fused, dtype):
    """Ragged lengths (no frames, no labels), junk labels, any blank, and (by seed) NaN and -inf scores read and
    not read, wide score ranges."""
    g = torch.Generator().manual_seed(seed)
    N, T, U, V = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((1, 5), (1, 12), (0, 7), (2, 7)))
    x = torch.randn(N, T, U + 1, V, generator=g, dtype=torch.float64) * (1 + 2 * float(torch.rand(1, generator=g)))
    if not fused:
        x = x.log_softmax(-1)
    blank = int(torch.randint(0, V, (1,), generator=g))
    tg = torch.randint(-1, V + 1, (N, U), generator=g)
    il, tl = torch.randint(0, T + 1, (N,), generator=g), torch.randint(0, U + 1, (N,), generator=g)
    if seed % 7 == 0:
        x[0, 0, 0, 0] = math.nan
    if seed % 5 == 0:
        x[-1, -1, -1, :] = math.nan  # past some samples' lattices
    if seed % 9 == 0:
        x[0, 0, 0, blank] = -math.inf
    if seed % 11 == 0:
        x = x * 400
    return x.to(dtype), tg, il, tl, blank


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cpu_path_matches_reference(fused, dtype):
    """The scaled recursion against the log-space reference on the same (float64) scores, with FastEmit, clamp
    and both loss scales: float64 to 1e-9; float32 within its log-sum-exp's rounding."""
    tol = 1e-9 if dtype == torch.float64 else 2e-6
    for seed in range(60):
        x, tg, il, tl, blank = _awkward_problem(seed, fused, dtype)
        extra = (0.3 if seed % 3 == 0 else 0.0, 0.5 if seed % 4 == 0 else -1.0, "rnnt")
        ref_loss, ref_grad = rnnt_forward_backward_reference(
            x.double(), tg, il, tl, blank, fused, *extra, fastemit_loss_scale=seed % 2 == 1
        )
        opts = TransducerOptions(
            blank, clamp=extra[1], fastemit_lambda=extra[0], fused_log_softmax=fused, fastemit_loss_scale=seed % 2 == 1
        )
        loss, grad = rnnt_reference.rnnt_forward_backward_scaled(x, tg, il, tl, opts)
        assert grad.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
        torch.testing.assert_close(loss, ref_loss, rtol=tol, atol=tol, equal_nan=True)
        torch.testing.assert_close(grad.double(), ref_grad, rtol=0, atol=tol, equal_nan=True)


def test_cpu_path_recomputes_what_it_cannot_scale(monkeypatch):
    """Normalised every few diagonals, the scaled recursion hands nothing to the log-space reference. Never
    normalised, two equally likely classes on a 1000 x 400 lattice count more paths than float64 holds (about
    1e363): the check must see it and hand the sample over, and the results are the reference's either way."""
    real = rnnt_reference.log_space_forward_backward
    calls = count_calls(
        monkeypatch, rnnt_reference, "log_space_forward_backward", record=lambda x, *args, **kwargs: x.shape[0]
    )
    x, targets, il, tl, blank = make_problem(3, 3, 40, 12, 6)
    uniform = torch.zeros(1, 1000, 401, 2, dtype=torch.float64)
    long_args = (torch.zeros(1, 400, dtype=torch.long), torch.tensor([1000]), torch.tensor([400]), 1)
    for every, problem, handed in ((8, (x, targets, il, tl, blank), []), (10**6, (uniform, *long_args), [1])):
        monkeypatch.setattr(rnnt_reference, "NORMALISE_EVERY", every)
        calls.clear()
        opts = TransducerOptions(problem[-1])
        loss, grad = rnnt_reference.rnnt_forward_backward_scaled(*problem[:-1], opts)
        assert calls == handed
        ref_loss, ref_grad = real(*problem[:-1], opts)
        assert torch.isfinite(ref_loss).all()
        torch.testing.assert_close(loss, ref_loss, rtol=1e-11, atol=0)
        torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-11)


@pytest.mark.parametrize("rnnt_type", ["rnnt", "rna"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_rnnt_loss_matches_reference_float32(rnnt_type, reduction, path):
    x, targets, il, tl, blank = make_problem(5, 4, 7, 3, 6, dtype=torch.float32, device=path.device)
    xs = x.clone().requires_grad_()
    out = sk.rnnt_loss(xs, targets, il, tl, blank=blank, reduction=reduction, rnnt_type=rnnt_type)
    assert out.dtype == torch.float32
    ref, ref_grad = rnnt_forward_backward_reference(
        x.cpu(), targets.cpu(), il.cpu(), tl.cpu(), blank, rnnt_type=rnnt_type
    )
    finite = torch.isfinite(ref)
    g = torch.rand(ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(6)) * finite
    if reduction == "none":
        torch.testing.assert_close(out.double().cpu(), ref, rtol=1e-5, atol=1e-5)
        out.backward(g.float().to(path.device))
        expected_grad = (ref_grad * g[:, None, None, None]).float()
    else:
        expected = ref.sum() if reduction == "sum" else ref.mean()
        torch.testing.assert_close(out.double().cpu(), expected, rtol=1e-5, atol=1e-5)
        out.backward()
        expected_grad = (ref_grad / (1 if reduction == "sum" else len(ref))).float()
    assert xs.grad.dtype == torch.float32
    torch.testing.assert_close(xs.grad.cpu(), expected_grad, rtol=0, atol=1e-6)
    path.check_ran()


def test_rnnt_loss_edge_cases():
    """U = 0 (blanks only), T = 1, no frames, RNA with more labels than frames; blank given as any index."""
    V = 5
    x = torch.randn(5, 3, 3, V, dtype=torch.float64, generator=torch.Generator().manual_seed(7), requires_grad=True)
    targets = torch.tensor([[1, 2], [1, 1], [3, 0], [2, 3], [1, 2]])
    il = torch.tensor([3, 1, 0, 0, 2])
    tl = torch.tensor([0, 2, 1, 0, 2])
    loss = sk.rnnt_loss(x, targets, il, tl, blank=0, reduction="none")
    lp = x.detach().log_softmax(-1)
    torch.testing.assert_close(loss[0], -lp[0, :, 0, 0].sum())  # three blanks
    torch.testing.assert_close(loss[1], -(lp[1, 0, 0, 1] + lp[1, 0, 1, 1] + lp[1, 0, 2, 0]))  # both labels at t=0
    assert torch.isinf(loss[2]) and loss[3] == 0  # no frames: impossible with labels, empty without
    (grad,) = torch.autograd.grad(loss[torch.isfinite(loss)].sum(), x)
    assert (grad[2:4] == 0).all() and torch.isfinite(grad).all()
    rna = sk.rnnt_loss(x, targets, il, tl, blank=0, reduction="none", rnnt_type="rna")
    assert torch.isinf(rna[1]) and torch.isfinite(rna[4])  # 2 labels in 1 frame; 2 labels in 2 frames
    same = sk.rnnt_loss(x, targets, il, tl, blank=-V, reduction="none")
    torch.testing.assert_close(same, loss, rtol=0, atol=0)


def test_rnnt_loss_nan_stays_in_its_sample():
    x, targets, il, tl, blank = make_problem(8, 3, 5, 2, 4)
    x[1, 0, 0, 2] = math.nan
    x.requires_grad_()
    loss = sk.rnnt_loss(x, targets, il, tl, blank=blank, reduction="none")
    assert loss[1].isnan() and torch.isfinite(loss[[0, 2]]).all()
    loss.sum().backward()
    assert x.grad[1].isnan().any() and torch.isfinite(x.grad[[0, 2]]).all()


def test_rnnt_module_and_argument_forms():
    x, targets, il, tl, blank = make_problem(9, 3, 5, 2, 4, dtype=torch.float32)
    ref = sk.rnnt_loss(x, targets, il, tl, blank=blank, reduction="none")
    torch.testing.assert_close(sk.rnnt_loss(x, targets.int(), il.tolist(), tl.tolist(), blank, reduction="none"), ref)
    torch.testing.assert_close(sk.RNNTLoss(blank=blank, reduction="none")(x, targets, il, tl), ref)


def _bad_cases(dtype=torch.float32):
    x = torch.randn(2, 4, 3, 5, dtype=dtype)
    tg = torch.tensor([[1, 2], [2, 3]])
    il, tl = torch.tensor([4, 3]), torch.tensor([2, 1])
    return [
        ((x, tg, torch.tensor([5, 3]), tl), {}, "logit_lengths\\[0\\]=5"),
        ((x, tg, torch.tensor([4, -1]), tl), {}, "logit_lengths\\[1\\]=-1"),
        ((x, tg, il, torch.tensor([3, 1])), {}, "target_lengths\\[0\\]=3"),
        ((x, tg, il, torch.tensor([2, -2])), {}, "target_lengths\\[1\\]=-2"),
        ((x, torch.tensor([[1, 5], [2, 3]]), il, tl), {}, "targets\\[0, 1\\]=5 is outside"),
        ((x, torch.tensor([[1, 2], [4, 3]]), il, tl), {}, "targets\\[1, 0\\]=4 equals blank"),
        ((x, tg[:, :1], il, tl), {}, "logits.shape\\[2\\]=3"),
        ((x.long(), tg, il, tl), {}, "logits must be"),
        ((x[0], tg, il, tl), {}, "4 dimensions"),
        ((x, tg.float(), il, tl), {}, "targets must be int32"),
        ((x, tg[:1], il, tl), {}, "targets has 1 rows"),
        ((x, tg, il[:1], tl), {}, "logit_lengths has 1 entries"),
        ((x, tg, il, tl), {"blank": 5}, "blank=5"),
        ((x, tg, il, tl), {"reduction": "avg"}, "reduction"),
        ((x, tg, il, tl), {"rnnt_type": "ctc"}, "rnnt_type"),
        ((x, tg, il, tl), {"fastemit_lambda": -0.5}, "fastemit_lambda"),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # kernels (under the interpreter), reference
@pytest.mark.parametrize("case", range(len(_bad_cases())))
def test_rnnt_bad_arguments_raise_value_error(case, dtype):
    args, kwargs, match = _bad_cases(dtype)[case]
    with pytest.raises(ValueError, match=match):
        sk.rnnt_loss(*args, **kwargs)


def test_rnnt_loss_matches_torchaudio_cpu():
    torchaudio = pytest.importorskip("torchaudio")
    x, targets, il, tl, blank = make_problem(10, 4, 9, 4, 7, dtype=torch.float32)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    theirs = torchaudio.functional.rnnt_loss(xa, targets.int(), il.int(), tl.int(), blank=blank, reduction="sum")
    ours = sk.rnnt_loss(xb, targets, il, tl, blank=blank, reduction="sum")
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    theirs.backward()
    ours.backward()
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_gpu_rnnt_loss_matches_torchaudio(gpu):
    torchaudio = pytest.importorskip("torchaudio")
    x, targets, il, tl, blank = make_problem(11, 8, 30, 10, 29, dtype=torch.float32, device=gpu)
    # torchaudio's CUDA kernel returns 0 for a sample without labels (its CPU kernel and this library agree
    # on -sum of the blank log-probs, measured on torchaudio 2.11): compare samples with labels only
    tl = tl.clamp(min=1)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    theirs = torchaudio.functional.rnnt_loss(xa, targets.int(), il.int(), tl.int(), blank=blank, reduction="none")
    ours = sk.rnnt_loss(xb, targets, il, tl, blank=blank, reduction="none")
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    g = torch.rand(8, device=gpu)
    theirs.backward(g)
    ours.backward(g)
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# the Triton kernels: one body on the CPU (interpreter) and on the GPU (path.device)


def compare_kernels(x, targets, il, tl, blank, *, tol=F32, reduction="none", seed=0, **kwargs):
    """Kernels (x in tol's dtype) against the float64 reference, loss and gradient under a random upstream
    gradient."""
    dtype, rtol, atol = tol
    xin = x.detach().to(dtype).requires_grad_()
    out = sk.rnnt_loss(xin, targets, il, tl, blank=blank, reduction=reduction, **kwargs)
    xr = x.detach().to(dtype).double().requires_grad_()
    ref = sk.rnnt.rnnt_loss_reference(xr, targets, il, tl, blank=blank, reduction=reduction, **kwargs)
    torch.testing.assert_close(out.double(), ref.detach(), rtol=rtol, atol=1e-4, equal_nan=True)
    finite = torch.isfinite(ref.detach())
    g = torch.rand(out.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    g = g.to(finite.device) * finite
    out.backward(g.to(out.dtype))
    ref.backward(g)
    assert xin.grad.dtype == dtype
    torch.testing.assert_close(xin.grad.double(), xr.grad, rtol=0, atol=atol, equal_nan=True)
    return out, xin.grad


@pytest.mark.kernels
@pytest.mark.parametrize("rnnt_type", ["rnnt", "rna"])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("seed", range(2))
def test_kernels_match_reference(path, rnnt_type, fused, seed):
    g = torch.Generator().manual_seed(200 + seed)
    N, T, U, V = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((1, 5), (1, 9), (0, 6), (2, 40)))
    blank = int(torch.randint(0, V, (1,), generator=g))
    x, targets, il, tl, blank = make_problem(seed, N, T, U, V, blank=blank, device=path.device)
    if not fused:  # not normalised
        x = x.log_softmax(-1) + 0.3 * torch.randn(x.shape, generator=g, dtype=x.dtype).to(x.device)
    lam = [0.0, 0.3][seed]
    compare_kernels(x, targets, il, tl, blank, fused_log_softmax=fused, rnnt_type=rnnt_type, fastemit_lambda=lam)
    assert path.launches


@pytest.mark.kernels
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_kernels_reductions_and_clamp(path, reduction):
    x, targets, il, tl, blank = make_problem(12, 3, 6, 3, 9, device=path.device)
    compare_kernels(x * 3, targets, il, tl, blank, reduction=reduction, clamp=0.05)
    # int32 lengths and labels go to the kernels as they are
    compare_kernels(x, targets.int(), il.int(), tl.int(), blank, reduction=reduction)
    assert path.launches


@pytest.mark.kernels
def test_kernels_edge_cases(path):
    """U = 0, T = 1, no frames (impossible with labels), RNA with more labels than frames, a NaN."""
    V = 6
    x = torch.randn(6, 4, 4, V, dtype=torch.float64, generator=torch.Generator().manual_seed(13)).to(path.device)
    targets = torch.tensor([[1, 2, 3], [1, 1, 2], [3, 0, 1], [2, 3, 4], [1, 2, 1], [4, 4, 4]])
    il = torch.tensor([4, 1, 0, 0, 2, 3])
    tl = torch.tensor([0, 3, 1, 0, 3, 2])
    for rnnt_type in ("rnnt", "rna"):
        out, grad = compare_kernels(x, targets, il, tl, 5, rnnt_type=rnnt_type)
        assert torch.isinf(out[2]) and (grad[2] == 0).all()
        # the kernels' batch reduction: an impossible sample makes the mean inf
        out, _ = compare_kernels(x, targets, il, tl, 5, rnnt_type=rnnt_type, reduction="mean")
        assert torch.isinf(out)
    x[5, 1, 0, 2] = math.nan
    out, grad = compare_kernels(x, targets, il, tl, 5)
    assert out[5].isnan() and torch.isfinite(out[[0, 1, 3, 4]]).all()
    assert grad[5].isnan().any() and torch.isfinite(grad[:5]).all()
    out, _ = compare_kernels(
        x[[0, 1, 3, 4, 5]], targets[[0, 1, 3, 4, 5]], il[[0, 1, 3, 4, 5]], tl[[0, 1, 3, 4, 5]], 5, reduction="sum"
    )
    assert out.isnan()
    assert path.launches


@pytest.mark.kernels
@pytest.mark.parametrize("blocks", [(2, 8, 1), (4, 16, 2)])
def test_kernels_several_chunks_and_u_blocks(path, monkeypatch, blocks):
    """Blocks smaller than a row: the log-sum-exp runs online over several chunks of classes, then the classes past
    them (V = 37: 32 + a chunk of 8 with 5 classes), and a row's cells spread over several programs (the tuned
    blocks cover whole rows at these sizes)."""
    monkeypatch.setattr(kernels, "_row_blocks", lambda U1, V: blocks)
    monkeypatch.setattr(kernels, "_grad_blocks", lambda U1, V: blocks)
    x, targets, il, tl, blank = make_problem(15, 3, 5, 6, 37, device=path.device)
    compare_kernels(x, targets, il, tl, blank, fastemit_lambda=0.2, clamp=0.3)
    # consuming the logits, the backward computes the log-sum-exps again, chunk by chunk, before writing
    kw = dict(blank=blank, reduction="sum", fastemit_lambda=0.2, clamp=0.3)
    plain = x.float().requires_grad_()
    sk.rnnt_loss(plain, targets, il, tl, **kw).backward()
    logits = x.float().requires_grad_() * 1.0
    sk.rnnt_loss(logits, targets, il, tl, **kw, reuse_logits_for_grad=True).backward()
    torch.testing.assert_close(logits.detach(), plain.grad, rtol=0, atol=1e-6)
    assert path.launches


@pytest.mark.kernels
def test_kernels_batch_reduction_and_validation_in_several_tiles(path, monkeypatch):
    """The last program's batch sum and the validation loop over more samples than one tile holds."""
    monkeypatch.setattr(kernels, "_batch_block", lambda N: 4)
    monkeypatch.setattr(transducer_checks.lattice, "_validate_blocks", lambda N, U: (4, 16))
    x, targets, il, tl, blank = make_problem(16, 11, 3, 2, 5, device=path.device)
    with torch.no_grad():  # loss only: the halves kernel sums
        out = sk.rnnt_loss(x.float(), targets, il, tl, blank=blank, reduction="sum")
    torch.testing.assert_close(out.double(), sk.rnnt.rnnt_loss_reference(x, targets, il, tl, blank, reduction="sum"))
    xg = x.float().requires_grad_()  # with the gradient: the join kernel averages
    out = sk.rnnt_loss(xg, targets, il, tl, blank=blank, reduction="mean")
    torch.testing.assert_close(out.double(), sk.rnnt.rnnt_loss_reference(x, targets, il, tl, blank))
    bad = tl.clone()
    bad[10] = 3  # past targets.shape[1] = 2: found in the last tile
    with pytest.raises(ValueError, match=r"target_lengths\[10\]"):
        sk.rnnt_loss(x.float(), targets, il, bad, blank=blank)
    assert path.launches


@pytest.mark.kernels
def test_kernels_strided_logits_and_float16(path):
    x, targets, il, tl, blank = make_problem(14, 3, 7, 4, 10, device=path.device)
    strided = x.transpose(1, 2).contiguous().transpose(1, 2)  # same values, T and U strides swapped
    assert not strided.is_contiguous()
    compare_kernels(strided, targets, il, tl, blank)
    compare_kernels(x, targets, il, tl, blank, tol=F16)
    assert path.launches


# ---------------------------------------------------------------------------------------------------------------
# GPU only: larger sizes, half precision, determinism, graphs, 64-bit offsets


@pytest.mark.gpu
@pytest.mark.parametrize("rnnt_type", ["rnnt", "rna"])
@pytest.mark.parametrize("fused", [True, False])
def test_gpu_matches_reference(gpu, rnnt_type, fused):
    x, targets, il, tl, blank = make_problem(20, 6, 60, 25, 300, device=gpu)
    if rnnt_type == "rna":
        tl = torch.minimum(tl, il)
    if not fused:
        x = x.log_softmax(-1)
    compare_kernels(x, targets, il, tl, blank, fused_log_softmax=fused, rnnt_type=rnnt_type, fastemit_lambda=0.1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_half_precision(gpu, dtype):
    x, targets, il, tl, blank = make_problem(21, 4, 40, 12, 100, device=gpu)
    out = sk.rnnt_loss(x.to(dtype).requires_grad_(), targets, il, tl, blank=blank, reduction="none")
    ref = sk.rnnt.rnnt_loss_reference(x.to(dtype).double(), targets, il, tl, blank=blank, reduction="none")
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
def test_gpu_deterministic(gpu):
    x, targets, il, tl, blank = make_problem(22, 8, 80, 20, 500, dtype=torch.float32, device=gpu)
    results = []
    for _ in range(3):
        xi = x.clone().requires_grad_()
        loss = sk.rnnt_loss(xi, targets, il, tl, blank=blank, reduction="none")
        loss.sum().backward()
        results.append((loss.detach(), xi.grad))
    for loss, grad in results[1:]:
        assert torch.equal(loss, results[0][0]) and torch.equal(grad, results[0][1])


@pytest.mark.kernels
def test_kernels_reuse_logits_for_grad(path):
    """The gradient lands in the logits' storage and equals the ordinary one."""
    x, targets, il, tl, blank = make_problem(15, 3, 6, 3, 7, dtype=torch.float32, device=path.device)
    xa = x.clone().requires_grad_()
    sk.rnnt_loss(xa, targets, il, tl, blank=blank, fastemit_lambda=0.2, clamp=0.3).backward()
    joint = x.clone().requires_grad_()
    logits = joint * 1.0  # a non-leaf, as a joint network's output is; Mul's backward does not read it
    storage = logits.data_ptr()
    sk.rnnt_loss(
        logits, targets, il, tl, blank=blank, fastemit_lambda=0.2, clamp=0.3, reuse_logits_for_grad=True
    ).backward()
    # the backward computes the log-sum-exps again (on the GPU, in another order than the forward: an ulp apart)
    torch.testing.assert_close(joint.grad, xa.grad, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(logits.detach(), joint.grad, rtol=0, atol=0)  # consumed: it holds the gradient now
    assert logits.data_ptr() == storage
    assert path.launches


@pytest.mark.kernels
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_kernels_through_torch_compile(path, reduction):
    """The torch.library op (fake shapes, autograd registration) under torch.compile's tracing: whole graph, with
    inductor on the GPU (which checks the alignment of the op's outputs: the batch mean is one of them)."""
    x, targets, il, tl, blank = make_problem(16, 2, 5, 3, 6, dtype=torch.float32, device=path.device)

    def f(v):
        return sk.rnnt_loss(v, targets, il, tl, blank=blank, reduction=reduction, validate=False).sum() * 2.0

    check_compiled_matches_eager(f, x, backend="aot_eager" if path.device.type == "cpu" else "inductor")
    assert path.launches


@pytest.mark.gpu
def test_gpu_cuda_graph_capture(gpu):
    x, targets, il, tl, blank = make_problem(23, 4, 30, 8, 40, dtype=torch.float32, device=gpu)
    check_graph_replay_matches_eager(lambda v: sk.rnnt_loss(v, targets, il, tl, blank=blank, validate=False), x)


@pytest.mark.gpu
def test_gpu_more_than_2_31_logits(gpu):
    """N*T*(U+1)*V > 2^31 (float16): the batch's losses equal those of its two halves computed separately."""
    N, T, U, V = 4, 400, 100, 14000
    assert N * T * (U + 1) * V > 2**31
    g = torch.Generator(device="cuda").manual_seed(25)
    x = torch.randn(N, T, U + 1, V, device="cuda", dtype=torch.float16, generator=g)
    targets = torch.randint(0, V - 1, (N, U), device="cuda", generator=g)
    il = torch.tensor([400, 350, 380, 400], device="cuda")
    tl = torch.tensor([100, 90, 60, 100], device="cuda")
    check_batch_halves(lambda v, sl: sk.rnnt_loss(v, targets[sl], il[sl], tl[sl], reduction="none"), x)


@pytest.mark.kernels
@pytest.mark.parametrize("seed", range(3))
def test_kernels_random_shapes_with_a_zero_probability(path, seed):
    """Random shapes (labels outnumbering frames too: the skewed lattice rows wrap), a -inf score."""
    g = torch.Generator().manual_seed(300 + seed)
    N, T, U, V = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((1, 5), (1, 9), (0, 7), (2, 20)))
    x, targets, il, tl, blank = make_problem(seed, N, T, U, V, device=path.device)
    x[0, 0, 0, 0] = -math.inf  # a zero probability
    out, _ = compare_kernels(x, targets, il, tl, blank, fastemit_lambda=0.1 * seed)
    assert torch.isfinite(out).all() or seed == 0
    assert path.launches
