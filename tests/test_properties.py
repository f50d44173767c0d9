"""Property-based tests (hypothesis): every public loss on every path against its float64 reference.

Each example draws a random ragged problem (lengths from 0 to the tensor's size, impossible samples, empty
batches and empty label sets, a NaN somewhere or not, every option of the loss) and runs it on one path of
``path`` (the PyTorch path, the Triton kernels under the interpreter, the GPU). The reference sees the
same values in float64. Checked: the loss's value and dtype, the gradient under a random upstream gradient
(zero outside what a sample reads, NaN exactly where the reference has it), and that the path meant to run
did. The number of examples comes from the hypothesis profile (tests/conftest.py): small in CI, larger with
``-m gpu``.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import speechkernels as sk
from speechkernels.ctc import api as ctc_api
from speechkernels.ctc.reference import ctc_loss_reference
from speechkernels.rnnt import api as rnnt_api
from speechkernels.rnnt.reference import rnnt_loss_reference

# dtype: (loss rtol, loss atol, gradient atol); the reference sees the input's values exactly (rounded to dtype)
TOLERANCES = {
    torch.float64: (1e-9, 1e-9, 1e-9),
    torch.float32: (2e-5, 1e-4, 2e-5),
    torch.float16: (2e-5, 1e-4, 2e-3),  # float32 arithmetic, the gradient rounded to float16
    torch.bfloat16: (2e-5, 1e-4, 1.6e-2),
}


def _dtypes(path) -> list[torch.dtype]:
    # the interpreter has no bfloat16; float64 takes the PyTorch path everywhere
    extra = [torch.bfloat16] if path.name != "triton" else []
    return [torch.float32, torch.float16, torch.float64, *extra]


def _inject_nan(x: torch.Tensor, g: torch.Generator, nan: bool) -> torch.Tensor:
    if nan and x.numel():
        x.view(-1)[int(torch.randint(0, x.numel(), (1,), generator=g))] = float("nan")
    return x


def _upstream(out: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return torch.rand(out.shape, generator=g, dtype=torch.float64) + 0.5


def _check_against_reference(out, ref, x_in, x_ref, g, dtype, *, batch_first=False):
    """Values, dtype and the gradient under a random upstream gradient (NaN where the reference has NaN)."""
    rtol, atol, grad_atol = TOLERANCES[dtype]
    assert out.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert out.shape == ref.shape
    torch.testing.assert_close(out.detach().cpu().double(), ref.detach(), rtol=rtol, atol=atol, equal_nan=True)
    w = _upstream(out, g)
    out.backward(w.to(out.device, out.dtype))
    ref.backward(w)
    grad = x_in.grad.transpose(0, 1) if batch_first else x_in.grad
    assert grad.dtype == dtype
    torch.testing.assert_close(grad.cpu().double(), x_ref.grad, rtol=0, atol=grad_atol, equal_nan=True)


def _common_draws(draw) -> dict:
    """What every loss problem draws: index dtype, how lengths are given, a NaN or not, the scores' scale, and the
    seed of the values."""
    return dict(
        int32=draw(st.booleans()),
        lengths_as=draw(st.sampled_from(["tensor", "list"])),
        nan=draw(st.booleans()),
        scale=draw(st.sampled_from([0.5, 2.0, 6.0])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


# ---------------------------------------------------------------------------------------------------------------
# CTC


@st.composite
def ctc_problems(draw):
    N = draw(st.integers(0, 4))
    T = draw(st.integers(0, 9))
    C = draw(st.integers(2, 7))
    S = draw(st.integers(0, 4))
    return dict(
        N=N,
        T=T,
        C=C,
        S=S,
        blank=draw(st.integers(0, C - 1)),
        reduction=draw(st.sampled_from(["none", "sum", "mean"])),
        logits=draw(st.booleans()),
        layout=draw(st.sampled_from(["padded", "concatenated"])),
        zero_infinity=draw(st.booleans()),
        batch_first=draw(st.booleans()),
        **_common_draws(draw),
    )


def make_ctc(p, dtype):
    """[T, N, C] scores in dtype, padded labels (junk past each length), input and target lengths."""
    g = torch.Generator().manual_seed(p["seed"])
    N, T, C, S, blank = p["N"], p["T"], p["C"], p["S"], p["blank"]
    x = (torch.randn(T, N, C, generator=g, dtype=torch.float64) * p["scale"]).to(dtype)
    x = _inject_nan(x, g, p["nan"])
    il = torch.randint(0, T + 1, (N,), generator=g)
    tl = torch.randint(0, S + 1, (N,), generator=g)
    classes = torch.tensor([c for c in range(C) if c != blank])
    labels = classes[torch.randint(0, C - 1, (N, S), generator=g)]
    repeat = torch.rand(N, S, generator=g) < 0.3  # repeated labels need a blank between them
    for j in range(1, S):
        labels[:, j] = torch.where(repeat[:, j], labels[:, j - 1], labels[:, j])
    junk = torch.randint(0, C, (N, S), generator=g)  # padding is never read (may equal blank)
    padded = torch.where(torch.arange(S)[None, :] < tl[:, None], labels, junk)
    return x, padded, il, tl, g


@given(p=ctc_problems())
def test_ctc_loss_matches_float64_reference(path, p):
    path.reset()
    dtype = _dtypes(path)[p["seed"] % len(_dtypes(path))]
    x, padded, il, tl, g = make_ctc(p, dtype)
    if p["layout"] == "padded":
        targets = padded
    else:
        targets = torch.cat([padded[n, : int(tl[n])] for n in range(p["N"])] + [padded.new_zeros(0)])
    index = torch.int32 if p["int32"] else torch.int64
    dev = path.device
    targets = targets.to(dev, index)
    il_in, tl_in = (il.tolist(), tl.tolist()) if p["lengths_as"] == "list" else (il.to(dev, index), tl.to(dev, index))
    x_in = (x.transpose(0, 1) if p["batch_first"] else x).detach().clone().to(dev).requires_grad_()
    args = (targets, il_in, tl_in, p["blank"], p["reduction"], p["zero_infinity"])
    kwargs = dict(batch_first=p["batch_first"], logits=p["logits"])
    if p["N"] == 0 and p["reduction"] == "mean":
        with pytest.raises(ValueError, match="reduction='mean'"):
            sk.ctc_loss(x_in, *args, **kwargs)
        return
    out = sk.ctc_loss(x_in, *args, **kwargs)
    x_ref = x.double().requires_grad_()
    ref = ctc_loss_reference(
        x_ref, padded, il, tl, p["blank"], p["reduction"], p["zero_infinity"], logits=p["logits"]
    ).double()
    _check_against_reference(out, ref, x_in, x_ref, g, dtype, batch_first=p["batch_first"])
    path.check_ran(dtype != torch.float64 and p["N"] > 0 and p["T"] > 0)


# ---------------------------------------------------------------------------------------------------------------
# RNN-T


@st.composite
def rnnt_problems(draw):
    V = draw(st.integers(2, 7))
    return dict(
        N=draw(st.integers(0, 3)),
        T=draw(st.integers(0, 6)),
        U=draw(st.integers(0, 3)),
        V=V,
        blank=draw(st.integers(-V, V - 1)),
        reduction=draw(st.sampled_from(["none", "sum", "mean"])),
        fused=draw(st.booleans()),
        rnnt_type=draw(st.sampled_from(["rnnt", "rna"])),
        fastemit_lambda=draw(st.sampled_from([0.0, 0.0, 0.25])),
        fastemit_loss_scale=draw(st.booleans()),
        clamp=draw(st.sampled_from([-1.0, -1.0, 0.05])),
        **_common_draws(draw),
    )


def make_rnnt(p, dtype):
    g = torch.Generator().manual_seed(p["seed"])
    N, T, U, V = p["N"], p["T"], p["U"], p["V"]
    blank = p["blank"] % V
    x = torch.randn(N, T, U + 1, V, generator=g, dtype=torch.float64) * p["scale"]
    if not p["fused"]:  # log-probabilities, not normalised
        x = x.log_softmax(-1) + 0.3 * torch.randn(x.shape, generator=g, dtype=torch.float64)
    x = _inject_nan(x.to(dtype), g, p["nan"])
    il = torch.randint(0, T + 1, (N,), generator=g)
    tl = torch.randint(0, U + 1, (N,), generator=g)
    classes = torch.tensor([c for c in range(V) if c != blank])
    labels = classes[torch.randint(0, V - 1, (N, U), generator=g)]
    junk = torch.randint(0, V, (N, U), generator=g)
    targets = torch.where(torch.arange(U)[None, :] < tl[:, None], labels, junk)
    return x, targets, il, tl, g


@given(p=rnnt_problems())
def test_rnnt_loss_matches_float64_reference(path, p):
    path.reset()
    dtype = _dtypes(path)[p["seed"] % len(_dtypes(path))]
    x, targets, il, tl, g = make_rnnt(p, dtype)
    index = torch.int32 if p["int32"] else torch.int64
    dev = path.device
    il_in, tl_in = (il.tolist(), tl.tolist()) if p["lengths_as"] == "list" else (il.to(dev, index), tl.to(dev, index))
    x_in = x.detach().clone().to(dev).requires_grad_()
    options = dict(
        blank=p["blank"],
        clamp=p["clamp"],
        reduction=p["reduction"],
        fused_log_softmax=p["fused"],
        fastemit_lambda=p["fastemit_lambda"],
        rnnt_type=p["rnnt_type"],
    )
    if p["N"] == 0 and p["reduction"] == "mean":
        with pytest.raises(ValueError, match="reduction='mean'"):
            sk.rnnt_loss(x_in, targets.to(dev, index), il_in, tl_in, **options)
        return
    out = sk.rnnt_loss(
        x_in, targets.to(dev, index), il_in, tl_in, fastemit_loss_scale=p["fastemit_loss_scale"], **options
    )
    x_ref = x.double().requires_grad_()
    ref = rnnt_loss_reference(x_ref, targets, il, tl, fastemit_loss_scale=p["fastemit_loss_scale"], **options)
    _check_against_reference(out, ref, x_in, x_ref, g, dtype)
    path.check_ran(dtype != torch.float64 and p["N"] > 0 and p["T"] > 0)


# ---------------------------------------------------------------------------------------------------------------
# unchecked input (validate=False): the kernels and the PyTorch path clamp lengths and labels the same way


def _unchecked_paths(path):
    if not path.kernels:
        pytest.skip("compares the kernel paths with the PyTorch path")


@st.composite
def unchecked_lengths(draw, N, T, S, C, avoid=None):
    """Lengths and labels in and out of range; labels never ``avoid`` (nor clamped onto it: 0 < avoid < C - 1)."""
    il = draw(st.lists(st.integers(-2, T + 3), min_size=N, max_size=N))
    tl = draw(st.lists(st.integers(-2, S + 3), min_size=N, max_size=N))
    label = st.integers(-3, C + 3).filter(lambda v: v != avoid)
    labels = draw(st.lists(label, min_size=N * S, max_size=N * S))
    return il, tl, labels


@given(data=st.data(), seed=st.integers(0, 2**31 - 1), logits=st.booleans(), padded=st.booleans())
def test_ctc_unchecked_input_same_on_every_path(path, data, seed, logits, padded):
    _unchecked_paths(path)
    path.reset()
    # a label equal to the blank (or clamped onto it) is outside what the paths promise to agree on
    N, T, C, S, blank = 3, 6, 5, 3, 2
    il, tl, labels = data.draw(unchecked_lengths(N, T, S, C, avoid=blank))
    x = torch.randn(T, N, C, generator=torch.Generator().manual_seed(seed))
    targets = torch.tensor(labels).reshape(N, S) if padded else torch.tensor(labels)
    out = {}
    for name, dev in (("kernels", path.device), ("torch", torch.device("cpu"))):
        with mock.patch.object(ctc_api, "kernels", None if name == "torch" else ctc_api.kernels):
            xi = x.clone().to(dev).requires_grad_()
            loss = sk.ctc_loss(xi, targets.to(dev), il, tl, blank, "none", logits=logits, validate=False)
            loss.backward(torch.ones_like(loss))
            out[name] = (loss.detach().cpu(), xi.grad.cpu())
    torch.testing.assert_close(out["kernels"][0], out["torch"][0], rtol=2e-5, atol=1e-4)
    torch.testing.assert_close(out["kernels"][1], out["torch"][1], rtol=0, atol=2e-5)
    path.check_ran()


@given(data=st.data(), seed=st.integers(0, 2**31 - 1), fused=st.booleans(), rnnt_type=st.sampled_from(["rnnt", "rna"]))
def test_rnnt_unchecked_input_same_on_every_path(path, data, seed, fused, rnnt_type):
    _unchecked_paths(path)
    path.reset()
    N, T, U, V = 3, 5, 3, 5
    il, tl, labels = data.draw(unchecked_lengths(N, T, U, V))
    x = torch.randn(N, T, U + 1, V, generator=torch.Generator().manual_seed(seed))
    targets = torch.tensor(labels).reshape(N, U)
    out = {}
    for name, dev in (("kernels", path.device), ("torch", torch.device("cpu"))):
        with mock.patch.object(rnnt_api, "kernels", None if name == "torch" else rnnt_api.kernels):
            xi = x.clone().to(dev).requires_grad_()
            loss = sk.rnnt_loss(
                xi,
                targets.to(dev),
                il,
                tl,
                blank=0,
                reduction="none",
                fused_log_softmax=fused,
                rnnt_type=rnnt_type,
                validate=False,
            )
            loss.backward(torch.ones_like(loss))
            out[name] = (loss.detach().cpu(), xi.grad.cpu())
    torch.testing.assert_close(out["kernels"][0], out["torch"][0], rtol=2e-5, atol=1e-4)
    torch.testing.assert_close(out["kernels"][1], out["torch"][1], rtol=0, atol=2e-5)
    path.check_ran()
