"""Timing, memory and environment helpers shared by the benchmarks, and the pieces of their command line: the
common options, row parsing, progress lines, table legends and the speed-up plot."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import math
import multiprocessing
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch

MATPLOTLIB_HINT = "--plot needs matplotlib: pip install matplotlib (or pip install -e '.[bench]')"


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
            "ms": statistics.median(times[name]),
            "ms_quartiles": [q1, q3],
            "ms_min": min(times[name]),
            "peak_extra_bytes": mem.get("allocated"),
            "peak_extra_requested_bytes": mem.get("requested"),
        }
    return out


def time_graphed_step(
    loss_fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, device: torch.device, reps: int
) -> dict:
    """A training step (loss_fn(v) then its backward, v a leaf on x's values) captured in one CUDA graph, as
    torch.compile's "reduce-overhead" mode or torch.cuda.make_graphed_callables run it: the median replay time,
    its quartiles and minimum. loss_fn must not synchronise with the host (validate=False)."""
    v = x.detach().clone().requires_grad_()

    def step():
        v.grad = None
        loss_fn(v).backward()

    return time_graphed_call(step, device, reps)


def time_graphed_call(fn: Callable[[], object], device: torch.device, reps: int) -> dict:
    """fn() captured in one CUDA graph (after three calls on a side stream: compilation, allocator), replayed: the
    median replay time, its quartiles and minimum. fn must not synchronise with the host."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
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
    print(f"wrote {path}", flush=True)


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


# ---- the command line shared by every benchmark ----


def add_common_arguments(
    p: argparse.ArgumentParser, rows_type: Callable[[str], list], rows_help: str, plot_help: str
) -> None:
    """--device, --json, --plot and --rows, the same on every subcommand (``rows_type`` parses --rows)."""
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default=None,
        help="where to run (default: cuda when available, else cpu: a short demo of the CPU paths)",
    )
    p.add_argument(
        "--json",
        metavar="PATH",
        default=None,
        help="write the rows and the environment (device, versions, date) to this JSON file",
    )
    p.add_argument("--plot", metavar="PATH", default=None, help=f"write a PNG of {plot_help} (needs matplotlib)")
    p.add_argument(
        "--rows",
        metavar="ROWS",
        type=rows_type,
        default=None,
        help=f"run only these rows, comma-separated: {rows_help}",
    )


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def comma_choices(choices: Sequence[str]) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated subset of ``choices``, each named at most once."""

    def parse(text: str) -> list[str]:
        names = [t.strip() for t in text.split(",") if t.strip()]
        bad = [n for n in names if n not in choices]
        if bad or not names:
            raise argparse.ArgumentTypeError(
                f"{', '.join(map(repr, bad)) or 'nothing'}: not a valid choice; choose one or more of "
                f"{', '.join(choices)} (comma-separated)"
            )
        return list(dict.fromkeys(names))

    return parse


def split_rows(text: str) -> list[str]:
    """The comma-separated items of a --rows value (an empty one is an error)."""
    items = [t.strip() for t in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty row (rows are separated by single commas)")
    return items


def parse_shape(item: str, form: str, counts: Sequence[int], example: str, seps: str = "x") -> tuple[int, ...]:
    """One row of positive integers joined by any of ``seps`` (``counts``: how many numbers it may have), or
    argparse.ArgumentTypeError naming the expected ``form`` and an ``example``."""
    parts = [item]
    for sep in seps:
        parts = [q for part in parts for q in part.split(sep)]
    try:
        vals = tuple(int(v) for v in parts)
    except ValueError:
        vals = ()
    if len(vals) not in counts or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"{item!r} is not {form} (positive integers), e.g. {example}")
    return vals


def _busy(core: int, stop) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    while not stop.is_set():
        a = (a @ a).tanh_()


@contextlib.contextmanager
def busy_core(settle_s: float = 0.5) -> Iterator[bool]:
    """A neighbour process busy on one core (a one-thread matmul loop, pinned to the last core where the system
    allows) while the block runs: the CPU rows "with one busy core" (a data loader, a second job). Yields False,
    and starts nothing, on a machine of one core."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if len(cores) < 2:
        yield False
        return
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    stop = ctx.Event()
    proc = ctx.Process(target=_busy, args=(cores[-1], stop), daemon=True)
    proc.start()
    time.sleep(settle_s)
    try:
        yield True
    finally:
        stop.set()
        proc.join(10)


def resolve_device(args: argparse.Namespace) -> torch.device:
    return torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))


def example_device(parser: argparse.ArgumentParser, device: str | None) -> torch.device:
    """An example's ``--device`` (choices cpu, cuda; None: cuda where available), or a parser error (usage,
    status 2) for cuda on a machine without it."""
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available on this machine (torch.cuda.is_available() is False)")
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def check_common(parser: argparse.ArgumentParser, args: argparse.Namespace, outputs: Sequence[str] = ()) -> None:
    """The checks argparse cannot make alone, before anything runs (a benchmark can take many minutes, and an
    error after them would lose the table): CUDA present for --device cuda, matplotlib for --plot, the folders
    of the files to write (``outputs``) present. Errors exit through ``parser.error`` (usage, status 2)."""
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(
            "--device cuda: CUDA is not available on this machine (torch.cuda.is_available() is False); "
            "run with --device cpu for the CPU demo"
        )
    if args.plot and not matplotlib_available():
        parser.error(MATPLOTLIB_HINT)
    for path in outputs:
        folder = os.path.dirname(path) or "."
        if not os.path.isdir(folder):
            parser.error(f"cannot write {path}: the folder {folder} does not exist")


def cpu_note(what: str, seconds: float) -> None:
    """The first line of a CPU run: what its numbers are (and are not) about, and how long it takes."""
    print(
        f"# note: running on the CPU, {what} is a short demo of the CPU (PyTorch) paths at small sizes (about "
        f"{seconds:.0f} s in all with the default rows). The GPU kernels are the point of this package: run on a "
        "CUDA GPU for the real tables (results from an H100 are in benchmarks/results/).",
        flush=True,
    )


@functools.lru_cache(maxsize=1)
def _tqdm():
    """tqdm's class where it is importable and stderr is a terminal (its bar redraws in place), else None."""
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


def progress(items: Sequence, what: str, label: Callable[[object], str]) -> Iterator:
    """Yields ``items``, reporting each on stderr as it starts: a tqdm bar where tqdm is importable and stderr
    a terminal, else a line "[3/18] ctc 150x8x28x150 ... (4.2 s elapsed)"; then the total time."""
    start = time.perf_counter()
    tqdm = _tqdm()
    if tqdm is not None:
        bar = tqdm(items, desc=what, unit="row", file=sys.stderr, leave=False, dynamic_ncols=True)
        for item in bar:
            bar.set_postfix_str(label(item))
            yield item
        bar.close()
    else:
        for i, item in enumerate(items, 1):
            print(
                f"[{i}/{len(items)}] {what} {label(item)} ... ({time.perf_counter() - start:.1f} s elapsed)",
                file=sys.stderr,
                flush=True,
            )
            yield item
    print(f"{what}: {len(items)} rows in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)


def emit(line: str) -> None:
    """Print a table line to stdout (clearing a tqdm bar first, which would otherwise share its terminal line)."""
    tqdm = _tqdm()
    if tqdm is None:
        print(line, flush=True)
        return
    with tqdm.external_write_mode(file=sys.stdout):
        print(line, flush=True)


def print_legend(columns: Iterable[tuple[str, str]], cells: str) -> None:
    """The lines between a table's title and its column names: each column and its unit, then what the cells
    without a number ("-", "n/a") mean."""
    columns = list(columns)
    width = max(len(name) for name, _ in columns)
    for name, text in columns:
        print(f"#   {name:>{width}}: {text}")
    print(f"#   {'cells':>{width}}: {cells}", flush=True)


def fmt_num(value: float | None, spec: str, width: int, suffix: str = "") -> str:
    """A table cell: ``value`` formatted with ``spec`` (and ``suffix``), or - where there is none (None, NaN)."""
    if value is None or not math.isfinite(value):
        return f"{'-':>{width}}"
    return f"{format(value, spec) + suffix:>{width}}"


def device_name(env: dict, device: torch.device) -> str:
    return env["device"] if device.type == "cuda" else "CPU"


def plot_series(
    path: str,
    labels: Sequence[str],
    series: dict[str, Sequence[float | None]],
    title: str,
    ylabel: str,
    xlabel: str = "",
    lines: Sequence[tuple[float, str]] = ((1.0, "1.0: as fast as the peer"),),
    empty_note: str = "no value to plot",
) -> None:
    """A PNG of one group of bars per row (``labels`` on the x axis), one bar per series (log scale; no bar where
    a value is missing), with horizontal reference ``lines``; prints "wrote PATH"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, ax = plt.subplots(figsize=(max(6.0, len(labels) * 0.55 + 2), 5))
    width = 0.8 / max(1, len(series))
    xs = range(len(labels))
    ys = [y for y, _ in lines]
    for k, (name, values) in enumerate(series.items()):
        offset = (k - (len(series) - 1) / 2) * width
        pts = [(i + offset, v) for i, v in zip(xs, values, strict=True) if v is not None and math.isfinite(v) and v > 0]
        if pts:
            ax.bar([p[0] for p in pts], [p[1] for p in pts], width=width, label=name)
            ys += [p[1] for p in pts]
    for k, (y, text) in enumerate(lines):
        ax.axhline(y, color="k", lw=0.8, ls=("-", "--", ":")[k % 3], label=text)
    if len(ys) == len(lines):
        ax.text(0.5, 0.8, empty_note, transform=ax.transAxes, ha="center", va="center")
    ax.set_yscale("log")
    lo, hi = min(ys, default=0.5), max(ys, default=2.0)
    ax.set_ylim(lo / 1.5, hi * 1.5)  # room above and below the bars and the reference lines alike
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    # minor ticks labelled only within a decade or so, where there may be no major tick at all
    ax.yaxis.set_minor_formatter(plain if hi / lo < 20 else NullFormatter())
    ax.set_xticks(list(xs), labels, rotation=90 if max(map(len, labels), default=0) > 6 else 0, fontsize=7)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.set_ylabel(ylabel)
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}", flush=True)


def plot_title(what: str, env: dict, device: torch.device) -> str:
    return f"{what}\n{device_name(env, device)}, {env['date'][:10]}"
