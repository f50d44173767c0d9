"""No silent wrong result, no obscure error: the losses' edge cases on every path (``path``: the PyTorch
path, the Triton kernels under the interpreter, the GPU), and a catalogue of malformed arguments, each of which
must raise a ValueError that names the argument."""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest
import torch
from helpers import count_calls, optional_module

import speechkernels as sk
from speechkernels._backend import triton_missing
from speechkernels._launch import Launch
from speechkernels.ctc.reference import ctc_loss_reference
from speechkernels.rnnt.reference import rnnt_loss_reference


def _ctc_problem(dev, N=3, T=6, C=5, S=2, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, N, C, generator=g).to(dev, dtype)
    targets = torch.randint(1, C, (N, S), generator=g).to(dev)
    return x, targets


def _rnnt_problem(dev, N=2, T=5, U=2, V=5, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, T, U + 1, V, generator=g).to(dev, dtype)
    targets = torch.randint(1, V, (N, U), generator=g).to(dev)
    return x, targets


# ---------------------------------------------------------------------------------------------------------------
# reuse_logits_for_grad: never a silently wrong gradient


def test_reuse_logits_refuses_logits_that_overlap_themselves(path):
    base, targets = _rnnt_problem(path.device, N=1)
    lg = base.requires_grad_().expand(2, -1, -1, -1)
    targets = targets.expand(2, -1)
    with pytest.raises(ValueError, match="reuse_logits_for_grad"):
        sk.rnnt_loss(lg, targets, [5, 5], [2, 2], blank=0, reuse_logits_for_grad=True)
    # without reuse the same logits are fine: the gradient of the expanded view sums into the base
    sk.rnnt_loss(lg, targets, [5, 5], [2, 2], blank=0).backward()
    assert torch.isfinite(base.grad).all()


@pytest.mark.parametrize("reader", ["square", "log_softmax"])
def test_reuse_logits_a_later_reader_raises_instead_of_reading_the_gradient(path, reader):
    """Another op that saved the logits for its backward (lg ** 2; or the log_softmax that made them) would read
    the gradient written over them: autograd's in-place check stops it. The PyTorch path never writes into the
    logits, so there the gradient is simply right."""
    x, targets = _rnnt_problem(path.device)

    def total(reuse):
        leaf = x.clone().requires_grad_()
        lg = torch.log_softmax(leaf, -1) if reader == "log_softmax" else leaf * 1.0
        # made before the loss, the square's backward runs after the loss's
        p = (lg**2).sum() if reader == "square" else 0.0
        loss = sk.rnnt_loss(lg, targets, [5, 4], [2, 1], blank=0, fused_log_softmax=False, reuse_logits_for_grad=reuse)
        return leaf, p + loss

    expected_leaf, expected = total(False)
    expected.backward()
    leaf, total = total(True)
    if path.kernels:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            total.backward()
    else:
        total.backward()
        torch.testing.assert_close(leaf.grad, expected_leaf.grad)


def test_reuse_logits_consumes_a_contiguous_joint_output(path):
    """The supported use: the logits made by an op whose backward does not read them (a matmul's output)."""
    x, targets = _rnnt_problem(path.device)
    w = torch.randn(5, 5, device=path.device)
    grads = []
    for reuse in (False, True):
        leaf = x.clone().requires_grad_()
        sk.rnnt_loss(leaf @ w, targets, [5, 4], [2, 1], blank=0, reuse_logits_for_grad=reuse).backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)
    path.check_ran()


# ---------------------------------------------------------------------------------------------------------------
# lengths, labels and scalars in every accepted form; non-integral ones refused


@pytest.mark.parametrize(
    "lengths",
    [[4.7, 3.2, 5.0], np.array([3.5, 3.0, 4.0]), [True, 3, 4], torch.tensor([4.0, 3.0, 5.0]), ["4", 3, 4]],
    ids=["float-list", "float-numpy", "bool", "float-tensor", "str"],
)
def test_non_integer_lengths_are_refused_naming_the_element(path, lengths):
    x, targets = _ctc_problem(path.device)
    with pytest.raises(ValueError, match=r"input_lengths"):
        sk.ctc_loss(x, targets, lengths, [2, 2, 1])
    with pytest.raises(ValueError, match=r"target_lengths"):
        sk.ctc_loss(x, targets, [6, 5, 4], lengths)
    lg, tg = _rnnt_problem(path.device, N=3)
    with pytest.raises(ValueError, match=r"logit_lengths"):
        sk.rnnt_loss(lg, tg, lengths, [2, 2, 1])
    if not isinstance(lengths, torch.Tensor):
        with pytest.raises(ValueError, match=r"input_lengths\[0\]"):
            sk.ctc_loss(x, targets, lengths, [2, 2, 1])


def test_integer_like_forms_give_the_same_loss(path):
    x, targets = _ctc_problem(path.device)
    lg, tg = _rnnt_problem(path.device, N=3)
    forms = [
        [6, 5, 4],
        (6, 5, 4),
        np.array([6, 5, 4]),
        np.array([6, 5, 4], dtype=np.int32),
        [np.int64(6), np.int32(5), torch.tensor(4)],
        torch.tensor([6, 5, 4], dtype=torch.int32),
    ]
    ctc = [sk.ctc_loss(x, targets, f, [2, 2, 1], blank=0, reduction="none") for f in forms]
    blanks = [2, np.int64(2), torch.tensor(2), np.int32(2)]
    ctc += [sk.ctc_loss(x, targets.clamp(max=1), [6, 5, 4], [2, 2, 1], blank=b, reduction="none") for b in blanks]
    rnnt = [sk.rnnt_loss(lg, tg, [f_ - 1 for f_ in [6, 5, 4]], [2, 2, 1], blank=b) for b in [0, np.int64(0)]]
    rnnt += [sk.rnnt_loss(lg, tg, f, [2, 2, 1], blank=0) for f in ([5, 4, 3], np.array([5, 4, 3]))]
    for got in ctc[1 : len(forms)]:
        torch.testing.assert_close(got, ctc[0], rtol=0, atol=0)
    for got in ctc[len(forms) + 1 :]:
        torch.testing.assert_close(got, ctc[len(forms)], rtol=0, atol=0)
    for got in rnnt[1:]:
        torch.testing.assert_close(got, rnnt[0], rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------------
# what used to crash inside


def test_ctc_batch_whose_targets_are_all_empty(path):
    x, _ = _ctc_problem(path.device, N=2, T=4)
    lp = x.log_softmax(-1).requires_grad_()
    for targets in (torch.zeros(2, 0, dtype=torch.long), torch.zeros(0, dtype=torch.long)):
        out = sk.ctc_loss(lp, targets.to(path.device), [4, 3], [0, 0], reduction="none")
        # no labels: the only path is all blanks
        expected = -lp.detach()[:, :, 0].cpu().double()
        torch.testing.assert_close(out.cpu().double(), torch.stack([expected[:4, 0].sum(), expected[:3, 1].sum()]))
        if not path.name == "cuda":  # torch's own CTC agrees (its CPU kernel)
            torch.testing.assert_close(
                out.cpu(),
                torch.nn.functional.ctc_loss(lp.detach().cpu(), targets, [4, 3], [0, 0], reduction="none"),
            )
    path.check_ran()


def test_unchecked_out_of_range_labels_are_clamped_not_a_crash(path):
    """validate=False promises clamped labels and lengths (meaningless numbers, never a fault or an IndexError):
    label 9 of 5 classes reads class 4, as the kernels do."""
    x, _ = _ctc_problem(path.device, N=2)
    bad = torch.tensor([[9, 1], [-3, 2]], device=path.device)
    clamped = bad.clamp(0, 4)
    out = sk.ctc_loss(x, bad, [6, 6], [2, 2], reduction="none", validate=False)
    torch.testing.assert_close(out, sk.ctc_loss(x, clamped, [6, 6], [2, 2], reduction="none", validate=False))
    lg, _ = _rnnt_problem(path.device)
    bad = torch.tensor([[9, 1], [-3, 2]], device=path.device)
    out = sk.rnnt_loss(lg, bad, [5, 5], [2, 2], blank=0, reduction="none", validate=False)
    expected = sk.rnnt_loss(lg, bad.clamp(0, 4), [5, 5], [2, 2], blank=0, reduction="none", validate=False)
    torch.testing.assert_close(out, expected)
    with pytest.raises(ValueError, match=r"targets"):
        sk.rnnt_loss(lg, bad, [5, 5], [2, 2], blank=0)


# ---------------------------------------------------------------------------------------------------------------
# NaN only where it is read


def test_nan_past_the_lengths_is_not_read(path):
    x, targets = _ctc_problem(path.device, N=2)
    x[5, 1] = float("nan")  # frame 5 of sample 1, whose input length is 4
    for logits in (True, False):
        xi = x.clone().requires_grad_()
        loss = sk.ctc_loss(xi, targets, [6, 4], [2, 2], logits=logits, reduction="none")
        loss.backward(torch.ones_like(loss))
        assert torch.isfinite(loss).all() and torch.isfinite(xi.grad).all()
        assert (xi.grad[4:, 1] == 0).all()
    lg, tg = _rnnt_problem(path.device, U=3)
    lg[1, 4] = float("nan")  # frame 4 of sample 1 (3 frames)
    lg[1, :, 3] = float("nan")  # label row 3 of sample 1 (2 labels)
    for fused in (True, False):
        xi = lg.clone().requires_grad_()
        loss = sk.rnnt_loss(xi, tg, [5, 3], [3, 2], blank=0, fused_log_softmax=fused, reduction="none")
        loss.backward(torch.ones_like(loss))
        assert torch.isfinite(loss).all() and torch.isfinite(xi.grad).all()
        assert (xi.grad[1, 3:] == 0).all() and (xi.grad[1, :, 3] == 0).all()
    path.check_ran()


# ---------------------------------------------------------------------------------------------------------------
# the same observable results on every path


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_loss_dtype_is_float32_or_float64(path, dtype):
    if dtype == torch.bfloat16 and path.name == "triton":
        pytest.skip("the interpreter has no bfloat16")
    expected = torch.float64 if dtype == torch.float64 else torch.float32
    x, targets = _ctc_problem(path.device, dtype=dtype)
    for reduction in ("none", "mean"):
        assert sk.ctc_loss(x, targets, [6, 5, 4], [2, 2, 1], reduction=reduction).dtype == expected
    lg, tg = _rnnt_problem(path.device, dtype=dtype)
    for reduction in ("none", "sum"):
        assert sk.rnnt_loss(lg, tg, [5, 4], [2, 1], blank=0, reduction=reduction).dtype == expected


def test_empty_batch(path):
    x = torch.randn(6, 0, 5, device=path.device, requires_grad=True)
    targets = torch.zeros(0, 2, dtype=torch.long, device=path.device)
    lg = torch.randn(0, 5, 3, 5, device=path.device, requires_grad=True)
    none = sk.ctc_loss(x, targets, [], [], reduction="none")
    assert none.shape == (0,) and none.dtype == torch.float32
    total = sk.ctc_loss(x, targets, [], [], reduction="sum")
    assert total.item() == 0.0
    total.backward()
    assert x.grad.shape == x.shape
    assert sk.rnnt_loss(lg, targets, [], [], reduction="none").shape == (0,)
    assert sk.rnnt_loss(lg, targets, [], [], reduction="sum").item() == 0.0
    with pytest.raises(ValueError, match=r"reduction='mean'.*N=0"):
        sk.ctc_loss(x, targets, [], [])
    with pytest.raises(ValueError, match=r"reduction='mean'.*N=0"):
        sk.rnnt_loss(lg, targets, [], [])


@pytest.mark.parametrize("fused", [True, False])
def test_fastemit_conventions(path, fused):
    """NeMo reports (1 + lambda) times the loss, warp-rnnt the loss itself; both scale the label edges' gradient
    by 1 + lambda."""
    x, targets = _rnnt_problem(path.device)
    lam = 0.3
    grads, losses = [], []
    for scale in (True, False):
        xi = x.clone().requires_grad_()
        loss = sk.rnnt_loss(
            xi,
            targets,
            [5, 4],
            [2, 1],
            blank=0,
            fused_log_softmax=fused,
            reduction="none",
            fastemit_lambda=lam,
            fastemit_loss_scale=scale,
        )
        loss.backward(torch.ones_like(loss))
        grads.append(xi.grad)
        losses.append(loss.detach())
    # with a gradient to compute, as above (the kernels then meet alpha and beta halfway: another rounding)
    plain = sk.rnnt_loss(
        x.clone().requires_grad_(), targets, [5, 4], [2, 1], blank=0, fused_log_softmax=fused, reduction="none"
    ).detach()
    torch.testing.assert_close(losses[0], (1 + lam) * plain, rtol=1e-6, atol=0)
    torch.testing.assert_close(losses[1], plain, rtol=0, atol=0)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
    ref = rnnt_loss_reference(
        x.double(),
        targets,
        torch.tensor([5, 4]),
        torch.tensor([2, 1]),
        blank=0,
        fused_log_softmax=fused,
        reduction="none",
        fastemit_lambda=lam,
        fastemit_loss_scale=False,
    )
    torch.testing.assert_close(losses[1].cpu().double(), ref.cpu(), rtol=1e-5, atol=1e-5)
    path.check_ran()


def test_ctc_reference_oracle_matches_torch_on_empty_targets():
    lp = torch.randn(5, 3, 4, dtype=torch.float64).log_softmax(-1)
    targets = torch.zeros(3, 0, dtype=torch.long)
    il, tl = torch.tensor([5, 2, 0]), torch.tensor([0, 0, 0])
    ours = ctc_loss_reference(lp, targets, il, tl, reduction="none")
    torch.testing.assert_close(ours, torch.nn.functional.ctc_loss(lp, targets, il, tl, reduction="none"))


# ---------------------------------------------------------------------------------------------------------------
# the catalogue of malformed arguments: each raises ValueError naming the argument


def _ctc_call(**overrides):
    x, targets = _ctc_problem("cpu")
    args = dict(log_probs=x, targets=targets, input_lengths=[6, 5, 4], target_lengths=[2, 2, 1])
    args.update(overrides)
    return lambda: sk.ctc_loss(**args)


def _rnnt_call(**overrides):
    lg, targets = _rnnt_problem("cpu")
    args = dict(logits=lg, targets=targets, logit_lengths=[5, 4], target_lengths=[2, 1])
    args.update(overrides)
    return lambda: sk.rnnt_loss(**args)


CATALOGUE = [
    ("ctc log_probs list", _ctc_call(log_probs=[[0.0]]), "log_probs"),
    ("ctc log_probs int", _ctc_call(log_probs=torch.zeros(6, 3, 5, dtype=torch.long)), "log_probs"),
    ("ctc log_probs 4-D", _ctc_call(log_probs=torch.zeros(6, 3, 5, 1)), "log_probs"),
    ("ctc targets list", _ctc_call(targets=[[1, 2]] * 3), "targets"),
    ("ctc targets float", _ctc_call(targets=torch.ones(3, 2)), "targets"),
    ("ctc targets rows", _ctc_call(targets=torch.ones(2, 2, dtype=torch.long)), "targets"),
    ("ctc input_lengths float", _ctc_call(input_lengths=[6.0, 5, 4]), r"input_lengths\[0\]"),
    ("ctc input_lengths numpy float", _ctc_call(input_lengths=np.array([6.5, 5, 4])), r"input_lengths\[0\]"),
    ("ctc input_lengths too few", _ctc_call(input_lengths=[6, 5]), "input_lengths"),
    ("ctc input_lengths 2-D", _ctc_call(input_lengths=torch.ones(3, 2, dtype=torch.long)), "input_lengths"),
    ("ctc input_lengths past T", _ctc_call(input_lengths=[7, 5, 4]), r"input_lengths\[0\]"),
    ("ctc input_lengths None", _ctc_call(input_lengths=None), "input_lengths"),
    ("ctc target_lengths negative", _ctc_call(target_lengths=[2, -1, 1]), r"target_lengths\[1\]"),
    ("ctc target_lengths past S", _ctc_call(target_lengths=[3, 2, 1]), r"target_lengths\[0\]"),
    ("ctc label blank", _ctc_call(targets=torch.tensor([[0, 1], [1, 2], [3, 4]])), "targets"),
    ("ctc label range", _ctc_call(targets=torch.tensor([[5, 1], [1, 2], [3, 4]])), "targets"),
    ("ctc blank float", _ctc_call(blank=0.0), "blank"),
    ("ctc blank bool", _ctc_call(blank=False), "blank"),
    ("ctc blank str", _ctc_call(blank="0"), "blank"),
    ("ctc blank range", _ctc_call(blank=5), "blank"),
    ("ctc blank negative", _ctc_call(blank=-1), "blank"),
    ("ctc reduction", _ctc_call(reduction="avg"), "reduction"),
    ("ctc reduction None", _ctc_call(reduction=None), "reduction"),
    ("ctc zero_infinity", _ctc_call(zero_infinity="yes"), "zero_infinity"),
    ("ctc logits int", _ctc_call(logits=1), "logits"),
    ("ctc batch_first", _ctc_call(batch_first=None), "batch_first"),
    ("ctc validate", _ctc_call(validate="False"), "validate"),
    ("rnnt logits 3-D", _rnnt_call(logits=torch.zeros(2, 5, 3)), "logits"),
    ("rnnt logits int", _rnnt_call(logits=torch.zeros(2, 5, 3, 5, dtype=torch.int32)), "logits"),
    ("rnnt targets 1-D", _rnnt_call(targets=torch.ones(4, dtype=torch.long)), "targets"),
    ("rnnt targets float", _rnnt_call(targets=torch.ones(2, 2)), "targets"),
    ("rnnt targets width", _rnnt_call(targets=torch.ones(2, 3, dtype=torch.long)), "targets"),
    ("rnnt logit_lengths float", _rnnt_call(logit_lengths=[4.7, 3.2]), r"logit_lengths\[0\]"),
    ("rnnt logit_lengths past T", _rnnt_call(logit_lengths=[6, 4]), r"logit_lengths\[0\]"),
    ("rnnt target_lengths numpy float", _rnnt_call(target_lengths=np.array([2.0, 1.5])), "target_lengths"),
    ("rnnt target_lengths past U", _rnnt_call(target_lengths=[3, 1]), r"target_lengths\[0\]"),
    ("rnnt label blank", _rnnt_call(targets=torch.tensor([[4, 1], [1, 2]])), "targets"),
    ("rnnt blank range", _rnnt_call(blank=5), "blank"),
    ("rnnt blank float", _rnnt_call(blank=-1.0), "blank"),
    ("rnnt blank tensor float", _rnnt_call(blank=torch.tensor(-1.0)), "blank"),
    ("rnnt clamp nan", _rnnt_call(clamp=float("nan")), "clamp"),
    ("rnnt clamp str", _rnnt_call(clamp="0.5"), "clamp"),
    ("rnnt clamp None", _rnnt_call(clamp=None), "clamp"),
    ("rnnt reduction", _rnnt_call(reduction="batchmean"), "reduction"),
    ("rnnt fused_log_softmax", _rnnt_call(fused_log_softmax=0), "fused_log_softmax"),
    ("rnnt fastemit_lambda str", _rnnt_call(fastemit_lambda="0.1"), "fastemit_lambda"),
    ("rnnt fastemit_lambda negative", _rnnt_call(fastemit_lambda=-0.1), "fastemit_lambda"),
    ("rnnt fastemit_lambda nan", _rnnt_call(fastemit_lambda=float("nan")), "fastemit_lambda"),
    ("rnnt fastemit_lambda inf", _rnnt_call(fastemit_lambda=float("inf")), "fastemit_lambda"),
    ("rnnt fastemit_loss_scale", _rnnt_call(fastemit_loss_scale="nemo"), "fastemit_loss_scale"),
    ("rnnt rnnt_type", _rnnt_call(rnnt_type="tdt"), "rnnt_type"),
    ("rnnt validate", _rnnt_call(validate=None), "validate"),
    ("rnnt reuse_logits_for_grad", _rnnt_call(reuse_logits_for_grad=1), "reuse_logits_for_grad"),
    (
        "ctc module reduction",
        lambda: sk.CTCLoss(reduction="avg")(*_ctc_problem("cpu"), [6, 5, 4], [2, 2, 1]),
        "reduction",
    ),
    ("rnnt module clamp", lambda: sk.RNNTLoss(clamp=float("nan"))(*_rnnt_problem("cpu"), [5, 4], [2, 1]), "clamp"),
]


@pytest.mark.parametrize("call,match", [c[1:] for c in CATALOGUE], ids=[c[0] for c in CATALOGUE])
def test_malformed_argument_raises_value_error_naming_it(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(("module", "function"), [(sk.CTCLoss, sk.ctc_loss), (sk.RNNTLoss, sk.rnnt_loss)])
def test_loss_modules_take_the_functions_options(module, function):
    options = list(inspect.signature(function).parameters.values())[4:]
    assert list(inspect.signature(module).parameters.values()) == options
    m = module(*(p.default for p in options if p.kind is p.POSITIONAL_OR_KEYWORD))
    assert all(getattr(m, p.name) == p.default for p in options)
    with pytest.raises(TypeError, match="bogus"):
        module(bogus=1)


def test_only_a_missing_triton_is_hidden():
    """The kernels modules' imports (``except ImportError as error: kernels = triton_missing(error)``): None where
    Triton is what is missing, any other import error raised again."""
    assert triton_missing(ModuleNotFoundError("No module named 'triton'", name="triton")) is None
    assert triton_missing(ImportError("cannot import name 'language'", name="triton.language")) is None
    with pytest.raises(ModuleNotFoundError, match="numpy"):
        triton_missing(ModuleNotFoundError("No module named 'numpy'", name="numpy"))
    with pytest.raises(ModuleNotFoundError):
        optional_module("speechkernels.no_such_module")


def test_loss_op_outputs_own_aligned_storage_and_give_the_gradient():
    """A loss whose batch reduction is an element after the per-sample losses (the kernels' layout): the library
    op returns it at the start of its own storage (compiled graphs check the alignment of an op's outputs), and
    the eager and library paths give the same value and gradient."""
    from speechkernels._op import LossOp

    def forward(x, reduction):
        out = torch.empty(x.shape[0] + 1, dtype=x.dtype)
        out[:-1] = (x * x).sum(1)
        out[-1] = out[:-1].sum()
        return (out[-1] if reduction == "sum" else out[:-1]), (x.detach() * 2,)

    def forward_fake(x, reduction):
        return x.new_empty(() if reduction == "sum" else x.shape[:1]), x.new_empty(x.shape)

    def backward(grad_out, x, twice_x, reduction):
        return torch.zeros_like(x) + twice_x * (grad_out if reduction == "sum" else grad_out[:, None])

    op = LossOp(
        "speechkernels_test::square_sum",
        "Tensor x, str reduction",
        forward,
        forward_fake,
        backward,
        n_state=1,
        grads="x",
    )
    x = torch.randn(3, 4, dtype=torch.float64)
    for reduction in ("sum", "none"):
        out, state = op._fwd_op(x, reduction)
        compiled_out = torch.compile(lambda v, r=reduction: op._fwd_op(v, r)[0], backend="aot_eager")(x)
        for o in (out, compiled_out):  # in a compiled graph, a view made inside the op does not know its base
            assert o.storage_offset() == 0 and o.untyped_storage().data_ptr() % 16 == 0
        torch.testing.assert_close(state, 2 * x)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        la = op.apply(xa, reduction)
        lb = torch.compile(lambda v, r=reduction: op.apply(v, r), backend="aot_eager", fullgraph=True)(xb)
        torch.testing.assert_close(la, (x * x).sum(1).sum() if reduction == "sum" else (x * x).sum(1))
        torch.testing.assert_close(lb, la)
        la.sum().backward()
        lb.sum().backward()
        torch.testing.assert_close(xa.grad, 2 * x)
        torch.testing.assert_close(xb.grad, 2 * x)


_launch_kernels = optional_module("launch_kernels")


@pytest.mark.skipif(_launch_kernels is None, reason="needs Triton")
def test_launch_gives_tritons_results_for_every_specialisation(path):
    """Launch calls the compiled kernel directly once a specialisation has run: an integer equal to 1 or a
    multiple of 16, a pointer off 16-byte alignment, another dtype or constexpr each take their own compiled
    kernel, and every call writes what Triton's launcher writes."""
    fast = Launch(_launch_kernels.axpy_kernel)
    cases = []
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(80, device=path.device).to(dtype)
        for offset in (0, 1):  # x[1:] is 2 or 4 bytes off the allocation's alignment
            for n, a in ((1, 0.5), (5, -2.0), (16, 3.0), (37, 1.5)):
                for scale in (1, 3):
                    cases.append((x[offset:], n, a, scale))
    for round in range(2):  # the second round runs every specialisation through the direct call
        if round == 1 and path.device.type == "cuda":
            fast.kernel = _NoLauncher()
        for x, n, a, scale in cases:
            y = torch.full((64,), float("nan"), device=path.device, dtype=x.dtype)
            fast[(1,)](x, y, n, a, SCALE=scale, BLOCK=64, num_warps=1)
            expected = torch.full((64,), float("nan"), dtype=torch.float64)
            expected[:n] = x[:n].double().cpu() * a * scale + n
            torch.testing.assert_close(y.double().cpu(), expected, equal_nan=True, rtol=1e-3, atol=1e-3)
    if path.device.type == "cuda":
        # dtypes x alignments x (n == 1, n % 16 == 0) classes x constexprs; floats are not part of the key
        assert len(fast._compiled) == 2 * 2 * 3 * 2


class _NoLauncher:
    def __getitem__(self, grid):
        raise AssertionError("a specialisation that already ran went through Triton's launcher again")


# ---------------------------------------------------------------------------------------------------------------
# contents refused on every path in the same words: on the kernels' paths the device-side check finds them (the
# lengths live on the device), on the PyTorch path the host-side checks; the message names the argument, the
# sample and the value either way


def _contents_call(kind: str, dev, **overrides):
    """A loss call of ``kind`` with lengths and labels as tensors on ``dev`` (``overrides``: lists)."""
    if kind.startswith("ctc"):
        x, targets = _ctc_problem(dev)
        args = dict(log_probs=x, targets=targets, input_lengths=[6, 5, 4], target_lengths=[2, 2, 1])
        if kind == "ctc concatenated":
            args.update(targets=targets.reshape(-1)[:5])
    else:
        V = 7 if kind == "tdt" else 5
        lg, targets = _rnnt_problem(dev, V=V)
        args = dict(logits=lg, targets=targets.clamp(max=2), logit_lengths=[5, 4], target_lengths=[2, 1])
    args.update({k: torch.tensor(v, device=dev) for k, v in overrides.items()})
    if kind.startswith("ctc"):
        return lambda: sk.ctc_loss(**args)
    if kind == "tdt":
        return lambda: sk.tdt_loss(**args, durations=[0, 1], blank=4)
    if kind == "multiblank":
        return lambda: sk.multiblank_rnnt_loss(**args, big_blank_durations=[2])
    if kind == "joint":
        lg = args.pop("logits")
        N, T, U1, V = lg.shape
        g = torch.Generator().manual_seed(1)
        enc, pred = torch.randn(N, T, 3, generator=g).to(dev), torch.randn(N, U1, 3, generator=g).to(dev)
        weight = torch.randn(V, 3, generator=g).to(dev)
        return lambda: sk.rnnt_joint_loss(enc, pred, weight, None, *args.values())
    return lambda: sk.rnnt_loss(**args)


CONTENTS = [
    ("ctc", dict(input_lengths=[6, 7, 4]), "input_lengths[1]=7 is outside [0, T=6]"),
    ("ctc", dict(input_lengths=[6, 5, -2]), "input_lengths[2]=-2 is outside [0, T=6]"),
    ("ctc", dict(target_lengths=[2, 3, 1]), "target_lengths[1]=3 is outside [0, targets.shape[1]=2]"),
    ("ctc", dict(target_lengths=[-1, 2, 1]), "target_lengths[0]=-1 is outside [0, targets.shape[1]=2]"),
    ("ctc", dict(targets=[[1, 2], [1, 5], [3, 4]]), "targets: label 5 of sample 1 (position 1) is outside [0, C=5)"),
    ("ctc", dict(targets=[[1, 2], [1, 2], [0, 4]]), "targets: label 0 of sample 2 (position 0) equals blank=0"),
    (
        "ctc concatenated",
        dict(target_lengths=[2, 2, 2]),
        "target_lengths[2]=2 runs past the 5 concatenated targets (samples 0 to 2 take 6 labels)",
    ),
    (
        "ctc concatenated",
        dict(target_lengths=[2, 6, 1]),
        "target_lengths[1]=6 is outside [0, 5 (the concatenated targets)]",
    ),
    (
        "ctc concatenated",
        dict(targets=[1, 2, 3, -1, 4]),
        "targets: label -1 of sample 1 (position 1) is outside [0, C=5)",
    ),
    ("rnnt", dict(logit_lengths=[5, 6]), "logit_lengths[1]=6 is outside [0, T=5]"),
    ("rnnt", dict(target_lengths=[-3, 1]), "target_lengths[0]=-3 is outside [0, U=2]"),
    ("rnnt", dict(targets=[[1, 2], [5, 1]]), "targets[1, 0]=5 is outside [0, V=5)"),
    ("rnnt", dict(targets=[[1, 4], [1, 1]]), "targets[0, 1]=4 equals blank=4"),
    ("tdt", dict(logit_lengths=[9, 4]), "logit_lengths[0]=9 is outside [0, T=5]"),
    ("tdt", dict(targets=[[1, 2], [4, 1]]), "targets[1, 0]=4 equals blank=4"),
    ("multiblank", dict(target_lengths=[2, 3]), "target_lengths[1]=3 is outside [0, U=2]"),
    ("multiblank", dict(targets=[[1, 2], [1, 9]], target_lengths=[2, 2]), "targets[1, 1]=9 is outside [0, V=5)"),
    ("joint", dict(logit_lengths=[5, -1]), "logit_lengths[1]=-1 is outside [0, T=5]"),
    ("joint", dict(targets=[[-4, 2], [1, 1]]), "targets[0, 0]=-4 is outside [0, V=5)"),
]


@pytest.mark.parametrize("kind,overrides,message", CONTENTS, ids=[f"{c[0]}: {c[2][:30]}" for c in CONTENTS])
def test_bad_contents_are_refused_naming_argument_sample_and_value(path, monkeypatch, kind, overrides, message):
    lattice = optional_module("speechkernels._transducer.lattice")  # None without Triton: the PyTorch path only

    path.reset()
    device_checks = count_calls(monkeypatch, lattice, "validate_lengths_and_labels") if lattice is not None else []
    with pytest.raises(ValueError) as raised:
        _contents_call(kind, path.device, **overrides)()
    assert str(raised.value) == message
    # on the kernels' paths the device-side check found it (CTC's in its first kernel): no host check came first
    assert len(path.launches if kind.startswith("ctc") else device_checks) == int(path.kernels)


@pytest.mark.parametrize(
    "kind,overrides,message",
    [
        (
            "ctc",
            dict(input_lengths=[6, 7, 4]),
            r"^input_lengths\[1\] is outside \[0, T=6\] as the device-side check "
            r"read it, although it reads 7 here$",
        ),
        (
            "ctc",
            dict(targets=[[1, 2], [1, 2], [0, 4]]),
            r"^targets: the device-side check read a label equal to blank=0 "
            r"in sample 2's labels",
        ),
        ("rnnt", dict(target_lengths=[2, 3]), r"^target_lengths\[1\] is outside \[0, U=2\] as the device-side check"),
        (
            "rnnt",
            dict(targets=[[1, 2], [5, 1]]),
            r"^targets: the device-side check read a label outside \[0, V=5\) in "
            r"sample 1's",
        ),
    ],
)
def test_a_device_side_finding_names_the_sample_without_the_host_checks(path, monkeypatch, kind, overrides, message):
    """Should the host-side re-check not confirm what the device found, the refusal still names the argument, the
    sample and the value (the device's bits per sample)."""
    if not path.kernels:
        pytest.skip("the device-side check runs on the kernels' paths")
    from speechkernels._transducer import checks as transducer_checks
    from speechkernels.ctc import api as ctc_api

    monkeypatch.setattr(ctc_api, "check_label_contents", lambda *args: None)
    monkeypatch.setattr(transducer_checks, "check_contents", lambda *args: None)
    with pytest.raises(ValueError, match=message):
        _contents_call(kind, path.device, **overrides)()


def test_the_package_works_without_triton():
    """Without Triton (a CPU-only machine, macOS, Windows) the package imports and every capability's PyTorch path
    runs; the Triton-only paths refuse with a ValueError that names Triton."""
    import subprocess
    import sys

    script = """
import sys
sys.modules["triton"] = None  # `import triton` fails, as where it is not installed
import torch
import speechkernels as sk
x = torch.randn(6, 2, 5)
assert torch.isfinite(sk.ctc_loss(x, torch.tensor([[1, 2], [3, 1]]), [6, 5], [2, 2], logits=True))
lg = torch.randn(2, 5, 3, 6, requires_grad=True)
sk.rnnt_loss(lg, torch.tensor([[1, 2], [0, 1]]), [5, 4], [2, 2]).backward()
sk.tdt_loss(torch.randn(2, 5, 3, 8), torch.tensor([[1, 2], [0, 1]]), [5, 4], [2, 2], durations=[0, 1]).item()
enc, pred, w = torch.randn(2, 5, 4), torch.randn(2, 3, 4), torch.randn(6, 4)
sk.rnnt_joint_loss(enc, pred, w, None, torch.tensor([[1, 2], [0, 1]]), [5, 4], [2, 2]).item()
sk.ctc_forced_align(x.transpose(0, 1).log_softmax(-1), torch.tensor([[1, 2], [3, 1]]))
net = sk.wavenet.WaveNet(layers=2, cycle=2, residual_channels=4, gate_channels=4, skip_channels=4, classes=8,
                         cond_channels=0)
assert net.generate(None, 5, batch=1).shape == (1, 5)
server = sk.wavenet.WaveNetServer(net, chunk=4)
server.warmup(2)
rid = server.submit(6)
assert sum(c[rid].numel() for c in server) == 6
sk.wavenet.serial_chain(torch.randn(2, 4, 4), torch.randn(1, 4), 3)
for call in (lambda: net.generate(None, 5, batch=1, kernel="triton"),
             lambda: sk.wavenet.WaveNetServer(net, kernel="triton"),
             lambda: sk.wavenet.serial_chain(torch.randn(2, 4, 4), torch.randn(1, 4), 3, design="stream")):
    try:
        call()
    except ValueError as e:
        assert "Triton" in str(e), e
    else:
        raise AssertionError("a Triton path ran without Triton")
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
