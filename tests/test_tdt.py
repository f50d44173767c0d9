"""TDT and multi-blank transducer losses: the float64 reference against brute-force path enumeration, against the
RNN-T loss (multi-blank without big blanks), gradcheck, impossible samples and NaN confinement."""

from __future__ import annotations

import math

import pytest
import torch

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


@pytest.mark.parametrize("opts", [{}, dict(fastemit_lambda=0.3, clamp=0.05), dict(fastemit_lambda=0.2,
                                  fastemit_loss_scale=False, reduction="sum")])  # fmt: skip
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
            loss = tdt_loss_reference(xi, targets, il, tl, durations, reduction="sum", fastemit_lambda=lam,
                                      fastemit_loss_scale=scale)  # fmt: skip
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
