"""The joint network fused with the RNN-T loss: the PyTorch reference against the unfused composition, every path
(PyTorch, Triton under the interpreter, CUDA) against float64, dropout, edge cases, bad arguments, the module."""

from __future__ import annotations

import inspect

import pytest
import torch
from helpers import (
    FixedPath,
    check_float32_against_float64,
    check_graph_replay_matches_eager,
    count_calls,
    leaf_grads,
    rel,
)

import speechkernels as sk
from speechkernels._transducer.activations import drop_threshold
from speechkernels._transducer.joint_reference import dropout_keep, joint_hidden
from speechkernels._transducer.options import JointNetworkOptions, TransducerOptions
from speechkernels.rnnt import joint_reference
from speechkernels.rnnt.joint_reference import RNNTJointLossReferenceFunction
from speechkernels.rnnt.reference import rnnt_loss_reference


@pytest.fixture
def joint_spy(monkeypatch):
    """Counts calls of the fused forward, so a test knows the kernels (not the reference) ran."""
    from speechkernels.rnnt import kernels

    return count_calls(monkeypatch, kernels, "joint_forward")


def make_case(N, T, U, H, V, *, seed=0, dtype=torch.float32, device="cpu", rna=False, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    enc = torch.randn(N, T, H, generator=g)
    pred = torch.randn(N, U + 1, H, generator=g)
    weight = torch.randn(V, H, generator=g) * scale / H**0.5
    bias = torch.randn(V, generator=g) * 0.1
    targets = torch.randint(1, V, (N, U), generator=g) if V > 1 else torch.zeros(N, U, dtype=torch.long)
    il = torch.randint(1, T + 1, (N,), generator=g)
    tl = torch.randint(0, U + 1, (N,), generator=g)
    il[0], tl[0] = T, U
    if rna:
        tl = torch.minimum(tl, il)
    xs = [x.to(device, dtype) for x in (enc, pred, weight, bias)]
    return xs, targets.to(device), il.to(device), tl.to(device)


OPTIONS = [
    dict(activation="relu"),
    dict(activation="tanh", rnnt_type="rna", fastemit_lambda=0.1),
    dict(activation="sigmoid", clamp=0.02, dropout=0.3),
    dict(activation="relu", dropout=0.2, fastemit_lambda=0.05, fastemit_loss_scale=False),
]


@pytest.mark.parametrize("opts", OPTIONS)
def test_reference_matches_unfused_composition(opts, monkeypatch):
    """The chunked reference (two frames a chunk) equals torch's joint + rnnt_loss_reference, in float64."""
    monkeypatch.setattr(joint_reference, "_chunk_frames", lambda *a: 2)
    xs, tg, il, tl = make_case(3, 7, 4, 6, 9, dtype=torch.float64, rna=opts.get("rnnt_type") == "rna")
    act, drop = opts.get("activation"), opts.get("dropout", 0.0)
    fe, scale = opts.get("fastemit_lambda", 0.0), opts.get("fastemit_loss_scale", True)
    rt, clamp, seed = opts.get("rnnt_type", "rnnt"), opts.get("clamp", -1.0), (7, 11)
    upstream = torch.rand(3, dtype=torch.float64)

    def fused(e, p, w, b):
        opts = TransducerOptions(blank=0, clamp=clamp, fastemit_lambda=fe, fastemit_loss_scale=scale, rnnt_type=rt)
        net = JointNetworkOptions(act, drop, *seed)
        return RNNTJointLossReferenceFunction.apply(e, p, w, b, tg, il, tl, opts, net, torch.float64)

    def unfused(e, p, w, b):
        logits = torch.nn.functional.linear(joint_hidden(e, p, 0, 7, act, drop, seed), w, b)
        return rnnt_loss_reference(logits, tg, il, tl, 0, clamp, "none", True, fe, rt, scale)

    la, ga = leaf_grads(xs, fused, upstream)
    lb, gb = leaf_grads(xs, unfused, upstream)
    torch.testing.assert_close(la, lb, rtol=1e-12, atol=1e-12)
    for a, b in zip(ga, gb, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def _check_against_float64(path, N, T, U, H, V, opts, reduction="none", seed=0, loss_tol=1e-5, grad_tol=1e-4):
    rna = opts.get("rnnt_type") == "rna"
    xs, tg, il, tl = make_case(N, T, U, H, V, seed=seed, device=path.device, rna=rna)
    upstream = torch.rand(N, device=path.device) if reduction == "none" else None

    def run(dtype):
        def f(e, p, w, b):
            return sk.rnnt_joint_loss(
                e, p, w, b, tg, il, tl, blank=0, reduction=reduction, generator=torch.Generator().manual_seed(3), **opts
            )

        return leaf_grads([x.to(dtype) for x in xs], f, upstream)

    check_float32_against_float64(path, run, loss_tol, grad_tol)


@pytest.mark.parametrize(
    "size, opts, reduction",
    [
        ((3, 9, 5, 20, 19), OPTIONS[0], "none"),
        ((3, 9, 5, 40, 19), OPTIONS[1], "mean"),
        ((2, 6, 3, 20, 37), OPTIONS[2], "sum"),
        ((3, 9, 5, 17, 5), OPTIONS[3], "none"),
    ],
)
def test_joint_loss_matches_float64(path, size, opts, reduction):
    _check_against_float64(path, *size, opts, reduction)


@pytest.mark.parametrize("size", [(2, 1, 0, 16, 3), (2, 5, 0, 20, 7), (1, 1, 1, 16, 2), (3, 4, 6, 24, 5)])
def test_joint_loss_small_and_empty_lattices(path, size):
    """U = 0, T = 1, more labels than frames."""
    _check_against_float64(path, *size, {})


def test_joint_loss_edge_cases(path):
    dev = path.device
    xs, tg, il, tl = make_case(3, 6, 3, 20, 11, device=dev)
    xs = [x.requires_grad_() for x in xs]
    il = torch.tensor([6, 0, 4], device=dev)  # a sample without frames but with labels: no path
    tl = torch.tensor([3, 2, 0], device=dev)
    loss = sk.rnnt_joint_loss(*xs, tg, il, tl, blank=0, reduction="none")
    assert torch.isinf(loss[1]) and torch.isfinite(loss[[0, 2]]).all()
    (loss[[0, 2]].sum() + 0 * loss[1]).backward()
    assert xs[0].grad[1].abs().max() == 0  # the impossible sample's encoder rows
    # N = 0
    e = torch.zeros(0, 6, 20, device=dev)
    p = torch.zeros(0, 4, 20, device=dev)
    empty = dict(targets=torch.zeros(0, 3, dtype=torch.long, device=dev), logit_lengths=[], target_lengths=[])
    assert sk.rnnt_joint_loss(e, p, xs[2], xs[3], **empty, reduction="sum").item() == 0
    assert sk.rnnt_joint_loss(e, p, xs[2], xs[3], **empty, reduction="none").shape == (0,)
    with pytest.raises(ValueError, match="mean"):
        sk.rnnt_joint_loss(e, p, xs[2], xs[3], **empty, reduction="mean")


def test_joint_loss_nan_stays_in_its_sample(path):
    xs, tg, il, tl = make_case(3, 6, 3, 20, 11, device=path.device)
    xs[0][1, 2, 5] = float("nan")  # a frame sample 1 reads
    il = torch.full_like(il, 6)
    xs = [x.requires_grad_() for x in xs]
    loss = sk.rnnt_joint_loss(*xs, tg, il, tl, blank=0, reduction="none")
    assert torch.isnan(loss[1]) and torch.isfinite(loss[[0, 2]]).all()
    loss.sum().backward()
    assert torch.isfinite(xs[0].grad[[0, 2]]).all() and torch.isnan(xs[0].grad[1]).any()
    assert torch.isfinite(xs[1].grad[[0, 2]]).all()


def test_dropout_is_repeatable_and_seeded(path):
    xs, tg, il, tl = make_case(2, 8, 4, 24, 13, device=path.device)

    def run(seed):
        return leaf_grads(
            xs,
            lambda e, p, w, b: sk.rnnt_joint_loss(
                e, p, w, b, tg, il, tl, blank=0, dropout=0.4, generator=torch.Generator().manual_seed(seed)
            ),
        )

    (la, ga), (lb, gb), (lc, _) = run(1), run(1), run(2)
    assert torch.equal(la, lb) and all(torch.equal(a, b) for a, b in zip(ga, gb, strict=True))
    assert not torch.equal(la, lc)
    torch.manual_seed(5)
    l1 = sk.rnnt_joint_loss(*xs, tg, il, tl, blank=0, dropout=0.4)
    torch.manual_seed(5)
    l2 = sk.rnnt_joint_loss(*xs, tg, il, tl, blank=0, dropout=0.4)
    assert torch.equal(l1, l2)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_mask_statistics(p):
    """The hash keeps a fraction 1 - p of the elements, independently of the neighbouring features and cells."""
    cells = torch.arange(4000, dtype=torch.int64)[:, None] * 977  # spread-out cell indices
    keep = dropout_keep(cells[:, 0], 256, (12345, 678), drop_threshold(p)).double()
    n = keep.numel()
    assert abs(keep.mean().item() - (1 - p)) < 4 * (p * (1 - p) / n) ** 0.5
    for a, b in ((keep[:, 1:], keep[:, :-1]), (keep[1:], keep[:-1])):
        corr = ((a - a.mean()) * (b - b.mean())).mean() / (a.std() * b.std())
        assert abs(corr.item()) < 0.02
    other = dropout_keep(cells[:, 0], 256, (12346, 678), drop_threshold(p))
    assert (other != keep.bool()).double().mean() > 0.9 * 2 * p * (1 - p)


def _bad_calls():
    xs, tg, il, tl = make_case(2, 5, 3, 16, 7)
    e, p, w, b = xs
    ok = dict(enc=e, pred=p, weight=w, bias=b, targets=tg, logit_lengths=il, target_lengths=tl)
    return [
        (dict(pred=p[:, :, :8]), "pred's joint width"),
        (dict(weight=w[:, :8]), "weight must be"),
        (dict(bias=b[:3]), "bias must be"),
        (dict(enc=e[0]), "enc must be"),
        (dict(pred=p[:1]), "pred has batch size"),
        (dict(targets=tg[:, :2]), "pred.shape"),
        (dict(targets=tg.float()), "targets must be int32 or int64"),
        (dict(enc=e.long()), "enc must be float"),
        (dict(weight=w.double()), "weight is torch.float64"),
        (dict(bias=b.half()), "bias is torch.float16"),
        (dict(logit_lengths=il[:1]), "logit_lengths has 1"),
        (dict(logit_lengths=torch.tensor([6, 5])), "logit_lengths"),
        (dict(target_lengths=torch.tensor([4, 0])), "target_lengths"),
        (dict(target_lengths=[1.5, 2]), "target_lengths"),
        (dict(targets=torch.full_like(tg, 9)), "targets"),
        (dict(blank=7), "blank=7"),
        (dict(activation="gelu"), "activation"),
        (dict(dropout=1.0), "dropout"),
        (dict(dropout=-0.1), "dropout"),
        (dict(reduction="avg"), "reduction"),
        (dict(rnnt_type="ctc"), "rnnt_type"),
        (dict(fastemit_lambda=-1.0), "fastemit_lambda"),
        (dict(generator=3), "generator"),
        (dict(validate=1), "validate"),
    ], ok


@pytest.mark.parametrize("case", range(len(_bad_calls()[0])))
def test_joint_bad_arguments_raise_value_error(path, case):
    cases, ok = _bad_calls()
    change, message = cases[case]
    args = {k: (v.to(path.device) if isinstance(v, torch.Tensor) else v) for k, v in {**ok, **change}.items()}
    with pytest.raises(ValueError, match=message):
        sk.rnnt_joint_loss(**args)


def test_joint_module():
    torch.manual_seed(0)
    m = sk.RNNTJointLoss(12, 10, 16, 9, activation="tanh", dropout=0.3, blank=0, reduction="sum")
    enc, pred = torch.randn(2, 5, 12), torch.randn(2, 4, 10)
    tg, il, tl = torch.randint(1, 9, (2, 3)), [5, 4], [3, 2]
    m.eval()  # no dropout: the loss of the logits joint() makes
    logits = m.joint(enc, pred)
    assert logits.shape == (2, 5, 4, 9)
    expected = rnnt_loss_reference(logits.double(), tg, torch.tensor(il), torch.tensor(tl), 0, reduction="sum")
    torch.testing.assert_close(m(enc, pred, tg, il, tl).double(), expected, rtol=1e-5, atol=1e-5)
    m.train()
    a = m(enc, pred, tg, il, tl, generator=torch.Generator().manual_seed(1))
    b = m(enc, pred, tg, il, tl, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and not torch.allclose(a.double(), expected)
    a.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = m(enc, pred, tg, il, tl)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    with pytest.raises(ValueError, match="dropout"):
        sk.RNNTJointLoss(4, 4, 4, 4, dropout=1.5)
    with pytest.raises(ValueError, match="vocab_size"):
        sk.RNNTJointLoss(4, 4, 4, 0)
    with pytest.raises(TypeError, match="blnk"):
        sk.RNNTJointLoss(4, 4, 4, 5, blnk=0)
    options = list(inspect.signature(sk.RNNTJointLoss).parameters)
    assert options[-7:] == [
        "blank",
        "reduction",
        "clamp",
        "fastemit_lambda",
        "fastemit_loss_scale",
        "rnnt_type",
        "validate",
    ]


# ---------------------------------------------------------------------------------------------------------------
# GPU: large sizes, 16-bit inputs, determinism, CUDA graphs


@pytest.mark.gpu
@pytest.mark.parametrize("size", [(4, 130, 37, 640, 1025), (3, 77, 50, 700, 301), (2, 200, 9, 96, 8193)])
def test_gpu_joint_loss_large_float32(gpu, size):
    _check_against_float64(FixedPath(gpu), *size, {"activation": "relu"}, "none")


def _check_16bit(device, dtype, opts, size):
    xs, tg, il, tl = make_case(*size, device=device, rna=opts.get("rnnt_type") == "rna", seed=1)
    xs = [x.to(dtype) for x in xs]

    def f(e, p, w, b):
        return sk.rnnt_joint_loss(
            e, p, w, b, tg, il, tl, blank=0, reduction="sum", generator=torch.Generator().manual_seed(3), **opts
        )

    loss, grads = leaf_grads(xs, f)
    ref_loss, ref_grads = leaf_grads([x.double() for x in xs], f)
    assert rel(loss, ref_loss) < 1e-2
    for a, b in zip(grads, ref_grads, strict=True):
        assert a.dtype == dtype
        cos = torch.nn.functional.cosine_similarity(a.double().flatten(), b.flatten(), dim=0)
        assert cos > 0.999, cos
    again = leaf_grads(xs, f)
    assert torch.equal(loss, again[0]) and all(torch.equal(a, b) for a, b in zip(grads, again[1], strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("opts", OPTIONS)
def test_gpu_joint_loss_16bit(gpu, dtype, opts):
    _check_16bit(gpu, dtype, opts, (4, 70, 23, 200, 301))


@pytest.mark.kernels
def test_joint_kernels_float16_inputs(path, joint_spy):
    _check_16bit(path.device, torch.float16, OPTIONS[1], (3, 11, 4, 40, 37))
    assert joint_spy


@pytest.mark.gpu
def test_gpu_joint_module_autocast_and_graph_capture(gpu):
    torch.manual_seed(0)
    m = sk.RNNTJointLoss(64, 48, 96, 129, blank=128, validate=False).to(gpu)
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
        lambda x: sk.rnnt_joint_loss(x, p, w, None, tg, il, tl, blank=128, validate=False), e
    )


def _compiled_matches_eager(device, opts):
    """The loss and all four gradients through torch.compile (whole graph, the library ops' fake shapes and
    autograd registration) equal eager's."""
    xs, tg, il, tl = make_case(3, 9, 4, 20, 11, seed=5, device=device)
    bias = opts.pop("bias", True)

    def f(enc, pred, weight, b):
        return (
            sk.rnnt_joint_loss(enc, pred, weight, b if bias else None, tg, il, tl, blank=0, validate=False, **opts)
            * 2.0
        )

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager" if device.type == "cpu" else "inductor")
    la, ga = leaf_grads(xs, compiled)
    lb, gb = leaf_grads(xs, f)
    torch.testing.assert_close(la, lb, rtol=0, atol=0)
    for a, b in zip(ga, gb, strict=True):
        if b is None:
            assert a is None
        else:
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.kernels
@pytest.mark.parametrize(
    "opts",
    [
        dict(reduction="none"),
        dict(reduction="mean", activation="tanh", bias=False),
        dict(reduction="sum", rnnt_type="rna", fastemit_lambda=0.1, clamp=0.05),
    ],
)
def test_joint_kernels_through_torch_compile(path, joint_spy, opts):
    _compiled_matches_eager(path.device, opts)
    assert joint_spy
