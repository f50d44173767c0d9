"""Host-side cost of one CTC call: where the CPU time of a small forward+backward goes.

python benchmarks/overhead_ctc.py: CPU microseconds per call of each piece, measured with perf_counter over
many calls (the GPU work of these small calls is shorter than their host work).
"""

from __future__ import annotations

import time

import torch

import speechkernels as sk
from speechkernels.bench.ctc import make_inputs
from speechkernels.ctc import kernels


def us(fn, n=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def main():
    dev = torch.device("cuda")
    T, N, C = 150, 1, 28
    x, tg, il, tl = make_inputs(T, N, C, dev)
    tg, il, tl = tg.to(dev), il.to(dev), tl.to(dev)
    v = x.clone().requires_grad_()
    out = {}
    out["torch clamp op"] = us(lambda: il.clamp(min=1))
    out["ctc_forward launcher, no grad, no validation"] = us(
        lambda: kernels.ctc_forward(x, tg, il, tl, 0, True, True, False, False)
    )
    out["ctc_forward launcher, grad, validation"] = us(
        lambda: kernels.ctc_forward(x, tg, il, tl, 0, True, True, True, True)
    )
    fw = kernels.ctc_forward(x, tg, il, tl, 0, True, True, True, False)
    g = torch.ones(N, device=dev)
    out["ctc_backward launcher"] = us(lambda: kernels.ctc_backward(g, x, *fw[2:7], 0, True))
    with torch.no_grad():
        out["ctc_loss no grad, validate=False, reduction none"] = us(
            lambda: sk.ctc_loss(x, tg, il, tl, reduction="none", logits=True, validate=False)
        )
        out["ctc_loss no grad, validate=False, mean"] = us(
            lambda: sk.ctc_loss(x, tg, il, tl, logits=True, validate=False)
        )

    def step(validate):
        v.grad = None
        sk.ctc_loss(v, tg, il, tl, logits=True, validate=validate).backward()

    out["step validate=False"] = us(lambda: step(False))
    out["step validate=True"] = us(lambda: step(True))
    for k, val in out.items():
        print(f"{val:9.1f} us  {k}")


if __name__ == "__main__":
    main()
