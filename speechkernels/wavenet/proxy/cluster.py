"""The serial-chain proxy on a thread-block cluster (CUDA C++ compiled at run time through ``cuda.core``;
optional: ``pip install speechkernels[cuda]``, Hopper or newer).

Why not Triton: one SM streams the weights from L2 at most at its own L2 bandwidth, and the per-layer exchange
between SMs that spreading a stream over several SMs needs costs 0.7-1.0 us through global memory (a grid
barrier), 80 times per sample. A thread-block cluster exchanges through distributed shared memory instead, which
Triton cannot express (benchmarks/notes/wavenet.md has the measurements).

Design: one cluster of ``C`` CTAs per group of ``S`` streams. CTA r owns rows [r H/C, (r+1) H/C) of every
matrix; a group of ``LPR`` lanes owns one row (lane l the columns 4 (l + LPR j) + 0..3: the group reads
contiguous bytes of the vector, free of shared-memory bank conflicts) and keeps the next ``D`` layers' weights of
that row in registers (loaded D layers ahead, straight from L2). Per layer each CTA waits on its own mbarrier until
the whole input vector has arrived in its shared memory, computes its rows (the row's partial sums fetched in one
round of shuffles), and writes each result into every CTA's next buffer with ``st.async`` that completes bytes on
that CTA's mbarrier: point-to-point, no cluster-wide barrier.
Two buffers alternate by layer parity (a CTA can only write buffer b for layer k+2 after every CTA has sent its
layer-k+1 rows, which each sends only after reading buffer b for layer k).

The kernel's source: ``csrc/serial_chain_cluster.cu``, compiled after ``csrc/cluster_common.cuh``.
"""

from __future__ import annotations

import functools

import torch

from ..cuda_runtime import compile_cluster_kernel, device_arch, launch


def row_split_config(H: int, C: int, S: int, bf16: bool) -> dict:
    """Launch parameters for H rows over C CTAs and S streams per cluster: lanes per row LPR (a power of 2
    dividing 32; each lane holds H / LPR columns of its row; fewer when a CTA would need more than 32 warps) and
    the prefetch depth D (layers, even): 4, or fewer where the registers left per thread do not hold 4 (at
    H = 128, C = 16 on the H100 depth 4 ran 3-5 % faster than 8 and 2, benchmarks/notes/wavenet.md)."""
    lpr = 8
    while lpr > 1 and ((H // lpr) % 4 or (H // C) * lpr // 32 > 32):
        lpr //= 2
    threads = max(32, (H // C) * lpr)
    per_layer = (H // lpr) // (2 if bf16 else 1)  # registers per prefetched layer
    d = max(2, min(4, (min(255, 65536 // threads) - 40 - 8 * S) // max(1, per_layer)))
    d -= d % 2  # even: the buffer parity of an unrolled step is then known at compile time
    # the critical path's options (benchmarks/notes/wavenet.md, v15-v21): interleaved columns (no bank conflicts on the
    # vector's reads), four FMA chains, the indexed reduction at one or two streams per cluster; with bfloat16
    # weights the loads (and conversions) placed in the polling loop
    opts = dict(TW=0, RED=int(S <= 2), FCH=4, LIW=int(bf16), WIL=int(bf16), CIL=1)
    return dict(H=H, C=C, S=S, LPR=lpr, D=d, WBF16=int(bf16), **opts)


def check_row_split_config(cfg: dict) -> None:
    """Raises ValueError where ``row_split_config``'s parameters (with any overrides) do not split H."""
    H, C, lpr = cfg["H"], cfg["C"], cfg["LPR"]
    rpw = 32 // lpr
    if H % C or (H // C) % rpw or (H // lpr) % 4 or (H // C) // rpw > 32 or C > 16 or cfg["D"] % 2:
        raise ValueError(f"the cluster design cannot split H={H} over C={C} CTAs with {lpr} lanes per row")


@functools.cache
def row_split_kernel(arch: str, ACQ: int | None = None, **defines):
    """The row-split kernel for ``row_split_config()``'s parameters plus RELU; ACQ the wait's semantics
    (cluster_common.cuh), by default the relaxed poll with the restricted fence where this NVRTC compiles it
    (PTX 8.6, NVRTC 12.8 or newer). The other cluster kernels keep the acquiring poll: with the fence the compiler
    schedules them 2-5 % slower (benchmarks/notes/wavenet.md)."""
    if ACQ is None:
        try:
            return row_split_kernel(arch, 1, **defines)
        except Exception:  # noqa: BLE001 - older NVRTC
            return row_split_kernel(arch, 0, **defines)
    return compile_cluster_kernel(
        "serial_chain_cluster", "serial_chain_cluster.cu", arch, {**defines, "ACQ": ACQ}, defines["C"]
    )


def serial_chain_cluster(
    weights: torch.Tensor, x0: torch.Tensor, n_samples: int, relu: bool, C: int | None = None, S: int = 1, **over
) -> torch.Tensor:
    """Launcher: ceil(B / S) clusters of C CTAs ([B, H] float32 out); ``over`` overrides LPR or D. C defaults to
    16 CTAs with 8 lanes per row where the GPU allows clusters of 16, else 8 (benchmarks/notes/wavenet.md)."""
    if C is None:
        H = weights.shape[1]
        try:
            if H % 16:
                raise ValueError("H")
            return serial_chain_cluster(weights, x0, n_samples, relu, 16, S, **{"LPR": 8, **over})
        except ValueError:
            C = 8
    import numpy as np

    H = weights.shape[1]
    B = x0.shape[0]
    cfg = {**row_split_config(H, C, S, weights.dtype == torch.bfloat16), **over}
    check_row_split_config(cfg)
    kernel = row_split_kernel(**cfg, RELU=int(relu), arch=device_arch(x0.device))
    nw = (H // C) // (32 // cfg["LPR"])
    return launch_chain(kernel, weights, x0, n_samples, (B + S - 1) // S, 32 * nw, C, np.int32(B))


def launch_chain(
    kernel, weights: torch.Tensor, x0: torch.Tensor, n_samples: int, grid: int, block: int, C: int, *extra
) -> torch.Tensor:
    """Launches a serial-chain cluster kernel (``grid`` clusters of C CTAs of ``block`` threads) on the weights
    (contiguous), the input (as float32) and a [B, H] float32 output, L and the layer steps n_samples * L, then
    ``extra``; returns the output."""
    import numpy as np

    L, H, _ = weights.shape
    w = weights.contiguous()
    x = x0.float().contiguous()
    out = torch.empty(x0.shape[0], H, dtype=torch.float32, device=x0.device)
    args = (
        np.uint64(w.data_ptr()),
        np.uint64(x.data_ptr()),
        np.uint64(out.data_ptr()),
        np.int32(L),
        np.int64(n_samples * L),
        *extra,
    )
    launch(kernel, x0.device, grid, block, args, cluster=C)
    return out


def row_split_fits(H: int, bf16: bool, S: int = 1) -> bool:
    """Whether ``serial_chain_cluster``'s default split (16 CTAs of 8 lanes per row, else 8 CTAs) takes width H."""
    for C, over in ((16, {"LPR": 8}), (8, {})):
        if H % C:
            continue
        try:
            check_row_split_config({**row_split_config(H, C, S, bf16), **over})
        except ValueError:
            continue
        return True
    return False
