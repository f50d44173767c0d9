"""Serve many WaveNet voices at once: requests of different lengths arrive while others are being generated, each
gets its samples chunk by chunk, and the script reports each request's time to its first chunk and its rate.

    python examples/wavenet_serve.py [--requests 32] [--samples 8000] [--chunk 2000] [--layers 20] [--device cpu]

On a Hopper GPU with cuda-core the chunks run on the batched thread-block cluster kernel (several streams per
cluster), elsewhere on the PyTorch path. The weights are random: the point is the serving loop.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from speechkernels.wavenet import WaveNet, WaveNetServer


def main(argv: list[str] | None = None) -> dict[int, torch.Tensor]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--samples", type=int, default=8000, help="the longest request's samples")
    p.add_argument("--chunk", type=int, default=2000, help="samples per request per step")
    p.add_argument("--layers", type=int, default=20)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    args = p.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
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
    total = time.perf_counter() - t0
    out = {rid: torch.cat(c) for rid, c in parts.items()}
    rates = [lengths[r] / done[r] / 1e3 for r in done]
    print(f"{device.type}: {len(out)} requests, {sum(lengths)} samples in {total:.2f} s "
          f"({sum(lengths) / total / 1e6:.3f} M samples/s); first chunk after {1e3 * min(first.values()):.0f} to "
          f"{1e3 * max(first.values()):.0f} ms; {min(rates):.1f} to {max(rates):.1f} kHz per request")  # fmt: skip
    return out


if __name__ == "__main__":
    main()
