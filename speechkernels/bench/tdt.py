"""TDT and multi-blank transducer losses: forward+backward from logits, against our own rnnt_loss at the same
(N, T, U, V) (the token logits alone).

Rows (N, T, U, V, D): (32, 400, 128, 1025, 5), (16, 250-400 ragged, 40-100 ragged, 8193, 5), (8, 1500, 300, 1025,
5) with durations [0, 1, 2, 3, 4]; multi-blank (32, 400, 128, 1025 + 3 big blanks of durations [2, 4, 8]). U counts
the labels (logits [N, T, U + 1, V + D]). Times are medians of CUDA-event-timed calls after warm-up, the losses
taking turns call by call, rnnt_loss on a contiguous copy of the token logits (* where no copy fits: on the slice
of ours); memory is the peak allocated above
what existed before the call. The error columns (small CPU rows only) compare with the float64 reference.

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
from .common import environment, fmt_mb, fmt_ms, plot_bars, print_title, time_forward_backward, write_json

DURATIONS = [0, 1, 2, 3, 4]
BIG_BLANKS = [2, 4, 8]
# (kind, N, (T_min, T), (U_min, U), V, extra columns)
ROWS = [
    ("tdt", 32, (400, 400), (128, 128), 1025, 5),
    ("tdt", 16, (250, 400), (40, 100), 8193, 5),
    ("tdt", 8, (1500, 1500), (300, 300), 1025, 5),
    ("multiblank", 32, (400, 400), (128, 128), 1025, 3),
]
CPU_DEMO = [("tdt", 2, (20, 20), (5, 5), 28, 5), ("multiblank", 2, (20, 20), (5, 5), 28, 3)]
JOINT_ROWS = [(32, 400, 128, 1025), (16, 400, 100, 8193)]  # (N, T, U, V), durations DURATIONS
JOINT_CPU_DEMO = [(2, 30, 8, 33)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--json", default=None, help="write the rows and the environment to this JSON file")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--joint", action="store_true", help="the fused joint's table (TDTJointLoss) instead")
    p.add_argument("--plot", default=None, help="write a PNG of the times and memory to this path")


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


def losses(kind, targets, il, tl, V, tokens=None):
    """name -> function of the logits to the batch-mean loss: ours, and rnnt_loss of the token logits (on
    ``tokens``, a contiguous leaf of their own when given: its gradient is dropped before each call)."""
    if kind == "tdt":
        ours = lambda v: sk.tdt_loss(v, targets, il, tl, DURATIONS, blank=V - 1)  # noqa: E731
    else:
        ours = lambda v: sk.multiblank_rnnt_loss(v, targets, il, tl, BIG_BLANKS)  # noqa: E731

    def rnnt(v):
        if tokens is None:
            return sk.rnnt_loss(v[..., :V], targets, il, tl, blank=V - 1)
        tokens.grad = None
        return sk.rnnt_loss(tokens, targets, il, tl, blank=V - 1)

    return {kind: ours, "rnnt": rnnt}


def errors(kind, logits, targets, il, tl, V):
    """(loss error, gradient error) of ours against the float64 reference (small rows)."""
    x = logits.detach().double().requires_grad_()
    if kind == "tdt":
        ref = tdt_loss_reference(x, targets, il, tl, DURATIONS, V - 1)
    else:
        ref = multiblank_rnnt_loss_reference(x, targets, il, tl, BIG_BLANKS)
    ref.backward()
    y = logits.detach().clone().requires_grad_()
    ours = losses(kind, targets, il, tl, V)[kind](y)
    ours.backward()
    return abs(ours.item() - ref.item()) / abs(ref.item()), (y.grad.double() - x.grad).abs().max().item()


def run_joint(args, device, env) -> int:
    """The fused joint's table: TDTJointLoss against RNNTJointLoss (same N, T, U, V) and the unfused TDT joint."""
    print_title("TDT joint network + loss, training step (forward+backward)", env, args.reps,
                f"; joint {joint_bench.ENC_DIM}->{joint_bench.JOINT_DIM}<-{joint_bench.PRED_DIM} relu, durations "
                f"{DURATIONS}")  # fmt: skip
    print(f"{'N':>3} {'T':>5} {'U':>4} {'V':>5} {'dtype':>8} | {'tdt ms':>8} {'rnnt ms':>8} {'ratio':>6} "
          f"{'unfused':>8} | {'MB tdt':>8} {'MB rnnt':>8} {'MB unf':>8}")  # fmt: skip
    out = []
    for N, T, U, V in JOINT_ROWS if device.type == "cuda" else JOINT_CPU_DEMO:
        inputs = joint_bench.make_inputs(N, T, U, V, device)
        torch.manual_seed(0)
        tdt = sk.TDTJointLoss(joint_bench.ENC_DIM, joint_bench.PRED_DIM, joint_bench.JOINT_DIM, V, DURATIONS,
                              blank=V - 1).to(device)  # fmt: skip
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
            r_s = f"{ratio:>6.2f}" if ratio is not None else f"{'-':>6}"
            print(f"{N:>3} {T:>5} {U:>4} {V:>5} {dtype:>8} | {fmt_ms(res['tdt'])} {fmt_ms(res['rnnt'])} {r_s} "
                  f"{fmt_ms(res['unfused'])} | {fmt_mb(res['tdt'])} {fmt_mb(res['rnnt'])} {fmt_mb(res['unfused'])}",
                  flush=True)  # fmt: skip
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if args.json:
        write_json(args.json, {"benchmark": "tdt_joint", "environment": env, "rows": out})
    if args.plot:
        plot(out, ("tdt", "rnnt", "unfused"), "TDT joint (fused), RNN-T joint (fused), TDT joint with its logits made",
             args.plot)  # fmt: skip
    return 0


def run(args) -> int:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.joint:
        return run_joint(args, device, environment(device))
    dtype = getattr(torch, args.dtype)
    rows = ROWS if device.type == "cuda" else CPU_DEMO
    env = environment(device)
    print_title(
        f"TDT and multi-blank losses, forward+backward ({args.dtype})",
        env,
        args.reps,
        "; rnnt: rnnt_loss of the token logits",
    )
    print(f"{'kind':>10} {'N':>3} {'T':>9} {'U':>8} {'V':>5} {'X':>2} | {'ours ms':>8} {'rnnt ms':>8} {'ratio':>6} | "
          f"{'MB ours':>8} {'MB rnnt':>8} | loss err  grad err")  # fmt: skip
    out = []
    for kind, N, T_range, U_range, V, X in rows:
        logits, targets, il, tl = make_inputs(kind, N, T_range, U_range, V, X, device, dtype)
        C = V if kind == "tdt" else V + X  # the token logits rnnt_loss takes: TDT's tokens; all classes
        # rnnt_loss on a contiguous copy of the token logits where three such tensors fit (a slice of ours costs
        # it a strided read and a full-size zero gradient); the copy's gradient is dropped once accumulated
        tokens = None
        free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 0
        if C < logits.shape[-1] and 4 * logits.nbytes < free:
            tokens = logits[..., :C].contiguous().requires_grad_()
            tokens.register_post_accumulate_grad_hook(lambda t: setattr(t, "grad", None))
        res = time_forward_backward(losses(kind, targets, il, tl, C, tokens), logits, device, args.reps)
        ours, rnnt = res[kind], res["rnnt"]
        err = errors(kind, logits, targets, il, tl, C) if device.type == "cpu" else (None, None)
        row = dict(kind=kind, N=N, T=list(T_range), U=list(U_range), V=V, X=X, dtype=args.dtype, ours=ours, rnnt=rnnt,
                   ratio=ours["ms"] / rnnt["ms"], rnnt_on="slice" if tokens is None and C < logits.shape[-1] else
                   "contiguous", loss_err=err[0], grad_err=err[1])  # fmt: skip
        out.append(row)
        t_s = f"{T_range[0]}-{T_range[1]}" if T_range[0] != T_range[1] else str(T_range[1])
        u_s = f"{U_range[0]}-{U_range[1]}" if U_range[0] != U_range[1] else str(U_range[1])
        e_s = f"{err[0]:.1e}  {err[1]:.1e}" if err[0] is not None else "   -        -"
        mark = "*" if row["rnnt_on"] == "slice" else " "
        print(f"{kind:>10} {N:>3} {t_s:>9} {u_s:>8} {V:>5} {X:>2} | {fmt_ms(ours)} {fmt_ms(rnnt)}{mark}"
              f"{row['ratio']:>6.2f} | {fmt_mb(ours)} {fmt_mb(rnnt)} | {e_s}", flush=True)  # fmt: skip
        del logits, tokens
    if args.json:
        write_json(args.json, {"benchmark": "tdt", "environment": env, "rows": out})
    if args.plot:
        plot(out, ("ours", "rnnt"), "TDT / multi-blank loss (ours) and rnnt_loss of the token logits", args.plot)
    return 0


def plot(rows: list[dict], names: tuple[str, ...], title: str, path: str) -> None:
    """The rows' times and memory (``common.plot_bars``), labelled kind, N x T x U x V (+ X) and dtype."""

    def label(r):
        span = lambda v: v if isinstance(v, int) else f"{v[0]}-{v[1]}" if v[0] != v[1] else v[1]  # noqa: E731
        extra = f"+{len(r['durations'])}" if "durations" in r else f"+{r['X']}"
        return f"{r.get('kind', 'joint')}\n{r['N']}x{span(r['T'])}x{span(r['U'])}x{r['V']}{extra}\n{r['dtype']}"

    plot_bars(rows, list(names), [label(r) for r in rows], title + ", forward+backward", "ms per call", path)
