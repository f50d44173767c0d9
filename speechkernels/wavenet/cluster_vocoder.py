"""WaveNet vocoder generation on a thread-block cluster (CUDA C++ through ``cuda.core``; optional, Hopper or
newer; the Triton kernel in ``kernels.py`` is the fallback).

One cluster of ``C`` CTAs per stream, all samples in one launch. Per layer one exchange through distributed
shared memory (``st.async`` completing bytes on each CTA's mbarrier, as ``cluster.py``):

- CTA r computes gate units j in [r G2/C, (r+1) G2/C), one per warp: four lane groups hold the rows
  tanh/sigmoid of the current-input matrix and of the past-input matrix. The past product W_past x is computed
  when x is produced and queued (per CTA, in global memory, read one layer ahead), so the dilation queue holds
  G-vectors of this CTA's rows rather than inputs.
- z_j goes to every CTA; each CTA then has the whole z and computes the whole residual update itself (no second
  exchange) and its rows of the skip sum (kept un-reduced per lane until the head).
- Head: relu(skip) rows, head1 rows and the logits' rows are exchanged in turn; every CTA samples the same class
  from the same logits and uniform (inverse CDF, as ``generate_incremental``).
Weights stream from L2, each layer's loaded one layer ahead into registers; the head's rows stay in registers.
The 8 lanes of a group take interleaved 16-byte chunks of every vector (free of shared-memory bank conflicts).

The kernel's source: ``csrc/wavenet_cluster.cu``, compiled after ``csrc/cluster_common.cuh``.
"""

from __future__ import annotations

import functools

import torch

from .cuda_runtime import clusters_available, compile_cluster_kernel, device_arch, launch, set_dynamic_shared_memory
from .kernels import inverse_temperature


def config(model, C: int = 8) -> dict:
    """Compile-time sizes of the cluster kernel for ``model``; raises ValueError when the shapes do not split."""
    R, G2, SK, NC = model.residual_channels, model.gate_channels // 2, model.skip_channels, model.classes
    cfg = {"R": R, "G2": G2, "SK": SK, "NC": NC, "C": C}
    ok = (
        model.layers <= 512
        and C <= 8
        and G2 % C == 0
        and _embed_bytes(R, NC) <= 160 * 1024
        and 1 <= G2 // C <= 32
        and R % 32 == 0
        and G2 % 32 == 0
        and SK % 64 == 0
    )
    if ok:
        ng = 4 * (G2 // C)
        ok = R % ng == 0 and SK % (C * ng) == 0 and NC % (C * ng) == 0 and NC % 32 == 0
    if not ok:
        raise ValueError(f"the cluster vocoder kernel does not split {cfg}")
    return cfg


def available(model, C: int = 8) -> bool:
    if not clusters_available():
        return False
    try:
        config(model, C)
    except ValueError:
        return False
    return True


@functools.cache
def _kernel(
    R: int, G2: int, SK: int, NC: int, C: int, WBF16: int, GREEDY: int, arch: str, ACQ: int | None = None, VIL: int = 1
):
    """VIL 1: the lanes of a group take interleaved 16-byte chunks of each vector (no bank conflicts)."""
    defines = dict(R=R, G2=G2, SK=SK, NC=NC, C=C, WBF16=WBF16, GREEDY=GREEDY, VIL=VIL)
    if ACQ is not None:  # the wait's semantics (cluster_common.cuh; 0 unless given: measured faster here)
        defines["ACQ"] = ACQ
    kernel = compile_cluster_kernel("wavenet_cluster", "wavenet_cluster.cu", arch, defines, C)
    set_dynamic_shared_memory(kernel, _embed_bytes(R, NC), "the cluster vocoder kernel")
    return kernel


def _embed_bytes(R: int, NC: int) -> int:
    return NC * R * 4


def pack(model, cond, g, weights_dtype: torch.dtype, C: int) -> dict:
    """The model's weights in the kernel's layouts (``weights_dtype``: float32 or bfloat16) and the conditioning
    per frame [B, F, L, G] (the current-input bias folded in)."""
    L, R, G = model.layers, model.residual_channels, model.gate_channels
    G2 = G // 2
    dev = model.embed.weight.device

    from .model import stack_layers as stack

    wc, wp = stack(model.w_cur), stack(model.w_past)  # [L, G, R]
    # rows of unit j: cur tanh, cur sigmoid, past tanh, past sigmoid; units of CTA r, warp w: j = r G2/C + w
    wg = torch.stack([wc[:, :G2], wc[:, G2:], wp[:, :G2], wp[:, G2:]], dim=2)  # [L, G2, 4, R]
    wg = wg.reshape(L, C, G2 // C, 4, R)
    dil, qoff, _ = model.queue_layout(dev)
    wt = weights_dtype
    return {
        "wg": wg.to(wt).contiguous(),
        "wr": stack(model.w_res).to(wt).contiguous(),  # [L, R, G2]
        "br": stack(model.w_res, "bias").contiguous(),
        "ws": stack(model.w_skip).to(wt).contiguous(),  # [L, SK, G2]
        "bs": stack(model.w_skip, "bias").sum(0).contiguous(),
        "w1": model.head1.weight.to(wt).contiguous(),
        "b1": model.head1.bias.float().contiguous(),
        "w2": model.head2.weight.to(wt).contiguous(),
        "b2": model.head2.bias.float().contiguous(),
        "embed": model.embed.weight.float().contiguous(),
        "cb": model.frame_bias(cond, g).contiguous(),
        "dil": dil,
        "qoff": qoff,
    }


def wavenet_generate_cluster(
    model,
    cond: torch.Tensor | None,
    g: torch.Tensor | None,
    uniforms: torch.Tensor,
    temperature: float,
    weights_dtype: torch.dtype = torch.float32,
    C: int = 8,
) -> torch.Tensor:
    """Launcher: one cluster of C CTAs per stream, all samples in one launch ([B, n_samples] int64)."""
    import numpy as np

    cfg = config(model, C)
    n, B = uniforms.shape
    dev = uniforms.device
    p = pack(model, cond, g, weights_dtype, C)
    cb = p["cb"].expand(B, p["cb"].shape[1], model.layers, model.gate_channels).contiguous()
    Q = sum(model.dilations)
    queue = torch.zeros(B, C, Q, model.gate_channels // 2 // C, 2, device=dev)
    out = torch.empty(B, n, dtype=torch.long, device=dev)
    u = uniforms.float().contiguous()
    kernel = _kernel(**cfg, WBF16=int(weights_dtype == torch.bfloat16), GREEDY=int(temperature == 0),
                     arch=device_arch(dev))  # fmt: skip
    nt = 32 * (cfg["G2"] // C)
    hop = model.hop_length if cond is not None else 1 << 30
    tensors = (p["wg"], p["wr"], p["br"], p["ws"], p["bs"], p["w1"], p["b1"], p["w2"], p["b2"], p["embed"], cb,
               p["dil"], p["qoff"], queue, u, out)  # fmt: skip
    inv_temp = inverse_temperature(temperature)  # finite in float32 however small the temperature
    args = [np.uint64(x.data_ptr()) for x in tensors]
    args += [np.int32(v) for v in (B, model.layers, cb.shape[1], Q, hop, n, model.start_class())]
    args.append(np.float32(inv_temp))
    launch(kernel, dev, B, nt, args, cluster=C, shmem=_embed_bytes(cfg["R"], cfg["NC"]))
    return out
