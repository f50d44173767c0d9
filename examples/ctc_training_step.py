"""Train a small acoustic model with the CTC loss for a few steps, on the GPU when there is one, else the CPU.

    python examples/ctc_training_step.py [--steps 30] [--device cpu]

The model maps random features to class scores; ``CTCLoss(logits=True)`` fuses the log_softmax, so the model
hands it raw scores. One fixed batch: the loss must fall.
"""

from __future__ import annotations

import argparse

import torch

import speechkernels as sk
from speechkernels.bench.common import example_device, positive_int


def main(argv: list[str] | None = None) -> tuple[float, float]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=positive_int, default=30)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    args = p.parse_args(argv)
    device = example_device(p, args.device)
    torch.manual_seed(0)

    T, N, F, C, S = 60, 4, 20, 12, 10  # frames, batch, features, classes (blank 0), longest transcript
    model = torch.nn.Sequential(torch.nn.Linear(F, 64), torch.nn.ReLU(), torch.nn.Linear(64, C)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    feats = torch.randn(T, N, F, device=device)  # [T, N, F], time first as torch's ctc_loss
    targets = torch.randint(1, C, (N, S), device=device)  # padded labels
    input_lengths = torch.tensor([60, 55, 50, 60])
    target_lengths = torch.tensor([10, 8, 9, 6])
    criterion = sk.CTCLoss(blank=0, logits=True)

    losses = []
    for step in range(args.steps):
        loss = criterion(model(feats), targets, input_lengths, target_lengths)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        print(f"step {step:3d}  CTC loss {losses[-1]:.4f}")
    print(f"{device.type}: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {args.steps} steps")
    return losses[0], losses[-1]


if __name__ == "__main__":
    main()
