"""Where the time of a CTC forward+backward goes, and how the recursion kernels' settings change it.

python benchmarks/tune_ctc.py [--rows 150x1x28,...]: per-kernel GPU times (profiler) of the logits mode,
then the forward launcher timed over num_warps and the fast/accurate log1p, with the error of each variant.
python benchmarks/tune_ctc.py --wave 1500x1x29x1500:1200x16x32x600: the wavefront's (lanes, warps) per program.
"""

from __future__ import annotations

import argparse
import functools

import torch

import speechkernels as sk
from speechkernels import _outputs as utils
from speechkernels.bench.common import kernel_times_ms, time_ms
from speechkernels.bench.ctc import make_inputs, reference
from speechkernels.ctc import kernels


def _step(T, N, C, dev):
    """One logits-mode forward+backward on the benchmark's inputs for this row."""
    x, tg, il, tl = make_inputs(T, N, C, dev)
    tg, il, tl = tg.to(dev), il.to(dev), tl.to(dev)
    v = x.clone().requires_grad_()

    def step():
        v.grad = None
        sk.ctc_loss(v, tg, il, tl, logits=True).backward()

    return step


def profile(T, N, C):
    dev = torch.device("cuda")
    step = _step(T, N, C, dev)

    total = time_ms(step, dev, reps=10)
    per = kernel_times_ms(step)
    print(f"{T}x{N}x{C}: total {total:.3f} ms; kernels {sum(per.values()):.3f} ms")
    for k, ms in list(per.items())[:8]:
        print(f"   {ms:8.3f}  {k}")


def cpu_profile(T, N, C):
    """Where the host time of a small forward+backward goes (the GPU work is short there)."""
    import cProfile
    import pstats

    dev = torch.device("cuda")
    step = _step(T, N, C, dev)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(18)


def sweep(T, N, C, warps_list, check):
    """The forward launcher (emission and both recursions) over num_warps, alpha and beta fused or split, then the
    whole step with each split choice."""
    dev = torch.device("cuda")
    x, tg, il, tl = make_inputs(T, N, C, dev)
    tg, il, tl = tg.to(dev), il.to(dev), tl.to(dev)
    ref = reference(x, tg, il, tl) if check else None
    for split in (False, True):
        for w in warps_list:

            def fwd(w=w, split=split):
                return kernels.ctc_forward(x, tg, il, tl, 0, True, True, True, False, warps=w, split_recursion=split)

            ms = time_ms(fwd, dev, reps=10)
            line = f"{T}x{N}x{C} split={split:d} warps={w:2d}: forward {ms:8.3f} ms"
            if ref is not None:
                loss, state, _ = fwd()
                fin = torch.isfinite(ref[0])
                g = kernels.ctc_backward(fin.float(), x, *state, 0, True)
                rel = ((loss.double() - ref[0]).abs() / ref[0].abs())[fin].max().item()
                line += f"  loss err {rel:.1e} grad err {(g.double() - ref[1]).abs().max().item():.1e}"
            print(line, flush=True)
    real = kernels.ctc_forward
    for split in (False, True):
        kernels.ctc_forward = functools.partial(real, split_recursion=split)
        try:
            print(f"{T}x{N}x{C} split={split:d}: step {time_ms(_step(T, N, C, dev), dev, reps=30):8.3f} ms", flush=True)
        finally:
            kernels.ctc_forward = real


def grad_sweep(T, N, C):
    """The gradient kernel alone over its row block and num_warps, with its HBM rate (x read, gradient written)."""
    dev = torch.device("cuda")
    x, tg, il, tl = make_inputs(T, N, C, dev)
    tg, il, tl = tg.to(dev), il.to(dev), tl.to(dev)
    _, state, _ = kernels.ctc_forward(x, tg, il, tl, 0, True, True, True, False)
    g = torch.ones(N, device=dev)
    base = kernels.ctc_backward(g, x, *state, 0, True)
    for block_c, warps, block_k in (
        (1024, 4, 64),
        (2048, 8, 64),
        (4096, 8, 64),
        (1024, 4, 256),
        (1024, 4, 1024),
        (2048, 8, 512),
        (32, 1, 64),
        (32, 1, 256),
        (32, 1, 1024),
        (32, 2, 512),
        (32, 4, 1024),
    ):
        if block_c < min(C, 1024) or (block_c > 32 and C <= 32):
            continue
        kw = dict(block_c=block_c, warps=warps, block_k=block_k)
        grad = kernels.ctc_backward(g, x, *state, 0, True, **kw)
        same = torch.equal(grad, base)
        ms = time_ms(lambda kw=kw: kernels.ctc_backward(g, x, *state, 0, True, **kw), dev)
        rate = 2 * x.numel() * x.element_size() / ms / 1e9
        print(f"{T}x{N}x{C} grad {kw}: {ms:7.3f} ms {rate:5.2f} TB/s same={same}", flush=True)


def ab_fuse(T, N, C, rounds=5):
    """Whole step with the emission pass inside the recursion kernel or as its own grid, alternated to cancel
    drift: the medians of each."""
    dev = torch.device("cuda")
    real = kernels.use_small_forward
    times = {True: [], False: []}
    try:
        for _ in range(rounds):
            for fused in (True, False):
                kernels.use_small_forward = lambda *args, fused=fused: fused
                times[fused].append(time_ms(_step(T, N, C, dev), dev, reps=20))
    finally:
        kernels.use_small_forward = real
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    print(f"{T}x{N}x{C} step: emission fused {med[True]:.3f} ms, own grid {med[False]:.3f} ms", flush=True)


WAVE_SHAPES = (None, (32, 1), (64, 2), (128, 4), (256, 8))


def wave_sweep(T, N, C, S, reps=10):
    """The forward launcher (emission pass and both recursions, no validation) with one program per sample
    (None) or the wavefront at each (lanes, warps), the recursion kernels' GPU time, and whether the loss and the
    occupancy table equal the one-program path's bit for bit."""
    dev = torch.device("cuda")
    x, tg, il, tl = make_inputs(T, N, C, dev, S=S)
    tg, il, tl = tg.to(dev), il.to(dev), tl.to(dev)
    base = None
    utils.POISON_OUTPUTS = True  # unwritten table slots are NaN, so that the comparison sees written ones only
    for shape in WAVE_SHAPES:

        def fwd(shape=shape):
            return kernels.ctc_forward(x, tg, il, tl, 0, True, True, True, False, wave=shape)

        out, state, _ = fwd()
        same = "-"
        if base is None:
            base = (out, state[3].clone())
        else:
            same = torch.equal(out, base[0]) and torch.equal(state[3].nan_to_num(7.0), base[1].nan_to_num(7.0))
        utils.POISON_OUTPUTS = False
        ms = time_ms(fwd, dev, reps=reps)
        utils.POISON_OUTPUTS = True
        per = kernel_times_ms(fwd)
        rec = sum(v for k, v in per.items() if "recursion" in k or "wave" in k)
        print(f"{T}x{N}x{C}x{S} wave={shape}: forward {ms:8.3f} ms, recursions {rec:8.3f} ms, same={same}", flush=True)
    utils.POISON_OUTPUTS = False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="150x1x28,150x256x5000,1500x1x29,1500x128x1000")
    ap.add_argument("--sweep", default="150x1x28:1500x1x29:1500x32x29")
    ap.add_argument("--no-cpu-profile", action="store_true")
    ap.add_argument("--grad-sweep", default="150x256x5000")
    ap.add_argument("--ab-fuse", default="", help="rows for the fused/grid emission comparison")
    ap.add_argument("--wave", default="", help="rows TxNxCxS for the wavefront sweep, e.g. 1500x1x29x1500")
    a = ap.parse_args()
    for r in a.wave.split(":") if a.wave else []:
        wave_sweep(*(int(v) for v in r.split("x")))
    if a.wave:
        return
    for r in a.rows.split(","):
        profile(*(int(v) for v in r.split("x")))
    if not a.no_cpu_profile:
        cpu_profile(150, 1, 28)
    for r in a.sweep.split(":") if a.sweep else []:
        T, N, C = (int(v) for v in r.split("x"))
        sweep(T, N, C, [2, 4, 8] if T <= 150 else [8, 16, 32], check=True)
    for r in a.ab_fuse.split(":") if a.ab_fuse else []:
        ab_fuse(*(int(v) for v in r.split("x")))
    for r in a.grad_sweep.split(":") if a.grad_sweep else []:
        grad_sweep(*(int(v) for v in r.split("x")))


if __name__ == "__main__":
    main()
