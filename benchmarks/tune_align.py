"""Kernel time of ctc_align at the benchmark's rows for forward blocks (lanes, warps) and segment lengths.

python benchmarks/tune_align.py [--rows N:T:C:S,...] [--json out.json]
"""

import argparse
import json
import time

import torch

from speechkernels.align import kernels as ak
from speechkernels.bench.align import ROWS, make_inputs
from speechkernels.bench.common import peak_extra_memory, time_ms

p = argparse.ArgumentParser()
p.add_argument("--rows", default=None)
p.add_argument("--blocks", default="32:1,64:2,128:4,256:8")
p.add_argument("--segments", default="112,240")
p.add_argument("--chunks", default="16")
p.add_argument("--json", default=None)
args = p.parse_args()
rows = [tuple(int(v) for v in r.split(":")) for r in args.rows.split(",")] if args.rows else ROWS
dev = torch.device("cuda")
out = []
for N, T, C, S in rows:
    x, tg = make_inputs(N, T, C, S, dev)
    il = torch.full((N,), T, device=dev)
    tl = torch.full((N,), S, device=dev)
    for chunk, bw in ((int(c), b) for c in args.chunks.split(",") for b in args.blocks.split(",")):
        ak.CHUNK = chunk
        block, warps = (int(v) for v in bw.split(":"))
        for seg in (int(v) for v in args.segments.split(",")):

            def call(x=x, tg=tg, il=il, tl=tl, block=block, warps=warps, seg=seg):
                return ak.ctc_align(x, tg, il, tl, 0, True, block=block, warps=warps, segment=seg)

            try:
                t0 = time.perf_counter()
                call()
                torch.cuda.synchronize()
                first_s = time.perf_counter() - t0
                ms = time_ms(call, dev, warmup=2, reps=10)
                mem = peak_extra_memory(call, dev)["allocated"]
            except Exception as e:  # noqa: BLE001 - a configuration that does not fit is reported
                ms, mem, first_s = None, repr(e)[:80], None
            rec = dict(
                N=N,
                T=T,
                C=C,
                S=S,
                chunk=chunk,
                block=block,
                warps=warps,
                segment=seg,
                ms=ms,
                first_call_s=first_s,
                peak_extra_bytes=mem,
            )
            out.append(rec)
            print(json.dumps(rec), flush=True)
if args.json:
    json.dump(out, open(args.json, "w"), indent=1)
