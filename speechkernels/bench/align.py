"""CTC forced alignment: ``ctc_forced_align`` against torchaudio's ``forced_align`` (one utterance per call, as it
accepts), on the GPU and on the CPU.

Rows (N, T, C, S): N utterances of T frames, C classes (the blank 0), S labels each. Emissions are synthetic CTC
posteriors: a random alignment of the labels (each label 1-4 frames, the blanks spread between them, a blank between
repeated labels), logits N(0, 1) plus 4 on the aligned class, log-softmax: peaked like a trained model's, so that the
best path is clear. Times: the median of CUDA-event-timed calls after warm-up (perf_counter on the CPU), the whole
call (ours with its default validation, which reads the lengths and labels back; "unchecked": validate=False);
torchaudio aligns the batch one utterance after another. Memory: the peak allocated above what existed before the
call. Agreement: utterances whose path equals ours at every frame, against each torchaudio run.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch

import speechkernels as sk

from .common import (
    add_common_arguments,
    emit,
    environment,
    parse_shape,
    peak_extra_memory,
    plot_series,
    plot_title,
    positive_int,
    print_legend,
    print_title,
    progress,
    resolve_device,
    split_rows,
    times_ms,
    write_json,
)

ROWS = [(32, 1500, 1025, 120), (16, 3000, 32, 600), (1, 30000, 32, 6000), (64, 500, 5000, 60), (1, 180000, 32, 30000)]
CPU_DEMO = [(8, 300, 32, 40), (2, 2000, 32, 300)]
LONG = 10**9  # rows with N * T * S above this (the hour) run the CPU columns only with --cpu-long
CPU_SECONDS = 1  # the CPU demo's rows with the default options, start-up not included
LEGEND = [
    ("N T C S", "utterances, frames, classes (blank 0 among them), labels per utterance"),
    ("ours ms", "median ms of one ctc_forced_align call on the GPU (its default validation included)"),
    ("unchk ms", "the same with validate=False"),
    ("ta ms", "the same, torchaudio's forced_align, one utterance per call (it takes a batch of one)"),
    ("x", "ta ms / ours ms: our speed-up (>1: ours is faster); the second x: the same on the CPU"),
    ("ours MB, ta MB", "peak extra GPU memory of one call in MiB"),
    ("cpu ms, ta cpu", "median ms of the same calls on the CPU (--peer-reps calls)"),
    ("equal", "utterances whose path equals torchaudio's at every frame: on the GPU, on the CPU"),
]
CELLS = (
    "-: not run (GPU columns on a CPU run, torchaudio not installed, CPU columns skipped by --no-cpu or past "
    f"N*T*S={LONG:.0e} without --cpu-long)"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(
        p,
        parse_rows,
        "NxTxCxS (utterances, frames, classes, labels per utterance; N:T:C:S works too), e.g. 8x300x32x40",
        "our speed-up over torchaudio's forced_align per row, on the GPU and on the CPU",
    )
    p.add_argument("--reps", type=positive_int, default=20, help="timed calls of ours on the GPU (default 20)")
    p.add_argument(
        "--peer-reps", type=positive_int, default=3, help="timed calls of torchaudio, and of every CPU run (default 3)"
    )
    p.add_argument("--no-cpu", action="store_true", help="skip the CPU columns")
    p.add_argument("--cpu-long", action="store_true", help=f"CPU columns also for rows above N*T*S={LONG:.0e}")


def parse_rows(text: str) -> list[tuple[int, int, int, int]]:
    """--rows: comma-separated NxTxCxS (or N:T:C:S) as [(N, T, C, S)], or argparse's ArgumentTypeError naming
    the form."""
    rows = []
    for item in split_rows(text):
        N, T, C, S = parse_shape(item, "NxTxCxS", (4,), "8x300x32x40", seps="x:")
        if C < 2:
            raise argparse.ArgumentTypeError(f"{item!r}: C={C} leaves no class for the labels (the blank is 0)")
        if T < 2 * S - 1:
            raise argparse.ArgumentTypeError(
                f"{item!r}: T={T} frames cannot hold S={S} labels with a blank between repeated ones (T >= 2S - 1)"
            )
        rows.append((N, T, C, S))
    return list(dict.fromkeys(rows))


def make_inputs(N: int, T: int, C: int, S: int, device, seed: int = 0):
    """Synthetic CTC posteriors [N, T, C] float32 around a random alignment of S random labels in [1, C) per
    utterance, and the labels [N, S] int64."""
    rng = np.random.default_rng(seed * 7919 + N * 31 + T * 17 + C * 3 + S)
    labels = rng.integers(1, C, (N, S))
    truth = np.zeros((N, T), np.int64)
    for n in range(N):
        lab = labels[n]
        repeats = int((lab[1:] == lab[:-1]).sum())
        dur = np.ones(S, np.int64)
        spare = T - S - repeats
        extra = rng.multinomial(spare // 2, np.ones(S) / S) if S else np.zeros(0, np.int64)
        dur += np.minimum(extra, 3)
        blanks = T - int(dur.sum()) - repeats
        gaps = rng.multinomial(blanks, np.ones(S + 1) / (S + 1)) if S else np.array([T])
        gaps[1:S][lab[1:] == lab[:-1]] += 1
        t = 0
        for j in range(S):
            t += gaps[j]
            truth[n, t : t + dur[j]] = lab[j]
            t += dur[j]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, T, C, generator=g)
    x.scatter_add_(2, torch.from_numpy(truth)[:, :, None], torch.full((N, T, 1), 4.0))
    return x.log_softmax(-1).to(device), torch.from_numpy(labels).to(device)


def torchaudio_align():
    """torchaudio.functional.forced_align, or None where torchaudio (or its alignment op) is missing."""
    try:
        from torchaudio.functional import forced_align
    except Exception:  # noqa: BLE001 - any import failure means the peer is absent
        return None
    return forced_align


def one_by_one(forced_align, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """torchaudio's paths [N, T], one utterance per call (it takes a batch of one)."""
    return torch.cat([forced_align(x[n : n + 1], targets[n : n + 1], blank=0)[0] for n in range(x.shape[0])])


def agreement(x: torch.Tensor, ours: torch.Tensor, theirs: torch.Tensor) -> dict:
    """Utterances (and frames) where the two paths agree; where they differ, how much better ours scores in exact
    arithmetic (the sum of its log-probabilities in float64, less theirs): 0 or about a float32 rounding of the
    total means the two paths are equally good, and the float32 recursions broke the near-tie differently."""
    ours, theirs = ours.cpu(), theirs.cpu().to(torch.int64)
    same = ours == theirs
    equal = same.all(1)
    gaps = []
    for n in (~equal).nonzero()[:, 0].tolist():
        mine, other = (_path_score(x[n], path) for path in (ours[n], theirs[n]))
        gaps.append(
            {
                "utterance": n,
                "frames_differing": int((~same[n]).sum()),
                "ours_minus_theirs": mine - other,
                "ours_total": mine,
            }
        )
    frames = same.float().mean().item()
    return {"utterances_equal": int(equal.sum()), "utterances": len(same), "frames_equal": frames, "differing": gaps}


def _path_score(x: torch.Tensor, path: torch.Tensor) -> float:
    """The sum of a path's log-probabilities [T, C] -> float64 (frames marked -1 count nothing)."""
    picked = x.double().cpu().gather(1, path.clamp(min=0)[:, None])[:, 0]
    return picked[path >= 0].sum().item()


def timed(fn, device, reps: int, warmup: int) -> tuple[dict, object]:
    """The median time of fn() (and its minimum, and on a GPU the peak extra memory of one more call), and the last
    timed call's result."""
    result = []
    ms = times_ms(lambda: result.append(fn()), device, warmup=warmup, reps=reps)
    mem = peak_extra_memory(fn, device) or {}
    stats = {"ms": statistics.median(ms), "ms_min": min(ms), "reps": reps, "peak_extra_bytes": mem.get("allocated")}
    return stats, result[-1]


def measure(N: int, T: int, C: int, S: int, device, args, forced_align, cpu_ok: bool) -> dict:
    """One row: ours (and unchecked) and torchaudio on ``device`` if it is a GPU, and on the CPU if ``cpu_ok``."""
    x, targets = make_inputs(N, T, C, S, device)
    row = dict(N=N, T=T, C=C, S=S)
    ali = sk.ctc_forced_align(x, targets)[0]
    row["ours_found"] = int((ali >= 0).all(1).sum())
    if device.type == "cuda":
        row["ours"], _ = timed(lambda: sk.ctc_forced_align(x, targets), device, args.reps, 3)
        row["unchecked"], _ = timed(lambda: sk.ctc_forced_align(x, targets, validate=False), device, args.reps, 3)
        if forced_align is not None:
            row["torchaudio"], theirs = timed(lambda: one_by_one(forced_align, x, targets), device, args.peer_reps, 1)
            row["agree_torchaudio"] = agreement(x, ali, theirs)
    if cpu_ok:
        xc, tc = x.cpu(), targets.cpu()
        cpu = torch.device("cpu")
        row["ours_cpu"], (ali_cpu, _) = timed(lambda: sk.ctc_forced_align(xc, tc), cpu, args.peer_reps, 0)
        row["cpu_equals_gpu"] = bool(torch.equal(ali_cpu, ali.cpu()))
        if forced_align is not None:
            row["torchaudio_cpu"], theirs = timed(lambda: one_by_one(forced_align, xc, tc), cpu, args.peer_reps, 0)
            row["agree_torchaudio_cpu"] = agreement(xc, ali, theirs)
    return row


def run(args) -> int:
    device = resolve_device(args)
    env = environment(device)
    forced_align = torchaudio_align()
    rows = args.rows or (ROWS if device.type == "cuda" else CPU_DEMO)
    gpu = device.type == "cuda"
    print_title(
        "CTC forced alignment (ctc_forced_align vs torchaudio forced_align, one utterance per call)", env, args.reps
    )
    print_legend(LEGEND, CELLS)
    print(
        f"{'N':>3} {'T':>6} {'C':>5} {'S':>5} | {'ours ms':>8} {'unchk ms':>8} {'ta ms':>8} {'x':>6} | "
        f"{'ours MB':>8} {'ta MB':>7} | {'cpu ms':>8} {'ta cpu':>8} {'x':>5} | equal (ta gpu, ta cpu)",
        flush=True,
    )
    out = []
    for N, T, C, S in progress(rows, "align", lambda r: "x".join(map(str, r))):
        cpu_ok = not args.no_cpu and (args.cpu_long or N * T * S <= LONG or not gpu)
        out.append(measure(N, T, C, S, device, args, forced_align, cpu_ok))
        _print_row(out[-1])
    if args.json:
        write_json(args.json, {"benchmark": "align", "environment": env, "rows": out})
    if args.plot:
        labels = [f"{r['N']}x{r['T']}x{r['C']}\nS={r['S']}" for r in out]
        series = {
            "GPU: torchaudio ms / ours ms": [_over(r, "torchaudio", "ours") for r in out],
            "CPU: torchaudio ms / ours ms": [_over(r, "torchaudio_cpu", "ours_cpu") for r in out],
        }
        plot_series(
            args.plot,
            labels,
            series,
            plot_title("CTC forced alignment against torchaudio", env, device),
            "speed-up over torchaudio's forced_align",
            "NxTxC, S labels",
            lines=((1.0, "1.0: as fast"),),
            empty_note="torchaudio did not run (not installed?)",
        )
    return 0


def _over(row: dict, a: str, b: str) -> float | None:
    """row[a]'s time over row[b]'s, or None where either did not run."""
    return row[a]["ms"] / row[b]["ms"] if row.get(a) and row.get(b) else None


def _print_row(row: dict) -> None:
    def ms(key):
        return f"{row[key]['ms']:8.2f}" if row.get(key) else f"{'-':>8}"

    def mb(key):
        b = (row.get(key) or {}).get("peak_extra_bytes")
        return f"{b / 2**20:8.0f}" if b is not None else f"{'-':>8}"

    def ratio(a, b):
        return f"{row[b]['ms'] / row[a]['ms']:6.1f}" if row.get(a) and row.get(b) else f"{'-':>6}"

    def eq(key):
        a = row.get(key)
        return f"{a['utterances_equal']}/{a['utterances']}" if a else "-"

    emit(
        f"{row['N']:>3} {row['T']:>6} {row['C']:>5} {row['S']:>5} | {ms('ours')} {ms('unchecked')} "
        f"{ms('torchaudio')} {ratio('ours', 'torchaudio')} | {mb('ours')} {mb('torchaudio')[1:]} | {ms('ours_cpu')} "
        f"{ms('torchaudio_cpu')} {ratio('ours_cpu', 'torchaudio_cpu')[1:]} | "
        f"{eq('agree_torchaudio')}, {eq('agree_torchaudio_cpu')}"
    )
