"""TDT and multi-blank transducer losses: the float64 reference against brute-force path enumeration, against the
RNN-T loss (multi-blank without big blanks), gradcheck, impossible samples and NaN confinement."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import check_batch_halves, check_compiled_matches_eager, check_graph_replay_matches_eager

from speechkernels.rnnt.reference import rnnt_loss_reference
from speechkernels.tdt.reference import multiblank_rnnt_loss_reference, tdt_loss_reference


def make_case(seed, N, T, U, C, *, avoid=(), dtype=torch.float64):
    """Random scores [N, T, U+1, C], labels outside ``avoid`` (the blanks), ragged lengths (sample 0 full)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, T, U + 1, C, generator=g, dtype=torch.float64).to(dtype)
    classes = torch.tensor([c for c in range(C) if c not in avoid])
    targets = classes[torch.randint(0, len(classes), (N, U), generator=g)]
    il = torch.randint(1, T + 1, (N,), generator=g)
    tl = torch.randint(0, U + 1, (N,), generator=g)
    il[0], tl[0] = T, U
    return x, targets, il, tl


def path_sum(T_n, U_n, blank_edges, label_edges):
    """-log of the sum over every path from (0, 0) to (T_n, U_n) (depth-first): blank_edges(t, u) and
    label_edges(t, u) give (duration, log weight) pairs; a blank may land on T_n, a label only before it."""
    scores = []

    def walk(t, u, score):
        if (t, u) == (T_n, U_n):
            scores.append(score)
            return
        if t >= T_n:
            return
        for d, w in blank_edges(t, u):
            if d > 0 and t + d <= T_n:
                walk(t + d, u, score + w)
        if u < U_n:
            for d, w in label_edges(t, u):
                if t + d < T_n:
                    walk(t + d, u + 1, score + w)

    walk(0, 0, 0.0)
    return -torch.logsumexp(torch.tensor(scores, dtype=torch.float64), 0) if scores else torch.tensor(math.inf)


@pytest.mark.parametrize("seed", range(4))
def test_tdt_reference_matches_brute_force(seed):
    durations = [[0, 1, 2], [0, 1, 2, 3, 4], [1, 2], [0, 2, 3]][seed]
    D, V, sigma = len(durations), 5, [0.0, 0.05, 0.0, 0.1][seed]
    x, targets, il, tl = make_case(seed, 3, 6, 3, V + D, avoid=(V - 1,))
    targets = targets.clamp(max=V - 2)  # token labels, not the blank V - 1 nor a duration column
    loss = tdt_loss_reference(x, targets, il, tl, durations, sigma=sigma, reduction="none")
    lp = torch.log_softmax(x[..., :V], -1) - sigma
    ld = torch.log_softmax(x[..., V:], -1)
    for n in range(3):

        def blanks(t, u, n=n):
            return [(d, lp[n, t, u, V - 1] + ld[n, t, u, i]) for i, d in enumerate(durations)]

        def labels(t, u, n=n):
            return [(d, lp[n, t, u, targets[n, u]] + ld[n, t, u, i]) for i, d in enumerate(durations)]

        expected = path_sum(int(il[n]), int(tl[n]), blanks, labels)
        torch.testing.assert_close(loss[n], expected.to(loss.dtype), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_multiblank_reference_matches_brute_force(seed):
    big = [[2], [2, 4], [3, 2]][seed]
    V, sigma = 6, [0.0, 0.05, 0.2][seed]
    C = V + len(big)
    blank = C - 1
    x, targets, il, tl = make_case(10 + seed, 3, 7, 3, C, avoid=range(V - 1, C))
    loss = multiblank_rnnt_loss_reference(x, targets, il, tl, big, sigma=sigma, reduction="none")
    lp = torch.log_softmax(x, -1) - sigma
    for n in range(3):

        def blanks(t, u, n=n):
            return [(1, lp[n, t, u, blank])] + [(d, lp[n, t, u, blank - 1 - i]) for i, d in enumerate(big)]

        def labels(t, u, n=n):
            return [(0, lp[n, t, u, targets[n, u]])]

        expected = path_sum(int(il[n]), int(tl[n]), blanks, labels)
        torch.testing.assert_close(loss[n], expected.to(loss.dtype), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "opts",
    [{}, dict(fastemit_lambda=0.3, clamp=0.05), dict(fastemit_lambda=0.2, fastemit_loss_scale=False, reduction="sum")],
)
def test_multiblank_without_big_blanks_is_the_rnnt_loss(opts):
    x, targets, il, tl = make_case(20, 4, 7, 4, 6, avoid=(5,))
    opts = {"reduction": "none", **opts}
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    a = multiblank_rnnt_loss_reference(xa, targets, il, tl, [], **opts)
    b = rnnt_loss_reference(xb, targets, il, tl, **opts)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    g = torch.rand(a.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (a * g).sum().backward()
    (b * g).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("which", ["tdt", "multiblank"])
def test_reference_gradcheck(which):
    if which == "tdt":
        x, targets, il, tl = make_case(30, 2, 5, 2, 4 + 3, avoid=(3,))
        targets = targets.clamp(max=2)

        def f(v):
            return tdt_loss_reference(v, targets, il, tl, [0, 1, 2], sigma=0.05, reduction="none")
    else:
        x, targets, il, tl = make_case(31, 2, 6, 2, 6, avoid=(4, 5))

        def f(v):
            return multiblank_rnnt_loss_reference(v, targets, il, tl, [3], sigma=0.05, reduction="none")

    assert torch.autograd.gradcheck(f, (x.requires_grad_(),))


def test_tdt_fastemit_scales_the_label_edges_gradient():
    """FastEmit: the loss as the plain one (times 1 + lambda with fastemit_loss_scale), the gradient with
    respect to the token logits through the label edges times 1 + lambda: with lambda, the gradient is the plain
    gradient plus lambda times the gradient of the label edges alone."""
    durations = [0, 1, 2]
    x, targets, il, tl = make_case(40, 2, 5, 2, 5 + 3, avoid=(4,))
    targets = targets.clamp(max=3)
    grads = {}
    for lam in (0.0, 0.5):
        for scale in (True, False):
            xi = x.clone().requires_grad_()
            loss = tdt_loss_reference(
                xi, targets, il, tl, durations, reduction="sum", fastemit_lambda=lam, fastemit_loss_scale=scale
            )
            loss.backward()
            grads[lam, scale] = (loss.detach(), xi.grad)
    plain = grads[0.0, True][0]
    torch.testing.assert_close(grads[0.5, False][0], plain)
    torch.testing.assert_close(grads[0.5, True][0], 1.5 * plain)
    torch.testing.assert_close(grads[0.5, True][1], grads[0.5, False][1])
    assert not torch.allclose(grads[0.5, True][1], grads[0.0, True][1])


def test_impossible_samples_and_nan_confinement():
    """Durations that overshoot the last frame: with durations [0, 2] a blank cannot land on frame 3 (loss +inf,
    zero gradient); a NaN in one sample's lattice stays in that sample."""
    x, targets, il, tl = make_case(50, 3, 4, 1, 4 + 2, avoid=(3,))
    targets = targets.clamp(max=2)
    il, tl = torch.tensor([3, 4, 4]), torch.tensor([0, 1, 1])
    x[2, 1, 0, 0] = math.nan
    xi = x.clone().requires_grad_()
    loss = tdt_loss_reference(xi, targets, il, tl, [0, 2], reduction="none")
    values = loss.detach()
    assert math.isinf(values[0]) and math.isfinite(values[1]) and math.isnan(values[2])
    loss[:2].sum().backward()
    assert (xi.grad[0] == 0).all() and torch.isfinite(xi.grad[1]).all()
    # the sample with a path: brute force agrees (a blank of 2 lands on 4; labels land before it)
    lp = torch.log_softmax(x[1, ..., :4], -1)
    ld = torch.log_softmax(x[1, ..., 4:], -1)
    blanks = lambda t, u: [(d, lp[t, u, 3] + ld[t, u, i]) for i, d in enumerate([0, 2])]  # noqa: E731
    labels = lambda t, u: [(d, lp[t, u, targets[1, u]] + ld[t, u, i]) for i, d in enumerate([0, 2])]  # noqa: E731
    expected = path_sum(4, 1, blanks, labels)
    torch.testing.assert_close(values[1], expected.to(loss.dtype))


# ---------------------------------------------------------------------------------------------------------------
# the public API (speechkernels.tdt_loss, multiblank_rnnt_loss and their modules)


def tdt_case(seed, N, T, U, V, D, *, blank=-1, dtype=torch.float64):
    """make_case for V tokens and D durations: labels among the tokens, never the blank."""
    return make_case(seed, N, T, U, V + D, avoid=(blank % V, *range(V, V + D)), dtype=dtype)


def grads_of(fn, x, upstream=None):
    xi = x.detach().clone().requires_grad_()
    loss = fn(xi)
    loss.backward(torch.ones_like(loss) if upstream is None else upstream)
    return loss.detach(), xi.grad


def on(device, *tensors):
    return [t.to(device) for t in tensors]


TDT_OPTIONS = [
    dict(),
    dict(reduction="sum", sigma=0.05),
    dict(reduction="none", clamp=0.02, fastemit_lambda=0.3),
    dict(reduction="none", fused_log_softmax=False, fastemit_loss_scale=False, fastemit_lambda=0.1),
    dict(blank=0, sigma=0.1),
]


@pytest.mark.parametrize("opts", TDT_OPTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tdt_loss_matches_reference(path, opts, dtype):
    """Values and gradients of the public loss (each path) against the float64 reference on fresh random inputs
    (ragged lengths, a sample without labels), for each option; float32 in, float32 out."""
    from speechkernels import tdt_loss

    durations = [0, 1, 2, 4]
    blank = opts.get("blank", -1)
    x, targets, il, tl = tdt_case(60 + len(opts), 4, 7, 3, 6, 4, blank=blank, dtype=dtype)
    tl[1] = 0
    x = x if opts.get("fused_log_softmax", True) else torch.log_softmax(x, -1)
    xd, td, ild, tld = on(path.device, x, targets, il, tl)
    loss, grad = grads_of(lambda v: tdt_loss(v, td, ild, tld, durations, **opts), xd)
    path.check_ran(dtype != torch.float64)
    loss, grad = loss.cpu(), grad.cpu()
    ropts = {k: v for k, v in opts.items() if k not in ("blank", "sigma")}
    ropts.setdefault("reduction", "mean")
    ref, rgrad = grads_of(
        lambda v: tdt_loss_reference(v, targets, il, tl, durations, blank, opts.get("sigma", 0.0), **ropts), x.double()
    )
    assert loss.dtype == dtype and grad.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss.double(), ref, **tol)
    torch.testing.assert_close(grad.double(), rgrad, **tol)


def test_tdt_clamp_leaves_the_durations_gradient():
    """clamp bounds the token logits' gradient only (as NeMo): the duration logits' is the unclamped one."""
    from speechkernels import tdt_loss

    x, targets, il, tl = tdt_case(70, 2, 6, 2, 5, 3)
    _, free = grads_of(lambda v: tdt_loss(v, targets, il, tl, [0, 1, 3], reduction="sum"), x)
    _, clamped = grads_of(lambda v: tdt_loss(v, targets, il, tl, [0, 1, 3], reduction="sum", clamp=0.01), x)
    assert free[..., :5].abs().max() > 0.01 and clamped[..., :5].abs().max() <= 0.01
    torch.testing.assert_close(clamped[..., :5], free[..., :5].clamp(-0.01, 0.01))
    torch.testing.assert_close(clamped[..., 5:], free[..., 5:])


@pytest.mark.parametrize(
    "opts",
    [
        dict(),
        dict(reduction="none", sigma=0.05, clamp=0.03, fastemit_lambda=0.2),
        dict(reduction="sum", fused_log_softmax=False),
    ],
)
def test_multiblank_loss_matches_reference(path, opts):
    """The public multi-blank loss (each path, float32) against its float64 reference (values and gradients)."""
    from speechkernels import multiblank_rnnt_loss

    x, targets, il, tl = make_case(71, 3, 8, 3, 7, avoid=(4, 5, 6))
    x = x if opts.get("fused_log_softmax", True) else torch.log_softmax(x, -1)
    xd, td, ild, tld = on(path.device, x.float(), targets, il, tl)
    loss, grad = grads_of(lambda v: multiblank_rnnt_loss(v, td, ild, tld, [2, 4], **opts), xd)
    path.check_ran()
    ro = {k: v for k, v in opts.items() if k != "sigma"}
    ref, rgrad = grads_of(
        lambda v: multiblank_rnnt_loss_reference(v, targets, il, tl, [2, 4], -1, opts.get("sigma", 0.0), **ro), x
    )
    torch.testing.assert_close(loss.cpu().double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.cpu().double(), rgrad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["tdt", "multiblank"])
def test_durations_longer_than_the_frames(path, kind):
    """Durations up to 8 over 2-5 frames and more labels than frames (the recursions' history reaches past the
    lattice's first row): values and gradients against the float64 reference (each path, float32)."""
    from speechkernels import multiblank_rnnt_loss, tdt_loss

    if kind == "tdt":  # (the two losses and their references take the same arguments)
        loss_fn, ref_fn, durations = tdt_loss, tdt_loss_reference, [0, 1, 3, 8]
        x, targets, il, tl = tdt_case(73, 3, 5, 7, 5, 4)
        il = torch.tensor([5, 2, 3])
    else:
        loss_fn, ref_fn, durations = multiblank_rnnt_loss, multiblank_rnnt_loss_reference, [2, 8]
        x, targets, il, tl = make_case(74, 3, 4, 6, 7, avoid=(4, 5, 6))
        il = torch.tensor([4, 2, 3])
    xd, td, ild, tld = on(path.device, x.float(), targets, il, tl)
    loss, grad = grads_of(lambda v: loss_fn(v, td, ild, tld, durations, reduction="none"), xd)
    path.check_ran()
    ref, rgrad = grads_of(lambda v: ref_fn(v, targets, il, tl, durations, reduction="none"), x)
    torch.testing.assert_close(loss.cpu().double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.cpu().double(), rgrad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["tdt", "multiblank"])
def test_label_rows_longer_than_a_warp(path, kind):
    """U + 1 = 70 and 41 (the recursions' rows rounded up to 96 and 64 entries, the lanes to 128 and 64) with a
    0-frame edge: values and gradients against the float64 reference (each path, float32)."""
    from speechkernels import multiblank_rnnt_loss, tdt_loss

    if kind == "tdt":
        loss_fn, ref_fn, durations = tdt_loss, tdt_loss_reference, [0, 1, 2, 3]
        x, targets, il, tl = tdt_case(75, 2, 6, 69, 5, 4)
    else:
        loss_fn, ref_fn, durations = multiblank_rnnt_loss, multiblank_rnnt_loss_reference, [2, 3]
        x, targets, il, tl = make_case(76, 2, 5, 40, 6, avoid=(3, 4, 5))
    xd, td, ild, tld = on(path.device, x.float(), targets, il, tl)
    loss, grad = grads_of(lambda v: loss_fn(v, td, ild, tld, durations, reduction="none"), xd)
    path.check_ran()
    ref, rgrad = grads_of(lambda v: ref_fn(v, targets, il, tl, durations, reduction="none"), x)
    torch.testing.assert_close(loss.cpu().double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.cpu().double(), rgrad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_multiblank_loss_without_big_blanks_is_rnnt_loss(path, reduction):
    """Without big blanks the multi-blank loss is rnnt_loss (values and gradients, float32, each path)."""
    from speechkernels import multiblank_rnnt_loss, rnnt_loss

    y, targets, il, tl = on(path.device, *make_case(72, 3, 6, 3, 5, avoid=(4,), dtype=torch.float32))
    ours = grads_of(lambda v: multiblank_rnnt_loss(v, targets, il, tl, [], reduction=reduction), y)
    theirs = grads_of(lambda v: rnnt_loss(v, targets, il, tl, reduction=reduction), y)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_tdt_omega_draws_from_the_generator():
    """omega: one draw per call from ``generator`` (reproducible with a seed); the chosen RNN-T loss is rnnt_loss
    of the token logits, with a zero gradient for the durations; omega=0 draws nothing."""
    from speechkernels import rnnt_loss, tdt_loss

    x, targets, il, tl = tdt_case(73, 3, 6, 2, 5, 3, dtype=torch.float32)
    kw = dict(reduction="none", fastemit_lambda=0.1, clamp=0.05)
    tdt = grads_of(lambda v: tdt_loss(v, targets, il, tl, [0, 1, 2], **kw), x)
    rnnt = grads_of(lambda v: rnnt_loss(v[..., :5], targets, il, tl, -1, 0.05, "none", fastemit_lambda=0.1), x)
    assert (rnnt[1][..., 5:] == 0).all()

    def run(seed, calls):
        g = torch.Generator().manual_seed(seed)
        out = [
            grads_of(lambda v: tdt_loss(v, targets, il, tl, [0, 1, 2], omega=0.5, generator=g, **kw), x)
            for _ in range(calls)
        ]
        return out

    first, again = run(5, 12), run(5, 12)
    picks = []
    for (loss, grad), (loss2, grad2) in zip(first, again, strict=True):
        assert torch.equal(loss, loss2) and torch.equal(grad, grad2)
        is_rnnt = torch.equal(loss, rnnt[0])
        assert is_rnnt or torch.equal(loss, tdt[0])
        torch.testing.assert_close(grad, rnnt[1] if is_rnnt else tdt[1])
        picks.append(is_rnnt)
    g = torch.Generator().manual_seed(5)
    assert picks == [torch.rand((), generator=g).item() < 0.5 for _ in range(12)]
    assert 0 < sum(picks) < 12
    always = grads_of(lambda v: tdt_loss(v, targets, il, tl, [0, 1, 2], omega=1.0, **kw), x)
    torch.testing.assert_close(always, rnnt)
    g = torch.Generator().manual_seed(3)
    state = g.get_state()
    tdt_loss(x, targets, il, tl, [0, 1, 2], generator=g)
    assert torch.equal(g.get_state(), state)


@pytest.mark.parametrize("T, U, durations", [(1, 0, [1]), (1, 2, [0, 1]), (5, 0, [2, 3]), (4, 2, [0, 3])])
def test_tdt_small_shapes_match_reference(path, T, U, durations):
    """U = 0, T = 1, durations that overshoot T: the public loss (each path, float32) is the reference's."""
    from speechkernels import tdt_loss

    x, targets, il, tl = tdt_case(74 + T, 3, T, U, 4, len(durations))
    xd, td, ild, tld = on(path.device, x.float(), targets, il, tl)
    loss, grad = grads_of(lambda v: tdt_loss(v, td, ild, tld, durations, reduction="none"), xd)
    ref, rgrad = grads_of(lambda v: tdt_loss_reference(v, targets, il, tl, durations, reduction="none"), x)
    torch.testing.assert_close(loss.cpu().double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.cpu().double(), rgrad, rtol=1e-5, atol=1e-5)


def test_tdt_no_frames_and_nan_confinement(path):
    """A sample with no frames (+inf, zero gradient); a NaN in a cell no sample reads has no effect, one in a cell
    a sample reads makes that sample's loss NaN only (each path)."""
    from speechkernels import tdt_loss

    x, targets, il, tl = tdt_case(80, 3, 5, 2, 4, 3, dtype=torch.float32)
    il, tl = torch.tensor([0, 3, 5]), torch.tensor([1, 2, 1])
    x[1, 4] = math.nan  # past sample 1's frames
    x[1, 1, 2] = math.nan  # read by sample 1 (t=1 < 3, u=2 <= 2)
    x[2, 0, 2] = math.nan  # past sample 2's labels
    x, targets, il, tl = on(path.device, x, targets, il, tl)
    loss, grad = grads_of(lambda v: tdt_loss(v, targets, il, tl, [0, 1, 2], reduction="none"), x)
    path.check_ran()
    loss, grad = loss.cpu(), grad.cpu()
    assert math.isinf(loss[0]) and (grad[0] == 0).all()
    assert math.isnan(loss[1]) and math.isfinite(loss[2])
    assert torch.isfinite(grad[2]).all() and (grad[2, :, 2] == 0).all()


def test_tdt_module_forms():
    """TDTLoss and MultiblankRNNTLoss take the functions' options (same names, defaults) and give their values."""
    import inspect

    from speechkernels import MultiblankRNNTLoss, TDTLoss, multiblank_rnnt_loss, tdt_loss

    x, targets, il, tl = tdt_case(81, 2, 5, 2, 6, 2, dtype=torch.float32)
    crit = TDTLoss([0, 2], sigma=0.05, reduction="sum")
    torch.testing.assert_close(
        crit(x, targets, il, tl), tdt_loss(x, targets, il, tl, [0, 2], sigma=0.05, reduction="sum")
    )
    assert list(inspect.signature(TDTLoss).parameters) == list(inspect.signature(tdt_loss).parameters)[4:]
    y = x[..., :6]
    crit = MultiblankRNNTLoss(big_blank_durations=[3], clamp=0.1)
    torch.testing.assert_close(
        crit(y, targets.clamp(max=3), il, tl), multiblank_rnnt_loss(y, targets.clamp(max=3), il, tl, [3], clamp=0.1)
    )
    with pytest.raises(TypeError, match="durations"):
        TDTLoss()
    with pytest.raises(TypeError, match="bogus"):
        tdt_loss(x, targets, il, tl, [0, 2], bogus=1)


BAD_TDT = [
    (dict(durations=[]), "durations must hold a positive duration"),
    (dict(durations=[0]), "durations must hold a positive duration"),
    (dict(durations=[0, 1, 1]), "durations must be distinct"),
    (dict(durations=[-1, 1]), r"durations\[0\] must be >= 0"),
    (dict(durations=[0, 1.5]), r"durations\[1\] must be an integer"),
    (dict(durations="01"), "durations must be a sequence of integers"),
    (dict(durations=torch.tensor([0.0, 1.0])), "durations must be a sequence of integers"),
    (dict(omega=1.5), "omega must be a probability"),
    (dict(omega=-0.1), "omega must be >= 0"),
    (dict(omega=math.nan), "omega must be a number, got nan"),
    (dict(generator=3), "generator must be a torch.Generator"),
    (dict(sigma=math.inf), "sigma must be a finite number"),
    (dict(blank=6), r"blank=6 is outside \[-V, V\) for V=6 token classes"),
    (dict(reduction="avg"), "reduction must be one of"),
    (dict(fastemit_lambda=-1.0), "fastemit_lambda must be >= 0"),
    (dict(durations=list(range(1, 10))), "leaves no token class"),
    (dict(targets_value=5), r"targets\[0, 0\]=5 equals blank=5"),
    (dict(targets_value=6), r"targets\[0, 0\]=6 is outside \[0, V=6\)"),
    (dict(il=[9, 5]), r"logit_lengths\[0\]=9 is outside \[0, T=5\]"),
    (dict(tl=[1]), "target_lengths has 1 entries but the batch size is 2"),
    (dict(clamp="a"), "clamp must be a real number"),
    (dict(fused_log_softmax=2), "fused_log_softmax must be True or False"),
    (dict(validate="yes"), "validate must be True or False"),
    (dict(fastemit_loss_scale=None), "fastemit_loss_scale must be True or False"),
    (dict(logits_dims=3), "logits must have 4 dimensions"),
    (dict(logits_dtype=torch.int64), "logits must be float16, bfloat16, float32 or float64"),
    (dict(targets_dtype=torch.float32), "targets must be int32 or int64"),
]


@pytest.mark.parametrize("kw, match", BAD_TDT)
def test_tdt_bad_arguments(kw, match):
    from speechkernels import tdt_loss

    x, targets, il, tl = tdt_case(82, 2, 5, 2, 6, 3, dtype=torch.float32)
    kw = dict(kw)
    if "targets_value" in kw:
        targets[0, 0] = kw.pop("targets_value")
    if "logits_dims" in kw:
        x = x[0] if kw.pop("logits_dims") == 3 else x
    x = x.to(kw.pop("logits_dtype", x.dtype))
    targets = targets.to(kw.pop("targets_dtype", targets.dtype))
    args = dict(durations=[0, 1, 2], logit_lengths=kw.pop("il", il), target_lengths=kw.pop("tl", tl)) | kw
    with pytest.raises(ValueError, match=match):
        tdt_loss(x, targets, **args)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(big_blank_durations=[1, 2]), r"big_blank_durations\[0\] must be >= 2"),
        (dict(big_blank_durations=[2, 2]), "big_blank_durations must be distinct"),
        (dict(blank=1), "leaves no room"),
        (dict(targets_value=5), r"targets\[0, 0\]=5 is a big blank \(indices 4 to 5\)"),
        (dict(targets_value=6), r"targets\[0, 0\]=6 equals blank=6"),
        (dict(blank=7), r"blank=7 is outside \[-V, V\) for V=7"),
    ],
)
def test_multiblank_bad_arguments(kw, match):
    from speechkernels import multiblank_rnnt_loss

    x, targets, il, tl = make_case(83, 2, 5, 2, 7, avoid=(4, 5, 6), dtype=torch.float32)
    kw = dict(kw)
    if "targets_value" in kw:
        targets[0, 0] = kw.pop("targets_value")
    args = dict(big_blank_durations=[2, 4]) | kw
    with pytest.raises(ValueError, match=match):
        multiblank_rnnt_loss(x, targets, il, tl, **args)


def _both_losses(device, dtype=torch.float32, seed=80, N=3, T=6, U=3, **opts):
    """(name, loss of the logits, logits) for a TDT and a multi-blank problem on ``device``."""
    from speechkernels import multiblank_rnnt_loss, tdt_loss

    x, targets, il, tl = on(device, *tdt_case(seed, N, T, U, 6, 3))
    xm, tm, ilm, tlm = on(device, *make_case(seed + 1, N, T, U, 7, avoid=(4, 5, 6)))
    return [
        ("tdt", lambda v: tdt_loss(v, targets, il, tl, [0, 1, 2], **opts), x.to(dtype)),
        ("multiblank", lambda v: multiblank_rnnt_loss(v, tm, ilm, tlm, [2, 4], **opts), xm.to(dtype)),
    ]


def test_tdt_kernels_through_torch_compile(path):
    """The torch.library op (fake shapes, autograd registration) under torch.compile's whole-graph tracing, both
    losses: aot_eager on the interpreter, inductor on the GPU (which checks the outputs' alignment)."""
    if not path.kernels:
        pytest.skip("the kernels' op")
    backend = "inductor" if path.device.type == "cuda" else "aot_eager"
    for _name, fn, x in _both_losses(path.device, validate=False, reduction="none"):
        check_compiled_matches_eager(lambda v, fn=fn: fn(v).sum() * 2.0, x, backend=backend)
    path.check_ran()


@pytest.mark.gpu
def test_gpu_tdt_cuda_graph_capture(gpu):
    """Both losses and their backward captured in a CUDA graph (validate=False: no host synchronisation),
    replayed on new logits: the eager loss and gradient."""
    for _name, fn, x in _both_losses(gpu, seed=81, N=4, T=30, U=8, validate=False):
        check_graph_replay_matches_eager(fn, x)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_tdt_half_precision(gpu, dtype):
    """16-bit logits: float32 losses and gradients in the logits' dtype, against the float64 reference of the same
    rounded logits (float32 sums inside)."""
    from speechkernels import multiblank_rnnt_loss, tdt_loss

    x, targets, il, tl = tdt_case(82, 4, 40, 12, 100, 5)
    xh = x.to(dtype)
    loss, grad = grads_of(
        lambda v: tdt_loss(v, *on(gpu, targets, il, tl), [0, 1, 2, 3, 4], reduction="none"), xh.to(gpu)
    )
    ref, rgrad = grads_of(
        lambda v: tdt_loss_reference(v, targets, il, tl, [0, 1, 2, 3, 4], -1, 0.0, reduction="none"), xh.double()
    )
    assert loss.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(loss.cpu().double(), ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grad.cpu().double(), rgrad, rtol=0, atol=1e-2)
    xm, tm, ilm, tlm = make_case(83, 4, 40, 12, 103, avoid=(99, 100, 101, 102))
    loss, grad = grads_of(
        lambda v: multiblank_rnnt_loss(v, *on(gpu, tm, ilm, tlm), [2, 4, 8], reduction="none"), xm.to(dtype).to(gpu)
    )
    ref, rgrad = grads_of(
        lambda v: multiblank_rnnt_loss_reference(v, tm, ilm, tlm, [2, 4, 8], -1, 0.0, reduction="none"),
        xm.to(dtype).double(),
    )
    torch.testing.assert_close(loss.cpu().double(), ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grad.cpu().double(), rgrad, rtol=0, atol=1e-2)


@pytest.mark.gpu
def test_gpu_tdt_deterministic(gpu):
    """Three runs, bit for bit the same losses and gradients (no atomics but integer NaN counts)."""
    for _name, fn, x in _both_losses(gpu, seed=84, N=8, T=80, U=20, reduction="none"):
        runs = [grads_of(lambda v, fn=fn: fn(v), x) for _ in range(3)]
        for loss, grad in runs[1:]:
            assert torch.equal(loss, runs[0][0]) and torch.equal(grad, runs[0][1])


@pytest.mark.gpu
def test_gpu_tdt_more_than_2_31_logits(gpu):
    """N*T*(U+1)*(V+D) > 2^31 (float16): the batch's losses and the last sample's gradient equal those of its two
    halves computed separately."""
    from speechkernels import tdt_loss

    N, T, U, V, D = 4, 400, 100, 14000, 3
    assert N * T * (U + 1) * (V + D) > 2**31
    g = torch.Generator(device="cuda").manual_seed(85)
    x = torch.randn(N, T, U + 1, V + D, device="cuda", dtype=torch.float16, generator=g)
    targets = torch.randint(0, V - 1, (N, U), device="cuda", generator=g)
    il = torch.tensor([400, 350, 380, 400], device="cuda")
    tl = torch.tensor([100, 90, 60, 100], device="cuda")
    check_batch_halves(lambda v, sl: tdt_loss(v, targets[sl], il[sl], tl[sl], [0, 1, 2], reduction="none"), x)
