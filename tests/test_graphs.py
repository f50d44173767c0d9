"""The losses inside captured training steps (GPU): torch.cuda.make_graphed_callables and torch.compile's
"reduce-overhead" mode (CUDA graphs) give the eager step's loss and gradients, replay after replay on new inputs.
The losses run with validate=False (no read of the device), on static shapes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import speechkernels as sk

N, T, U, V, F = 4, 30, 6, 12, 8


class Step(nn.Module):
    """A projection to per-frame (CTC) or per-cell (transducers) scores, then the loss."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.enc = nn.Linear(F, V)
        self.pred = nn.Embedding(V, V) if kind != "ctc" else None  # every parameter gets a gradient

    def forward(self, feats, targets, frames, labels):
        enc = self.enc(feats)  # [N, T, V]
        if self.kind == "ctc":
            return sk.ctc_loss(enc, targets + 1, frames, labels, batch_first=True, logits=True, validate=False)
        prefix = torch.cat([torch.zeros_like(targets[:, :1]), targets], dim=1)
        logits = enc[:, :, None] + self.pred(prefix)[:, None]  # [N, T, U + 1, V]
        if self.kind == "rnnt":
            return sk.rnnt_loss(logits, targets, frames, labels, validate=False)
        return sk.tdt_loss(logits, targets, frames, labels, [0, 1, 2], blank=V - 4, validate=False)


def inputs(seed, device):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(N, T, F, generator=g)
    targets = torch.randint(0, V - 4, (N, U), generator=g)  # below every blank used here
    frames = torch.randint(T // 2, T + 1, (N,), generator=g)
    labels = torch.randint(1, U + 1, (N,), generator=g)
    return [t.to(device) for t in (feats, targets, frames, labels)]


def eager_grads(model, args):
    model.zero_grad(set_to_none=True)
    loss = model(*args)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ctc", "rnnt", "tdt"])
def test_make_graphed_callables(gpu, kind):
    torch.manual_seed(0)
    model = Step(kind).to(gpu)
    reference = Step(kind).to(gpu)
    reference.load_state_dict(model.state_dict())
    graphed = torch.cuda.make_graphed_callables(model, tuple(inputs(0, gpu)))
    for seed in (1, 2, 3):
        args = inputs(seed, gpu)
        want_loss, want = eager_grads(reference, args)
        for p in model.parameters():
            p.grad = None
        loss = graphed(*args)
        loss.backward()
        torch.testing.assert_close(loss.detach(), want_loss)
        for p, w in zip(model.parameters(), want, strict=True):
            torch.testing.assert_close(p.grad, w)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ctc", "rnnt", "tdt"])
def test_compile_reduce_overhead(gpu, kind):
    torch.manual_seed(0)
    model = Step(kind).to(gpu)
    compiled = torch.compile(model, mode="reduce-overhead")
    for seed in (1, 2, 3, 4):  # the first calls record, the later ones replay
        args = inputs(seed, gpu)
        want_loss, want = eager_grads(model, args)
        model.zero_grad(set_to_none=True)
        loss = compiled(*args)
        loss.backward()
        torch.testing.assert_close(loss.detach().clone(), want_loss)
        for p, w in zip(model.parameters(), want, strict=True):
            torch.testing.assert_close(p.grad, w)
