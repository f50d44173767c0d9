"""Dependent-chain latencies of the instructions on the WaveNet proxy's critical path, in SM clocks (one warp, or
a CTA of 8 warps for the barrier): tensor-core mma (m16n8k16 bfloat16, float32 accumulation), warp shuffle with
an add, the tanh of the kernels (exp and a division), the three-piece bfloat16 split, a shared-memory load, the
block barrier; and the tensor-core issue rate with 8 independent accumulators per warp. One JSON object per
line. (The tanh and fma chains fold away at compile time: their columns read about 0.)

    PYTHONPATH=$PWD python benchmarks/latency_probe.py
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import torch

from speechkernels.wavenet import cuda_runtime

SRC = (pathlib.Path(__file__).parent / "csrc" / "latency_probe.cu").read_text()

NAMES = [
    "mma",
    "shfl_add",
    "tanh_exp_div",
    "split3",
    "lds",
    "bar_sync",
    "sts_bar_lds_bar",
    "tanh_approx",
    "fma",
    "mma_issue",
]


def main():
    kern = cuda_runtime.compile_kernel("lat", SRC, cuda_runtime.device_arch())
    for threads in (32, 256):
        out = torch.zeros(threads, device="cuda")
        t = torch.zeros(16, dtype=torch.int64, device="cuda")
        for _ in range(3):
            args = (np.uint64(out.data_ptr()), np.uint64(t.data_ptr()), np.float32(0.5))
            cuda_runtime.launch(kern, out.device, 1, threads, args)
        torch.cuda.synchronize()
        tt = t.cpu().tolist()
        row = {n: tt[i] / 64 for i, n in enumerate(NAMES[:-1])}
        row["mma_clocks_each_per_warp"] = tt[9] / 128  # 128 independent-ish mma per warp; warps share 4 SMSPs
        print(json.dumps({"threads": threads, **row}), flush=True)


if __name__ == "__main__":
    main()
