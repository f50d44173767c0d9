"""WaveNet inference benchmark: the serial-chain proxy (L=80 matrices of 128x128 per sample) and the vocoder,
in samples per second per stream and in total, and as a multiple of real time at 16 kHz and 24 kHz.

Proxy rows: float32 and bfloat16 weights, B in {1, 8, 132, 1024} streams; implementations: PyTorch eager (a
matrix product per layer), PyTorch with one CUDA graph per sample, and the Triton designs of
``speechkernels.wavenet.serial_chain``. Vocoder rows: 20 and 30 layers (residual 64, gate 128, skip 256, 256
classes, 80 mel bins, hop 256), PyTorch incremental generation, eager and with one step in a CUDA graph,
sampling included. Each rate is the
median over repetitions of a timed run of ``--samples`` samples after a warm-up run.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from speechkernels.wavenet import WaveNet, serial_chain
from speechkernels.wavenet.generate import generate_cuda_graph
from speechkernels.wavenet.reference import activation_fn

from .common import environment, write_json

PROXY = [(dtype, B) for dtype in ("float32", "bfloat16") for B in (1, 8, 132, 1024)]
VOCODER = [(layers, B) for layers in (20, 30) for B in (1, 8, 132)]
CPU_PROXY = [("float32", 1), ("float32", 8)]
CPU_VOCODER = [(20, 1)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--json", default=None, help="write the rows and the environment to this JSON file")
    p.add_argument("--samples", type=int, default=None, help="samples per timed run (default: 2000 GPU, 20 CPU)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--designs", default="stream", help="Triton designs of the proxy to run on the GPU")


def timed(fn, device: torch.device, reps: int) -> float:
    """Median seconds of fn() over reps runs after one warm-up run."""
    fn()
    out = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def proxy_graph(w: torch.Tensor, x0: torch.Tensor, n: int, activation: str = "tanh"):
    """The PyTorch baseline with one CUDA graph per sample (L matrix products and the copy back), replayed n
    times; returns a function that runs it."""
    act = activation_fn(activation)
    w_t = w.float().transpose(1, 2).contiguous()
    x = x0.float().clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the capture, as CUDA graphs require
        y = x
        for i in range(w_t.shape[0]):
            y = act(y @ w_t[i])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x
        for i in range(w_t.shape[0]):
            y = act(y @ w_t[i])
        x.copy_(y)

    def run():
        for _ in range(n):
            graph.replay()

    return run


def proxy_implementations(w: torch.Tensor, x0: torch.Tensor, n: int, designs: str):
    """(name, function running n samples) of the proxy: PyTorch eager, and on the GPU PyTorch with a CUDA graph
    per sample and the Triton designs."""
    out = [("torch eager", lambda: serial_chain(w, x0, n))]
    if w.is_cuda:
        out.append(("torch graph", proxy_graph(w, x0, n)))
        for design in designs.split(",") if designs else []:
            out.append((design, lambda design=design: serial_chain(w, x0, n, design=design)))
    return out


def vocoder_implementations(net: WaveNet, cond: torch.Tensor, n: int):
    """(name, function generating n samples per stream, sampling included): PyTorch incremental generation,
    eager and (on the GPU) one step captured in a CUDA graph."""
    gen = torch.Generator(device=cond.device).manual_seed(0)
    out = [("torch eager", lambda: net.generate(cond, n, generator=gen))]
    if cond.is_cuda:
        out.append(("torch graph", lambda: generate_cuda_graph(net, cond, n, generator=gen)))
    return out


def rates(seconds: float, n: int, B: int) -> dict:
    per_stream = n / seconds
    return {"s": seconds, "samples_per_s_per_stream": per_stream, "samples_per_s_total": per_stream * B,
            "x_realtime_16k": per_stream / 16000, "x_realtime_24k": per_stream / 24000}  # fmt: skip


def run(args) -> int:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    n = args.samples or (2000 if cuda else 20)
    env = environment(device)
    print(f"# WaveNet inference, {env['device']}, torch {env['torch']}, triton {env['triton']}, {n} samples per "
          f"run, median of {args.reps}")  # fmt: skip
    print(f"{'what':>28} {'B':>5} | {'kHz/stream':>10} {'x16k':>6} {'x24k':>6} | {'MS/s total':>10}")
    results = []

    def report(what, B, r, extra):
        row = {"what": what, "B": B, **extra, **r}
        results.append(row)
        print(f"{what:>28} {B:5d} | {r['samples_per_s_per_stream'] / 1e3:10.2f} {r['x_realtime_16k']:6.2f} "
              f"{r['x_realtime_24k']:6.2f} | {r['samples_per_s_total'] / 1e6:10.3f}", flush=True)  # fmt: skip

    g = torch.Generator().manual_seed(0)
    for dtype, B in PROXY if cuda else CPU_PROXY:
        L, H = 80, 128
        w = (torch.randn(L, H, H, generator=g) / math.sqrt(H)).to(getattr(torch, dtype)).to(device)
        x0 = torch.randn(B, H, generator=g).to(device)
        extra = {"kind": "proxy", "L": L, "H": H, "weights": dtype}
        for name, fn in proxy_implementations(w, x0, n, args.designs if cuda else ""):
            report(f"proxy {dtype} {name}", B, rates(timed(fn, device, args.reps), n, B), extra)
    for layers, B in VOCODER if cuda else CPU_VOCODER:
        torch.manual_seed(0)
        net = WaveNet(layers=layers, cycle=10).to(device).eval()
        cond = torch.randn(B, net.cond_channels, math.ceil(n / net.hop_length), generator=g).to(device)
        extra = {"kind": "vocoder", "layers": layers}
        for name, fn in vocoder_implementations(net, cond, n):
            report(f"vocoder {layers} layers {name}", B, rates(timed(fn, device, args.reps), n, B), extra)
    if args.json:
        write_json(args.json, {"benchmark": "wavenet", "environment": env, "samples": n, "rows": results})
    return 0
