"""Where the host time of a small RNN-T step goes (run on the GPU machine).

python benchmarks/host_profile_rnnt.py [--rows 150x40x28x16]: CPU microseconds per forward+backward step of
speechkernels (with and without validation, per-sample and batch-mean losses), of the peers and of two floors (a
skeleton autograd.Function with and without a validation read: the least host work such a loss can do), with and
without a synchronisation after each step, of rnnt_loss's argument checks alone, then a cProfile of the
speechkernels step with the autograd engine kept on the calling thread (so that the backward's Python shows up).
"""

from __future__ import annotations

import argparse

import torch
from host_profile_ctc import _tiny_kernel, print_cprofile, us

import speechkernels as sk
from speechkernels._launch import launch
from speechkernels.bench.rnnt import implementations, make_inputs
from speechkernels.rnnt import api as rnnt_api


class _Skeleton(torch.autograd.Function):
    """The least an eager loss with a device-side validation can do on the host: forward launches a check of one
    value and reads it back, allocates the loss and the gradient and launches one kernel (standing for a kernel
    that computes both); backward is one multiplication (warp-rnnt's). No argument checks, no GPU work to speak of."""

    @staticmethod
    def forward(ctx, x, targets, il, tl, validate):
        if validate:
            flag = torch.empty(1, dtype=torch.int32, device=x.device)
            launch(_tiny_kernel)[(1,)](il, flag, 1, BLOCK=16)
            flag.item()
        loss = torch.empty(x.shape[0] + 1, device=x.device)
        grad = torch.empty_like(x)
        launch(_tiny_kernel)[(1,)](x, loss, 1, BLOCK=16)
        ctx.save_for_backward(grad)
        return loss[0]

    @staticmethod
    def backward(ctx, g):
        (grad,) = ctx.saved_tensors
        return grad.mul_(g), None, None, None, None


class _NoOp:
    @staticmethod
    def apply(*inputs):
        return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="150x40x28x16")
    args = p.parse_args()
    dev = torch.device("cuda")
    out = {}
    for row in args.rows.split(","):
        T, U, V, N = (int(s) for s in row.split("x"))
        logits, targets, il, tl = make_inputs(T, U, V, N, dev)
        v = logits.detach().requires_grad_()
        impls = {k: f for k, f in implementations(logits, targets, il, tl).items() if f is not None}
        inputs = (targets, il, tl)
        impls["sk no validate"] = lambda v, a=inputs: sk.rnnt_loss(v, *a, blank=0, validate=False)
        impls["floor: skeleton with validation"] = lambda v, a=inputs: _Skeleton.apply(v, *a, True)
        impls["floor: skeleton without validation"] = lambda v, a=inputs: _Skeleton.apply(v, *a, False)
        impls["sk reduction none + sum"] = lambda v, a=inputs: sk.rnnt_loss(v, *a, blank=0, reduction="none").sum()
        for name, fn in impls.items():

            def step(fn=fn, v=v):
                v.grad = None
                fn(v).backward()

            out[f"{row} {name}"] = us(step, n=200)
            out[f"{row} {name} (sync each)"] = us(step, n=200, sync_each=True)
        with torch.no_grad():
            out[f"{row} sk forward only, no grad"] = us(lambda v=v, a=inputs: sk.rnnt_loss(v, *a, blank=0), n=200)
        # rnnt_loss's own argument checks: the op replaced by one that does nothing
        op, rnnt_api.RNNT_LOSS_OP = rnnt_api.RNNT_LOSS_OP, _NoOp()
        try:
            out[f"{row} sk argument checks only"] = us(lambda v=v, a=inputs: sk.rnnt_loss(v, *a, blank=0), n=200)
        finally:
            rnnt_api.RNNT_LOSS_OP = op
    for k, val in out.items():
        print(f"{val:9.1f} us  {k}")

    T, U, V, N = (int(s) for s in args.rows.split(",")[0].split("x"))
    logits, targets, il, tl = make_inputs(T, U, V, N, dev)
    v = logits.detach().requires_grad_()

    def step():
        v.grad = None
        sk.rnnt_loss(v, targets, il, tl, blank=0).backward()

    print_cprofile(step)


if __name__ == "__main__":
    main()
