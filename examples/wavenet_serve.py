"""Serve many WaveNet voices at once: requests of different lengths arrive while others are being generated, each
gets its samples chunk by chunk, and the script reports each request's time to its first chunk and its rate.

    python examples/wavenet_serve.py [--requests 32] [--samples 8000] [--chunk 2000] [--layers 20] [--device cpu]

On a Hopper GPU with cuda-core the chunks run on the batched thread-block cluster kernel (several streams per
cluster), elsewhere on the PyTorch path. The weights are random: the point is the serving loop. The defaults
above are the GPU's; on the CPU (its PyTorch path generates a few thousand samples a second) they are 8 requests
of up to 1000 samples in chunks of 250, 10 layers, a few seconds on two cores.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from speechkernels.bench.common import example_device, positive_int
from speechkernels.wavenet import WaveNet, WaveNetServer


def main(argv: list[str] | None = None) -> dict[int, torch.Tensor]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=positive_int, default=None, help="default 32 (8 on the CPU)")
    p.add_argument(
        "--samples",
        type=positive_int,
        default=None,
        help="the longest request's samples, default 8000 (1000 on the CPU)",
    )
    p.add_argument(
        "--chunk", type=positive_int, default=None, help="samples per request per step, default 2000 (250 on the CPU)"
    )
    p.add_argument("--layers", type=positive_int, default=None, help="default 20 (10 on the CPU)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    args = p.parse_args(argv)
    device = example_device(p, args.device)
    cpu = device.type == "cpu"
    for name, gpu_default, cpu_default in (
        ("requests", 32, 8),
        ("samples", 8000, 1000),
        ("chunk", 2000, 250),
        ("layers", 20, 10),
    ):
        if getattr(args, name) is None:
            setattr(args, name, cpu_default if cpu else gpu_default)
    torch.manual_seed(0)
    hop = 256
    net = WaveNet(layers=args.layers, cycle=min(args.layers, 10), cond_channels=80, hop_length=hop)
    net = net.to(device).eval()
    server = WaveNetServer(net, chunk=args.chunk, generator=torch.Generator(device).manual_seed(0))
    server.warmup(args.requests)  # compile now: no chunk waits for a kernel
    # half the requests now, the others one per step while the first ones generate; lengths from 1/4 to all
    lengths = [args.samples * (1 + k % 4) // 4 for k in range(args.requests)]
    waiting = list(range(args.requests))
    submitted, first, done, parts = {}, {}, {}, {}

    def submit(k: int) -> None:
        mel = torch.randn(80, math.ceil(lengths[k] / hop), device=device)  # [mel bins, frames]
        rid = server.submit(lengths[k], mel)
        submitted[rid], parts[rid] = time.perf_counter(), []

    for k in waiting[: args.requests // 2 or 1]:
        submit(k)
    waiting = waiting[args.requests // 2 or 1 :]
    t0 = time.perf_counter()
    steps = 0
    while server.active or server.pending or waiting:
        if waiting:
            submit(waiting.pop(0))
        chunks = server.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        for rid, c in chunks.items():
            first.setdefault(rid, now - submitted[rid])
            parts[rid].append(c)
            if sum(x.shape[0] for x in parts[rid]) == lengths[rid]:
                done[rid] = now - submitted[rid]
        steps += 1
        print(
            f"step {steps:3d}  chunks for {len(chunks)} requests, {len(done)} of {args.requests} requests done, "
            f"{now - t0:.2f} s",
            flush=True,
        )
    total = time.perf_counter() - t0
    out = {rid: torch.cat(c) for rid, c in parts.items()}
    rates = [lengths[r] / done[r] / 1e3 for r in done]
    print(
        f"{device.type}: {len(out)} requests, {sum(lengths)} samples in {total:.2f} s "
        f"({sum(lengths) / total / 1e6:.3f} M samples/s); first chunk after {1e3 * min(first.values()):.0f} to "
        f"{1e3 * max(first.values()):.0f} ms; {min(rates):.1f} to {max(rates):.1f} kHz per request"
    )
    return out


if __name__ == "__main__":
    main()
