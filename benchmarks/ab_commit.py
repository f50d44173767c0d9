"""Before/after of a change on the GPU machine: the package at an earlier commit and the working tree, timed
step by step in one process, taking turns, so that both see the same machine state (each run gets a fresh
machine, and the host-bound rows swing by 2x between machines).

Prepare the earlier code as a package named ``skold`` (its torch.library namespace renamed, so that both
register their ops):

    mkdir -p .old/pkgs && git archive COMMIT speechkernels | tar -x -C .old/pkgs
    mv .old/pkgs/speechkernels .old/pkgs/skold
    grep -rl '"speechkernels::' .old/pkgs/skold | xargs sed -i 's/"speechkernels::/"skold::/g'

then `python benchmarks/ab_commit.py [--old .old/pkgs] [--json out.json]`: per row the median milliseconds of
an eager forward+backward step with a synchronisation after it (host time included), old and new: host-bound
rows, then the largest CTC and RNN-T rows and the fused joint's first row (bfloat16), with fewer steps.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--old", default=".old/pkgs", help="the folder holding the skold package")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    sys.path.insert(0, args.old)
    import skold

    import speechkernels as sk

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    rows = {}

    def ab(key, step_old, step_new, steps=args.steps):
        t = {"old": [], "new": []}
        for i in range(steps):
            order = (("old", step_old), ("new", step_new)) if i % 2 else (("new", step_new), ("old", step_old))
            for name, fn in order:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                t[name].append(time.perf_counter() - t0)
        med = {k: sorted(v[steps // 8 :])[len(v[steps // 8 :]) // 2] * 1e3 for k, v in t.items()}
        rows[key] = {
            "old_ms": round(med["old"], 4),
            "new_ms": round(med["new"], 4),
            "new_minus_old_us": round((med["new"] - med["old"]) * 1e3, 1),
        }
        print(key, rows[key], flush=True)

    def rnnt_step(mod, *args, **kw):
        return lambda: mod.rnnt_loss(*args, blank=0, **kw).backward()

    def ctc_step(mod, *args):
        return lambda: mod.ctc_loss(*args, logits=True).backward()

    # RNN-T: warp-rnnt's table rows (U counts the blank row), int32 lengths on the device
    for T, U, V, N in ((150, 40, 28, 1), (150, 40, 28, 16), (150, 20, 5000, 32), (1500, 300, 50, 16)):
        x = torch.randn(N, T, U, V, device=dev, generator=g).requires_grad_()
        tg = torch.randint(1, V, (N, U - 1), device=dev, generator=g, dtype=torch.int32)
        il = torch.full((N,), T, dtype=torch.int32, device=dev)
        tl = torch.full((N,), U - 1, dtype=torch.int32, device=dev)
        steps = args.steps if T * U * V * N < 2**26 else args.steps // 4
        for suffix, kw in (("", {}), ("_novalidate", {"validate": False})):
            args_ = (x, tg, il, tl)
            ab(f"rnnt_{T}x{U}x{V}_N{N}{suffix}", rnnt_step(skold, *args_, **kw), rnnt_step(sk, *args_, **kw), steps)
        del x
    # CTC, T = 150, C = 28: lengths as lists (converted on the host) and as device tensors
    for N in (1, 8):
        x = torch.randn(150, N, 28, device=dev, generator=g).requires_grad_()
        tg = torch.randint(1, 28, (N, 40), device=dev, generator=g)
        lengths = {
            "list": ([150] * N, [40] * N),
            "tensor": (torch.full((N,), 150, device=dev), torch.full((N,), 40, device=dev)),
        }
        for kind, (il, tl) in lengths.items():
            ab(f"ctc_150x{N}x28_{kind}", ctc_step(skold, x, tg, il, tl), ctc_step(sk, x, tg, il, tl))
    # kernel-bound rows: the largest of the benchmarks' tables, fewer steps
    steps = max(args.steps // 8, 10)
    for T, N, C in ((150, 256, 5000), (1500, 128, 1000)):
        x = torch.randn(T, N, C, device=dev, generator=g).requires_grad_()
        S = min(T // 3, 100)
        tg = torch.randint(1, C, (N, S), device=dev, generator=g)
        il, tl = torch.full((N,), T, device=dev), torch.full((N,), S, device=dev)
        ab(f"ctc_{T}x{N}x{C}", ctc_step(skold, x, tg, il, tl), ctc_step(sk, x, tg, il, tl), steps)
        del x
    for T, U, V, N in ((150, 21, 5000, 128), (1500, 301, 50, 64)):
        x = torch.randn(N, T, U, V, device=dev, generator=g).requires_grad_()
        tg = torch.randint(1, V, (N, U - 1), device=dev, generator=g, dtype=torch.int32)
        il = torch.full((N,), T, dtype=torch.int32, device=dev)
        tl = torch.full((N,), U - 1, dtype=torch.int32, device=dev)
        ab(f"rnnt_{T}x{U}x{V}_N{N}", rnnt_step(skold, x, tg, il, tl), rnnt_step(sk, x, tg, il, tl), steps)
        del x
    # the fused joint: (N, T, U, V) = (32, 400, 128, 1025), hidden 640, bfloat16
    N, T, U, V, H = 32, 400, 128, 1025, 640
    enc = (torch.randn(N, T, H, device=dev, generator=g) * 0.1).bfloat16().requires_grad_()
    pred = (torch.randn(N, U + 1, H, device=dev, generator=g) * 0.1).bfloat16().requires_grad_()
    weight = (torch.randn(V, H, device=dev, generator=g) / H**0.5).bfloat16().requires_grad_()
    bias = torch.zeros(V, device=dev).bfloat16().requires_grad_()
    tg = torch.randint(0, V - 1, (N, U), device=dev, generator=g)
    il, tl = torch.full((N,), T, device=dev), torch.full((N,), U, device=dev)

    def joint_step(mod):
        return lambda: mod.rnnt_joint_loss(enc, pred, weight, bias, tg, il, tl, blank=V - 1).backward()

    ab(f"joint_{N}x{T}x{U}x{V}_bf16", joint_step(skold), joint_step(sk), steps)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
