"""WaveNet vocoder generation on a thread-block cluster (CUDA C++ through ``cuda.core``; optional, Hopper or
newer; the Triton kernel in ``triton_vocoder.py`` is the fallback).

One cluster of ``C`` CTAs per stream, all samples in one launch. Per layer one exchange through distributed
shared memory (``st.async`` completing bytes on each CTA's mbarrier, as ``proxy/cluster.py``):

- CTA r computes gate units j in [r G2/C, (r+1) G2/C), one per warp: four lane groups hold the rows
  tanh/sigmoid of the current-input matrix and of the past-input matrix. The past product W_past x is computed
  when x is produced and queued (per CTA, in global memory, read one layer ahead), so the dilation queue holds
  G-vectors of this CTA's rows rather than inputs.
- z_j goes to every CTA; each CTA then has the whole z and computes the whole residual update itself (no second
  exchange) and its rows of the skip sum (kept un-reduced per lane until the head).
- Head: relu(skip) rows, head1 rows and the logits' rows are exchanged in turn; every CTA samples the same class
  from the same logits and uniform (inverse CDF, as the PyTorch path).
Weights stream from L2, each layer's loaded one layer ahead into registers; the head's rows stay in registers.
The 8 lanes of a group take interleaved 16-byte chunks of every vector (free of shared-memory bank conflicts).

The kernel's source: ``csrc/wavenet_cluster.cu``, compiled after ``csrc/cluster_common.cuh`` and
``csrc/vocoder_common.cuh``.

Beyond the clusters the GPU holds at once (15 on an H100), the batched kernel (``csrc/wavenet_cluster_batch.cu``,
``wavenet_generate_cluster_batch``) runs several streams per cluster with the same split: each lane applies its
weights to every stream's vector, the 8 lanes' sums of up to 8 streams reduced together, each CTA's slices staged
and sent in 16-byte chunks; ``cluster_plan`` picks one kernel or the other and the streams per cluster. It also
continues earlier launches (the queues, the last classes, the frames' phase): ``server.WaveNetServer``'s chunks.
The kernels' sizes, variants and plans: ``cluster_planning.py``; this module lays out the weights and launches.
"""

from __future__ import annotations

import torch

from .cluster_planning import (
    batch_kernel_plan,
    batch_shared_bytes,
    batch_streams_supported,
    cluster_plan,
    embed_bytes,
    vocoder_cluster_batch_kernel,
    vocoder_cluster_config,
    vocoder_cluster_kernel,
)
from .cuda_runtime import device_arch, launch
from .weights import Continuation, VocoderInputs, VocoderWeights, frame_bias, inverse_temperature, run_start


def cluster_layout(weights: VocoderWeights, weights_dtype: torch.dtype, C: int) -> dict:
    """The weights in the kernel's layouts (``weights_dtype``: float32 or bfloat16 matrices), packed once per
    weights, dtype and cluster size (kept in ``weights.layouts``)."""
    key = ("cluster", weights_dtype, C)
    if key not in weights.layouts:
        w, wt = weights, weights_dtype
        L, R, G2 = w.layers, w.residual_channels, w.gate_channels // 2
        # rows of unit j: cur tanh, cur sigmoid, past tanh, past sigmoid; units of CTA r, warp w: j = r G2/C + w
        wg = torch.stack([w.w_cur[:, :G2], w.w_cur[:, G2:], w.w_past[:, :G2], w.w_past[:, G2:]], dim=2)
        wg = wg.reshape(L, C, G2 // C, 4, R)  # [L, G2, 4, R] split by CTA
        weights.layouts[key] = {
            "wg": wg.to(wt).contiguous(),
            "wr": w.w_res.to(wt).contiguous(),  # [L, R, G2]
            "br": w.b_res.contiguous(),
            "ws": w.w_skip.to(wt).contiguous(),  # [L, SK, G2]
            "bs": w.b_skip.sum(0).contiguous(),
            "w1": w.w_head1.to(wt).contiguous(),
            "b1": w.b_head1,
            "w2": w.w_head2.to(wt).contiguous(),
            "b2": w.b_head2,
        }
    return weights.layouts[key]


def wavenet_generate_cluster(
    weights: VocoderWeights, inputs: VocoderInputs, weights_dtype: torch.dtype = torch.float32, C: int = 8
) -> torch.Tensor:
    """Launcher: one cluster of C CTAs per stream, all samples in one launch ([B, n_samples] int64), from the
    model's weights (``weights.vocoder_weights``) and a run's checked inputs. ``weights_dtype``: torch.float32 or
    torch.bfloat16, the type the kernel reads the matrices in (float32 arithmetic)."""
    w = weights
    uniforms, temperature = inputs.uniforms, inputs.temperature
    cfg = vocoder_cluster_config(w.layers, w.residual_channels, w.gate_channels, w.skip_channels, w.classes, C)
    n, B = uniforms.shape
    dev = uniforms.device
    p = cluster_layout(w, weights_dtype, C)
    Q = w.queue_slots
    queue = torch.zeros(B, C, Q, w.gate_channels // 2 // C, 2, device=dev)
    out = torch.empty(B, n, dtype=torch.long, device=dev)
    kernel = vocoder_cluster_kernel(
        **cfg, WBF16=int(weights_dtype == torch.bfloat16), GREEDY=int(temperature == 0), arch=device_arch(dev)
    )
    _launch(kernel, B, embed_bytes(cfg["R"], cfg["NC"]), cfg, C, w, p, inputs, (queue,), (out,), w.start_class)
    return out


def compile_batch_kernels(
    weights: VocoderWeights,
    max_streams: int,
    weights_dtype: torch.dtype,
    greedy: bool,
    device: torch.device,
    C: int = 8,
) -> list[int]:
    """Compiles (once; NVRTC, about a second each) the batched kernel's variants that ``cluster_plan`` picks for 1 to
    max_streams streams; returns their streams per cluster."""
    w = weights
    cfg = vocoder_cluster_config(w.layers, w.residual_channels, w.gate_channels, w.skip_channels, w.classes, C)
    counts = sorted({cluster_plan(w, B, device, C)[0] for B in range(1, max_streams + 1)})
    for ms in counts:
        vocoder_cluster_batch_kernel(
            **cfg, MS=ms, WBF16=int(weights_dtype == torch.bfloat16), GREEDY=int(greedy), arch=device_arch(device)
        )
    return counts


def wavenet_generate_cluster_batch(
    weights: VocoderWeights,
    inputs: VocoderInputs,
    weights_dtype: torch.dtype = torch.float32,
    C: int = 8,
    streams_per_cluster: int | None = None,
    cont: Continuation | None = None,
) -> torch.Tensor:
    """Launcher of the batched kernel: MS streams per cluster (the fewest that keep every cluster resident unless
    ``streams_per_cluster`` gives MS), all samples in one launch ([B, n_samples] int64).

    ``cont`` continues earlier launches (``weights.Continuation``; its queue: ``batch_queue``)."""
    w = weights
    uniforms, temperature = inputs.uniforms, inputs.temperature
    cfg = vocoder_cluster_config(w.layers, w.residual_channels, w.gate_channels, w.skip_channels, w.classes, C)
    n, B = uniforms.shape
    dev = uniforms.device
    arch = device_arch(dev)
    if streams_per_cluster is None:
        MS, K = batch_kernel_plan(cfg, B, dev)
    else:
        MS, K = streams_per_cluster, -(-B // streams_per_cluster)
    if not batch_streams_supported(cfg, MS):
        raise ValueError(f"the batched cluster kernel does not run {MS} streams per cluster for {cfg}")
    p = cluster_layout(w, weights_dtype, C)
    prev, phase, queue, queue_rows, queue_time = run_start(w, B, dev, cont, lambda: batch_queue(w, B, C, dev))
    out = torch.empty(B, n, dtype=torch.long, device=dev)
    kernel = vocoder_cluster_batch_kernel(
        **cfg, MS=MS, WBF16=int(weights_dtype == torch.bfloat16), GREEDY=int(temperature == 0), arch=arch
    )
    shmem = batch_shared_bytes(cfg["R"], cfg["G2"], cfg["SK"], cfg["NC"], C, MS)
    _launch(kernel, K, shmem, cfg, C, w, p, inputs, (queue,), (prev, phase, queue_rows, out), queue_time)
    return out


_LAYOUT_KEYS = ("wg", "wr", "br", "ws", "bs", "w1", "b1", "w2", "b2")


def _launch(
    kernel,
    grid: int,
    shmem: int,
    cfg: dict,
    C: int,
    w: VocoderWeights,
    p: dict,
    inputs: VocoderInputs,
    queues: tuple,
    outputs: tuple,
    last: int,
) -> None:
    """Launches either cluster kernel (``grid`` clusters of C CTAs) with its arguments in their order: the
    layout's weights, the embedding, each stream's frame bias, the dilations and queue offsets, ``queues``, the
    uniforms, ``outputs`` (pointers); then the streams, layers, frames, queue slots, hop and samples and ``last``
    (int32: the start class of the one-stream kernel, the queue's clock of the batched one), and the inverse
    temperature (float32). The tensors made here live until the launch is enqueued."""
    import numpy as np

    cond, g, uniforms, temperature = inputs
    n, B = uniforms.shape
    cb = frame_bias(w, cond, g).contiguous()
    cb = cb.expand(B, cb.shape[1], w.layers, w.gate_channels).contiguous()
    hop = w.hop_length if cond is not None else 1 << 30
    u = uniforms.float().contiguous()
    tensors = (*(p[k] for k in _LAYOUT_KEYS), w.embed, cb, w.dilations, w.queue_offsets, *queues, u, *outputs)
    ints = (B, w.layers, cb.shape[1], w.queue_slots, hop, n, last)
    args = [np.uint64(x.data_ptr()) for x in tensors]
    args += [np.int32(v) for v in ints]
    args.append(np.float32(inverse_temperature(temperature)))  # finite in float32 however small the temperature
    launch(kernel, uniforms.device, grid, 32 * (cfg["G2"] // C), args, cluster=C, shmem=shmem)


def batch_queue(weights: VocoderWeights, rows: int, C: int, device) -> torch.Tensor:
    """Zeroed dilation queues of the batched kernel, ``rows`` streams' worth: [rows, C, Q, G2 / C, 2] (each CTA's
    past products of its gate units, a row per queue slot)."""
    G2 = weights.gate_channels // 2
    return torch.zeros(rows, C, weights.queue_slots, G2 // C, 2, device=device)
