"""CTC loss benchmark: forward+backward from activations, against torch's native and cuDNN kernels.

Configurations: the DeepBench CTC table (T=150, N in 1..256, C in {28, 5000}) with label lengths uniform in
1..T and every input length T, plus T=1500 rows. Each implementation starts from the same float32 activations;
peers that need log-probabilities get torch's log_softmax (its backward is timed too). Times are medians of
CUDA-event-timed repetitions after warm-up, the implementations taking turns call by call; memory is the peak
allocated above what existed before the call.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import torch

import speechkernels as sk
from speechkernels.ctc.reference import ctc_loss_reference

from .common import environment, fmt_mb, fmt_ms, print_title, time_forward_backward, time_graphed_step, write_json

# rows (T, N, C, S): label lengths uniform in 1..S
T150 = [(150, n, c, 150) for c in (28, 5000) for n in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
T1500 = [(1500, n, c, 1500) for c in (29, 1000) for n in (1, 32, 128)]
LONG_LABELS = [(1200, 16, 32, 600)]  # long label sequences in a small batch
CPU_DEMO = [(150, 1, 28, 150), (150, 8, 28, 150), (150, 8, 500, 150)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--json", default=None, help="write the rows and the environment to this JSON file")
    p.add_argument("--plot", default=None, help="write a PNG of the speed-ups to this path")
    p.add_argument("--rows", default=None, help="only these configurations TxNxC[xS] (S: longest label sequence, "
                   "default T), e.g. 150x256x5000,1200x16x32x600")  # fmt: skip
    p.add_argument("--reps", type=int, default=20)
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
    rel = ((loss.double() - ref_loss).abs() / ref_loss.abs().clamp(min=1e-30))[finite].max().item()
    gerr = (v.grad.double() - ref_grad).abs().max().item()
    return rel, gerr


def reference(x, targets, il, tl):
    xr = x.detach().double().requires_grad_()
    loss = ctc_loss_reference(xr, targets, il, tl, reduction="none", logits=True)
    finite = torch.isfinite(loss)
    loss.backward(finite.double())
    return loss.detach(), xr.grad


def run(args) -> int:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rows = T150 + T1500 + LONG_LABELS if device.type == "cuda" else CPU_DEMO
    if args.rows:
        wanted = [parse_row(r) for r in args.rows.split(",")]
        rows = [r for r in rows if r in wanted] or wanted
    env = environment(device)
    print_title("CTC loss, forward+backward from activations", env, args.reps)
    results = []
    header = (f"{'T':>5} {'N':>4} {'C':>5} {'S':>5} | {'sk logits':>9} {'sk lp':>8} {'native':>8} {'cudnn':>8} | "
              f"{'x best':>6} {'x(lp)':>6} | {'MB sk':>7} {'MB nat':>7} | {'loss err':>8} {'grad err':>8}")  # fmt: skip
    print(header)
    for T, N, C, S in rows:
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
                    if not results:
                        print(f"# {name} kernels: {entry['kernels']}")
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
        results.append(row)

        print_row(row)
    if args.json:
        write_json(args.json, {"benchmark": "ctc", "environment": env, "rows": results})
    if args.plot:
        plot(results, args.plot, f"CTC loss, forward+backward, {env['device']}, {env['date'][:10]}")
    return 0


def parse_row(text: str) -> tuple[int, int, int, int]:
    """TxNxC or TxNxCxS as (T, N, C, S); S defaults to T."""
    try:
        vals = [int(v) for v in text.split("x")]
    except ValueError:
        vals = []
    if len(vals) not in (3, 4) or min(vals) < 1:
        raise SystemExit(f"--rows: {text!r} is not TxNxC or TxNxCxS (positive integers)")
    return (*vals[:3], vals[3] if len(vals) == 4 else vals[0])


def print_row(row: dict) -> None:
    def ms(name):
        return fmt_ms(row.get(name))

    def mb(name):
        return fmt_mb(row.get(name), width=7, decimals=1)

    err = row["sk_logits"].get("loss_rel_err", math.nan), row["sk_logits"].get("grad_abs_err", math.nan)
    shape = f"{row['T']:5d} {row['N']:4d} {row['C']:5d} {row.get('S', row['T']):5d}"
    print(f"{shape} | {row['sk_logits']['ms']:9.3f} {ms('sk_logprobs')} "
          f"{ms('torch_native')} {ms('torch_cudnn')} | {row['speedup_logits']:6.2f} {row['speedup_logprobs']:6.2f} | "
          f"{mb('sk_logits')} {mb('torch_native')} | {err[0]:8.1e} {err[1]:8.1e}"
          + (f" | graph {row['sk_graph']['ms']:7.3f} ms, {row['speedup_graph']:5.2f}x" if "sk_graph" in row else ""),
          flush=True)  # fmt: skip


def plot(results, path, title=None):
    """Speed-up over the best torch kernel per row: eager logits and log_probs modes, and the step captured in a
    CUDA graph (against the peers' eager steps) where the run measured it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['T']}/{r['N']}/{r['C']}" + (f"/{r['S']}" if r.get("S", r["T"]) != r["T"] else "") for r in results]
    series = [("speedup_logits", "logits mode, eager"), ("speedup_logprobs", "log_probs mode, eager")]
    if any("speedup_graph" in r for r in results):
        series.append(("speedup_graph", "logits mode in a CUDA graph"))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6, len(results) * 0.5), 4.5))
    xs = range(len(results))
    for k, (key, label) in enumerate(series):
        offset = (k - (len(series) - 1) / 2) * width
        ax.bar([i + offset for i in xs], [r.get(key, 0) for r in results], width=width, label=label)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(list(xs), labels, rotation=90, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("speed-up over the best torch kernel (eager)")
    ax.set_xlabel("T/N/C (/S: longest label sequence, default T)")
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
