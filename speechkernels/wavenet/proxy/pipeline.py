"""The serial-chain proxy on a thread-block cluster with the layers split across its CTAs (CUDA C++ compiled at
run time through ``cuda.core``; optional: ``pip install speechkernels[cuda]``, Hopper or newer; bfloat16
weights).

Why: the row-split design (``cluster.py``) exchanges through distributed shared memory after every layer, and
that exchange (~350 ns) bounds it. Here CTA r of a cluster of ``C`` holds the whole of layers
[r L / C, (r + 1) L / C) in its registers, as tensor-core fragments, and runs them one after another inside the
SM (a block barrier per layer); the vector crosses to the next CTA's shared memory once per CTA, not once per
layer: C hops per sample instead of L exchanges. Measured slower all the same (32 against 46 kHz on the H100,
benchmarks/notes/wavenet.md): a layer inside the SM takes about 390 ns, the block barrier waiting for the slowest of the
warps that share the tensor pipes.

Per layer each of the H / 16 warps computes one 16-row tile of ``W x`` with ``mma.m16n8k16`` (bfloat16 inputs,
float32 accumulation). The float32 vector x enters as three bfloat16 pieces x = hi + mid + lo (each the leading
8 significant bits of what the previous left, so their sum is x exactly) in three columns of the B operand;
the weights are bfloat16, so every product is exact and the three column sums add up to the float32 dot
product. Whoever produces x writes it already split and laid out as the B fragments are read (a 32-bit word per
two consecutive rows and piece; the weight rows are permuted within each 16-row tile so that the lane holding a
word's two rows computes both), into its own shared memory between layers and with ``st.async`` into the next
CTA's at the end of its layers, completing bytes on that CTA's mbarrier.

The kernel's source: ``csrc/serial_chain_pipeline.cu``, compiled after ``csrc/cluster_common.cuh``.
"""

from __future__ import annotations

import functools

import torch

from ..cuda_runtime import compile_cluster_kernel, device_arch, launch

# registers per thread left for the resident weights (32 bits each) after the fragments and the rest
REG_BUDGET = 176


def max_layers_per_cta(H: int) -> int:
    """How many layers of width H one CTA keeps in its registers (4 H / 16 per thread per layer)."""
    return max(0, REG_BUDGET // (H // 4)) if H % 32 == 0 and 32 <= H <= 128 else 0


def pipeline_config(L: int, H: int, max_cluster: int = 16, C: int | None = None) -> dict | None:
    """The smallest cluster that holds all L layers in registers (C CTAs, LPC layers per CTA at most), or None
    where none does (H not a multiple of 32 up to 128, or more layers than max_cluster CTAs hold); C forces the
    cluster size."""
    per = max_layers_per_cta(H)
    if per == 0:
        return None
    C = C or -(-L // per)
    if C > max_cluster or -(-L // C) > per or C > L:
        return None
    return {"H": H, "C": C, "LPC": -(-L // C)}


@functools.cache
def pipeline_kernel(H: int, C: int, LPC: int, RELU: int, arch: str, TW: int = 0, PROF: int = 0, NACC: int = 4):
    """The layer-split kernel for ``pipeline_config()``'s parameters plus RELU and the probe options."""
    defines = dict(H=H, C=C, LPC=LPC, RELU=RELU, TW=TW, PROF=PROF, NACC=NACC)
    return compile_cluster_kernel("serial_chain_pipeline", "serial_chain_pipeline.cu", arch, defines, C)


def serial_chain_pipeline(
    weights: torch.Tensor,
    x0: torch.Tensor,
    n_samples: int,
    relu: bool,
    C: int | None = None,
    TW: int = 0,
    PROF: int = 0,
    prof=None,
    NACC: int = 4,
) -> torch.Tensor:
    """Launcher: one cluster per stream ([B, H] float32 out); bfloat16 weights [L, H, H] with H a multiple of 32
    up to 128 and L within what 16 CTAs hold (80 at H = 128). Probe options: TW spins with test_wait; NACC sets
    the independent accumulators; PROF > 0 records SM clocks of samples PROF .. PROF + 3 into ``prof`` (int64,
    [B C, 4, LPC + 1, 4]) followed by the global timer at each CTA's start and end of samples 0 .. 1023
    ([B C, 1024, 2])."""
    import numpy as np

    L, H, _ = weights.shape
    if weights.dtype != torch.bfloat16:
        raise ValueError(f"the pipeline design takes bfloat16 weights, got {weights.dtype}")
    cfg = pipeline_config(L, H, C=C)
    if cfg is None:
        raise ValueError(f"the pipeline design cannot hold L={L} layers of H={H} in one cluster's registers")
    B = x0.shape[0]
    w = weights.contiguous()
    x = x0.float().contiguous()
    out = torch.empty(B, H, dtype=torch.float32, device=x0.device)
    kernel = pipeline_kernel(**cfg, RELU=int(relu), arch=device_arch(x0.device), TW=TW, PROF=PROF, NACC=NACC)
    args = (
        np.uint64(w.data_ptr()),
        np.uint64(x.data_ptr()),
        np.uint64(out.data_ptr()),
        np.int32(L),
        np.int32(n_samples),
    )
    if PROF:
        assert prof is not None and prof.numel() >= B * cfg["C"] * (4 * (cfg["LPC"] + 1) * 4 + 2048)
        args += (np.uint64(prof.data_ptr()),)
    launch(kernel, x0.device, B, 32 * (H // 16), args, cluster=cfg["C"])
    return out
