"""Where the host time of a small CTC step goes (run on the GPU machine).

python benchmarks/host_profile_ctc.py [--rows 150x1x28]: CPU microseconds per call of the building blocks
(a torch op, an allocation, a Triton launch, a custom autograd.Function step), of a whole speechkernels step
and of the torch peers' steps, then a cProfile of the speechkernels step with the autograd engine kept on the
calling thread (so that the backward's Python shows up).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import threading
import time

import torch
import triton
import triton.language as tl

import speechkernels as sk
from speechkernels._launch import launch
from speechkernels.bench.ctc import _cudnn_form, make_inputs
from speechkernels.ctc import api as ctc_api
from speechkernels.ctc import kernels


@triton.jit
def _tiny_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(y_ptr + o, tl.load(x_ptr + o, mask=o < n, other=0.0), mask=o < n)


@triton.jit
def _many_args_kernel(a, b, c, d, e, f, g, h, n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(b + o, tl.load(a + o) + n0 + n1 + n2 + n3 + n4 + n5 + n6 + n7 + n8 + n9)


def us(fn, n=400, sync_each=False):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
            if sync_each:
                torch.cuda.synchronize()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        best.append((t1 - t0) / n * 1e6)
    return min(best)


def print_cprofile(step, keys=("tottime",), lines=30, warmup=50, n=300):
    """cProfile of n calls of step() after warm-up, the autograd engine kept on the calling thread (so that the
    backward's Python shows up), printed sorted by each of ``keys``."""
    with torch.autograd.set_multithreading_enabled(False):
        for _ in range(warmup):
            step()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        prof.disable()
    for key in keys:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(lines)
        print(s.getvalue())


class _TritonBackward(torch.autograd.Function):
    """One op forward; the backward allocates its gradient and launches a small Triton kernel (as a loss's does)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sum(0)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        grad = torch.empty_like(x)
        _tiny_kernel[(1,)](g.expand(4, -1).contiguous(), grad, x.numel(), BLOCK=128)
        return grad


class _OneOp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.sum(0)

    @staticmethod
    def backward(ctx, g):
        return g.expand(4, -1).clone()


def profile_row(row, dev, out):
    T, N, C = (int(s) for s in row.split("x"))
    x, tg, il, tl_ = make_inputs(T, N, C, dev)
    tgd, ild, tld = tg.to(dev), il.to(dev), tl_.to(dev)
    v = x.clone().requires_grad_()
    form = _cudnn_form(x, tg, il, tl_)

    def sk_step(validate=True, logits=True, il=ild, tl=tld):
        v.grad = None
        xx = v if logits else v.log_softmax(-1)
        sk.ctc_loss(xx, tgd, il, tl, logits=logits, validate=validate).backward()

    def native_step():
        v.grad = None
        torch.nn.functional.ctc_loss(v.log_softmax(-1), tgd, ild, tld).backward()

    def cudnn_step():
        v.grad = None
        torch.nn.functional.ctc_loss(v.log_softmax(-1), *form).backward()

    print(f"# {T}x{N}x{C}")
    res = {
        "sk step logits validate": lambda: sk_step(),
        "sk step logits no validate": lambda: sk_step(False),
        "sk step logits, CPU lengths": lambda: sk_step(il=il, tl=tl_),
        "sk step log_probs": lambda: sk_step(logits=False),
        "torch native step": native_step,
    }
    if form is not None:
        res["torch cudnn step"] = cudnn_step
    for k, fn in res.items():
        out[f"{row} {k}"] = us(fn, n=200)
        out[f"{row} {k} (sync each)"] = us(fn, n=200, sync_each=True)
    with torch.no_grad():
        out[f"{row} sk forward only, no grad"] = us(lambda: sk.ctc_loss(v, tgd, ild, tld, logits=True), n=200)
    # the phases of a step, each timed with a synchronisation after it (as the benchmark times a step)
    out[f"{row} phase: sk forward only, grad on"] = us(lambda: sk.ctc_loss(v, tgd, ild, tld, logits=True), 200, True)
    fwd_args = (v.detach(), tgd, ild, tld, 0, True, True, True, True, False, "mean")
    out[f"{row} phase: ctc_forward launcher (grad, validate)"] = us(lambda: kernels.ctc_forward(*fwd_args), 200, True)
    no_val = fwd_args[:8] + (False,) + fwd_args[9:]
    out[f"{row} phase: ctc_forward launcher (grad, no validate)"] = us(lambda: kernels.ctc_forward(*no_val), 200, True)
    _, state, _ = kernels.ctc_forward(*fwd_args)
    g = torch.ones((), device=dev)
    backward = kernels.ctc_backward
    out[f"{row} phase: ctc_backward launcher"] = us(lambda: backward(g, v.detach(), *state, 0, True), 200, True)
    with torch.autograd.set_multithreading_enabled(False):
        out[f"{row} phase: sk step, autograd on the calling thread"] = us(lambda: sk_step(), 200, True)
    real_op = ctc_api.CTC_LOSS_OP

    class _Stub:
        def apply(self, *args):
            return args[0]

    ctc_api.CTC_LOSS_OP = _Stub()
    try:
        out[f"{row} phase: ctc_loss argument handling only"] = us(lambda: sk.ctc_loss(v, tgd, ild, tld, logits=True))
    finally:
        ctc_api.CTC_LOSS_OP = real_op


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="150x1x28")
    args = p.parse_args()
    dev = torch.device("cuda")
    a = torch.randn(1024, device=dev)
    b = torch.empty_like(a)
    out = {}
    out["torch op (clamp)"] = us(lambda: a.clamp(min=1))
    out["torch.empty(16)"] = us(lambda: torch.empty(16, device=dev))
    out["tensor.to(same device)"] = us(lambda: a.to(dev))
    out["triton launch, 3 args"] = us(lambda: _tiny_kernel[(1,)](a, b, 100, BLOCK=128))
    out["triton launch, 18 args"] = us(
        lambda: _many_args_kernel[(1,)](a, b, a, b, a, b, a, b, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, BLOCK=128)
    )
    many = (a, b, a, b, a, b, a, b, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
    fast = launch(_many_args_kernel)
    _many_args_kernel[(1,)](*many, BLOCK=128)
    expected = b[:128].tolist()
    fast[(1,)](*many, BLOCK=128)
    b.zero_()
    fast[(1,)](*many, BLOCK=128)
    assert b[:128].tolist() == expected, "Launch's direct call wrote other values than Triton's launcher"
    out["Launch of the 18-argument kernel (compiled kernel called directly)"] = us(lambda: fast[(1,)](*many, BLOCK=128))
    (compiled, tail), *_ = fast._compiled.values()
    stream = torch._C._cuda_getCurrentRawStream(dev.index or 0)
    out["  its compiled kernel's launcher alone"] = us(
        lambda: compiled.run(
            1, 1, 1, stream, compiled.function, compiled.packed_metadata, None, None, None, *many, *tail
        )
    )
    key_of = next(iter(fast._keys.values()))
    out["  its specialisation key alone"] = us(lambda: key_of(0, (("BLOCK", 128),), *many))
    out["cuda synchronize (idle)"] = us(torch.cuda.synchronize)
    out["torch op + synchronize"] = us(lambda: (a.clamp(min=1), torch.cuda.synchronize()))
    out["triton launch, 3 args + synchronize"] = us(
        lambda: (_tiny_kernel[(1,)](a, b, 100, BLOCK=128), torch.cuda.synchronize())
    )
    out["tiny launch + .tolist() of 2 values"] = us(lambda: (_tiny_kernel[(1,)](a, b, 100, BLOCK=128), b[:2].tolist()))
    v4 = torch.randn(4, 16, device=dev, requires_grad=True)

    def one_op_step():
        v4.grad = None
        _OneOp.apply(v4).sum().backward()

    def native_step():
        v4.grad = None
        v4.sum(0).sum().backward()

    out["native autograd step (two sums)"] = us(native_step)
    with torch.autograd.set_multithreading_enabled(False):
        out["  same, native, autograd on the calling thread"] = us(native_step)
    out["autograd.Function step (1 op each way) + sum"] = us(one_op_step)
    with torch.autograd.set_multithreading_enabled(False):
        out["  same, autograd on the calling thread"] = us(one_op_step)

    def triton_backward_step():
        v4.grad = None
        _TritonBackward.apply(v4).sum().backward()

    # the autograd engine runs a CUDA backward on its device thread: does a Triton launch cost more there?
    for name, fn in (("1 op each way", one_op_step), ("a Triton launch in the backward", triton_backward_step)):
        out[f"autograd.Function step, {name} (sync each)"] = us(fn, 200, True)
        with torch.autograd.set_multithreading_enabled(False):
            out[f"  same, {name}, autograd on the calling thread (sync each)"] = us(fn, 200, True)
    in_thread = {}
    worker = threading.Thread(target=lambda: in_thread.update(t=us(lambda: _tiny_kernel[(1,)](a, b, 100, BLOCK=128))))
    worker.start()
    worker.join()
    out["triton launch, 3 args, from a second Python thread"] = in_thread["t"]
    for row in args.rows.split(","):
        profile_row(row, dev, out)
    for k, val in out.items():
        print(f"{val:9.1f} us  {k}")

    T, N, C = (int(s) for s in args.rows.split(",")[0].split("x"))
    x, tg, il, tl_ = make_inputs(T, N, C, dev)
    tgd, ild, tld = tg.to(dev), il.to(dev), tl_.to(dev)
    v = x.clone().requires_grad_()

    def step():
        v.grad = None
        sk.ctc_loss(v, tgd, ild, tld, logits=True).backward()

    print_cprofile(step, ("tottime", "cumulative"), 35)


if __name__ == "__main__":
    main()
