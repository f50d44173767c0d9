"""Checks shared by the loss tests: torch.compile and CUDA-graph replay against eager execution."""

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
