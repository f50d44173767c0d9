"""Joint network + RNN-T loss benchmark: a training step of a transducer's joint (encoder and predictor
projections, relu, output layer, loss), forward and backward.

Implementations: "fused" (``speechkernels.RNNTJointLoss``: the logits never exist), "sk" (the same layers in
PyTorch, materialising the [N, T, U+1, V] logits, then ``speechkernels.rnnt_loss``) and "torchaudio" (the same,
then ``torchaudio.functional.rnnt_loss``, which takes float32 and float16 logits only: its 16-bit column runs
under float16 autocast). Rows (N, T, U, V), joint 512 -> 640 <- 640, relu, blank = V - 1: NeMo's Flash RNN-T
benchmark (32, 400, 128, 1025), a large vocabulary with ragged lengths (16, 250-400, 40-100, 8193), (64, 200,
60, 513) and long-form (8, 1500, 300, 1025). Each in float32 and under bfloat16 autocast.

Times are medians of CUDA-event-timed steps after warm-up, the implementations taking turns; memory is the peak
allocated above what existed before the step (parameters, inputs and their gradients of an earlier step
excluded). TFLOP/s counts the joint's three products over the cells with edges (2 * cells * H * V each: the
logits, and the two of their gradient), the work of any implementation that does not recompute; the fused one
does more (it makes the logits again in the backward). Errors are against float64 (the same parameters and
inputs the kernels see: the projected encoder and predictor outputs and the output layer in the step's dtype)
on the rows small enough: the loss's relative error (sample by sample), and for each of the four gradients its
relative error in norm and its cosine similarity.
"""

from __future__ import annotations

import argparse

import torch

import speechkernels as sk

from .common import (
    add_common_arguments,
    comma_choices,
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
    progress,
    resolve_device,
    split_rows,
    time_forward_backward,
    write_json,
)

ENC_DIM, PRED_DIM, JOINT_DIM = 512, 640, 640
ROWS = [(32, 400, 128, 1025), (16, 400, 100, 8193), (64, 200, 60, 513), (8, 1500, 300, 1025)]
RAGGED = {(16, 400, 100, 8193): ((250, 400), (40, 100))}
CPU_DEMO = [(2, 30, 8, 33)]
ERROR_LIMIT = 2**31  # cells x V up to which the float64 errors are computed
# torchaudio's rnnt_loss ends in an illegal memory access on the H100 at 16 x 400 x 101 x 8193 (float32 and
# float16) and 8 x 1500 x 301 x 1025 logits (5.3e9, 3.7e9 elements): not run from 2^31 elements on
TORCHAUDIO_LIMIT = 2**31
DTYPES = ("float32", "bfloat16")
IMPLS = ("fused", "sk", "torchaudio")
CPU_SECONDS = 2  # the CPU demo's rows with the default options, start-up not included
LEGEND = [
    ("N T U V", "batch, frames, labels, vocabulary (blank V - 1); ragged rows show the longest lengths"),
    ("dtype", "float32, or bfloat16 autocast (torchaudio under float16 autocast: it takes no bfloat16)"),
    ("fused", "median ms of one training step of the joint and the loss: RNNTJointLoss (the logits never exist)"),
    ("sk, taudio", "the same, the joint in PyTorch (logits made) then our rnnt_loss, or torchaudio's"),
    ("x best", "speed-up of fused over the faster of sk and taudio (>1: fused is faster)"),
    ("MB ...", "peak extra GPU memory of one step in MiB, per implementation"),
    ("TFLOP/s", "the joint's three products (2 * cells * H * V flop each) per second of the fused step"),
    ("loss err", "fused: max relative error of the per-sample losses against float64 (rows small enough)"),
    ("grad err, min cos", "fused: largest relative error in norm and smallest cosine of its four gradients"),
]
CELLS = (
    "-: no value (no peer ran, memory on a CPU, errors with --no-error or the row too large); n/a: not run "
    "(torchaudio missing, or skipped on logits of 2^31 elements or more; not in --impls; out of memory)"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(
        p,
        parse_rows,
        "NxTxUxV (batch, frames, labels, vocabulary), e.g. 32x400x128x1025",
        "the fused step's speed-up over the fastest unfused one per row",
    )
    p.add_argument(
        "--dtypes",
        type=comma_choices(DTYPES),
        default=list(DTYPES),
        help="float32 and/or bfloat16 (autocast), comma-separated (default both)",
    )
    p.add_argument(
        "--impls",
        type=comma_choices(IMPLS),
        default=list(IMPLS),
        help=f"which implementations to run, comma-separated from {','.join(IMPLS)} (default all)",
    )
    p.add_argument("--reps", type=positive_int, default=10, help="timed steps per implementation (default 10)")
    p.add_argument("--no-error", action="store_true", help="skip the float64 comparison")


def parse_rows(text: str) -> list[tuple[int, int, int, int]]:
    """--rows: comma-separated NxTxUxV as [(N, T, U, V)], or argparse's ArgumentTypeError naming the form."""
    rows = []
    for item in split_rows(text):
        N, T, U, V = parse_shape(item, "NxTxUxV", (4,), "2x30x8x33")
        if V < 2:
            raise argparse.ArgumentTypeError(f"{item!r}: V={V} leaves no token for the labels (the blank is V - 1)")
        rows.append((N, T, U, V))
    return list(dict.fromkeys(rows))


def make_inputs(N: int, T: int, U: int, V: int, device: torch.device, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed * 7919 + N * 31 + T * 17 + U * 7 + V)
    enc = torch.randn(N, T, ENC_DIM, generator=g)
    pred = torch.randn(N, U + 1, PRED_DIM, generator=g)
    targets = torch.randint(0, V - 1, (N, U), generator=g, dtype=torch.int32)
    (t_lo, t_hi), (u_lo, u_hi) = RAGGED.get((N, T, U, V), ((T, T), (U, U)))
    il = torch.randint(t_lo, t_hi + 1, (N,), generator=g, dtype=torch.int32)
    tl = torch.randint(u_lo, u_hi + 1, (N,), generator=g, dtype=torch.int32)
    il[0], tl[0] = t_hi, u_hi  # the padded shapes are used
    return [x.to(device) for x in (enc, pred, targets, il, tl)]


def make_module(V: int, device: torch.device, seed: int = 0) -> sk.RNNTJointLoss:
    torch.manual_seed(seed)
    return sk.RNNTJointLoss(ENC_DIM, PRED_DIM, JOINT_DIM, V, blank=V - 1).to(device)


def unfused(module: sk.RNNTJointLoss, enc, pred, targets, il, tl, loss: str) -> torch.Tensor:
    """The same layers in PyTorch: the logits materialised, then a loss on them."""
    logits = module.joint(enc, pred)
    V = logits.shape[-1]
    if loss == "sk":
        return sk.rnnt_loss(logits, targets, il, tl, blank=V - 1)
    import torchaudio.functional as taf

    return taf.rnnt_loss(logits, targets, il, tl, blank=V - 1, reduction="mean")


def implementations(module, names: list[str]) -> dict:
    impls = {}
    if "fused" in names:
        impls["fused"] = (lambda e, p, tg, il, tl: module(e, p, tg, il, tl), None)
    if "sk" in names:
        impls["sk"] = (lambda e, p, tg, il, tl: unfused(module, e, p, tg, il, tl, "sk"), None)
    if "torchaudio" in names:
        try:
            import torchaudio.functional  # noqa: F401

            impls["torchaudio"] = (
                lambda e, p, tg, il, tl: unfused(module, e, p, tg, il, tl, "torchaudio"),
                torch.float16,
            )
        except ImportError:
            pass
    return impls


def step_fn(fn, module, inputs, autocast_dtype, device):
    """fn as a function of the encoder outputs (the leaf time_forward_backward makes), with the parameters'
    gradients dropped before each step."""
    _, pred, targets, il, tl = inputs

    def f(enc):
        for p in module.parameters():
            p.grad = None
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            return fn(enc, pred, targets, il, tl)

    return f


def float64_errors(module, inputs, dtype, device) -> dict:
    """The fused loss and its gradients against the float64 reference path, on the inputs the kernels see: the
    projected encoder and predictor outputs and the output layer, in the step's dtype (bfloat16 under autocast),
    then made float64 for the reference."""
    enc, pred, targets, il, tl = inputs
    dt = torch.float32 if dtype == "float32" else torch.bfloat16
    with torch.no_grad():
        xs = [module.enc(enc).to(dt), module.pred(pred).to(dt), module.out.weight.to(dt), module.out.bias.to(dt)]
    blank = module.out.weight.shape[0] - 1

    def run(tensors):
        leaves = [x.detach().clone().requires_grad_() for x in tensors]
        loss = sk.rnnt_joint_loss(*leaves, targets, il, tl, blank=blank, reduction="none")
        grads = torch.autograd.grad(loss.sum(), leaves)
        return loss.detach().double(), [g.double() for g in grads]

    loss, g = run(xs)
    ref_loss, ref_g = run([x.double() for x in xs])
    out = {"loss_rel_err": ((loss - ref_loss).abs() / ref_loss.abs()).max().item(), "grads": {}}
    for name, a, b in zip(("enc", "pred", "weight", "bias"), g, ref_g, strict=True):
        rel = ((a - b).norm() / b.norm()).item()
        cos = torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()
        out["grads"][name] = {"rel_err": rel, "cosine": cos}
    out["grad_rel_err_max"] = max(v["rel_err"] for v in out["grads"].values())
    out["grad_cosine_min"] = min(v["cosine"] for v in out["grads"].values())
    return out


def run(args) -> int:
    device = resolve_device(args)
    rows = args.rows or (ROWS if device.type == "cuda" else CPU_DEMO)
    dtypes = args.dtypes.split(",") if isinstance(args.dtypes, str) else args.dtypes
    env = environment(device)
    print(
        f"# joint network + RNN-T loss, training step (forward+backward), joint {ENC_DIM}->{JOINT_DIM}<-{PRED_DIM}"
        f" relu, {env['device']}, torch {env['torch']}, triton {env['triton']}, median of {args.reps}"
    )
    print_legend(LEGEND, CELLS)
    print(
        f"{'N':>3} {'T':>5} {'U':>4} {'V':>5} {'dtype':>8} | {'fused':>8} {'sk':>8} {'taudio':>8} | {'x best':>6} | "
        f"{'MB fused':>8} {'MB sk':>8} {'MB ta':>8} | {'TFLOP/s':>7} | {'loss err':>8} {'grad err':>8} "
        f"{'min cos':>8}",
        flush=True,
    )
    results = []
    for N, T, U, V in progress(rows, "joint", lambda r: "x".join(map(str, r))):
        inputs = make_inputs(N, T, U, V, device)
        module = make_module(V, device)
        il, tl = inputs[3].long(), inputs[4].long()
        cells = int((il * (tl + 1)).sum())
        flop = 3 * 2 * cells * JOINT_DIM * V
        for dtype in dtypes:
            row = {"N": N, "T": T, "U": U, "V": V, "H": JOINT_DIM, "dtype": dtype, "cells": cells, "joint_flop": flop}
            impls = {}
            names = list(args.impls.split(",") if isinstance(args.impls, str) else args.impls)
            if N * T * (U + 1) * V >= TORCHAUDIO_LIMIT and "torchaudio" in names:
                names.remove("torchaudio")
                row["torchaudio_skipped"] = "logits of 2^31 elements or more: torchaudio 2.11's loss faults on them"
            for name, (fn, half) in implementations(module, names).items():
                ac = None if dtype == "float32" else (half or torch.bfloat16)
                impls[name] = step_fn(fn, module, inputs, ac, device)
                row.setdefault("autocast", {})[name] = None if ac is None else str(ac).replace("torch.", "")
            row.update(safe_times(impls, inputs[0], device, args.reps))
            if row.get("fused"):
                row["fused"]["tflops"] = flop / row["fused"]["ms"] / 1e9
            peers = [row[p]["ms"] for p in ("sk", "torchaudio") if row.get(p)]
            row["speedup"] = min(peers) / row["fused"]["ms"] if peers and row.get("fused") else None
            if not args.no_error and "fused" in impls and cells * V <= ERROR_LIMIT:
                row["fused"].update(float64_errors(module, inputs, dtype, device))
            results.append(row)
            print_row(row)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if args.json:
        write_json(args.json, {"benchmark": "joint", "environment": env, "rows": results})
    if args.plot:
        plot(results, args.plot, plot_title("joint network + RNN-T loss, training step", env, device))
    return 0


def safe_times(impls, x, device, reps):
    """time_forward_backward, one implementation at a time where one runs out of memory (recorded as None)."""
    try:
        return time_forward_backward(impls, x, device, reps=reps, warmup=3)
    except torch.OutOfMemoryError:
        out = {}
        for name, fn in impls.items():
            torch.cuda.empty_cache()
            try:
                out.update(time_forward_backward({name: fn}, x, device, reps=reps, warmup=3))
            except torch.OutOfMemoryError:
                out[name] = None
        return out


def plot(results: list[dict], path: str, title: str) -> None:
    """The fused step's speed-up over the fastest unfused step per row (no bar where none ran)."""
    labels = [f"{r['N']}x{r['T']}x{r['U']}x{r['V']}\n{r['dtype']}" for r in results]
    plot_series(
        path,
        labels,
        {"fused against the fastest of sk, torchaudio": [r.get("speedup") for r in results]},
        title,
        "speed-up of the fused step",
        "NxTxUxV, dtype",
        lines=((1.0, "1.0: as fast as unfused"),),
        empty_note="no unfused step ran (see --impls)",
    )


def print_row(row: dict) -> None:
    f = row.get("fused") or {}
    err = f.get("loss_rel_err"), f.get("grad_rel_err_max"), f.get("grad_cosine_min")
    emit(
        f"{row['N']:3d} {row['T']:5d} {row['U']:4d} {row['V']:5d} {row['dtype']:>8} | {fmt_ms(row.get('fused'))} "
        f"{fmt_ms(row.get('sk'))} {fmt_ms(row.get('torchaudio'))} | {fmt_num(row['speedup'], '.2f', 6)} | "
        f"{fmt_mb(row.get('fused'))} {fmt_mb(row.get('sk'))} {fmt_mb(row.get('torchaudio'))} | "
        f"{fmt_num(f.get('tflops'), '.1f', 7)} | {fmt_num(err[0], '.1e', 8)} {fmt_num(err[1], '.1e', 8)} "
        f"{fmt_num(err[2], '.5f', 8)}"
    )
