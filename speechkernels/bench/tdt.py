"""TDT and multi-blank transducer losses: forward+backward from logits, against our own rnnt_loss at the same
(N, T, U, V) (the token logits alone).

Rows (N, T, U, V, D): (32, 400, 128, 1025, 5), (16, 250-400 ragged, 40-100 ragged, 8193, 5), (8, 1500, 300, 1025,
5) with durations [0, 1, 2, 3, 4], and (4, 1200, 200, 513, 9) with durations [0, 1, ..., 8]; multi-blank (32, 400,
128, 1025 + 3 big blanks of durations [2, 4, 8]). U counts the labels (logits [N, T, U + 1, V + D]). Times are
medians of CUDA-event-timed calls after warm-up, the losses taking turns call by call, rnnt_loss on a contiguous copy
of the token logits (* where no copy fits: on the slice of ours); memory is the peak allocated above what existed
before the call. The error columns (small CPU rows only) compare with the float64 reference.

Then the fused joint (``--joint``: this table only): a TDT model's joint training step (``TDTJointLoss``, joint 512 ->
640 <- 640, relu, an output layer of V + D rows) against the RNN-T one at the same (N, T, U, V) (``RNNTJointLoss``,
V rows) and against the TDT joint with its logits made (``module.joint`` then ``tdt_loss``), float32 and under
bfloat16 autocast, as ``bench joint`` times its rows.
"""

from __future__ import annotations

import argparse

import torch

import speechkernels as sk
from speechkernels.tdt.reference import multiblank_rnnt_loss_reference, tdt_loss_reference

from . import joint as joint_bench
from .common import (
    add_common_arguments,
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
    write_json,
)

DURATIONS = [0, 1, 2, 3, 4]
BIG_BLANKS = [2, 4, 8]
# (kind, N, (T_min, T), (U_min, U), V, extra columns)
ROWS = [
    ("tdt", 32, (400, 400), (128, 128), 1025, 5),
    ("tdt", 16, (250, 400), (40, 100), 8193, 5),
    ("tdt", 8, (1500, 1500), (300, 300), 1025, 5),
    ("tdt", 4, (1200, 1200), (200, 200), 513, 9),  # durations 0..8: the recursion's cost grows with D
    ("multiblank", 32, (400, 400), (128, 128), 1025, 3),
]
CPU_DEMO = [("tdt", 2, (20, 20), (5, 5), 28, 5), ("multiblank", 2, (20, 20), (5, 5), 28, 3)]
JOINT_ROWS = [(32, 400, 128, 1025), (16, 400, 100, 8193)]  # (N, T, U, V), durations DURATIONS
JOINT_CPU_DEMO = [(2, 30, 8, 33)]
KINDS = {"tdt": len(DURATIONS), "multiblank": len(BIG_BLANKS)}  # kind -> extra columns (by default)
CPU_SECONDS = 2  # the CPU demo's rows with the default options, start-up not included
LEGEND = [
    ("kind N T U", "tdt or multiblank, batch, frames, labels (lo-hi: ragged lengths, the longest spans the tensor)"),
    (
        "V X",
        f"tokens (blank V - 1) and extra columns: TDT's X durations 0..X-1 (default {DURATIONS}), or big blanks "
        f"{BIG_BLANKS}",
    ),
    (
        "ours ms",
        "median ms of one forward+backward from the logits [N, T, U + 1, V + X]: tdt_loss or multiblank_rnnt_loss",
    ),
    (
        "rnnt ms",
        "the same, our rnnt_loss on the token logits alone (*: on a slice of ours, not on a contiguous "
        "copy: on a CPU, or no room for one on the GPU)",
    ),
    ("ratio", "ours ms / rnnt ms: the cost of the durations or big blanks (>1: ours is slower)"),
    ("MB ours, MB rnnt", "peak extra GPU memory of one call in MiB"),
    (
        "loss err, grad err",
        "relative error of the loss and max absolute error of the gradient against float64 (CPU runs only)",
    ),
]
CELLS = "-: no value (memory on a CPU, errors on a GPU); n/a: the loss could not run the row"
JOINT_LEGEND = [
    ("N T U V", "batch, frames, labels, tokens (blank V - 1)"),
    ("dtype", "float32, or bfloat16 autocast"),
    ("tdt ms", f"median ms of a training step: TDTJointLoss (durations {DURATIONS}), the logits never made"),
    ("rnnt ms", "the same, RNNTJointLoss at the same N, T, U, V"),
    ("ratio", "tdt ms / rnnt ms: the cost of the durations (>1: TDT is slower)"),
    ("unfused", "the same, the TDT joint with its logits made (module.joint) then tdt_loss"),
    ("MB ...", "peak extra GPU memory of one step in MiB, per implementation"),
]
JOINT_CELLS = "-: no value (memory on a CPU, or no ratio where one side ran out of memory); n/a: out of memory"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(
        p,
        parse_rows,
        "[KIND:]NxTxUxV[+D], KIND tdt (default) or multiblank, T and U either a length "
        "or a range lo-hi of ragged lengths, +D: a TDT row's D durations 0..D-1 (default 5), e.g. "
        "tdt:2x20x5x28,tdt:4x1200x200x513+9,multiblank:16x250-400x40-100x8193 (with --joint: NxTxUxV)",
        "the speed-up of rnnt_loss's time over ours per row (below 1: ours is slower)",
    )
    p.add_argument("--reps", type=positive_int, default=20, help="timed calls per loss (default 20)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--joint", action="store_true", help="the fused joint's table (TDTJointLoss) instead")


def parse_rows(text: str) -> list[tuple]:
    """--rows: comma-separated [KIND:]NxTxUxV[+D] (T, U: a length or lo-hi; +D: a TDT row's durations 0..D-1) as
    [(kind, N, (T_min, T), (U_min, U), V, X)], or argparse's ArgumentTypeError naming the form."""
    form = "[KIND:]NxTxUxV[+D] (T and U a length or lo-hi, +D a TDT row's durations)"
    example = "tdt:2x20x5x28, tdt:4x1200x200x513+9 or multiblank:16x250-400x40-100x8193"
    rows = []
    for item in split_rows(text):
        kind, _, shape = item.rpartition(":")
        kind = kind or "tdt"
        if kind not in KINDS:
            raise argparse.ArgumentTypeError(f"{item!r}: kind {kind!r} is not one of {', '.join(KINDS)}")
        shape, plus, durations = shape.partition("+")
        parts = shape.split("x")
        if len(parts) != 4:
            raise argparse.ArgumentTypeError(f"{item!r} is not {form}, e.g. {example}")
        X = KINDS[kind]
        if plus:
            if kind != "tdt":
                raise argparse.ArgumentTypeError(f"{item!r}: +D (the durations) is a TDT row's")
            (X,) = parse_shape(durations, form, (1,), example)
        N, V = parse_shape(f"{parts[0]}x{parts[3]}", form, (2,), example)
        # a single length n stands for the range n-n
        lo_T, T = (parse_shape(parts[1], form, (1, 2), example, seps="-") * 2)[-2:]
        lo_U, U = (parse_shape(parts[2], form, (1, 2), example, seps="-") * 2)[-2:]
        if lo_T > T or lo_U > U:
            raise argparse.ArgumentTypeError(f"{item!r}: a range lo-hi needs lo <= hi")
        if V < 2:
            raise argparse.ArgumentTypeError(f"{item!r}: V={V} leaves no token for the labels (the blank is V - 1)")
        rows.append((kind, N, (lo_T, T), (lo_U, U), V, X))
    return list(dict.fromkeys(rows))


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--joint takes plain NxTxUxV rows (TDT, every sample of full length)."""
    if args.joint and args.rows:
        for row in args.rows:
            kind, _, T_range, U_range, _, X = row
            if kind != "tdt" or T_range[0] != T_range[1] or U_range[0] != U_range[1] or X != len(DURATIONS):
                parser.error(
                    f"--joint --rows: {_label(row)}: the joint's table takes NxTxUxV rows only (TDT, no "
                    "lo-hi ranges, no +D), e.g. 2x30x8x33"
                )


def make_inputs(kind, N, T_range, U_range, V, X, device, dtype, seed=0):
    """Logits [N, T, U + 1, V + X] (TDT: V tokens, the blank last, then X duration columns; multi-blank: V
    tokens less the blank, the X big blanks, the blank), labels in [0, V - 1) (never a blank), lengths uniform in
    the ranges (the longest sample spans the tensor)."""
    g = torch.Generator(device="cpu").manual_seed(seed * 7919 + N * 31 + T_range[1] * 17 + V)
    T, U = T_range[1], U_range[1]
    logits = torch.randn(N, T, U + 1, V + X, generator=g).to(device, dtype)
    targets = torch.randint(0, V - 1, (N, U), generator=g, dtype=torch.int32).to(device)
    il = torch.randint(T_range[0], T + 1, (N,), generator=g, dtype=torch.int32)
    tl = torch.randint(U_range[0], U + 1, (N,), generator=g, dtype=torch.int32)
    il[0], tl[0] = T, U
    return logits, targets, il.to(device), tl.to(device)


def losses(kind, targets, il, tl, V, X, tokens=None):
    """name -> function of the logits to the batch-mean loss: ours (TDT: durations 0..X-1), and rnnt_loss of the
    token logits (on ``tokens``, a contiguous leaf of their own when given: its gradient is dropped before each
    call)."""
    if kind == "tdt":
        ours = lambda v: sk.tdt_loss(v, targets, il, tl, list(range(X)), blank=V - 1)  # noqa: E731
    else:
        ours = lambda v: sk.multiblank_rnnt_loss(v, targets, il, tl, BIG_BLANKS)  # noqa: E731

    def rnnt(v):
        if tokens is None:
            return sk.rnnt_loss(v[..., :V], targets, il, tl, blank=V - 1)
        tokens.grad = None
        return sk.rnnt_loss(tokens, targets, il, tl, blank=V - 1)

    return {kind: ours, "rnnt": rnnt}


def errors(kind, logits, targets, il, tl, V, X):
    """(loss error, gradient error) of ours against the float64 reference (small rows)."""
    x = logits.detach().double().requires_grad_()
    if kind == "tdt":
        ref = tdt_loss_reference(x, targets, il, tl, list(range(X)), V - 1)
    else:
        ref = multiblank_rnnt_loss_reference(x, targets, il, tl, BIG_BLANKS)
    ref.backward()
    y = logits.detach().clone().requires_grad_()
    ours = losses(kind, targets, il, tl, V, X)[kind](y)
    ours.backward()
    return abs(ours.item() - ref.item()) / abs(ref.item()), (y.grad.double() - x.grad).abs().max().item()


def run_joint(args, device, env) -> int:
    """The fused joint's table: TDTJointLoss against RNNTJointLoss (same N, T, U, V) and the unfused TDT joint."""
    print_title(
        "TDT joint network + loss, training step (forward+backward)",
        env,
        args.reps,
        f"; joint {joint_bench.ENC_DIM}->{joint_bench.JOINT_DIM}<-{joint_bench.PRED_DIM} relu, durations {DURATIONS}",
    )
    print_legend(JOINT_LEGEND, JOINT_CELLS)
    print(
        f"{'N':>3} {'T':>5} {'U':>4} {'V':>5} {'dtype':>8} | {'tdt ms':>8} {'rnnt ms':>8} {'ratio':>6} "
        f"{'unfused':>8} | {'MB tdt':>8} {'MB rnnt':>8} {'MB unf':>8}",
        flush=True,
    )
    out = []
    if args.rows:
        rows = [(N, T_range[1], U_range[1], V) for _, N, T_range, U_range, V, _ in args.rows]
    else:
        rows = JOINT_ROWS if device.type == "cuda" else JOINT_CPU_DEMO
    for N, T, U, V in progress(rows, "tdt --joint", lambda r: "x".join(map(str, r))):
        inputs = joint_bench.make_inputs(N, T, U, V, device)
        torch.manual_seed(0)
        tdt = sk.TDTJointLoss(
            joint_bench.ENC_DIM, joint_bench.PRED_DIM, joint_bench.JOINT_DIM, V, DURATIONS, blank=V - 1
        ).to(device)
        rnnt = joint_bench.make_module(V, device)

        def unfused(e, p, tg, il, tl, tdt=tdt, V=V):
            return sk.tdt_loss(tdt.joint(e, p), tg, il, tl, DURATIONS, blank=V - 1)

        for dtype in ("float32", "bfloat16"):
            ac = None if dtype == "float32" else torch.bfloat16
            impls = {
                "tdt": joint_bench.step_fn(tdt, tdt, inputs, ac, device),
                "rnnt": joint_bench.step_fn(rnnt, rnnt, inputs, ac, device),
                "unfused": joint_bench.step_fn(unfused, tdt, inputs, ac, device),
            }
            res = joint_bench.safe_times(impls, inputs[0], device, args.reps)
            ratio = res["tdt"]["ms"] / res["rnnt"]["ms"] if res.get("tdt") and res.get("rnnt") else None
            row = dict(N=N, T=T, U=U, V=V, durations=DURATIONS, dtype=dtype, ratio=ratio, **res)
            out.append(row)
            emit(
                f"{N:>3} {T:>5} {U:>4} {V:>5} {dtype:>8} | {fmt_ms(res['tdt'])} {fmt_ms(res['rnnt'])} "
                f"{fmt_num(ratio, '.2f', 6)} {fmt_ms(res['unfused'])} | {fmt_mb(res['tdt'])} {fmt_mb(res['rnnt'])} "
                f"{fmt_mb(res['unfused'])}"
            )
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if args.json:
        write_json(args.json, {"benchmark": "tdt_joint", "environment": env, "rows": out})
    if args.plot:
        labels = [f"{r['N']}x{r['T']}x{r['U']}x{r['V']}+{len(DURATIONS)}\n{r['dtype']}" for r in out]
        series = {
            "RNNTJointLoss ms / TDTJointLoss ms": [_over(r, "rnnt", "tdt") for r in out],
            "unfused TDT joint ms / TDTJointLoss ms": [_over(r, "unfused", "tdt") for r in out],
        }
        plot_series(
            args.plot,
            labels,
            series,
            plot_title("TDT joint network + loss, training step", env, device),
            "speed-up of TDTJointLoss (<1: slower)",
            "NxTxUxV+durations, dtype",
            lines=((1.0, "1.0: as fast"),),
        )
    return 0


def _over(row: dict, a: str, b: str) -> float | None:
    """row[a]'s time over row[b]'s, or None where either did not run."""
    return row[a]["ms"] / row[b]["ms"] if row.get(a) and row.get(b) else None


def run(args) -> int:
    device = resolve_device(args)
    if args.joint:
        return run_joint(args, device, environment(device))
    dtype = getattr(torch, args.dtype)
    rows = args.rows or (ROWS if device.type == "cuda" else CPU_DEMO)
    env = environment(device)
    print_title(
        f"TDT and multi-blank losses, forward+backward ({args.dtype})",
        env,
        args.reps,
        "; rnnt: rnnt_loss of the token logits",
    )
    print_legend(LEGEND, CELLS)
    print(
        f"{'kind':>10} {'N':>3} {'T':>9} {'U':>8} {'V':>5} {'X':>2} | {'ours ms':>8} {'rnnt ms':>8} {'ratio':>6} | "
        f"{'MB ours':>8} {'MB rnnt':>8} | loss err  grad err",
        flush=True,
    )
    out = []
    for kind, N, T_range, U_range, V, X in progress(rows, "tdt", _label):
        logits, targets, il, tl = make_inputs(kind, N, T_range, U_range, V, X, device, dtype)
        C = V if kind == "tdt" else V + X  # the token logits rnnt_loss takes: TDT's tokens; all classes
        # rnnt_loss on a contiguous copy of the token logits where three such tensors fit (a slice of ours costs
        # it a strided read and a full-size zero gradient); the copy's gradient is dropped once accumulated
        tokens = None
        free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 0
        if C < logits.shape[-1] and 4 * logits.nbytes < free:
            tokens = logits[..., :C].contiguous().requires_grad_()
            tokens.register_post_accumulate_grad_hook(lambda t: setattr(t, "grad", None))
        res = time_forward_backward(losses(kind, targets, il, tl, C, X, tokens), logits, device, args.reps)
        ours, rnnt = res[kind], res["rnnt"]
        err = errors(kind, logits, targets, il, tl, C, X) if device.type == "cpu" else (None, None)
        row = dict(
            kind=kind,
            N=N,
            T=list(T_range),
            U=list(U_range),
            V=V,
            X=X,
            dtype=args.dtype,
            ours=ours,
            rnnt=rnnt,
            ratio=ours["ms"] / rnnt["ms"],
            rnnt_on="slice" if tokens is None and C < logits.shape[-1] else "contiguous",
            loss_err=err[0],
            grad_err=err[1],
        )
        out.append(row)
        t_s, u_s = _span(T_range), _span(U_range)
        mark = "*" if row["rnnt_on"] == "slice" else " "
        emit(
            f"{kind:>10} {N:>3} {t_s:>9} {u_s:>8} {V:>5} {X:>2} | {fmt_ms(ours)} {fmt_ms(rnnt)}{mark}"
            f"{fmt_num(row['ratio'], '.2f', 6)} | {fmt_mb(ours)} {fmt_mb(rnnt)} | {fmt_num(err[0], '.1e', 7)}  "
            f"{fmt_num(err[1], '.1e', 7)}"
        )
        del logits, tokens
    if args.json:
        write_json(args.json, {"benchmark": "tdt", "environment": env, "rows": out})
    if args.plot:
        plot(
            out,
            args.plot,
            plot_title(f"TDT and multi-blank losses against rnnt_loss of the token logits ({args.dtype})", env, device),
        )
    return 0


def _span(v: list[int] | tuple[int, int]) -> str:
    return f"{v[0]}-{v[1]}" if v[0] != v[1] else str(v[1])


def _label(row: tuple) -> str:
    kind, N, T_range, U_range, V, X = row
    durations = f"+{X}" if kind == "tdt" and X != len(DURATIONS) else ""
    return f"{kind}:{N}x{_span(T_range)}x{_span(U_range)}x{V}{durations}"


def plot(rows: list[dict], path: str, title: str) -> None:
    """rnnt_loss's time over ours per row: how close the TDT / multi-blank loss comes to the plain RNN-T loss."""
    labels = [f"{r['kind']}\n{r['N']}x{_span(r['T'])}x{_span(r['U'])}x{r['V']}+{r['X']}" for r in rows]
    plot_series(
        path,
        labels,
        {"rnnt ms / ours ms": [_over(r, "rnnt", "ours") for r in rows]},
        title,
        "speed-up over rnnt_loss (<1: ours is slower)",
        "kind, NxTxUxV+X",
        lines=((1.0, "1.0: as fast as rnnt_loss"),),
    )
