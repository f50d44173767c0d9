"""Checks shared by the loss tests: torch.compile and CUDA-graph replay against eager execution, a batch against
its halves, call counting, gradients of several leaves."""

from __future__ import annotations

import torch


def check_compiled_matches_eager(f, x, **compile_kwargs):
    """f compiled whole-graph gives the eager loss and gradient."""
    compiled = torch.compile(f, fullgraph=True, **compile_kwargs)
    xa = x.clone().requires_grad_()
    xb = x.clone().requires_grad_()
    la, lb = compiled(xa), f(xb)
    la.backward()
    lb.backward()
    torch.testing.assert_close(la, lb)
    torch.testing.assert_close(xa.grad, xb.grad)


def check_graph_replay_matches_eager(loss_fn, x):
    """loss_fn(v) -> scalar loss, with no host synchronisation: captured in a CUDA graph with its backward,
    replayed on new inputs, it gives the eager loss and gradient."""
    xs = x.clone().requires_grad_()

    def step():
        xs.grad = None
        loss = loss_fn(xs)
        loss.backward()
        return loss

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step()
    new = torch.randn_like(x)
    xs.data.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    xr = new.clone().requires_grad_()
    eager = loss_fn(xr)
    eager.backward()
    torch.testing.assert_close(static_loss, eager.detach())
    torch.testing.assert_close(xs.grad, xr.grad)


def check_batch_halves(loss_fn, x):
    """loss_fn(v, sl) -> per-sample losses of the samples ``sl`` of v (a batch of 4, here more than 2^31 logits):
    the batch's losses and its last sample's gradient equal those of its two halves computed separately, bit for
    bit."""
    x = x.detach().requires_grad_()
    loss = loss_fn(x, slice(0, 4))
    loss.sum().backward()
    grad_last = x.grad[3].clone()
    x.grad = None
    halves = []
    for sl in (slice(0, 2), slice(2, 4)):
        xh = x.detach()[sl].clone().requires_grad_()
        lh = loss_fn(xh, sl)
        lh.sum().backward()
        halves.append((lh.detach(), xh.grad))
    torch.testing.assert_close(loss.detach(), torch.cat([halves[0][0], halves[1][0]]), rtol=0, atol=0)
    torch.testing.assert_close(grad_last, halves[1][1][1], rtol=0, atol=0)


def count_calls(monkeypatch, module, name: str) -> list:
    """Replaces module.name by a wrapper that records each call: a test then knows the kernels (not the
    reference) ran."""
    calls = []
    real = getattr(module, name)

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls


def leaf_grads(xs, fn, upstream=None):
    """fn(*leaves) for fresh leaves of xs (None stays None), and its gradient (times ``upstream``, default ones)
    with respect to the leaves that exist (None for one the loss does not use)."""
    leaves = [x.detach().clone().requires_grad_() if x is not None else None for x in xs]
    loss = fn(*leaves)
    out = upstream.to(loss.dtype) if upstream is not None else torch.ones_like(loss)
    grads = torch.autograd.grad(loss, [x for x in leaves if x is not None], out, allow_unused=True)
    return loss.detach(), grads


def rel(a, b) -> float:
    """Relative error in norm."""
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


class FixedPath:
    """A loss path on a fixed device for tests of their own sizes (large ones on the GPU): no launch checks."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def reset(self) -> None:
        pass

    def check_ran(self, expected: bool = True) -> None:
        pass


def check_float32_against_float64(path, run, loss_tol=1e-5, grad_tol=1e-4, names=("enc", "pred", "weight", "bias")):
    """run(dtype) -> (loss, gradients): float32 on ``path`` (whose kernels must run) against float64 (the PyTorch
    path): the loss within loss_tol relative, each gradient within grad_tol relative in norm, float32 both."""
    path.reset()
    loss, grads = run(torch.float32)
    path.check_ran()
    ref_loss, ref_grads = run(torch.float64)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), ref_loss, rtol=loss_tol, atol=1e-6)
    for name, a, b in zip(names, grads, ref_grads, strict=False):
        assert a.dtype == torch.float32
        assert rel(a, b) < grad_tol, (name, rel(a, b))
