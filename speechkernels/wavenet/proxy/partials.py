"""The serial-chain proxy on a thread-block cluster with the columns split across its CTAs (CUDA C++ compiled at
run time through ``cuda.core``; optional: ``pip install speechkernels[cuda]``, Hopper or newer).

The row-split design (``cluster.py``) reduces each row's dot product across lanes with three rounds of warp
shuffles before it sends the row out, and every CTA needs the whole vector. Here CTA s owns the slice
[s KS, (s + 1) KS) of the vector (KS = H / C) and the same columns of every matrix: per layer each of its H
threads multiplies one row's KS columns by the slice and sends that partial sum straight to the CTA that owns
the row (``st.async`` completing bytes on that CTA's mbarrier). The owner adds the C partials of each of its
elements (a few adds from shared memory, no shuffle reduction), applies the activation, and passes its KS new
elements to its threads with KS independent shuffles; then the next layer's partial sums. One exchange per
layer as before, with a shorter path around it; measured slower all the same (22-24 against 46 kHz on the
H100, benchmarks/notes/wavenet.md): 128 four-byte messages arrive at each CTA per layer instead of 32 sixteen-byte ones.

Thread t = 32 w + l handles row NW l + w (NW warps), so that every warp sends to every CTA: a CTA's partial
sums for a layer complete only after all warps of every CTA have read the previous layer's partials, which is
what lets two buffers alternate by layer parity.

The kernel's source: ``csrc/serial_chain_partials.cu``, compiled after ``csrc/cluster_common.cuh``.
"""

from __future__ import annotations

import functools

import torch

from ..cuda_runtime import compile_cluster_kernel, device_arch
from .cluster import launch_chain


def partials_config(H: int, C: int, bf16: bool) -> dict | None:
    """C CTAs of H threads (H a multiple of 32 up to 1024), H / C elements each (a multiple of 8, at most 32, and
    of 4 CTAs at least, for the 16-byte loads); the prefetch depth D (even) that fits the registers; None where
    the shape does not fit."""
    if H % 32 or H > 1024 or H % C or C < 4 or C > 16:
        return None
    ks = H // C
    if ks % 8 or ks > 32:
        return None
    per_layer = ks // 2 if bf16 else ks
    budget = min(255, 65536 // H) - 40 - ks  # registers left for the prefetched layers
    d = max(2, min(8, budget // per_layer))
    d -= d % 2
    return {"H": H, "C": C, "D": d, "WBF16": int(bf16)}


@functools.cache
def partials_kernel(H: int, C: int, D: int, WBF16: int, RELU: int, arch: str):
    """The column-split kernel for ``partials_config()``'s parameters plus RELU."""
    defines = dict(H=H, C=C, D=D, WBF16=WBF16, RELU=RELU)
    return compile_cluster_kernel("serial_chain_partials", "serial_chain_partials.cu", arch, defines, C)


def serial_chain_partials(
    weights: torch.Tensor, x0: torch.Tensor, n_samples: int, relu: bool, C: int | None = None, **over
) -> torch.Tensor:
    """Launcher: one cluster of C CTAs per stream ([B, H] float32 out); C defaults to 16 where H allows it and
    clusters of 16 are available, else 8; ``over`` overrides D."""
    H = weights.shape[1]
    bf16 = weights.dtype == torch.bfloat16
    if C is None:
        for c in (16, 8):
            if partials_config(H, c, bf16) is not None:
                try:
                    return serial_chain_partials(weights, x0, n_samples, relu, c, **over)
                except ValueError:
                    continue
        raise ValueError(f"the partials design cannot split H={H} over a cluster")
    cfg = partials_config(H, C, bf16)
    if cfg is None:
        raise ValueError(f"the partials design cannot split H={H} over C={C} CTAs")
    cfg.update(over)
    kernel = partials_kernel(**cfg, RELU=int(relu), arch=device_arch(x0.device))
    return launch_chain(kernel, weights, x0, n_samples, x0.shape[0], H, C)
