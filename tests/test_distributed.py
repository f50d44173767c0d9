"""Distributed data parallel training with every loss: two processes, each with half of a global batch, end with the
same gradients as one process with the whole batch (the losses are per sample; DDP averages the two halves' mean
losses' gradients, which is the whole batch's mean when the halves are equal).

The CPU test uses gloo (the kernels run under Triton's interpreter when TRITON_INTERPRET=1, the PyTorch path
otherwise); the GPU test NCCL on two GPUs.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import speechkernels as sk

N, T, U, V, F, H = 4, 6, 2, 5, 3, 8
DURATIONS = [0, 1, 2]
LOSSES = ("ctc", "rnnt", "tdt", "rnnt_joint")


class Tiny(nn.Module):
    """An encoder, a predictor and an output layer: enough to give each loss its inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(F, H)
        self.pred = nn.Embedding(V, H)
        self.out = nn.Linear(H, V + len(DURATIONS))

    def forward(self, kind, feats, targets, frames, labels):
        enc = torch.tanh(self.enc(feats))  # [n, T, H]
        if kind == "ctc":
            logits = self.out(enc)[..., :V]
            return sk.ctc_loss(logits, targets + 1, frames, labels, batch_first=True, logits=True)
        prefix = torch.cat([torch.zeros_like(targets[:, :1]), targets], dim=1)  # the blank V - 1 starts the prefix
        pred = self.pred(prefix)  # [n, U + 1, H]
        if kind == "rnnt_joint":
            return sk.rnnt_joint_loss(enc, pred, self.out.weight[:V], self.out.bias[:V], targets, frames, labels)
        joint = torch.tanh(enc[:, :, None] + pred[:, None])  # [n, T, U + 1, H]
        if kind == "rnnt":
            return sk.rnnt_loss(self.out(joint)[..., :V], targets, frames, labels)
        return sk.tdt_loss(self.out(joint), targets, frames, labels, DURATIONS)


def problem():
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(N, T, F, generator=g)
    targets = torch.randint(0, V - 1, (N, U), generator=g)  # never the transducers' blank V - 1, nor CTC's 0 (+1)
    frames = torch.tensor([T, T - 1, T, T - 2])
    labels = torch.tensor([U, 1, U, 2])
    return feats, targets, frames, labels


def gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().cpu().clone() for name, p in model.named_parameters() if p.grad is not None}


def _worker(rank: int, world: int, store: str, out: str, backend: str) -> None:
    device = torch.device(f"cuda:{rank}" if backend == "nccl" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        torch.manual_seed(1)
        # each loss leaves some parameters unused (CTC the predictor, the others the duration rows)
        ids = [rank] if device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(Tiny().to(device), device_ids=ids, find_unused_parameters=True)
        half = slice(rank * N // world, (rank + 1) * N // world)
        results = {}
        for kind in LOSSES:
            model.zero_grad(set_to_none=True)
            feats, targets, frames, labels = (t[half].to(device) for t in problem())
            model(kind, feats, targets, frames, labels).backward()
            results[kind] = gradients(model.module)
        torch.save(results, f"{out}.{rank}")
        dist.barrier()  # no rank tears gloo down while the other still talks to it (an abort at exit otherwise)
    finally:
        dist.destroy_process_group()
    # the results are saved: leave without the interpreter's teardown, where gloo's threads can still hold work and
    # abort the process ("terminate called without an active exception", seen once on a 2-core machine)
    os._exit(0)


def check_distributed(tmp_path, backend: str, device: torch.device) -> None:
    torch.manual_seed(1)
    model = Tiny().to(device)
    want = {}
    for kind in LOSSES:
        model.zero_grad(set_to_none=True)
        model(kind, *(t.to(device) for t in problem())).backward()
        want[kind] = gradients(model)
    out = str(tmp_path / "grads")
    mp.spawn(_worker, args=(2, str(tmp_path / "store"), out, backend), nprocs=2, join=True)
    for rank in range(2):
        got = torch.load(f"{out}.{rank}")
        for kind in LOSSES:
            for name in got[kind].keys() | want[kind].keys():  # a parameter a loss leaves unused: no gradient, or 0
                g, w = got[kind].get(name), want[kind].get(name)
                g = torch.zeros_like(w) if g is None else g
                w = torch.zeros_like(g) if w is None else w
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=f"{kind} {name} rank {rank}")


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_ddp_gloo_matches_one_process(tmp_path):
    check_distributed(tmp_path, "gloo", torch.device("cpu"))


@pytest.mark.gpu
def test_ddp_nccl_matches_one_process(tmp_path):
    if torch.cuda.device_count() < 2 or not dist.is_nccl_available():
        pytest.skip("needs two CUDA GPUs and NCCL")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast
    check_distributed(tmp_path, "nccl", torch.device("cuda:0"))
