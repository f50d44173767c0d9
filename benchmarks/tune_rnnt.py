"""Where the time of an RNN-T forward+backward goes, per kernel, and which kernel settings win.

python benchmarks/tune_rnnt.py [--rows 1500x300x50x16,...]: per-kernel GPU times (profiler) of one
forward+backward (fused log_softmax, batch mean) on the benchmark's inputs, then the forward over the recursion
kernels' num_warps, with the loss of each against the first, then the lattice and gradient passes over their
block sizes and warps.
"""

from __future__ import annotations

import argparse

import torch
import triton

import speechkernels as sk
from speechkernels._transducer.options import TransducerOptions
from speechkernels.bench.common import kernel_times_ms, time_ms
from speechkernels.bench.rnnt import make_inputs
from speechkernels.rnnt import kernels


def profile(T, U, V, N):
    dev = torch.device("cuda")
    logits, targets, il, tl = make_inputs(T, U, V, N, dev)
    v = logits.clone().requires_grad_()

    def step():
        v.grad = None
        sk.rnnt_loss(v, targets, il, tl, blank=0).backward()

    total = time_ms(step, dev, reps=5)
    per = kernel_times_ms(step, calls=3)
    print(f"{T}x{U}x{V}x{N}: step {total:.3f} ms; kernels {sum(per.values()):.3f} ms", flush=True)
    for k, ms in list(per.items())[:8]:
        print(f"   {ms:8.3f}  {k}", flush=True)


def warps_sweep(T, U, V, N, warps_list):
    """Forward (lattice and both recursion kernels) over the recursion kernels' num_warps."""
    dev = torch.device("cuda")
    logits, targets, il, tl = make_inputs(T, U, V, N, dev)
    real = kernels._recursion_warps
    base = None
    try:
        for w in warps_list:
            kernels._recursion_warps = lambda block, N, w=w: w

            def fwd():
                return kernels.rnnt_forward(logits, targets, il, tl, TransducerOptions(0, reduction="none"), True)

            ms = time_ms(fwd, dev, reps=5)
            loss = fwd()[0]
            base = loss if base is None else base
            diff = ((loss - base).abs() / base.abs()).max().item()
            print(f"{T}x{U}x{V}x{N} warps={w:2d}: forward {ms:8.3f} ms, loss vs first {diff:.1e}", flush=True)
    finally:
        kernels._recursion_warps = real


def blocks_sweep(T, U, V, N):
    """Lattice and gradient kernel times over (cells per program, classes per chunk, warps)."""
    dev = torch.device("cuda")
    logits, targets, il, tl = make_inputs(T, U, V, N, dev)
    v = logits.clone().requires_grad_()
    real = kernels._row_blocks
    bv0 = min(triton.next_power_of_2(V), 1024)
    configs = [
        (br, bv, w)
        for bv in sorted({bv0, min(bv0, 512), min(2 * bv0, 2048)})
        for br in (1, 2, 4, 8, 16, 32, 64)
        if 256 <= br * bv <= 4096 and br <= triton.next_power_of_2(U)
        for w in (1, 2, 4, 8, 16)
        if 32 * w <= br * bv
    ]
    try:
        for cfg in configs:
            kernels._row_blocks = lambda U1, V, cfg=cfg: cfg

            def step():
                v.grad = None
                sk.rnnt_loss(v, targets, il, tl, blank=0).backward()

            per = kernel_times_ms(step, calls=3)
            lat = sum(ms for k, ms in per.items() if "lattice" in k)
            grad = sum(ms for k, ms in per.items() if "grad" in k)
            print(
                f"{T}x{U}x{V}x{N} blocks r={cfg[0]:3d} v={cfg[1]:5d} warps={cfg[2]:2d}: lattice {lat:7.3f} ms,"
                f" grad {grad:7.3f} ms",
                flush=True,
            )
    finally:
        kernels._row_blocks = real


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="150x40x28x128,150x20x5000x128,1500x300x50x1,1500x300x50x16")
    ap.add_argument("--sweep", default="1500x300x50x1:1500x300x50x16")
    ap.add_argument("--blocks", default="150x40x28x128:150x20x5000x128:1500x300x50x16")
    a = ap.parse_args()
    for r in a.rows.split(",") if a.rows else []:
        profile(*(int(v) for v in r.split("x")))
    for r in a.sweep.split(":") if a.sweep else []:
        warps_sweep(*(int(v) for v in r.split("x")), [2, 4, 8, 16])
    for r in a.blocks.split(":") if a.blocks else []:
        blocks_sweep(*(int(v) for v in r.split("x")))


if __name__ == "__main__":
    main()
