"""Settings of greedy transducer decoding against each other on one bench row, in one process (run on the GPU
machine): per variant the median ms of eager calls taken in turns, the tokens against the first variant's, and
for the one-launch kernel program 0's phases (``transducer_greedy``'s profile events, summed over one decode, us)
and its steps:

    python benchmarks/greedy_variants.py ROW DTYPE '{"name": {"TILES": {...}, "COMPACT": false, ...}, ...}'
        [--json out.json] [--reps 12] [--device cpu]

ROW and DTYPE as ``python -m speechkernels.bench decode`` takes them (e.g. rnnt-128x15 float32); a variant's
"TILES" entries override ``transducer_kernels.TILES`` (read when a launch plan is made), its other entries the
module settings of ``transducer_beam_kernels`` (COMPACT, LINEAR_TILES, ...; read when a search is made) and
of ``api`` (GREEDY_STEP_ROWS); each variant decodes with its own copy of the decoder. ``--device cpu``: the CPU
path (a check of the script; no phases).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import time

import torch

from speechkernels.bench import decode as bench
from speechkernels.decode import api, transducer_beam_kernels, transducer_kernels


@contextlib.contextmanager
def settings(variant: dict):
    """The variant's settings for the duration of a call."""
    saved_tiles = dict(transducer_kernels.TILES)
    saved = {}
    transducer_kernels.TILES.update(variant.get("TILES", {}))
    for name, value in variant.items():
        if name == "TILES":
            continue
        module = api if hasattr(api, name) and not hasattr(transducer_beam_kernels, name) else transducer_beam_kernels
        saved[name] = (module, getattr(module, name))
        setattr(module, name, value)
    try:
        yield
    finally:
        transducer_kernels.TILES.clear()
        transducer_kernels.TILES.update(saved_tiles)
        for name, (module, value) in saved.items():
            setattr(module, name, value)


def phases(dec, x, lengths, variant: dict) -> dict:
    """Program 0's phases of one one-launch decode under the variant (us summed per phase) and its steps (GPU)."""
    if x.device.type != "cuda":
        return {"phases_us": {}, "steps": None}
    w = dec._current_weights()
    prof = torch.zeros(50000, 2, dtype=torch.int64, device=x.device)
    with settings(variant):
        transducer_kernels.transducer_greedy(
            w, x.contiguous(), lengths, None, dec.blank, dec.durations, dec.max_symbols_per_frame, None, prof
        )
    torch.cuda.synchronize()
    sums, steps, prev = {}, 0, None
    for code, t in prof.cpu().tolist():
        if t == 0:
            break
        if prev is not None:
            name = transducer_kernels._PHASES[code]
            sums[name] = round(sums.get(name, 0.0) + (t - prev) / 1e3, 1)
            steps += name == "decision"
        prev = t
    return {"phases_us": sums, "steps": steps}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("row")
    p.add_argument("dtype", choices=tuple(bench.DTYPES))
    p.add_argument("variants", type=json.loads)
    p.add_argument("--reps", type=int, default=12)
    p.add_argument("--json", default=None)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = p.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    model, N, T, seconds, dec, x, cal = bench.transducer_row(args.row, dev, bench.DTYPES[args.dtype])
    bench.calibrate(dec, cal)
    lengths = torch.full((N,), T, device=dev)
    decs, out = {}, {"row": args.row, "dtype": args.dtype, "variants": {}}
    for name, variant in args.variants.items():
        decs[name] = d = copy.deepcopy(dec)
        with settings(variant):
            hyp, _ = d.greedy(x, lengths, validate=False)
        lists = [hyp.tokens[n, : int(hyp.lengths[n])].tolist() for n in range(N)]
        frames = [hyp.frames[n, : int(hyp.lengths[n])].tolist() for n in range(N)]
        out["variants"][name] = dict(
            tokens=int(hyp.lengths.sum()), lists=(lists, frames), **phases(d, x, lengths, variant)
        )
        v = out["variants"][name]  # as each variant is ready (compiling them all can outlast a command's limit)
        print(f"{args.row} {args.dtype} {name}: ready, {v['tokens']} tokens, {v['steps']} one-launch steps, "
              f"{v['phases_us']}", flush=True)  # fmt: skip
    times = {name: [] for name in decs}
    for rep in range(args.reps + 3):
        for name, d in decs.items():
            with settings(args.variants[name]):
                if cuda:
                    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
                    torch.cuda.synchronize()
                    start.record()
                t0 = time.perf_counter()
                d.greedy(x, lengths, validate=False)
                if cuda:
                    end.record()
                    torch.cuda.synchronize()
                ms = start.elapsed_time(end) if cuda else (time.perf_counter() - t0) * 1e3
            if rep >= 3:
                times[name].append(ms)
    first = next(iter(out["variants"].values()))["lists"]
    for name, v in out["variants"].items():
        v["ms"] = sorted(times[name])[len(times[name]) // 2]
        v["same_as_first"] = sum(t == t0 and f == f0 for t, f, t0, f0 in zip(*v["lists"], *first, strict=True))
        del v["lists"]
        same = f"{v['same_as_first']}/{N} as the first"
        print(f"{args.row} {args.dtype} {name}: {v['ms']:.3f} ms, {v['tokens']} tokens, {same}, {v['steps']} "
              f"one-launch steps, {v['phases_us']}", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
