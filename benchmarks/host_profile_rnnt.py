"""Where the host time of a small RNN-T step goes (run on the GPU machine).

python benchmarks/host_profile_rnnt.py [--rows 150x40x28x16]: CPU microseconds per forward+backward step of
speechkernels (with and without validation, per-sample and batch-mean losses) and of the peers, with and
without a synchronisation after each step, then a cProfile of the speechkernels step with the autograd engine
kept on the calling thread (so that the backward's Python shows up).
"""

from __future__ import annotations

import argparse

import torch
from host_profile_ctc import print_cprofile, us

import speechkernels as sk
from speechkernels.bench.rnnt import implementations, make_inputs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="150x40x28x16")
    args = p.parse_args()
    dev = torch.device("cuda")
    out = {}
    for row in args.rows.split(","):
        T, U, V, N = (int(s) for s in row.split("x"))
        logits, targets, il, tl = make_inputs(T, U, V, N, dev)
        v = logits.detach().requires_grad_()
        impls = {k: f for k, f in implementations(logits, targets, il, tl).items() if f is not None}
        inputs = (targets, il, tl)
        impls["sk no validate"] = lambda v, a=inputs: sk.rnnt_loss(v, *a, blank=0, validate=False)
        impls["sk reduction none + sum"] = lambda v, a=inputs: sk.rnnt_loss(v, *a, blank=0, reduction="none").sum()
        for name, fn in impls.items():

            def step(fn=fn, v=v):
                v.grad = None
                fn(v).backward()

            out[f"{row} {name}"] = us(step, n=200)
            out[f"{row} {name} (sync each)"] = us(step, n=200, sync_each=True)
        with torch.no_grad():
            out[f"{row} sk forward only, no grad"] = us(lambda v=v, a=inputs: sk.rnnt_loss(v, *a, blank=0), n=200)
    for k, val in out.items():
        print(f"{val:9.1f} us  {k}")

    T, U, V, N = (int(s) for s in args.rows.split(",")[0].split("x"))
    logits, targets, il, tl = make_inputs(T, U, V, N, dev)
    v = logits.detach().requires_grad_()

    def step():
        v.grad = None
        sk.rnnt_loss(v, targets, il, tl, blank=0).backward()

    print_cprofile(step)


if __name__ == "__main__":
    main()
