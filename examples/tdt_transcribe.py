"""Train a small TDT model with ``TDTJointLoss`` on a synthetic task, then transcribe held-out utterances with
``TransducerDecoder.greedy`` and report the token error rate: the loss and the decoder agree on the blank, the
durations and the frames.

    python examples/tdt_transcribe.py [--steps 150] [--device cpu]

The task: each label is a fixed random feature pattern held for 2 to 4 frames, with noise; consecutive labels
differ. The encoder sees a frame and its neighbours (a convolution), the prediction network is an
``LSTMPredictor``; the decoder is built from the trained joint and predictor with ``TransducerDecoder.from_joint``.
"""

from __future__ import annotations

import argparse

import torch

import speechkernels as sk
from speechkernels.bench.common import example_device, positive_int

LABELS, FEATURES, WIDTH, DURATIONS = 8, 16, 48, [0, 1, 2, 3, 4]
BLANK = LABELS  # the last of the V = LABELS + 1 token classes


def utterances(n: int, g: torch.Generator, patterns: torch.Tensor, noise: float = 0.6):
    """n utterances of 3 to 8 labels: features [n, T, F] (zero-padded), frames [n], labels [n, U], lengths [n]."""
    feats, labels = [], []
    for _ in range(n):
        count = int(torch.randint(3, 9, (), generator=g))
        seq = [int(torch.randint(0, LABELS, (), generator=g))]
        while len(seq) < count:
            c = int(torch.randint(0, LABELS - 1, (), generator=g))
            seq.append(c + (c >= seq[-1]))  # never the previous label
        frames = [patterns[c].expand(int(torch.randint(2, 5, (), generator=g)), FEATURES) for c in seq]
        x = torch.cat(frames)
        feats.append(x + noise * torch.randn(x.shape, generator=g))
        labels.append(torch.tensor(seq))
    T = max(f.shape[0] for f in feats)
    x = torch.stack([torch.nn.functional.pad(f, (0, 0, 0, T - f.shape[0])) for f in feats])
    y = torch.nn.utils.rnn.pad_sequence(labels, batch_first=True, padding_value=BLANK)
    return x, torch.tensor([f.shape[0] for f in feats]), y, torch.tensor([len(s) for s in labels])


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(FEATURES, WIDTH, 5, padding=2)
        self.proj = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.relu(self.conv(x.transpose(1, 2)).transpose(1, 2)))


def edit_distance(a: list[int], b: list[int]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def main(argv: list[str] | None = None) -> float:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=positive_int, default=150)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    args = p.parse_args(argv)
    device = example_device(p, args.device)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    patterns = torch.randn(LABELS, FEATURES, generator=g)

    encoder = Encoder().to(device)
    predictor = sk.LSTMPredictor(LABELS + 1, WIDTH, WIDTH, blank=BLANK).to(device)
    joint = sk.TDTJointLoss(WIDTH, WIDTH, WIDTH, LABELS + 1, durations=DURATIONS, blank=BLANK).to(device)
    params = [*encoder.parameters(), *predictor.parameters(), *joint.parameters()]
    opt = torch.optim.Adam(params, lr=3e-3)
    for step in range(args.steps):
        x, frames, y, lengths = (t.to(device) for t in utterances(32, g, patterns))
        loss = joint(encoder(x), predictor(y), y, frames, lengths)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  TDT loss {loss.item():.4f}")

    decoder = sk.TransducerDecoder.from_joint(joint, predictor)
    x, frames, y, lengths = utterances(64, g, patterns)
    with torch.no_grad():
        hyp, _ = decoder.greedy(encoder(x.to(device)), frames)
    errors = sum(
        edit_distance(hyp.tokens[n, : hyp.lengths[n]].tolist(), y[n, : lengths[n]].tolist()) for n in range(64)
    )
    ter = errors / int(lengths.sum())
    k = int(hyp.lengths[0])
    print("reference :", y[0, : lengths[0]].tolist())
    print(
        "hypothesis:",
        hyp.tokens[0, :k].tolist(),
        "at frames",
        hyp.frames[0, :k].tolist(),
        "durations",
        hyp.durations[0, :k].tolist(),
    )
    print(f"{device.type}: token error rate {100 * ter:.1f}% on 64 held-out utterances after {args.steps} steps")
    return ter


if __name__ == "__main__":
    main()
