"""WaveNet inference benchmark: the serial-chain proxy (L=80 matrices of 128x128 per sample) and the vocoder,
in samples per second per stream and in total, and as a multiple of real time at 16 kHz and 24 kHz.

Proxy rows: float32 and bfloat16 weights, B in {1, 8, 132, 1024} streams; implementations: PyTorch eager (a
matrix product per layer), PyTorch with one CUDA graph per sample, and the Triton designs of
``speechkernels.wavenet.serial_chain``. Vocoder rows: 20 and 30 layers (residual 64, gate 128, skip 256, 256
classes, 80 mel bins, hop 256), PyTorch incremental generation, eager and with one step in a CUDA graph,
sampling included (the Triton generation kernel beside them on the GPU). Each rate is the median over
repetitions of a timed run after warm-up runs; a run has up to ``--samples`` samples, fewer for an
implementation so slow that it would take much longer than ``--seconds``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from speechkernels.wavenet import WaveNet, serial_chain
from speechkernels.wavenet.cuda_runtime import clusters_available
from speechkernels.wavenet.generation import cluster_kernel_available

from .common import (
    add_common_arguments,
    comma_choices,
    emit,
    environment,
    fmt_num,
    plot_title,
    positive_float,
    positive_int,
    print_legend,
    progress,
    resolve_device,
    split_rows,
    write_json,
)
from .wavenet_baselines import generate_cuda_graph, proxy_graph

PROXY = [(dtype, B) for dtype in ("float32", "bfloat16") for B in (1, 8, 132, 1024)]
VOCODER = [(layers, B) for layers in (20, 30) for B in (1, 8, 132)]
CPU_PROXY = [("float32", 1), ("float32", 8)]
CPU_VOCODER = [(20, 1)]
PARTS = ("proxy", "vocoder")
DESIGNS = ("stream", "barrier", "cluster", "partials", "pipeline")
WEIGHTS = ("float32", "bfloat16")
CPU_SECONDS = 2  # the CPU demo's rows with the default options, start-up not included
LEGEND = [
    ("what", "the part (proxy: 80 layers of 128x128 per sample, weights dtype; vocoder: layers) and implementation"),
    ("B", "streams generated at once"),
    ("n", "samples per stream in a timed run (fewer for slow implementations, see --seconds)"),
    ("kHz/stream", "thousands of samples per second per stream, the median of --reps timed runs"),
    ("x16k, x24k", "the same as a multiple of real time at 16 kHz and 24 kHz audio (>1: faster than real time)"),
    ("MS/s total", "millions of samples per second over all B streams"),
]
CELLS = "failed: the implementation cannot run here (its error follows); no other cell is ever empty"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p, parse_rows, "proxy:WEIGHTS:B (WEIGHTS float32 or bfloat16) or vocoder:LAYERS:B, B "
                         "streams, e.g. proxy:float32:8,vocoder:20:1", "the samples per second per stream (kHz) "
                         "per row, against 16 and 24 kHz real time")  # fmt: skip
    p.add_argument("--samples", type=positive_int, default=None,
                   help="most samples per timed run (default: 4000 GPU, 20 CPU)")  # fmt: skip
    p.add_argument("--seconds", type=positive_float, default=0.25,
                   help="aim of a timed run's length (fewer samples if slow; default 0.25)")  # fmt: skip
    p.add_argument("--reps", type=positive_int, default=3, help="timed runs per implementation (default 3)")
    p.add_argument(
        "--designs",
        type=comma_choices(DESIGNS),
        default=list(DESIGNS),
        help=f"kernel designs of the proxy (GPU), comma-separated from {','.join(DESIGNS)} (default all)",
    )
    p.add_argument("--only", type=comma_choices(PARTS), default=list(PARTS),
                   help="which parts to run: proxy, vocoder or proxy,vocoder (default both)")  # fmt: skip


def parse_rows(text: str) -> list[tuple[str, str | int, int]]:
    """--rows: comma-separated proxy:WEIGHTS:B or vocoder:LAYERS:B as [(part, weights or layers, B)], or
    argparse's ArgumentTypeError naming the form."""
    rows = []
    for item in split_rows(text):
        parts = item.split(":")
        ok = len(parts) == 3 and parts[2].isdigit() and int(parts[2]) >= 1
        if ok and parts[0] == "proxy" and parts[1] in WEIGHTS:
            rows.append(("proxy", parts[1], int(parts[2])))
        elif ok and parts[0] == "vocoder" and parts[1].isdigit() and int(parts[1]) >= 1:
            rows.append(("vocoder", int(parts[1]), int(parts[2])))
        else:
            raise argparse.ArgumentTypeError(f"{item!r} is not proxy:WEIGHTS:B (WEIGHTS {' or '.join(WEIGHTS)}) or "
                                             "vocoder:LAYERS:B (positive integers), e.g. proxy:float32:8 or "
                                             "vocoder:20:1")  # fmt: skip
    return list(dict.fromkeys(rows))


def default_rows(cuda: bool) -> list[tuple[str, str | int, int]]:
    return [("proxy", *r) for r in (PROXY if cuda else CPU_PROXY)] + [
        ("vocoder", *r) for r in (VOCODER if cuda else CPU_VOCODER)
    ]


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--rows and --only together must leave a row to run."""
    if args.rows and not any(part in args.only for part, _, _ in args.rows):
        parser.error(f"--rows and --only {','.join(args.only)} leave no row to run (rows of the other part only)")


def timed(fn, n_max: int, device: torch.device, reps: int, seconds: float) -> tuple[float, int]:
    """(median seconds, samples) of fn(n) over reps runs: n up to n_max, fewer where a run of n_max would take
    much longer than ``seconds``. n grows from a first run of a few samples (which also warms up) until a run
    takes at least a quarter of ``seconds``, so that a fixed cost per call does not set n."""

    def once(n):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn(n)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    n = min(n_max, 16)
    once(n)
    t = once(n)
    while n < n_max and t < seconds / 4:
        n = min(n_max, max(2 * n, int(n * seconds / max(t, 1e-9))))
        t = once(n)
    return statistics.median(once(n) for _ in range(reps)), n


def proxy_implementations(w: torch.Tensor, x0: torch.Tensor, designs: str | list[str]):
    """(name, function running n samples) of the proxy: PyTorch eager, and on the GPU PyTorch with a CUDA graph
    per sample and the kernel designs (the cluster design where cuda-core and the GPU allow it)."""
    out = [("torch eager", lambda n: serial_chain(w, x0, n, design="torch"))]
    if w.is_cuda:
        out.append(("torch graph", proxy_graph(w, x0)))
        for design in filter(None, designs.split(",") if isinstance(designs, str) else designs):
            if design in ("cluster", "partials", "pipeline") and not clusters_available():
                continue
            if design == "pipeline" and w.dtype != torch.bfloat16:  # bfloat16 weights only
                continue
            out.append((design, lambda n, design=design: serial_chain(w, x0, n, design=design)))
    return out


def vocoder_implementations(net: WaveNet, cond: torch.Tensor):
    """(name, function generating n samples per stream, sampling included): PyTorch incremental generation,
    eager and (on the GPU) one step captured in a CUDA graph, and the GPU kernels through ``WaveNet.generate``
    (the Triton kernel; the cluster kernel with float32 and bfloat16 weights where cuda-core and the GPU allow)."""
    gen = torch.Generator(device=cond.device).manual_seed(0)
    out = [("torch eager", lambda n: net.generate(cond, n, generator=gen, kernel="torch"))]
    if cond.is_cuda:
        out.append(("torch graph", lambda n: generate_cuda_graph(net, cond, n, generator=gen)))
        out.append(("triton", lambda n: net.generate(cond, n, generator=gen, kernel="triton")))
        if cluster_kernel_available(net):
            for wd in (torch.float32, torch.bfloat16):

                def cluster(n, wd=wd):
                    return net.generate(cond, n, generator=gen, kernel="cluster", weights_dtype=wd)

                out.append((f"cluster {str(wd)[6:]}", cluster))
    return out


def rates(seconds: float, n: int, B: int) -> dict:
    per_stream = n / seconds
    return {"s": seconds, "samples_per_s_per_stream": per_stream, "samples_per_s_total": per_stream * B,
            "x_realtime_16k": per_stream / 16000, "x_realtime_24k": per_stream / 24000}  # fmt: skip


def run(args) -> int:
    device = resolve_device(args)
    cuda = device.type == "cuda"
    n_max = args.samples or (4000 if cuda else 20)
    env = environment(device)
    print(f"# WaveNet inference, {env['device']}, torch {env['torch']}, triton {env['triton']}, up to {n_max} "
          f"samples per run (about {args.seconds} s), median of {args.reps}")  # fmt: skip
    print_legend(LEGEND, CELLS)
    print(f"{'what':>32} {'B':>5} {'n':>6} | {'kHz/stream':>10} {'x16k':>6} {'x24k':>6} | {'MS/s total':>10}",
          flush=True)  # fmt: skip
    results = []

    def report(what, B, fn, extra):
        try:
            seconds, n = timed(fn, n_max, device, args.reps, args.seconds)
        except Exception as err:  # a design that cannot run here (shape, resources): recorded, not fatal
            emit(f"{what:>32} {B:5d} failed: {type(err).__name__}: {err}")
            results.append({"what": what, "B": B, **extra, "error": f"{type(err).__name__}: {err}"})
            return
        r = rates(seconds, n, B)
        results.append({"what": what, "B": B, "n": n, **extra, **r})
        emit(f"{what:>32} {B:5d} {n:6d} | {fmt_num(r['samples_per_s_per_stream'] / 1e3, '.2f', 10)} "
             f"{fmt_num(r['x_realtime_16k'], '.2f', 6)} {fmt_num(r['x_realtime_24k'], '.2f', 6)} | "
             f"{fmt_num(r['samples_per_s_total'] / 1e6, '.3f', 10)}")  # fmt: skip

    rows = [r for r in args.rows or default_rows(cuda) if r[0] in args.only]
    g = torch.Generator().manual_seed(0)
    for part, what, B in progress(rows, "wavenet", lambda r: ":".join(map(str, r))):
        if part == "proxy":
            L, H = 80, 128
            w = (torch.randn(L, H, H, generator=g) / math.sqrt(H)).to(getattr(torch, what)).to(device)
            x0 = torch.randn(B, H, generator=g).to(device)
            extra = {"kind": "proxy", "L": L, "H": H, "weights": what}
            for name, fn in proxy_implementations(w, x0, args.designs if cuda else ""):
                report(f"proxy {what} {name}", B, fn, extra)
        else:
            torch.manual_seed(0)
            net = WaveNet(layers=what, cycle=10).to(device).eval()
            cond = torch.randn(B, net.cond_channels, math.ceil(n_max / net.hop_length), generator=g).to(device)
            extra = {"kind": "vocoder", "layers": what}
            for name, fn in vocoder_implementations(net, cond):
                report(f"vocoder {what} layers {name}", B, fn, extra)
    if args.json:
        write_json(args.json, {"benchmark": "wavenet", "environment": env, "rows": results})
    if args.plot:
        plot(results, args.plot, plot_title("WaveNet inference, samples per second per stream", env, device))
    return 0


def plot(results: list[dict], path: str, title: str) -> None:
    """Samples per second per stream (kHz) against the number of streams B, one line per implementation, the
    proxy and the vocoder side by side, against 16 and 24 kHz real time (no point where a run failed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in ("proxy", "vocoder") if any(r.get("kind") == k for r in results)] or ["proxy"]
    fig, axes = plt.subplots(1, len(kinds), figsize=(6.5 * len(kinds), 5), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        lines: dict[str, list[tuple[int, float]]] = {}
        for r in results:
            if r.get("kind") == kind and "error" not in r:
                lines.setdefault(r["what"], []).append((r["B"], r["samples_per_s_per_stream"] / 1e3))
        for name, pts in lines.items():
            pts.sort()
            ax.plot([b for b, _ in pts], [k for _, k in pts], marker="o", ms=3, lw=1, label=name.removeprefix(kind))
        for y, style in ((16.0, "--"), (24.0, ":")):
            ax.axhline(y, color="k", lw=0.8, ls=style, label=f"{y:g} kHz real time")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("streams B")
        ax.set_ylabel("samples per second per stream (kHz)")
        ax.set_title(kind, fontsize=9)
        ax.legend(fontsize=6, ncol=2)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}", flush=True)
