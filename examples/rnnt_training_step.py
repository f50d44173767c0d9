"""Train a tiny transducer (encoder, prediction network, joint) with the RNN-T loss for a few steps, on the GPU
when there is one, else the CPU.

    python examples/rnnt_training_step.py [--steps 30] [--device cpu]

The joint's output [N, T, U+1, V] goes to ``rnnt_loss`` as scores (its log_softmax is fused). One fixed batch:
the loss must fall.
"""

from __future__ import annotations

import argparse

import torch

import speechkernels as sk
from speechkernels.bench.common import example_device, positive_int


class TinyTransducer(torch.nn.Module):
    def __init__(self, features: int, vocab: int, width: int = 32) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(features, width)
        self.embed = torch.nn.Embedding(vocab, width)  # the blank (id vocab - 1) also starts each transcript
        self.predictor = torch.nn.GRU(width, width, batch_first=True)
        self.joint = torch.nn.Linear(width, vocab)
        self.blank = vocab - 1

    def forward(self, feats: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        enc = self.encoder(feats)  # [N, T, H]
        start = torch.full_like(targets[:, :1], self.blank)
        pred, _ = self.predictor(self.embed(torch.cat([start, targets], 1)))  # [N, U+1, H]
        return self.joint(torch.tanh(enc[:, :, None] + pred[:, None]))  # [N, T, U+1, V]


def main(argv: list[str] | None = None) -> tuple[float, float]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=positive_int, default=30)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    args = p.parse_args(argv)
    device = example_device(p, args.device)
    torch.manual_seed(0)

    N, T, U, F, V = 3, 24, 6, 16, 10  # batch, frames, longest transcript, features, vocabulary (blank last)
    model = TinyTransducer(F, V).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    feats = torch.randn(N, T, F, device=device)
    targets = torch.randint(0, V - 1, (N, U), device=device, dtype=torch.int32)
    frames = torch.tensor([24, 20, 18], dtype=torch.int32)
    labels = torch.tensor([6, 4, 5], dtype=torch.int32)

    losses = []
    for step in range(args.steps):
        logits = model(feats, targets.long())
        loss = sk.rnnt_loss(logits, targets, frames, labels, blank=V - 1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        print(f"step {step:3d}  RNN-T loss {losses[-1]:.4f}")
    print(f"{device.type}: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {args.steps} steps")
    return losses[0], losses[-1]


if __name__ == "__main__":
    main()
