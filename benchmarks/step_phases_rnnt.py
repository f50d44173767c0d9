"""Phases of one eager RNN-T step, ours against warp-rnnt (when importable): the forward call, the hand-over to the
backward, the backward's own Python, back to the caller, the final synchronisation (median microseconds over the
last 250 of 300 steps, a synchronisation before and after each; run on the GPU machine):

    python benchmarks/step_phases_rnnt.py [--rows 150x40x28x1,150x40x28x16]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import speechkernels as sk
from speechkernels.bench.rnnt import make_inputs
from speechkernels.rnnt import api as rnnt_api

STAMPS: dict[str, float] = {}


def stamped(fn):
    """fn, recording when it starts and returns (the backward's own Python)."""

    def wrapper(*args, **kwargs):
        STAMPS["b0"] = time.perf_counter()
        out = fn(*args, **kwargs)
        STAMPS["b1"] = time.perf_counter()
        return out

    return wrapper


def phases(step, v, steps=300) -> list[float]:
    rec = []
    for _ in range(steps):
        v.grad = None
        torch.cuda.synchronize()
        s0 = time.perf_counter()
        loss = step()
        s1 = time.perf_counter()
        loss.backward()
        s2 = time.perf_counter()
        torch.cuda.synchronize()
        s3 = time.perf_counter()
        rec.append((s1 - s0, STAMPS["b0"] - s1, STAMPS["b1"] - STAMPS["b0"], s2 - STAMPS["b1"], s3 - s2, s3 - s0))
    return [statistics.median(r[k] for r in rec[50:]) * 1e6 for k in range(6)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="150x40x28x1,150x40x28x16")
    args = p.parse_args()
    dev = torch.device("cuda")
    op = rnnt_api.RNNT_LOSS_OP
    op._backward = stamped(op._backward)
    try:
        import warp_rnnt

        warp_rnnt.RNNTLoss.backward = staticmethod(stamped(warp_rnnt.RNNTLoss.backward))
    except ImportError:
        warp_rnnt = None
    print("row, implementation: forward | to backward | backward | back to caller | sync | step (us)")
    for row in args.rows.split(","):
        T, U, V, N = (int(s) for s in row.split("x"))
        logits, targets, il, tl = make_inputs(T, U, V, N, dev)
        v = logits.detach().requires_grad_()
        steps = {
            "sk": lambda v=v, a=(targets, il, tl): sk.rnnt_loss(v, *a, blank=0),
            "sk validate=False": lambda v=v, a=(targets, il, tl): sk.rnnt_loss(v, *a, blank=0, validate=False),
        }
        if warp_rnnt is not None:
            steps["warp-rnnt"] = lambda v=v, a=(targets, il, tl): warp_rnnt.rnnt_loss(
                v.log_softmax(-1), *a, blank=0, reduction="mean", gather=False
            )
        for _round in range(2):  # the first round warms up
            for name, step in steps.items():
                ph = phases(step, v)
                print(f"{row} {name:18s}", " | ".join(f"{t:4.0f}" for t in ph), flush=True)


if __name__ == "__main__":
    main()
