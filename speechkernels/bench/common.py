"""Timing, memory and environment helpers shared by the benchmarks."""

from __future__ import annotations

import datetime
import json
import math
import platform
import statistics
import time
from collections.abc import Callable

import torch


def environment(device: torch.device) -> dict:
    import speechkernels

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
        "speechkernels": speechkernels.__version__,
        "python": platform.python_version(),
    }
    return env


def time_ms(fn: Callable[[], object], device: torch.device, warmup: int = 5, reps: int = 20) -> float:
    """Median wall time of fn() in milliseconds: CUDA events around each call after warm-up, or perf_counter on CPU."""
    return statistics.median(times_ms(fn, device, warmup, reps))


def times_ms(fn: Callable[[], object], device: torch.device, warmup: int = 5, reps: int = 20) -> list[float]:
    """Wall time of each of ``reps`` calls of fn() in milliseconds, after warm-up."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(reps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def interleaved_times_ms(
    fns: dict[str, Callable[[], object]], device: torch.device, warmup: int = 5, reps: int = 20
) -> dict[str, list[float]]:
    """Wall time in milliseconds of ``reps`` calls of each function, taken in rounds of one call each, after
    warm-up: CUDA events around each call (synchronised before the next), or perf_counter on the CPU."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            times[name].append(times_ms(fn, device, warmup=0, reps=1)[0])
    return times


def time_forward_backward(
    impls: dict[str, Callable[[torch.Tensor], torch.Tensor] | None],
    x: torch.Tensor,
    device: torch.device,
    reps: int,
    warmup: int = 5,
) -> dict[str, dict | None]:
    """Forward+backward of each implementation (fn(v) -> loss) from a leaf that shares ``x``'s storage: the median
    time, its quartiles and minimum, and the peak extra memory; None where fn is None.

    The implementations take turns, one call each per round, so that a slow spell of the host (they come and
    go on shared machines) falls on all of them alike."""
    steps = {}
    # one leaf on x's own storage for all (no copies: the largest rows fill most of the GPU's memory); none of
    # the implementations writes into its input
    v = x.detach().requires_grad_()
    for name, fn in impls.items():
        if fn is None:
            continue

        def step(fn=fn):
            v.grad = None
            fn(v).backward()

        steps[name] = (step, v)
    times = interleaved_times_ms({k: st for k, (st, _) in steps.items()}, device, warmup=warmup, reps=reps)
    out: dict[str, dict | None] = {name: None for name in impls}
    for name, (step, v) in steps.items():
        q1, _, q3 = statistics.quantiles(times[name], n=4) if reps > 1 else (math.nan,) * 3
        mem = peak_extra_memory(step, device, before=lambda v=v: setattr(v, "grad", None)) or {}
        v.grad = None
        out[name] = {
            "ms": statistics.median(times[name]), "ms_quartiles": [q1, q3], "ms_min": min(times[name]),
            "peak_extra_bytes": mem.get("allocated"), "peak_extra_requested_bytes": mem.get("requested"),
        }  # fmt: skip
    return out


def time_graphed_step(loss_fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, device: torch.device,
                      reps: int) -> dict:  # fmt: skip
    """A training step (loss_fn(v) then its backward, v a leaf on x's values) captured in one CUDA graph, as
    torch.compile's "reduce-overhead" mode or torch.cuda.make_graphed_callables run it: the median replay time,
    its quartiles and minimum. loss_fn must not synchronise with the host (validate=False)."""
    v = x.detach().clone().requires_grad_()

    def step():
        v.grad = None
        loss_fn(v).backward()

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up off the capture stream (compilation, allocator)
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    times = times_ms(graph.replay, device, warmup=5, reps=reps)
    q1, _, q3 = statistics.quantiles(times, n=4) if reps > 1 else (math.nan,) * 3
    return {"ms": statistics.median(times), "ms_quartiles": [q1, q3], "ms_min": min(times)}


def peak_extra_bytes(
    fn: Callable[[], object], device: torch.device, before: Callable[[], object] | None = None
) -> int | None:
    """Peak GPU memory allocated during fn() above what was allocated before it (None on the CPU).

    ``before`` runs first, outside the measurement (e.g. to drop a gradient left by an earlier call)."""
    mem = peak_extra_memory(fn, device, before)
    return mem["allocated"] if mem else None


def peak_extra_memory(
    fn: Callable[[], object], device: torch.device, before: Callable[[], object] | None = None
) -> dict[str, int] | None:
    """Peak extra GPU memory during fn() (None on the CPU), two ways: "allocated", the caching allocator's blocks
    (sizes rounded up: a block of more than 1 MiB may keep up to 2 MiB more than asked for), and "requested", the
    sizes the tensors asked for."""
    if device.type != "cuda":
        return None
    if before is not None:
        before()
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_stats(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    after = torch.cuda.memory_stats(device)
    return {
        "allocated": after["allocated_bytes.all.peak"] - base["allocated_bytes.all.current"],
        "requested": after["requested_bytes.all.peak"] - base["requested_bytes.all.current"],
    }


def write_json(path: str, payload: dict) -> None:
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
        f.write("\n")


def fmt_ms(entry: dict | None, width: int = 8) -> str:
    """A table cell: the entry's median milliseconds, or n/a where the implementation could not run."""
    return f"{entry['ms']:{width}.3f}" if entry else f"{'n/a':>{width}}"


def fmt_mb(entry: dict | None, width: int = 8, decimals: int = 0) -> str:
    """A table cell: the entry's peak extra memory in MiB, or - where there is none (CPU, or not run)."""
    mem = entry["peak_extra_bytes"] if entry else None
    return f"{mem / 2**20:{width}.{decimals}f}" if mem is not None else f"{'-':>{width}}"


def kernel_times_ms(fn: Callable[[], object], calls: int = 5) -> dict[str, float]:
    """GPU milliseconds per call of fn(), by kernel name (the CUDA profiler over ``calls`` calls)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per: dict[str, float] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            per[e.name[:60]] = per.get(e.name[:60], 0.0) + e.device_time / calls / 1e3
    return dict(sorted(per.items(), key=lambda kv: -kv[1]))


def print_title(what: str, env: dict, reps: int, note: str = " after warm-up") -> None:
    """A benchmark table's first line: what it measures, the GPU and versions, the statistic."""
    print(f"# {what}, {env['device']}, torch {env['torch']}, triton {env['triton']}, median of {reps}{note}")


def plot_bars(rows: list[dict], names: list[str], labels: list[str], title: str, time_label: str, path: str) -> None:
    """A PNG of two panels of bars (log scales), one group per row, one bar per implementation in ``names``: the
    entries' median milliseconds (``time_label``) and peak extra memory (MB); no bar where an entry is missing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(max(8, len(rows) * 1.9), 8))
    width = 0.8 / max(1, len(names))

    def value(r, name, key):
        v = (r.get(name) or {}).get(key) or 0
        return v / 1e6 if key == "peak_extra_bytes" else v

    for ax, key, unit in ((axes[0], "ms", time_label), (axes[1], "peak_extra_bytes", "MB peak extra memory")):
        for j, name in enumerate(names):
            vals = [value(r, name, key) for r in rows]
            ax.bar([i + (j - (len(names) - 1) / 2) * width for i in range(len(rows))], vals, width=width, label=name)
        ax.set_yscale("log")
        ax.set_ylabel(unit)
        ax.set_xticks(range(len(rows)), labels, fontsize=8)
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
