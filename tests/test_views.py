"""Inputs as users hold them: every tensor argument of every public loss, of the aligner and of WaveNet generation
given as a view (strided, transposed, at an offset, expanded where its values allow) gives, bit for bit, what the
same values give contiguous, on every path (``path``: the PyTorch path, the Triton kernels under the
interpreter, the GPU).

Each hypothesis example draws a small ragged problem (empty batches and empty label sets included, lengths equal
across the batch or not, every loss option that changes what is read), computes it with contiguous inputs, then
again with a random subset of its tensors (and the upstream gradient) replaced by ``helpers.random_view``: the
same values at other addresses, surrounded by garbage, so that a read that ignores a view's strides or offset
reads garbage. Both the outputs and every gradient must be identical.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import pytest
import torch
from helpers import random_view
from hypothesis import given, settings
from hypothesis import strategies as st

import speechkernels as sk
from speechkernels.ctc.reference import ctc_loss_reference
from speechkernels.rnnt.reference import rnnt_loss_reference


class Problem(NamedTuple):
    fn: Callable  # fn(*tensors) -> a tensor or a tuple of tensors
    tensors: list  # its tensor arguments (contiguous)
    grads: tuple[int, ...]  # which of them get a gradient
    check_ran: bool  # the path's kernels run on it (False: an empty problem, the PyTorch path everywhere)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _dtype(draw, path) -> torch.dtype:
    # the interpreter has no bfloat16; float64 takes the PyTorch path everywhere (drawn rarely)
    dtypes = [torch.float32, torch.float32, torch.float16]
    if path.name != "triton":
        dtypes.append(torch.bfloat16)
    return draw(st.sampled_from(dtypes))


def _lengths(draw, g, N: int, high: int, same: bool, low: int = 0) -> torch.Tensor:
    """N lengths in [low, high]; ``same``: all equal (so that a view of them may be expanded)."""
    if same:
        return torch.full((N,), draw(st.integers(low, high)), dtype=torch.int64)
    return torch.randint(low, high + 1, (N,), generator=g)


def _labels(g, N: int, S: int, classes: list[int], same: bool) -> torch.Tensor:
    """[N, S] labels drawn from ``classes``; ``same``: every row the same."""
    pick = torch.tensor(classes)[torch.randint(0, len(classes), (1 if same else N, S), generator=g)]
    return pick.expand(N, S).clone()


def _index(draw) -> torch.dtype:
    return draw(st.sampled_from([torch.int32, torch.int64]))


# ---------------------------------------------------------------------------------------------------------------
# the problems


def _ctc_tensors(draw, path, T_high: int, scores: Callable[[torch.Tensor], torch.Tensor]):
    """The tensors of a CTC loss or alignment: scores(x) for random x [N, T, C] (transposed to [T, N, C] unless
    batch_first), padded or concatenated labels, input and target lengths; with the blank, batch_first, the
    scores' dtype and the generator."""
    N, T, C, S = draw(st.integers(0, 3)), draw(st.integers(1, T_high)), draw(st.integers(2, 6)), draw(st.integers(0, 3))
    same, blank = draw(st.booleans()), draw(st.integers(0, C - 1))
    g = _gen(draw(st.integers(0, 2**31 - 1)))
    dtype = _dtype(draw, path)
    batch_first, padded = draw(st.booleans()), draw(st.booleans())
    x = scores(torch.randn(N, T, C, generator=g))
    if same and N:  # every sample's scores alike: an expanded view of them is possible
        x = x[:1].expand_as(x).clone()
    if not batch_first:
        x = x.transpose(0, 1).contiguous()
    il, tl = _lengths(draw, g, N, T, same), _lengths(draw, g, N, S, same)
    labels = _labels(g, N, S, [c for c in range(C) if c != blank], same)
    targets = labels if padded else torch.cat([labels[n, : int(tl[n])] for n in range(N)] + [labels.new_zeros(0)])
    index = _index(draw)
    dev = path.device
    tensors = [x.to(dev, dtype), targets.to(dev, index), il.to(dev, index), tl.to(dev, index)]
    return tensors, blank, batch_first, dtype, g


def ctc_problem(draw, path) -> Problem:
    tensors, blank, batch_first, dtype, _ = _ctc_tensors(draw, path, 6, lambda x: x)
    logits, reduction, validate = draw(st.booleans()), draw(st.sampled_from(["none", "sum"])), draw(st.booleans())

    def fn(*a):
        return sk.ctc_loss(
            *a, blank=blank, reduction=reduction, batch_first=batch_first, logits=logits, validate=validate
        )

    return Problem(fn, tensors, (0,), tensors[3].shape[0] > 0 and dtype != torch.float64)


def _transducer_tensors(draw, path, extra: int, label_classes: Callable[[int, int], list[int]], V_low: int = 2):
    """logits [N, T, U+1, V + extra], targets [N, U] from ``label_classes(V, blank)``, lengths; blank in [0, V)."""
    N, T, U = draw(st.integers(0, 3)), draw(st.integers(1, 5)), draw(st.integers(0, 3))
    V = draw(st.integers(V_low, 6))
    same = draw(st.booleans())
    g = _gen(draw(st.integers(0, 2**31 - 1)))
    dtype = _dtype(draw, path)
    x = torch.randn(N, T, U + 1, V + extra, generator=g)
    if same and N:
        x = x[:1].expand_as(x).clone()
    blank = V - 1
    il, tl = _lengths(draw, g, N, T, same), _lengths(draw, g, N, U, same)
    targets = _labels(g, N, U, label_classes(V, blank), same)
    index = _index(draw)
    dev = path.device
    return [x.to(dev, dtype), targets.to(dev, index), il.to(dev, index), tl.to(dev, index)], dtype, blank, g


def _loss_options(draw) -> dict:
    return dict(
        reduction=draw(st.sampled_from(["none", "sum"])),
        validate=draw(st.booleans()),
        fused_log_softmax=draw(st.booleans()),
        clamp=draw(st.sampled_from([-1.0, 0.05])),
    )


def rnnt_problem(draw, path) -> Problem:
    tensors, dtype, blank, _ = _transducer_tensors(draw, path, 0, lambda V, b: list(range(b)))
    options = _loss_options(draw)
    rnnt_type = draw(st.sampled_from(["rnnt", "rna"]))
    fastemit = draw(st.sampled_from([0.0, 0.25]))

    def fn(*a):
        return sk.rnnt_loss(*a, blank=blank, rnnt_type=rnnt_type, fastemit_lambda=fastemit, **options)

    return Problem(fn, tensors, (0,), tensors[0].shape[0] > 0 and dtype != torch.float64)


def tdt_problem(draw, path) -> Problem:
    durations = draw(st.sampled_from([[0, 1, 2], [1, 2], [0, 2, 3, 5]]))
    tensors, dtype, blank, _ = _transducer_tensors(draw, path, len(durations), lambda V, b: list(range(b)))
    options = _loss_options(draw)
    sigma = draw(st.sampled_from([0.0, 0.05]))

    def fn(*a):
        return sk.tdt_loss(*a, durations, blank=blank, sigma=sigma, **options)

    return Problem(fn, tensors, (0,), tensors[0].shape[0] > 0 and dtype != torch.float64)


def multiblank_problem(draw, path) -> Problem:
    big = [2, 3]
    tensors, dtype, blank, _ = _transducer_tensors(draw, path, 0, lambda V, b: list(range(b - len(big))), V_low=4)
    options = _loss_options(draw)

    def fn(*a):
        return sk.multiblank_rnnt_loss(*a, big, blank=blank, **options)

    return Problem(fn, tensors, (0,), tensors[0].shape[0] > 0 and dtype != torch.float64)


def _joint_problem(draw, path, kind: str) -> Problem:
    """enc, pred, weight, bias (or None), targets and lengths of a fused joint loss (``kind``: rnnt, tdt,
    multiblank)."""
    durations, big = [0, 1, 2], [2, 3]
    extra = len(durations) if kind == "tdt" else 0
    low = 2 + (len(big) if kind == "multiblank" else 0)
    classes = (lambda V, b: list(range(b - len(big)))) if kind == "multiblank" else (lambda V, b: list(range(b)))
    tensors, dtype, blank, g = _transducer_tensors(draw, path, extra, classes, V_low=low)
    _, targets, il, tl = tensors
    N, T, U1, Vx = tensors[0].shape
    H = draw(st.integers(1, 5))
    dev = path.device
    enc, pred = torch.randn(N, T, H, generator=g), torch.randn(N, U1, H, generator=g)
    weight, bias = torch.randn(Vx, H, generator=g), torch.randn(Vx, generator=g)
    tensors = [t.to(dev, dtype) for t in (enc, pred, weight)]
    with_bias = draw(st.booleans())
    if with_bias:
        tensors.append(bias.to(dev, dtype))
    tensors += [targets, il, tl]
    activation = draw(st.sampled_from(["relu", "tanh", "sigmoid"]))
    dropout = draw(st.sampled_from([0.0, 0.3]))
    seed = draw(st.integers(0, 2**31 - 1))
    reduction, validate = draw(st.sampled_from(["none", "sum"])), draw(st.booleans())

    def fn(*a):
        enc, pred, weight, *rest = a
        bias = rest.pop(0) if with_bias else None
        options = dict(
            blank=blank,
            activation=activation,
            dropout=dropout,
            generator=_gen(seed),
            reduction=reduction,
            validate=validate,
        )
        if kind == "tdt":
            return sk.tdt_joint_loss(enc, pred, weight, bias, *rest, durations, **options)
        if kind == "multiblank":
            return sk.multiblank_joint_loss(enc, pred, weight, bias, *rest, big, **options)
        return sk.rnnt_joint_loss(enc, pred, weight, bias, *rest, **options)

    return Problem(fn, tensors, tuple(range(4 if with_bias else 3)), N > 0 and dtype != torch.float64)


def align_problem(draw, path) -> Problem:
    tensors, blank, batch_first, dtype, g = _ctc_tensors(draw, path, 7, lambda x: x.log_softmax(-1))
    validate = draw(st.booleans())
    spans = draw(st.booleans())

    def fn(*a):
        alignments, scores = sk.ctc_forced_align(*a, blank=blank, batch_first=batch_first, validate=validate)
        if not spans:
            return alignments, scores
        # the spans of views of the aligner's outputs (batch first)
        al, sc = (alignments, scores) if batch_first else (alignments.T, scores.T)
        return tuple(sk.ctc_token_spans(random_view(al, g), random_view(sc.exp(), g), blank=blank))

    return Problem(fn, tensors, (), tensors[3].shape[0] > 0 and dtype != torch.float64)


def wavenet_problem(draw, path) -> Problem:
    B, n = draw(st.integers(1, 3)), draw(st.integers(1, 9))
    speakers, cond_channels = draw(st.sampled_from([0, 3])), draw(st.sampled_from([0, 3]))
    same, temperature = draw(st.booleans()), draw(st.sampled_from([0.0, 1.0]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = _gen(seed)
    torch.manual_seed(seed)
    sizes = dict(layers=3, cycle=2, residual_channels=4, gate_channels=6, skip_channels=5, classes=7, hop_length=2)
    model = sk.wavenet.WaveNet(cond_channels=cond_channels, speakers=speakers, speaker_channels=2, **sizes)
    model = model.to(path.device)
    tensors = []
    if cond_channels:
        cond = torch.randn(1 if same else B, cond_channels, (n + 1) // 2 + draw(st.integers(0, 2)), generator=g)
        tensors.append(cond.expand(B, -1, -1).clone().to(path.device))
    if speakers:
        tensors.append((torch.full((B,), 2) if same else torch.randint(0, speakers, (B,), generator=g)).to(path.device))
    kernel = {"torch": "torch", "triton": "triton", "cuda": "auto"}[path.name]
    if path.name == "cuda" and draw(st.booleans()):
        kernel = "triton"

    def fn(*a):
        cond = a[0] if cond_channels else None
        speaker = a[-1] if speakers else None
        return model.generate(
            cond, n, temperature=temperature, generator=_gen(seed), speaker=speaker, batch=B, kernel=kernel
        )

    return Problem(fn, tensors, (), False)


PROBLEMS = {
    "ctc_loss": ctc_problem,
    "rnnt_loss": rnnt_problem,
    "tdt_loss": tdt_problem,
    "multiblank_rnnt_loss": multiblank_problem,
    "rnnt_joint_loss": lambda draw, path: _joint_problem(draw, path, "rnnt"),
    "tdt_joint_loss": lambda draw, path: _joint_problem(draw, path, "tdt"),
    "multiblank_joint_loss": lambda draw, path: _joint_problem(draw, path, "multiblank"),
    "ctc_forced_align": align_problem,
    "wavenet_generate": wavenet_problem,
}


# ---------------------------------------------------------------------------------------------------------------


def _run(problem: Problem, tensors: list, upstream: Callable | None) -> list:
    """The outputs and, under an upstream gradient, the gradient of each input in ``problem.grads``."""
    leaves = [t.requires_grad_() if i in problem.grads else t for i, t in enumerate(tensors)]
    out = problem.fn(*leaves)
    outs = list(out) if isinstance(out, tuple) else [out]
    results = [o.detach() for o in outs]
    if problem.grads:
        grads = torch.autograd.grad(outs[0], [leaves[i] for i in problem.grads], upstream(outs[0]), allow_unused=True)
        results += list(grads)
    return results


@pytest.mark.parametrize("function", list(PROBLEMS))
@settings(max_examples=min(settings.default.max_examples, 20))  # on the GPU each new size compiles kernels
@given(data=st.data())
def test_views_give_the_results_of_contiguous_inputs(path, function, data):
    path.reset()
    problem = PROBLEMS[function](data.draw, path)
    seed = data.draw(st.integers(0, 2**31 - 1))
    g = _gen(seed)
    w = None

    def upstream(out, viewed: bool):
        nonlocal w
        if w is None:
            w = (torch.rand(out.shape, generator=_gen(seed), dtype=torch.float64) + 0.5).to(out.device, out.dtype)
        return random_view(w, g) if viewed else w

    expected = _run(problem, [t.clone() for t in problem.tensors], lambda out: upstream(out, False))
    n = len(problem.tensors)
    chosen = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True)) if n else []
    tensors = [random_view(t, g) if i in chosen else t.clone() for i, t in enumerate(problem.tensors)]
    got = _run(problem, tensors, lambda out: upstream(out, data.draw(st.booleans())))
    assert len(got) == len(expected)
    for k, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert (a is None) == (b is None), (function, k)
        if a is not None:  # bit for bit: values, NaN where NaN, dtype, shape
            torch.testing.assert_close(
                a,
                b,
                rtol=0,
                atol=0,
                equal_nan=True,
                msg=lambda m, k=k: f"{function}: output {k}, views of {chosen}: {m}",
            )
    if function != "wavenet_generate":
        path.check_ran(problem.check_ran)


@pytest.mark.parametrize("validate", [True, False])
def test_lengths_as_columns_of_one_tensor(path, validate):
    """k2 keeps each sample's frames and labels as columns of one tensor: ``boundary[:, 0]`` has stride 2. The
    losses of such lengths are those of their contiguous copies, and the float64 reference's."""
    torch.manual_seed(0)
    dev = path.device
    L = torch.tensor([[6, 3], [4, 2]], device=dev)
    x = torch.randn(2, 6, 4, 5).to(dev)
    y = torch.randint(0, 4, (2, 3), dtype=torch.int32).to(dev)
    expected = sk.rnnt_loss(x, y, L[:, 0].contiguous(), L[:, 1].contiguous(), reduction="none")
    got = sk.rnnt_loss(x, y, L[:, 0], L[:, 1], reduction="none", validate=validate)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    reference = rnnt_loss_reference(x.double().cpu(), y.cpu(), L[:, 0].cpu(), L[:, 1].cpu(), reduction="none")
    torch.testing.assert_close(got.double().cpu(), reference, rtol=1e-6, atol=1e-6)
    # CTC: three samples (frames, labels) in columns 1 and 3 of a [3, 4] tensor
    B = torch.tensor([[0, 10, 0, 4], [0, 9, 0, 6], [0, 10, 0, 3]], device=dev)
    lp = torch.randn(10, 3, 7).log_softmax(-1).to(dev)
    targets = torch.randint(1, 7, (3, 6)).to(dev)
    expected = sk.ctc_loss(lp, targets, B[:, 1].contiguous(), B[:, 3].contiguous(), reduction="none")
    got = sk.ctc_loss(lp, targets, B[:, 1], B[:, 3], reduction="none", validate=validate)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    reference = ctc_loss_reference(lp.double().cpu(), targets.cpu(), B[:, 1].cpu(), B[:, 3].cpu(), reduction="none")
    torch.testing.assert_close(got.double().cpu(), reference, rtol=1e-6, atol=1e-6)
    path.check_ran()
