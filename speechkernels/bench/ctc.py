"""CTC loss benchmark: forward+backward from activations, against torch's native and cuDNN kernels.

Configurations: the DeepBench CTC table (T=150, N in 1..256, C in {28, 5000}) with label lengths uniform in
1..T and every input length T, plus T=1500 rows. Each implementation starts from the same float32 activations;
peers that need log-probabilities get torch's log_softmax (its backward is timed too). Times are medians of
CUDA-event-timed repetitions after warm-up, the implementations taking turns call by call; memory is the peak
allocated above what existed before the call.
"""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import Callable

import torch

import speechkernels as sk
from speechkernels.ctc.reference import ctc_loss_reference

from .common import (
    add_common_arguments,
    busy_core,
    emit,
    environment,
    fmt_mb,
    fmt_ms,
    fmt_num,
    parse_shape,
    plot_series,
    plot_title,
    positive_int,
    print_legend,
    print_title,
    progress,
    resolve_device,
    split_rows,
    time_forward_backward,
    time_graphed_step,
    write_json,
)

# rows (T, N, C, S): label lengths uniform in 1..S
T150 = [(150, n, c, 150) for c in (28, 5000) for n in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
T1500 = [(1500, n, c, 1500) for c in (29, 1000) for n in (1, 32, 128)]
LONG_LABELS = [(1200, 16, 32, 600)]  # long label sequences in a small batch
CPU_DEMO = [(150, 1, 28, 150), (150, 8, 28, 150), (150, 8, 500, 150)]
CPU_BUSY_ROW = (150, 8, 28, 150)  # the CPU demo runs it again with a busy neighbour on one core
CPU_SECONDS = 3  # the CPU demo's rows with the default options, start-up not included


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(
        p,
        parse_rows,
        "TxNxC or TxNxCxS (frames, batch, classes, longest label sequence; S "
        "defaults to T), e.g. 150x256x5000,1200x16x32x600",
        "the speed-up over the fastest torch kernel per row",
    )
    p.add_argument("--reps", type=positive_int, default=20, help="timed calls per implementation (default 20)")
    p.add_argument("--no-error", action="store_true", help="skip the float64 reference comparison")
    p.add_argument("--graph", action="store_true", help="also time our step captured in a CUDA graph (GPU)")


def make_inputs(T: int, N: int, C: int, device: torch.device, seed: int = 0, S: int | None = None):
    """Activations [T, N, C], padded labels, input lengths T, label lengths uniform in 1..S (default T)."""
    g = torch.Generator().manual_seed(seed * 7919 + T * 31 + N * 7 + C)
    x = torch.randn(T, N, C, generator=g).to(device)
    tl = torch.randint(1, (S or T) + 1, (N,), generator=g)
    S = int(tl.max())
    targets = torch.randint(1, C, (N, S), generator=g)
    il = torch.full((N,), T, dtype=torch.int64)
    return x, targets, il, tl


def _cudnn_form(x, targets, il, tl):
    """Arguments in a form that makes torch take its cuDNN kernel, or None when cuDNN refuses the row."""
    flat = torch.cat([targets[n, : int(tl[n])] for n in range(targets.shape[0])]).to(torch.int32)
    lp = x.log_softmax(-1)
    for form in (
        (flat, il.tolist(), tl.tolist()),  # lists: cuDNN's classic path, int32 targets on the CPU
        (flat.cuda(), il.to(torch.int32).cuda(), tl.to(torch.int32).cuda()),  # tensors: int32 on the GPU
    ):
        if torch._use_cudnn_ctc_loss(lp, *form, 0):
            return form
    return None


def kernel_names(fn, x) -> list[str]:
    """Names of the GPU kernels one forward+backward launches (to show which peer path ran)."""
    from torch.profiler import ProfilerActivity, profile

    v = x.detach().clone().requires_grad_()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(v).backward()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})


def implementations(x, targets, il, tl, device) -> dict[str, Callable[[torch.Tensor], torch.Tensor] | None]:
    """name -> function from activations to the mean loss (None where the peer cannot run the row)."""
    tgt = targets.to(device)
    il_d, tl_d = il.to(device), tl.to(device)
    impls: dict[str, Callable | None] = {
        "sk_logits": lambda v: sk.ctc_loss(v, tgt, il_d, tl_d, logits=True),
        "sk_logprobs": lambda v: sk.ctc_loss(v.log_softmax(-1), tgt, il_d, tl_d),
        "torch_native": lambda v: torch.nn.functional.ctc_loss(v.log_softmax(-1), tgt, il_d, tl_d),
    }
    if device.type == "cuda":
        form = _cudnn_form(x, targets, il, tl)
        cudnn = None if form is None else (lambda v: torch.nn.functional.ctc_loss(v.log_softmax(-1), *form))
        impls["torch_cudnn"] = cudnn
    return impls


def errors(name, fn, x, targets, il, tl, ref_loss, ref_grad) -> tuple[float, float]:
    """Max relative loss error over alignable samples and max absolute gradient error, against float64."""
    v = x.detach().clone().requires_grad_()
    per_sample = {
        "sk_logits": lambda: sk.ctc_loss(v, targets, il, tl, reduction="none", logits=True),
        "sk_logprobs": lambda: sk.ctc_loss(v.log_softmax(-1), targets, il, tl, reduction="none"),
        "torch_native": lambda: torch.nn.functional.ctc_loss(
            v.log_softmax(-1), targets, il, tl, reduction="none", zero_infinity=True
        ),
    }.get(name)
    if per_sample is None:
        return math.nan, math.nan
    loss = per_sample()
    finite = torch.isfinite(ref_loss)
    loss.backward(finite.to(loss.dtype))
    rel = ((loss.double() - ref_loss).abs() / ref_loss.abs().clamp(min=1e-30))[finite]
    rel = rel.max().item() if rel.numel() else math.nan  # no alignable sample (labels longer than T allows)
    gerr = (v.grad.double() - ref_grad).abs().max().item()
    return rel, gerr


def reference(x, targets, il, tl):
    xr = x.detach().double().requires_grad_()
    loss = ctc_loss_reference(xr, targets, il, tl, reduction="none", logits=True)
    finite = torch.isfinite(loss)
    loss.backward(finite.double())
    return loss.detach(), xr.grad


LEGEND = [
    ("T N C S", "frames, batch, classes (blank 0 among them), longest label sequence (lengths uniform in 1..S)"),
    ("sk logits", "median ms of one forward+backward from float32 activations: ours with logits=True"),
    ("sk lp", "the same, ours on torch's log_softmax (timed with it, as for the peers)"),
    ("native, cudnn", "the same, torch's native CTC kernel and its cuDNN kernel (GPU only)"),
    ("x best, x(lp)", "speed-up of sk logits, sk lp over the faster of native and cudnn (>1: ours is faster)"),
    ("MB sk, MB nat", "peak extra GPU memory of one step in MiB, sk logits and native"),
    ("loss err", "sk logits: max relative error of the per-sample losses against the float64 reference"),
    ("grad err", "sk logits: max absolute error of the gradient against the float64 reference"),
    ("graph", "with --graph on a GPU: our step captured in a CUDA graph, ms and speed-up over the peers' eager steps"),
]
CELLS = (
    "-: no value (memory on a CPU; errors with --no-error, or loss err where no sample fits its labels in T "
    "frames); n/a: the implementation does not run here (cuDNN on a CPU, or cuDNN refuses the row)"
)


def run(args) -> int:
    device = resolve_device(args)
    rows = args.rows or (T150 + T1500 + LONG_LABELS if device.type == "cuda" else CPU_DEMO)
    env = environment(device)
    print_title("CTC loss, forward+backward from activations", env, args.reps)
    print_legend(LEGEND, CELLS)
    results = []
    header = (
        f"{'T':>5} {'N':>4} {'C':>5} {'S':>5} | {'sk logits':>9} {'sk lp':>8} {'native':>8} {'cudnn':>8} | "
        f"{'x best':>6} {'x(lp)':>6} | {'MB sk':>7} {'MB nat':>7} | {'loss err':>8} {'grad err':>8}"
    )
    print(header, flush=True)
    busy = [False] * len(rows)
    if device.type == "cpu" and not args.rows:
        rows, busy = [*rows, CPU_BUSY_ROW], [*busy, True]
    for k, (T, N, C, S) in enumerate(progress(rows, "ctc", lambda r: "x".join(map(str, r)))):
        with busy_core() if busy[k] else contextlib.nullcontext(False) as neighbour:
            row = _row(T, N, C, S, device, args, first=not results)
        row["busy_core"] = neighbour
        results.append(row)
        print_row(row)
    if args.json:
        write_json(args.json, {"benchmark": "ctc", "environment": env, "rows": results})
    if args.plot:
        plot(results, args.plot, plot_title("CTC loss, forward+backward from activations", env, device))
    return 0


def _row(T: int, N: int, C: int, S: int, device, args, first: bool) -> dict:
    """One row: each implementation's forward+backward, the errors against float64, the graph column."""
    x, targets, il, tl = make_inputs(T, N, C, device, S=S)
    tgt_d, il_d, tl_d = targets.to(device), il.to(device), tl.to(device)
    ref = None if args.no_error else reference(x, tgt_d, il_d, tl_d)
    row = {"T": T, "N": N, "C": C, "S": S}
    impls = implementations(x, targets, il, tl, device)
    for name, entry in time_forward_backward(impls, x, device, reps=args.reps).items():
        if entry is not None:
            fn = impls[name]
            if name.startswith("torch") and device.type == "cuda":
                entry["kernels"] = kernel_names(fn, x)
                if first:
                    emit(f"# {name} kernels: {entry['kernels']}")
            if ref is not None:
                entry["loss_rel_err"], entry["grad_abs_err"] = errors(name, fn, x, tgt_d, il_d, tl_d, *ref)
        row[name] = entry
    peers = [row[p]["ms"] for p in ("torch_native", "torch_cudnn") if row.get(p)]
    best = min(peers)
    row["speedup_logits"] = best / row["sk_logits"]["ms"]
    row["speedup_logprobs"] = best / row["sk_logprobs"]["ms"]
    if args.graph and device.type == "cuda":
        # the logits-mode step, captured whole (validate=False: no host read), against the peers' eager steps
        row["sk_graph"] = time_graphed_step(
            lambda v, t=tgt_d, i=il_d, n=tl_d: sk.ctc_loss(v, t, i, n, logits=True, validate=False),
            x,
            device,
            args.reps,
        )
        row["speedup_graph"] = best / row["sk_graph"]["ms"]
    return row


def parse_rows(text: str) -> list[tuple[int, int, int, int]]:
    """--rows: comma-separated TxNxC or TxNxCxS as [(T, N, C, S)] (S defaults to T), or argparse's
    ArgumentTypeError naming the expected form."""
    rows = []
    for item in split_rows(text):
        vals = parse_shape(item, "TxNxC or TxNxCxS", (3, 4), "150x8x28 or 1200x16x32x600")
        if vals[2] < 2:
            raise argparse.ArgumentTypeError(f"{item!r}: C={vals[2]} leaves no class for the labels (the blank is 0)")
        rows.append((*vals[:3], vals[3] if len(vals) == 4 else vals[0]))
    return list(dict.fromkeys(rows))


def parse_row(text: str) -> tuple[int, int, int, int]:
    """One TxNxC or TxNxCxS as (T, N, C, S); S defaults to T. Exits with a message naming --rows if malformed."""
    try:
        return parse_rows(text)[0]
    except argparse.ArgumentTypeError as err:
        raise SystemExit(f"--rows: {err}") from None


def print_row(row: dict) -> None:
    def ms(name):
        return fmt_ms(row.get(name))

    def mb(name):
        return fmt_mb(row.get(name), width=7, decimals=1)

    err = row["sk_logits"].get("loss_rel_err"), row["sk_logits"].get("grad_abs_err")
    shape = f"{row['T']:5d} {row['N']:4d} {row['C']:5d} {row.get('S', row['T']):5d}"
    g = row.get("sk_graph")
    graph = f" | graph {g['ms']:7.3f} ms, {fmt_num(row['speedup_graph'], '.2f', 5, 'x')}" if g else ""
    busy = "  (one busy core beside it)" if row.get("busy_core") else ""
    emit(
        f"{shape} | {row['sk_logits']['ms']:9.3f} {ms('sk_logprobs')} "
        f"{ms('torch_native')} {ms('torch_cudnn')} | {fmt_num(row['speedup_logits'], '.2f', 6)} "
        f"{fmt_num(row['speedup_logprobs'], '.2f', 6)} | {mb('sk_logits')} {mb('torch_native')} | "
        f"{fmt_num(err[0], '.1e', 8)} {fmt_num(err[1], '.1e', 8)}" + graph + busy
    )


def plot(results: list[dict], path: str, title: str) -> None:
    """Speed-up over the fastest torch kernel per row: eager logits and log_probs modes, and the step captured in a
    CUDA graph (against the peers' eager steps) where the run measured it."""
    labels = [f"{r['T']}/{r['N']}/{r['C']}" + (f"/{r['S']}" if r.get("S", r["T"]) != r["T"] else "") for r in results]
    series = {
        "logits mode, eager": [r["speedup_logits"] for r in results],
        "log_probs mode, eager": [r["speedup_logprobs"] for r in results],
    }
    if any("speedup_graph" in r for r in results):
        series["logits mode in a CUDA graph"] = [r.get("speedup_graph") for r in results]
    plot_series(
        path,
        labels,
        series,
        title,
        "speed-up over the fastest torch kernel (eager)",
        "T/N/C (/S: longest label sequence, default T)",
        lines=((1.0, "1.0: as fast as torch"),),
    )
