"""The CPU paths with a busy neighbour: forward+backward of ``ctc_loss`` 150x32x28 (and torch's own CTC loss),
``rnnt_loss`` 4x150x40x28 and ``WaveNet.generate`` of 2 streams x 400 samples, idle and while another process
runs a torch matmul loop on one core (one thread, pinned to the last core), this process free to use every core
with torch's default threads. Median of interleaved calls.

    python benchmarks/cpu_shared_cores.py [--reps 15] [--threads N]

One JSON line per case: idle and shared median ms, their ratio, torch's thread count, the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

import speechkernels as sk
from speechkernels.bench.common import busy_core
from speechkernels.wavenet import WaveNet


def _cases() -> dict:
    g = torch.Generator().manual_seed(0)
    T, N, C, S = 150, 32, 28, 40
    x = torch.randn(T, N, C, generator=g).log_softmax(-1).requires_grad_()
    tg = torch.randint(1, C, (N, S), generator=g)
    il, tl = torch.full((N,), T), torch.randint(S // 2, S + 1, (N,), generator=g)
    r = torch.randn(4, 150, 41, 28, generator=g).requires_grad_()
    rt = torch.randint(0, 27, (4, 40), generator=g, dtype=torch.int32)
    rl, ru = torch.full((4,), 150, dtype=torch.int32), torch.full((4,), 40, dtype=torch.int32)
    torch.manual_seed(0)
    net = WaveNet(layers=8, cycle=8, cond_channels=0).eval()

    def ctc():
        x.grad = None
        sk.ctc_loss(x, tg, il, tl).backward()

    def torch_ctc():
        x.grad = None
        F.ctc_loss(x, tg, il, tl).backward()

    def rnnt():
        r.grad = None
        sk.rnnt_loss(r, rt, rl, ru).backward()

    def generate():
        net.generate(None, 400, batch=2, generator=torch.Generator().manual_seed(0))

    return {
        "ctc_loss 150x32x28": ctc,
        "torch ctc_loss 150x32x28": torch_ctc,
        "rnnt_loss 4x150x40x28": rnnt,
        "WaveNet.generate 2 x 400": generate,
    }


def _times(cases: dict, reps: int) -> dict:
    for fn in cases.values():
        fn()
    out = {k: [] for k in cases}
    for _ in range(reps):
        for k, fn in cases.items():
            t = time.perf_counter()
            fn()
            out[k].append(1e3 * (time.perf_counter() - t))
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) in this process first")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    cores = sorted(os.sched_getaffinity(0))
    cases = _cases()
    idle = _times(cases, a.reps)
    with busy_core(settle_s=1.0):
        shared = _times(cases, a.reps)
    for k in cases:
        print(
            json.dumps(
                dict(
                    case=k,
                    idle_ms=round(idle[k], 2),
                    shared_ms=round(shared[k], 2),
                    ratio=round(shared[k] / idle[k], 2),
                    threads=torch.get_num_threads(),
                    cores=len(cores),
                )
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
