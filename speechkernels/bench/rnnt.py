"""RNN-T loss benchmark: forward+backward from logits, against torchaudio (and warp-rnnt when importable).

Configurations: warp-rnnt's benchmark table, (T, U, V) in {(150, 40, 28), (150, 20, 5000), (1500, 300, 50)}
where U counts the blank row (U - 1 labels per sample, logits [N, T, U, V]), N in {1, 16, 32, 64, 128}; every
sample uses the whole lattice. Times are medians of CUDA-event-timed calls after warm-up, the implementations
taking turns call by call; memory is the peak allocated above what existed before the call ("reuse": with
reuse_logits_for_grad=True; the JSON has the requested bytes too). The error columns compare against the float64
reference: the loss on every row (sample by sample), the gradient where it fits.
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable

import torch

import speechkernels as sk
from speechkernels.rnnt.reference import rnnt_forward_backward_reference

from .common import (
    add_common_arguments,
    emit,
    environment,
    fmt_mb,
    fmt_ms,
    fmt_num,
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
    time_forward_backward,
    time_graphed_step,
    write_json,
)

SHAPES = [(150, 40, 28), (150, 20, 5000), (1500, 300, 50)]
ROWS = [(T, U, V, N) for T, U, V in SHAPES for N in (1, 16, 32, 64, 128)]
CPU_DEMO = [(50, 10, 28, 2), (50, 10, 500, 2)]
PEERS = ("torchaudio", "warp_rnnt", "warp_rnnt_gather")
GRAD_CHECK_LIMIT = 2**26  # logits elements up to which the float64 gradient is compared too
CPU_SECONDS = 1  # the CPU demo's rows with the default options, start-up not included
LEGEND = [
    ("T U V N", "frames, label positions with the blank row (U - 1 labels), vocabulary (blank 0), batch"),
    ("sk ms", "median ms of one forward+backward from float32 logits [N, T, U, V]: ours"),
    ("taudio, warp", "the same, torchaudio's rnnt_loss and warp-rnnt (the faster of its two modes)"),
    ("x best", "speed-up of ours over the fastest peer (>1: ours is faster)"),
    ("MB sk, MB ta", "peak extra GPU memory of one step in MiB, ours and torchaudio"),
    ("reuse", "the same for ours with reuse_logits_for_grad=True (the gradient written over the logits)"),
    ("loss err", "max relative error of our per-sample losses against the float64 reference"),
    ("grad err", "max absolute error of our gradient against the float64 reference (rows up to 2^26 logits)"),
    ("graph", "with --graph on a GPU: our step captured in a CUDA graph, ms and speed-up over the peers' eager steps"),
]
CELLS = (
    "-: no value (no peer ran, memory on a CPU, errors with --no-error or the row too large for the float64 "
    "gradient); n/a: the peer is not installed, or not run on rows of 2^31 logits or more"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(
        p,
        parse_rows,
        "TxUxVxN (frames, label positions with the blank row, vocabulary, batch), e.g. 150x40x28x128",
        "the speed-up over the fastest peer per row",
    )
    p.add_argument("--reps", type=positive_int, default=20, help="timed calls per implementation (default 20)")
    p.add_argument("--no-error", action="store_true", help="skip the float64 reference comparison")
    p.add_argument("--graph", action="store_true", help="also time our step captured in a CUDA graph (GPU)")


def parse_rows(text: str) -> list[tuple[int, int, int, int]]:
    """--rows: comma-separated TxUxVxN as [(T, U, V, N)], or argparse's ArgumentTypeError naming the form."""
    rows = []
    for item in split_rows(text):
        T, U, V, N = parse_shape(item, "TxUxVxN", (4,), "150x40x28x16")
        if V < 2:
            raise argparse.ArgumentTypeError(f"{item!r}: V={V} leaves no token for the labels (the blank is 0)")
        rows.append((T, U, V, N))
    return list(dict.fromkeys(rows))


def make_inputs(T: int, U: int, V: int, N: int, device: torch.device, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed * 7919 + T * 31 + U * 17 + V * 7 + N)
    logits = torch.randn(N, T, U, V, device=device, generator=g)
    targets = torch.randint(1, V, (N, U - 1), device=device, generator=g, dtype=torch.int32)
    il = torch.full((N,), T, dtype=torch.int32, device=device)
    tl = torch.full((N,), U - 1, dtype=torch.int32, device=device)
    return logits, targets, il, tl


def implementations(logits, targets, il, tl) -> dict[str, Callable[[torch.Tensor], torch.Tensor] | None]:
    """name -> function from logits to the mean loss (None where the peer cannot run the row). blank = 0."""
    # peers are not run past 2^31 logits: torchaudio is reported to fault there with an illegal memory access
    # (which would poison the CUDA context for every row after it), warp-rnnt to return wrong losses
    fits = logits.numel() < 2**31
    impls: dict[str, Callable | None] = {
        "sk": lambda v: sk.rnnt_loss(v, targets, il, tl, blank=0),
    }
    try:
        import torchaudio.functional as taf

        impls["torchaudio"] = (lambda v: taf.rnnt_loss(v, targets, il, tl, blank=0)) if fits else None
    except ImportError:
        pass
    try:
        import warp_rnnt

        # both of its modes: log-probs over the whole vocabulary, and gathered to (blank, label) first
        def warp(v, gather):
            lp = v.log_softmax(-1)
            return warp_rnnt.rnnt_loss(lp, targets, il, tl, blank=0, reduction="mean", gather=gather)

        for name, gather in (("warp_rnnt", False), ("warp_rnnt_gather", True)):
            impls[name] = functools.partial(warp, gather=gather) if fits else None
    except ImportError:
        pass
    return impls


def reference_errors(fn, logits, targets, il, tl) -> tuple[float, float]:
    """Max relative loss error against float64 (sample by sample) and, for small rows, max absolute gradient
    error of the batch-mean loss."""
    N = logits.shape[0]
    per_sample = torch.empty(N, dtype=torch.float64, device=logits.device)
    chunk = max(1, int(2**27 // max(1, logits[0].numel())))
    for n0 in range(0, N, chunk):
        sl = slice(n0, n0 + chunk)
        per_sample[sl], _ = rnnt_forward_backward_reference(logits[sl], targets[sl], il[sl], tl[sl], 0, need_grad=False)
    ours = sk.rnnt_loss(logits, targets, il, tl, blank=0, reduction="none")
    rel = ((ours.double() - per_sample).abs() / per_sample.abs()).max().item()
    if logits.numel() > GRAD_CHECK_LIMIT:
        return rel, math.nan
    v = logits.detach().clone().requires_grad_()
    fn(v).backward()
    _, ref_grad = rnnt_forward_backward_reference(logits, targets, il, tl, 0)
    return rel, (v.grad.double() - ref_grad / N).abs().max().item()


def reuse_memory(logits, targets, il, tl, device) -> dict[str, int] | None:
    """Peak extra GPU memory of a forward+backward with reuse_logits_for_grad=True, on a copy of the logits
    (consumed; not counted). The gradient is taken with torch.autograd.grad, as it flows into the layer that made
    the logits in training: a leaf's .grad would be a copy (autograd does not store a leaf's own storage as its
    gradient)."""
    if device.type != "cuda":
        return None
    v = logits.detach().clone().requires_grad_()
    out = []

    def step():
        loss = sk.rnnt_loss(v, targets, il, tl, blank=0, reuse_logits_for_grad=True)
        out.append(torch.autograd.grad(loss, v)[0])

    mem = peak_extra_memory(step, device)
    assert out[0].data_ptr() == v.data_ptr()  # the gradient is in the logits' storage
    return mem


def run(args) -> int:
    device = resolve_device(args)
    rows = args.rows or (ROWS if device.type == "cuda" else CPU_DEMO)
    env = environment(device)
    print_title("RNN-T loss, forward+backward from logits", env, args.reps)
    print_legend(LEGEND, CELLS)
    print(
        f"{'T':>5} {'U':>4} {'V':>5} {'N':>4} | {'sk ms':>8} {'taudio':>8} {'warp':>8} | {'x best':>6} | "
        f"{'MB sk':>8} {'reuse':>6} {'MB ta':>8} | {'loss err':>8} {'grad err':>8}",
        flush=True,
    )
    results = []
    for T, U, V, N in progress(rows, "rnnt", lambda r: "x".join(map(str, r))):
        logits, targets, il, tl = make_inputs(T, U, V, N, device)
        row = {
            "T": T,
            "U": U,
            "V": V,
            "N": N,
            "logits_bytes": logits.numel() * logits.element_size(),
            "cells": N * T * U,
        }
        impls = implementations(logits, targets, il, tl)
        row.update(time_forward_backward(impls, logits, device, reps=args.reps, warmup=3))
        reuse = reuse_memory(logits, targets, il, tl, device) or {}
        row["sk"]["reuse_peak_extra_bytes"] = reuse.get("allocated")
        row["sk"]["reuse_peak_extra_requested_bytes"] = reuse.get("requested")
        if not args.no_error:
            row["sk"]["loss_rel_err"], row["sk"]["grad_abs_err"] = reference_errors(
                impls["sk"], logits, targets, il, tl
            )
        peers = [row[p]["ms"] for p in PEERS if row.get(p)]
        row["speedup"] = min(peers) / row["sk"]["ms"] if peers else None
        if args.graph and device.type == "cuda":
            # our step captured whole (validate=False: no host read), against the peers' eager steps
            row["sk_graph"] = time_graphed_step(
                lambda v, t=targets, i=il, n=tl: sk.rnnt_loss(v, t, i, n, blank=0, validate=False),
                logits,
                device,
                args.reps,
            )
            row["speedup_graph"] = min(peers) / row["sk_graph"]["ms"] if peers else None
        results.append(row)
        print_row(row)
        del logits
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.json:
        write_json(args.json, {"benchmark": "rnnt", "environment": env, "rows": results})
    if args.plot:
        plot(results, args.plot, plot_title("RNN-T loss, forward+backward from logits", env, device))
    return 0


def plot(results: list[dict], path: str, title: str) -> None:
    """Speed-up over the fastest peer per row, eager and (where the run measured it) in a CUDA graph."""
    labels = [f"{r['T']}x{r['U']}x{r['V']}\nN={r['N']}" for r in results]
    series = {"ours, eager": [r.get("speedup") for r in results]}
    if any("speedup_graph" in r for r in results):
        series["ours in a CUDA graph"] = [r.get("speedup_graph") for r in results]
    plot_series(
        path,
        labels,
        series,
        title,
        "speed-up over the fastest peer (eager)",
        "TxUxV, batch N",
        empty_note="no peer ran (torchaudio and warp-rnnt not installed)",
    )


def print_row(row: dict) -> None:
    def ms(name):
        return fmt_ms(row.get(name))

    def mb(name):
        return fmt_mb(row.get(name))

    warp = [row[p] for p in ("warp_rnnt", "warp_rnnt_gather") if row.get(p)]
    warp_best = min(warp, key=lambda e: e["ms"]) if warp else None
    r = row["sk"].get("reuse_peak_extra_bytes")
    reuse = fmt_num(None if r is None else r / 2**20, ".0f", 6)
    err = row["sk"].get("loss_rel_err"), row["sk"].get("grad_abs_err")
    g = row.get("sk_graph")
    graph = f" | graph {g['ms']:7.3f} ms, {fmt_num(row['speedup_graph'], '.2f', 5, 'x')}" if g else ""
    emit(
        f"{row['T']:5d} {row['U']:4d} {row['V']:5d} {row['N']:4d} | {ms('sk')} {ms('torchaudio')} "
        f"{fmt_ms(warp_best)} | {fmt_num(row['speedup'], '.2f', 6)} | {mb('sk')} {reuse} {mb('torchaudio')} | "
        f"{fmt_num(err[0], '.1e', 8)} {fmt_num(err[1], '.1e', 8)}" + graph
    )
