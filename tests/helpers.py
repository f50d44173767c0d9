"""Checks shared by the loss tests: torch.compile and CUDA-graph replay against eager execution, a batch against
its halves, call counting, gradients of several leaves."""

from __future__ import annotations

import importlib
import math

import torch

from speechkernels._backend import triton_missing


def optional_module(name: str):
    """The module ``name``, or None where Triton (which it imports) is not installed; any other import error
    propagates (the package's own kernels modules are imported the same way)."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        return triton_missing(error)


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


def count_calls(monkeypatch, module, name: str, calls: list | None = None, record=None) -> list:
    """Replaces module.name by a wrapper that appends to ``calls`` (a new list unless given) on each call, 1 or
    ``record(*args, **kwargs)``, then calls the real one: a test then knows which path ran (the kernels or the
    reference) and with what. The one launch spy of the tests."""
    calls = [] if calls is None else calls
    real = getattr(module, name)

    def spy(*args, **kwargs):
        calls.append(1 if record is None else record(*args, **kwargs))
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


def random_view(x: torch.Tensor, g: torch.Generator, expand: bool = True) -> torch.Tensor:
    """x's values in a view that is not contiguous (where x has two elements or more): its dimensions laid out in
    a random order, each with a random stride (gaps between elements), the whole at an offset of 1 to 4 elements in
    a larger buffer whose other elements are garbage (NaN, or a large integer), so that a kernel that reads the
    view as contiguous, or from its storage's start, reads garbage. With ``expand``, a dimension along which x is
    constant may become an expanded one (stride 0). Same dtype, device, shape and values as x."""
    x = x.detach()
    if x.dim() == 0:
        return x.clone()
    dims = x.dim()
    r = lambda n: int(torch.randint(0, n, (1,), generator=g))
    order = torch.randperm(dims, generator=g).tolist()  # memory order: order[0] outermost
    steps = [1 + r(3) for _ in range(dims)]
    shape = [x.shape[d] for d in order]
    offset = 1 + r(4)
    garbage = True if x.dtype == torch.bool else float("nan") if x.dtype.is_floating_point else 10**6 + 7

    def laid_out(steps):
        full = [max(s, 1) * st for s, st in zip(shape, steps, strict=True)]
        buf = torch.full((offset + math.prod(full) + 3,), garbage, dtype=x.dtype, device=x.device)
        inner = buf[offset : offset + math.prod(full)].view(full)
        view = inner[tuple(slice(0, s * st, st) for s, st in zip(shape, steps, strict=True))]
        view.copy_(x.permute(order))
        return view.permute([order.index(d) for d in range(dims)])

    out = laid_out(steps)
    if out.is_contiguous() and x.numel() > 1:  # the largest dimension strided instead
        steps[max(range(dims), key=lambda i: shape[i])] = 2
        out = laid_out(steps)
    if expand:
        for d in range(dims):
            if x.shape[d] > 1 and r(2) and bool((x == x.narrow(d, 0, 1)).all()):
                out = out.narrow(d, 0, 1).expand(*x.shape)
                break
    assert out.shape == x.shape and out.storage_offset() > 0 and (x.numel() < 2 or not out.is_contiguous())
    return out
