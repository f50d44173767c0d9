"""The joint network fused with the TDT loss: every path (PyTorch, Triton under the interpreter, CUDA) against the
float64 composition (logits made, then the TDT reference), edge cases, NaN confinement, omega, bad arguments, the
module, torch.compile, 16-bit inputs and CUDA graphs on the GPU."""

from __future__ import annotations

import inspect

import pytest
import torch
from helpers import (
    FixedPath,
    check_float32_against_float64,
    check_graph_replay_matches_eager,
    leaf_grads,
    rel,
)

import speechkernels as sk
from speechkernels._transducer.joint_reference import joint_hidden

DURATIONS = [0, 1, 2, 4]


def make_case(N, T, U, H, V, D, *, seed=0, dtype=torch.float32, device="cpu"):
    """enc, pred, a [V + D, H] weight (tokens, the blank last, then durations) and bias; labels never the blank."""
    g = torch.Generator().manual_seed(seed)
    enc = torch.randn(N, T, H, generator=g)
    pred = torch.randn(N, U + 1, H, generator=g)
    weight = torch.randn(V + D, H, generator=g) / H**0.5
    bias = torch.randn(V + D, generator=g) * 0.1
    targets = torch.randint(0, V - 1, (N, U), generator=g)
    il = torch.randint(1, T + 1, (N,), generator=g)
    tl = torch.randint(0, U + 1, (N,), generator=g)
    il[0], tl[0] = T, U
    return [x.to(device, dtype) for x in (enc, pred, weight, bias)], targets.to(device), il.to(device), tl.to(device)


OPTIONS = [
    dict(),
    dict(activation="tanh", sigma=0.05, fastemit_lambda=0.2),
    dict(activation="sigmoid", clamp=0.02, dropout=0.3, blank=0),
    dict(dropout=0.2, fastemit_lambda=0.1, fastemit_loss_scale=False, bias=False),
]


def _check_against_float64(path, N, T, U, H, V, opts, reduction="none", durations=DURATIONS, seed=0):
    opts = dict(opts)
    with_bias = opts.pop("bias", True)
    xs, tg, il, tl = make_case(N, T, U, H, V, len(durations), seed=seed, device=path.device)
    if opts.get("blank") == 0:
        tg = tg + 1  # labels in [1, V)
    if not with_bias:
        xs[3] = None
    upstream = torch.rand(N, device=path.device) if reduction == "none" else None

    def run(dtype):
        def f(e, p, w, b=None):
            return sk.tdt_joint_loss(
                e,
                p,
                w,
                b,
                tg,
                il,
                tl,
                durations,
                reduction=reduction,
                generator=torch.Generator().manual_seed(3),
                **opts,
            )

        return leaf_grads([x.to(dtype) if x is not None else None for x in xs], f, upstream)

    check_float32_against_float64(path, run)


def test_float64_path_is_the_unfused_composition():
    """The PyTorch path: logits made (joint_hidden, linear), then tdt_loss's float64 reference."""
    xs, tg, il, tl = make_case(2, 5, 2, 8, 7, 4, dtype=torch.float64)
    ours = sk.tdt_joint_loss(*xs, tg, il, tl, DURATIONS, sigma=0.05, reduction="none")
    logits = torch.nn.functional.linear(joint_hidden(xs[0], xs[1], 0, 5, "relu", 0.0, (0, 0)), xs[2], xs[3])
    ref = sk.tdt.tdt_loss_reference(logits, tg, il, tl, DURATIONS, 6, 0.05, reduction="none")
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "size, opts, reduction",
    [
        ((3, 8, 5, 20, 19), OPTIONS[0], "none"),
        ((2, 9, 4, 40, 23), OPTIONS[1], "mean"),
        ((2, 6, 3, 24, 37), OPTIONS[2], "sum"),
        ((3, 9, 5, 17, 6), OPTIONS[3], "none"),
    ],
)
def test_tdt_joint_loss_matches_float64(path, size, opts, reduction):
    _check_against_float64(path, *size, opts, reduction)


SMALL = [
    ((2, 1, 0, 16, 3), [1]),
    ((2, 5, 0, 20, 7), [1, 2]),
    ((1, 1, 1, 16, 2), [0, 1]),
    ((3, 4, 6, 24, 5), [0, 1, 2, 3, 4]),
]


@pytest.mark.parametrize("size, durations", SMALL)
def test_tdt_joint_loss_small_and_empty_lattices(path, size, durations):
    """U = 0, T = 1, more labels than frames, one duration and five."""
    _check_against_float64(path, *size, {}, durations=durations)


def test_tdt_joint_loss_impossible_sample_and_nan_confinement(path):
    dev = path.device
    xs, tg, il, tl = make_case(3, 6, 3, 20, 11, 4, device=dev)
    xs[0][2, 1, 5] = float("nan")  # a frame sample 2 reads
    il = torch.tensor([6, 0, 6], device=dev)  # sample 1: labels but no frames (no path)
    tl = torch.tensor([3, 2, 1], device=dev)
    xs = [x.requires_grad_() for x in xs]
    loss = sk.tdt_joint_loss(*xs, tg, il, tl, DURATIONS, reduction="none")
    assert torch.isfinite(loss[0]) and torch.isinf(loss[1]) and torch.isnan(loss[2])
    (loss[[0, 2]].sum() + 0 * loss[1]).backward()
    assert torch.isfinite(xs[0].grad[0]).all() and xs[0].grad[1].abs().max() == 0 and torch.isnan(xs[0].grad[2]).any()
    assert torch.isfinite(xs[1].grad[[0, 1]]).all()


@pytest.mark.parametrize("kw", [{}, dict(reduction="none", fastemit_lambda=0.1, blank=0, activation="tanh")], ids=str)
def test_tdt_joint_omega_is_the_rnnt_joint_loss_of_the_token_rows(kw):
    """omega's draw picks the RNN-T joint loss of the token rows, with the same options."""
    xs, tg, il, tl = make_case(2, 6, 3, 16, 9, 4)
    if kw:
        tg = tg + 1  # labels clear of blank 0
    picks = []
    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        draw = torch.rand((), generator=torch.Generator().manual_seed(seed)).item()
        loss = sk.tdt_joint_loss(*xs, tg, il, tl, DURATIONS, omega=0.5, generator=g, **kw)
        if draw < 0.5:
            expected = sk.rnnt_joint_loss(xs[0], xs[1], xs[2][:9], xs[3][:9], tg, il, tl, **kw)
        else:
            expected = sk.tdt_joint_loss(*xs, tg, il, tl, DURATIONS, **kw)
        assert loss.shape == ((2,) if kw else ())
        torch.testing.assert_close(loss, expected, rtol=0, atol=0)
        picks.append(draw < 0.5)
    assert any(picks) and not all(picks)


BAD = [
    (dict(durations=[0]), "positive duration"),
    (dict(durations=[1, 1]), "distinct"),
    (dict(durations=[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]), "leaves no token class"),
    (dict(omega=1.5), "omega"),
    (dict(sigma=float("inf")), "sigma"),
    (dict(blank=9), "blank=9"),
    (dict(dropout=1.0), "dropout"),
    (dict(activation="gelu"), "activation"),
    (dict(reduction="avg"), "reduction"),
    (dict(clamp="x"), "clamp"),
    (dict(fastemit_lambda=-0.1), "fastemit_lambda"),
    (dict(validate=1), "validate"),
    (dict(generator="seed"), "generator"),
]


@pytest.mark.parametrize("kw, match", BAD)
def test_tdt_joint_bad_arguments(kw, match):
    xs, tg, il, tl = make_case(2, 5, 2, 8, 7, 4)
    kw = dict(kw)
    durations = kw.pop("durations", DURATIONS)
    with pytest.raises(ValueError, match=match):
        sk.tdt_joint_loss(*xs, tg, il, tl, durations, **kw)


def test_joint_losses_refuse_fused_log_softmax():
    """The joint's outputs are scores: the unfused losses' fused_log_softmax is no option of the fused ones."""
    xs, tg, il, tl = make_case(2, 5, 2, 8, 9, 0)
    with pytest.raises(TypeError, match="fused_log_softmax"):
        sk.tdt_joint_loss(*xs, tg, il, tl, [1, 2], fused_log_softmax=False)
    with pytest.raises(TypeError, match="fused_log_softmax"):
        sk.multiblank_joint_loss(*xs, tg % 6, il, tl, [2], fused_log_softmax=True)


def test_tdt_joint_module():
    torch.manual_seed(0)
    m = sk.TDTJointLoss(12, 10, 16, 9, [0, 1, 2], sigma=0.05, reduction="sum")
    assert m.out.weight.shape == (12, 16)
    assert list(inspect.signature(sk.TDTJointLoss).parameters)[:5] == [
        "enc_dim",
        "pred_dim",
        "joint_dim",
        "vocab_size",
        "durations",
    ]
    enc, pred = torch.randn(2, 7, 12), torch.randn(2, 4, 10)
    tg, il, tl = torch.randint(0, 8, (2, 3)), torch.tensor([7, 5]), torch.tensor([3, 1])
    expected = sk.tdt_loss(m.joint(enc, pred), tg, il, tl, [0, 1, 2], sigma=0.05, reduction="sum")
    torch.testing.assert_close(m(enc, pred, tg, il, tl), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="unexpected keyword"):
        sk.TDTJointLoss(12, 10, 16, 9, [0, 1], rnnt_type="rna")


@pytest.mark.kernels
def test_tdt_joint_kernels_through_torch_compile(path):
    """The loss and all four gradients through torch.compile (whole graph: the library ops' fake shapes and
    autograd registration) equal eager's, bit for bit."""
    xs, tg, il, tl = make_case(3, 9, 4, 20, 11, 4, seed=5, device=path.device)

    def f(enc, pred, weight, b):
        return sk.tdt_joint_loss(enc, pred, weight, b, tg, il, tl, DURATIONS, validate=False, sigma=0.02) * 2.0

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager" if path.device.type == "cpu" else "inductor")
    la, ga = leaf_grads(xs, compiled)
    lb, gb = leaf_grads(xs, f)
    torch.testing.assert_close(la, lb, rtol=0, atol=0)
    for a, b in zip(ga, gb, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert path.launches


def _check_16bit(device, dtype, size):
    xs, tg, il, tl = make_case(*size, len(DURATIONS), device=device, seed=1)
    xs = [x.to(dtype) for x in xs]

    def f(e, p, w, b):
        return sk.tdt_joint_loss(e, p, w, b, tg, il, tl, DURATIONS, reduction="sum", sigma=0.02)

    loss, grads = leaf_grads(xs, f)
    ref_loss, ref_grads = leaf_grads([x.double() for x in xs], f)
    assert rel(loss, ref_loss) < 1e-2
    for a, b in zip(grads, ref_grads, strict=True):
        assert a.dtype == dtype
        cos = torch.nn.functional.cosine_similarity(a.double().flatten(), b.flatten(), dim=0)
        assert cos > 0.999, cos
    again = leaf_grads(xs, f)
    assert torch.equal(loss, again[0]) and all(torch.equal(a, b) for a, b in zip(grads, again[1], strict=True))


@pytest.mark.kernels
def test_tdt_joint_kernels_float16_inputs(path):
    _check_16bit(path.device, torch.float16, (3, 11, 4, 40, 37))
    assert path.launches


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_tdt_joint_loss_16bit(gpu, dtype):
    _check_16bit(gpu, dtype, (4, 70, 23, 200, 301))


@pytest.mark.gpu
@pytest.mark.parametrize("size", [(4, 130, 37, 640, 1025), (2, 200, 9, 96, 8193)])
def test_gpu_tdt_joint_loss_large_float32(gpu, size):
    _check_against_float64(FixedPath(gpu), *size, {"sigma": 0.02}, "none", durations=[0, 1, 2, 3, 4])


@pytest.mark.gpu
def test_gpu_tdt_joint_module_autocast_and_graph_capture(gpu):
    torch.manual_seed(0)
    m = sk.TDTJointLoss(64, 48, 96, 129, [0, 1, 2, 3, 4], validate=False).to(gpu)
    enc, pred = torch.randn(3, 40, 64, device=gpu), torch.randn(3, 11, 48, device=gpu)
    tg = torch.randint(0, 128, (3, 10), device=gpu)
    il, tl = torch.tensor([40, 33, 20], device=gpu), torch.tensor([10, 7, 3], device=gpu)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = m(enc, pred, tg, il, tl)
    loss.backward()
    assert loss.dtype == torch.float32 and m.out.weight.grad.dtype == torch.float32
    w = m.out.weight.detach()
    e, p = m.enc(enc).detach(), m.pred(pred).detach()
    check_graph_replay_matches_eager(
        lambda x: sk.tdt_joint_loss(x, p, w, None, tg, il, tl, [0, 1, 2, 3, 4], validate=False), e
    )


# ---------------------------------------------------------------------------------------------------------------
# multi-blank: big blanks among the V classes, before the blank

BIG = [2, 4]


def _check_multiblank_against_float64(path, N, T, U, H, V, opts, reduction="none", big=BIG, seed=0):
    opts = dict(opts)
    xs, tg, il, tl = make_case(N, T, U, H, V, 0, seed=seed, device=path.device)
    tg = tg % (V - 1 - len(big))  # labels below the big blanks
    upstream = torch.rand(N, device=path.device) if reduction == "none" else None

    def run(dtype):
        def f(e, p, w, b):
            return sk.multiblank_joint_loss(
                e, p, w, b, tg, il, tl, big, reduction=reduction, generator=torch.Generator().manual_seed(3), **opts
            )

        return leaf_grads([x.to(dtype) for x in xs], f, upstream)

    check_float32_against_float64(path, run)


@pytest.mark.parametrize(
    "size, opts, reduction",
    [
        ((3, 9, 5, 20, 19), {}, "none"),
        ((2, 8, 3, 20, 37), dict(sigma=0.05, clamp=0.02, fastemit_lambda=0.2, activation="tanh"), "sum"),
        ((3, 4, 6, 24, 7), dict(dropout=0.2), "mean"),
    ],
)
def test_multiblank_joint_loss_matches_float64(path, size, opts, reduction):
    _check_multiblank_against_float64(path, *size, opts, reduction)


def test_multiblank_joint_float64_path_is_the_unfused_composition():
    xs, tg, il, tl = make_case(2, 5, 2, 8, 9, 0, dtype=torch.float64)
    tg = tg % 6
    ours = sk.multiblank_joint_loss(*xs, tg, il, tl, BIG, sigma=0.05, reduction="none")
    logits = torch.nn.functional.linear(joint_hidden(xs[0], xs[1], 0, 5, "relu", 0.0, (0, 0)), xs[2], xs[3])
    ref = sk.tdt.multiblank_rnnt_loss_reference(logits, tg, il, tl, BIG, 8, 0.05, reduction="none")
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "kw, match", [(dict(big=[1]), ">= 2"), (dict(blank=1), "no room"), (dict(label=7), "is a big blank")]
)
def test_multiblank_joint_bad_arguments(kw, match):
    xs, tg, il, tl = make_case(2, 5, 2, 8, 9, 0)
    tg = tg % 6
    if "label" in kw:
        tg[0, 0] = kw["label"]
    with pytest.raises(ValueError, match=match):
        sk.multiblank_joint_loss(*xs, tg, il, tl, kw.get("big", BIG), blank=kw.get("blank", -1))


def test_multiblank_joint_module():
    torch.manual_seed(0)
    m = sk.MultiblankJointLoss(12, 10, 16, 11, [2, 4], sigma=0.05, reduction="sum")
    enc, pred = torch.randn(2, 7, 12), torch.randn(2, 4, 10)
    tg, il, tl = torch.randint(0, 8, (2, 3)), torch.tensor([7, 5]), torch.tensor([3, 1])
    expected = sk.multiblank_rnnt_loss(m.joint(enc, pred), tg, il, tl, [2, 4], sigma=0.05, reduction="sum")
    torch.testing.assert_close(m(enc, pred, tg, il, tl), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_gpu_multiblank_joint_loss_large_float32_and_16bit(gpu):
    _check_multiblank_against_float64(FixedPath(gpu), 4, 130, 37, 640, 1028, {"sigma": 0.02}, "none", big=[2, 4, 8])
    xs, tg, il, tl = make_case(4, 70, 23, 200, 304, 0, device=gpu, seed=1)
    tg = tg % 300
    xs = [x.to(torch.bfloat16) for x in xs]

    def f(e, p, w, b):
        return sk.multiblank_joint_loss(e, p, w, b, tg, il, tl, [2, 4, 8], reduction="sum")

    loss, grads = leaf_grads(xs, f)
    ref_loss, ref_grads = leaf_grads([x.double() for x in xs], f)
    assert rel(loss, ref_loss) < 1e-2
    for a, b in zip(grads, ref_grads, strict=True):
        assert torch.nn.functional.cosine_similarity(a.double().flatten(), b.flatten(), dim=0) > 0.999
