"""torch.compile(fullgraph=True) of the losses, on every path: one graph (the checks of the tensors' contents and
the per-sample branches run inside the losses' ops), the eager loss and gradient bit for bit, no recompilation
for new lengths or batch sizes beyond the first dynamic one, and the eager refusals of bad contents."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import speechkernels as sk

V, DURATIONS = 7, (0, 1, 2)


def _loss(kind: str, x, targets, frames, labels, validate: bool = True):
    if kind == "ctc":  # x [N, T, V]: batch-first logits
        return sk.ctc_loss(x, targets + 1, frames, labels, batch_first=True, logits=True, validate=validate)
    if kind == "rnnt":
        return sk.rnnt_loss(x, targets, frames, labels, reduction="sum", validate=validate)
    return sk.tdt_loss(x, targets, frames, labels, DURATIONS, blank=V - 1, validate=validate)


def _problem(kind: str, N: int, T: int, U: int, seed: int, device):
    g = torch.Generator().manual_seed(seed)
    shape = (N, T, V) if kind == "ctc" else (N, T, U + 1, V + (len(DURATIONS) if kind == "tdt" else 0))
    x = torch.randn(shape, generator=g)
    targets = torch.randint(0, V - 1, (N, U), generator=g)  # below every blank used here
    frames = torch.randint(max(1, T // 2), T + 1, (N,), generator=g)
    labels = torch.randint(0, U + 1, (N,), generator=g)
    if kind == "ctc":
        labels = torch.minimum(labels, frames // 2)  # room for repeats
    return [t.to(device) for t in (x, targets, frames, labels)]


@pytest.mark.parametrize("kind", ["ctc", "rnnt", "tdt"])
def test_compiled_whole_graph_across_lengths(path, kind):
    cpu = path.device.type == "cpu"
    counter = CompileCounterWithBackend("aot_eager" if cpu else "inductor")
    torch._dynamo.reset()
    compiled = torch.compile(_loss, fullgraph=True, backend=counter)
    shapes = [(3, 10, 3), (2, 13, 4), (4, 8, 2), (3, 15, 5), (2, 11, 3)]
    for seed, (N, T, U) in enumerate(shapes):
        x, targets, frames, labels = _problem(kind, N, T, U, seed, path.device)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        la = compiled(kind, xa, targets, frames, labels)
        lb = _loss(kind, xb, targets, frames, labels)
        la.backward()
        lb.backward()
        exact = dict(rtol=0, atol=0) if cpu else {}  # inductor's own kernels around the op may round otherwise
        torch.testing.assert_close(la, lb, **exact)
        torch.testing.assert_close(xa.grad, xb.grad, **exact)
    path.check_ran()
    # the first shape static, the second dynamic; no more
    assert counter.frame_count <= 2, counter.frame_count
    # a bad length refused as in eager mode, with the same words
    x, targets, frames, labels = _problem(kind, 2, 10, 3, 0, path.device)
    frames[1] = 11
    with pytest.raises(ValueError) as eager:
        _loss(kind, x, targets, frames, labels)
    with pytest.raises(ValueError) as traced:
        compiled(kind, x, targets, frames, labels)
    assert str(traced.value) == str(eager.value)
