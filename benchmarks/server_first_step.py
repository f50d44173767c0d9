"""The first chunk of a WaveNetServer after warmup() against its steady chunks: each count of requests in a fresh
process (nothing compiled or packed by an earlier one), the step times synchronised, and where the first step's
host time goes (cProfile, top entries by cumulative time).

    python benchmarks/server_first_step.py [--requests 1,60,128] [--chunk 2048] [--layers 20] [--steps 6]
                                           [--compile-only]

``--compile-only`` warms up as warmup() did before it ran a scratch chunk (the cluster kernel's variants compiled,
nothing else), for the before/after comparison.

One JSON line per count of requests: first and steady step times (ms), their ratio, the profile's top lines.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import subprocess
import sys
import time

import torch


def one(requests: int, chunk: int, layers: int, steps: int, top: int, compile_only: bool) -> dict:
    from speechkernels.wavenet import WaveNet, WaveNetServer
    from speechkernels.wavenet.cluster_vocoder import compile_batch_kernels
    from speechkernels.wavenet.weights import vocoder_weights

    dev = torch.device("cuda")
    torch.manual_seed(0)
    hop = 256
    net = WaveNet(layers=layers, cycle=min(layers, 10), cond_channels=80, hop_length=hop).to(dev).eval()
    server = WaveNetServer(net, chunk=chunk, generator=torch.Generator(dev).manual_seed(0))
    t = time.perf_counter()
    if compile_only:
        assert server.kernel == "cluster"
        compile_batch_kernels(vocoder_weights(net), requests, torch.float32, False, dev)
    else:
        server.warmup(requests)
    torch.cuda.synchronize()
    warmup_ms = 1e3 * (time.perf_counter() - t)
    n = chunk * steps
    for _ in range(requests):
        server.submit(n, torch.randn(80, -(-n // hop), device=dev))
    times, profile = [], None
    for k in range(steps):
        prof = cProfile.Profile() if k == 0 else None
        torch.cuda.synchronize()
        t = time.perf_counter()
        if prof is not None:
            prof.enable()
        server.step()
        torch.cuda.synchronize()
        if prof is not None:
            prof.disable()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(top)
            profile = s.getvalue()
        times.append(1e3 * (time.perf_counter() - t))
    steady = sorted(times[1:])[len(times[1:]) // 2]
    return dict(
        requests=requests,
        chunk=chunk,
        layers=layers,
        compile_only=compile_only,
        warmup_ms=round(warmup_ms, 1),
        first_ms=round(times[0], 2),
        steady_ms=[round(x, 2) for x in times[1:]],
        ratio=round(times[0] / steady, 3),
        gpu=torch.cuda.get_device_name(),
        profile=profile,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", default="1,60,128")
    p.add_argument("--chunk", type=int, default=2048)
    p.add_argument("--layers", type=int, default=20)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--compile-only", action="store_true")
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child process: this many requests
    a = p.parse_args()
    if a.one is not None:
        print(json.dumps(one(a.one, a.chunk, a.layers, a.steps, a.top, a.compile_only)))
        return
    for r in (int(v) for v in a.requests.split(",")):
        args = [
            sys.executable,
            __file__,
            "--one",
            str(r),
            "--chunk",
            str(a.chunk),
            "--layers",
            str(a.layers),
            "--steps",
            str(a.steps),
            "--top",
            str(a.top),
        ]
        if a.compile_only:
            args.append("--compile-only")
        out = subprocess.run(args, capture_output=True, text=True)
        lines = out.stdout.strip().splitlines()
        print(lines[-1] if lines else json.dumps(dict(requests=r, error=out.stderr[-2000:])), flush=True)


if __name__ == "__main__":
    main()
