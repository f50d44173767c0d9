"""Design probe: the transducer decoder's steps at 128 rows with the weights resident in shared memory across the
steps, in a CUDA C++ cluster kernel (csrc/decode_cluster_step.cu; the layout is described there).

The Parakeet-TDT-sized networks of ``bench decode`` (LSTM 640 x 2, projection 640, joint 640 -> 1030) in bfloat16
with random weights; every row runs every phase in every step (the kernel's worst case). Checks the kernel's
hidden states, projections and best columns against a PyTorch emulation of the same arithmetic (bfloat16 operands,
float32 sums), then times ``--steps`` steps (one launch) and one step, and prints the time per step.

    PYTHONPATH=$PWD python benchmarks/decode_cluster_probe.py [--steps 181] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np
import torch

from speechkernels.wavenet import cuda_runtime as cr

N, H, L, P, V, D, T = 128, 640, 2, 640, 1025, 5, 188
CS, NCL, UPC, PPC, JPC = 4, 27, 24, 24, 40
VJ = V + D


def padded(k: int) -> int:
    """The weights' row stride (bfloat16) for a K range of k: 32 mod 64 (16 mod 32 words)."""
    return k + (32 - k % 64) % 64


def shared_bytes() -> int:
    ks_l, ks_p, ks_j = 2 * H // CS, H // CS, P // CS
    w = L * 4 * UPC * padded(ks_l) + PPC * padded(ks_p) + JPC * padded(ks_j)
    return 2 * w + CS * (8 // CS) * (4 * UPC // 8) * 32 * 16 + 4 * N


def networks(device):
    g = torch.Generator(device="cpu").manual_seed(0)

    def r(*shape, scale):
        return (torch.randn(*shape, generator=g) * scale).to(device)

    s = H**-0.5
    return dict(
        w_ih=r(L, 4 * H, H, scale=s).bfloat16(),
        w_hh=r(L, 4 * H, H, scale=s).bfloat16(),
        b=r(L, 4 * H, scale=0.1),
        emb=r(V, H, scale=1.0).bfloat16(),
        pw=r(P, H, scale=s).bfloat16(),
        pb=r(P, scale=0.1),
        ow=r(VJ, P, scale=P**-0.5).bfloat16(),
        ob=r(VJ, scale=0.1),
        enc=r(N, T, P, scale=1.0).bfloat16(),
    )


def emulate(w, steps):
    """The kernel's arithmetic in PyTorch: bfloat16 operands, float32 sums and cells."""
    tok = torch.full((N,), V - 1, dtype=torch.long, device=w["emb"].device)
    h = torch.zeros(L, N, H, device=tok.device).bfloat16()
    c = torch.zeros(L, N, H, device=tok.device)
    cols = []
    for step in range(steps):
        x = w["emb"][tok]
        for layer in range(L):
            gates = x.float() @ w["w_ih"][layer].float().T + h[layer].float() @ w["w_hh"][layer].float().T
            i, f, gg, o = (gates + w["b"][layer]).chunk(4, 1)
            c[layer] = f.sigmoid() * c[layer] + i.sigmoid() * gg.tanh()
            h[layer] = (o.sigmoid() * c[layer].tanh()).bfloat16()
            x = h[layer]
        g = (x.float() @ w["pw"].float().T + w["pb"]).bfloat16()
        a = (w["enc"][:, step % T].float() + g.float()).relu().bfloat16()
        logits = a.float() @ w["ow"].float().T + w["ob"]
        col = logits.argmax(1)
        cols.append(col)
        tok = col % V
    return torch.stack(cols), h, g


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=181)
    ap.add_argument("--out", default=None)
    ap.add_argument("--bar", type=int, default=1, help="grid barrier: 0 every CTA arrives, 1 one per cluster")
    a = ap.parse_args()
    dev = torch.device("cuda")
    w = networks(dev)
    defines = dict(
        N=N, H=H, L=L, P=P, V=V, VJ=VJ, T=T, CS=CS, NCL=NCL, UPC=UPC, PPC=PPC, JPC=JPC, BLANK=V - 1, ACQ=0, BAR=a.bar
    )
    source = (pathlib.Path(__file__).parent / "csrc" / "decode_cluster_step.cu").read_text()
    kernel = cr.compile_kernel(
        "decode_cluster_step",
        cr.read_source(cr.CLUSTER_HEADER) + "\n" + source,
        cr.device_arch(dev),
        defines,
        CS,
    )
    shmem = shared_bytes()
    cr.set_dynamic_shared_memory(kernel, shmem, "the probe")
    fit = cr.max_active_clusters(kernel, 256, CS, shmem)
    print(f"shared memory {shmem} B; clusters of {CS} resident at once: {fit} (needs {NCL})", flush=True)
    if fit is not None and fit < NCL:
        raise SystemExit("not enough clusters resident for the grid-wide barriers")
    h = torch.zeros(2, L, N, H, device=dev).bfloat16()
    g = torch.zeros(N, P, device=dev).bfloat16()
    keys = torch.zeros(N, NCL, dtype=torch.int64, device=dev)
    counter = torch.zeros(1, dtype=torch.int32, device=dev)

    def run(steps, prof=None):
        tokens = torch.full((max(steps, 1), N), -1, dtype=torch.int32, device=dev)
        h.zero_()
        counter.zero_()
        tensors = [w[k] for k in ("w_ih", "w_hh", "b", "emb", "pw", "pb", "ow", "ob", "enc")]
        tensors += [h, g, keys, tokens, counter]
        args = [np.uint64(t.data_ptr()) for t in tensors] + [np.int32(steps)]
        args.append(np.uint64(0 if prof is None else prof.data_ptr()))
        cr.launch(kernel, dev, NCL, 256, args, cluster=CS, shmem=shmem)
        return tokens

    result = dict(device=torch.cuda.get_device_name(), shared_bytes=shmem, clusters_resident=fit, bar=a.bar)
    # exactness against the emulation: the first steps' columns, the hidden states and projection after 3 steps
    for steps in (1, 3, 20):
        tokens = run(steps)
        torch.cuda.synchronize()
        cols, h_ref, g_ref = emulate(w, steps)
        same = (tokens.long() == cols).float().mean().item()
        row = dict(steps=steps, columns_equal=same)
        if steps == 3:
            hk = h[steps & 1].float()
            row["h_max_diff"] = (hk - h_ref.float()).abs().max().item()
            row["g_max_diff"] = (g.float() - g_ref.float()).abs().max().item()
        print(row, flush=True)
        result[f"check_{steps}"] = row
    # timing: one launch of `steps` steps, and of one step (the weights' load and the launch)
    times = {}
    for steps in (1, a.steps):
        for _ in range(3):
            run(steps)
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        best = float("inf")
        for _ in range(10):
            ev[0].record()
            run(steps)
            ev[1].record()
            torch.cuda.synchronize()
            best = min(best, ev[0].elapsed_time(ev[1]))
        times[steps] = best
    per_step = (times[a.steps] - times[1]) / (a.steps - 1) * 1e3
    # CTA 0's clock: per phase (LSTM layers, projection, joint), the products, the cluster's sums, the barrier
    prof = torch.zeros(1 + a.steps * (L + 2) * 3, dtype=torch.int64, device=dev)
    run(a.steps, prof)
    torch.cuda.synchronize()
    d = prof[1:].view(a.steps, L + 2, 3).double() - torch.cat([prof[:1], prof[1:-1]]).view(a.steps, L + 2, 3).double()
    phases = (d[1:].mean(0) / 1e3).tolist()  # us, the first step apart (the weights' load)
    names = [f"layer {i}" for i in range(L)] + ["projection", "joint"]
    result["phase_us"] = {n: dict(products=p[0], sums=p[1], barrier=p[2]) for n, p in zip(names, phases, strict=True)}
    for n, p in zip(names, phases, strict=True):
        print(f"{n:11s} products {p[0]:6.2f} us, cluster sums {p[1]:6.2f} us, grid barrier {p[2]:6.2f} us")
    result.update(ms={str(k): v for k, v in times.items()}, us_per_step=per_step, steps=a.steps)
    print(f"{a.steps} steps {times[a.steps]:.3f} ms, 1 step {times[1]:.3f} ms: {per_step:.2f} us per step", flush=True)
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
