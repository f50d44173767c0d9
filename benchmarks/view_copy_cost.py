"""What scores passed as a view cost on the kernel path: forward+backward of ``ctc_loss`` and ``rnnt_loss`` with
contiguous scores against the same values as a view (a batch-first tensor transposed, or a strided slice), which
``kernel_layout`` copies once before the kernels read them, and the same view made contiguous by the caller
(``.contiguous()`` before the call). Median of interleaved rounds (CUDA events); each time includes autograd's
backward through the view (a transposed gradient, or a zero-filled gradient of the whole base for a slice).

    python benchmarks/view_copy_cost.py [--reps 30]

One JSON line per row: shape, the three times (ms), the view's extra time over contiguous scores, and the copy's
floor (2 x the scores' bytes at the bandwidth given with --gbps).
"""

from __future__ import annotations

import argparse
import json

import torch

import speechkernels as sk
from speechkernels.bench.common import time_forward_backward


def ctc_row(T: int, N: int, C: int, S: int, reps: int, gbps: float) -> dict:
    dev = torch.device("cuda")
    g = torch.Generator(dev).manual_seed(0)
    base = torch.randn(N, T, C, device=dev, generator=g).log_softmax(-1)  # batch-first: [T, N, C] is a transpose
    targets = torch.randint(1, C, (N, S), device=dev, generator=g)
    il = torch.full((N,), T, device=dev)
    tl = torch.full((N,), S, device=dev)

    def loss(v: torch.Tensor, view: bool, copy: bool = False) -> torch.Tensor:
        x = v.transpose(0, 1) if view else v
        x = x.contiguous() if copy else x
        return sk.ctc_loss(x, targets, il, tl, reduction="sum", validate=False)

    contiguous = base.transpose(0, 1).contiguous()
    a = time_forward_backward({"contiguous": lambda v: loss(v, False)}, contiguous, dev, reps)["contiguous"]
    b = time_forward_backward(
        {"view": lambda v: loss(v, True), "caller": lambda v: loss(v, True, True)}, base, dev, reps
    )
    return _row(
        "ctc_loss",
        f"{T}x{N}x{C}x{S}",
        "log_probs = batch-first [N, T, C].transpose(0, 1)",
        a,
        b,
        base.numel() * base.element_size(),
        gbps,
    )


def rnnt_row(N: int, T: int, U: int, V: int, reps: int, gbps: float) -> dict:
    dev = torch.device("cuda")
    g = torch.Generator(dev).manual_seed(0)
    wide = torch.randn(N, T, U + 1, V + 8, device=dev, generator=g)  # the view: the first V classes of each row
    targets = torch.randint(1, V, (N, U), device=dev, generator=g, dtype=torch.int32)
    il = torch.full((N,), T, device=dev, dtype=torch.int32)
    tl = torch.full((N,), U, device=dev, dtype=torch.int32)

    def loss(v: torch.Tensor, view: bool, copy: bool = False) -> torch.Tensor:
        x = v[..., :V] if view else v
        x = x.contiguous() if copy else x
        return sk.rnnt_loss(x, targets, il, tl, reduction="sum", validate=False)

    contiguous = wide[..., :V].contiguous()
    a = time_forward_backward({"contiguous": lambda v: loss(v, False)}, contiguous, dev, reps)["contiguous"]
    b = time_forward_backward(
        {"view": lambda v: loss(v, True), "caller": lambda v: loss(v, True, True)}, wide, dev, reps
    )
    return _row(
        "rnnt_loss",
        f"{N}x{T}x{U}x{V}",
        "logits = [..., :V] of a [N, T, U+1, V+8] tensor",
        a,
        b,
        contiguous.numel() * contiguous.element_size(),
        gbps,
    )


def _row(fn: str, shape: str, view: str, a: dict, b: dict, nbytes: int, gbps: float) -> dict:
    v, c = b["view"]["ms"], b["caller"]["ms"]
    return dict(
        function=fn,
        shape=shape,
        view=view,
        contiguous_ms=round(a["ms"], 3),
        view_ms=round(v, 3),
        caller_contiguous_ms=round(c, 3),
        extra_ms=round(v - a["ms"], 3),
        copy_floor_ms=round(2 * nbytes / gbps / 1e6, 3),
        gpu=torch.cuda.get_device_name(),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--gbps", type=float, default=3350.0, help="the GPU's memory bandwidth (H100 SXM: 3350)")
    a = p.parse_args()
    for row in (
        ctc_row(150, 32, 5000, 40, a.reps, a.gbps),
        ctc_row(150, 32, 28, 40, a.reps, a.gbps),
        rnnt_row(16, 150, 40, 1024, a.reps, a.gbps),
        rnnt_row(4, 150, 40, 28, a.reps, a.gbps),
    ):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
