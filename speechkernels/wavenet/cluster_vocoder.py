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
"""

from __future__ import annotations

import functools

import torch

from .cuda_runtime import (
    clusters_available,
    compile_cluster_kernel,
    device_arch,
    launch,
    max_active_clusters,
    set_dynamic_shared_memory,
)
from .weights import Continuation, VocoderInputs, VocoderWeights, frame_bias, inverse_temperature, run_start


def vocoder_cluster_config(
    layers: int, residual_channels: int, gate_channels: int, skip_channels: int, classes: int, C: int = 8
) -> dict:
    """Compile-time sizes of the cluster kernel for a WaveNet of these widths over clusters of C CTAs; raises
    ValueError when the shapes do not split."""
    R, G2, SK, NC = residual_channels, gate_channels // 2, skip_channels, classes
    cfg = {"R": R, "G2": G2, "SK": SK, "NC": NC, "C": C}
    ok = (
        layers <= 512
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


def vocoder_cluster_supported(
    layers: int, residual_channels: int, gate_channels: int, skip_channels: int, classes: int, C: int = 8
) -> bool:
    """Whether the cluster kernel runs here (``clusters_available``) for a WaveNet of these widths."""
    if not clusters_available():
        return False
    try:
        vocoder_cluster_config(layers, residual_channels, gate_channels, skip_channels, classes, C)
    except ValueError:
        return False
    return True


@functools.cache
def vocoder_cluster_kernel(
    R: int, G2: int, SK: int, NC: int, C: int, WBF16: int, GREEDY: int, arch: str, ACQ: int | None = None, VIL: int = 1
):
    """The compiled kernel for ``vocoder_cluster_config``'s sizes, the weight type (WBF16) and greedy sampling;
    ACQ the wait's semantics (cluster_common.cuh; 0 unless given: measured faster here); VIL 1: the lanes of a
    group take interleaved 16-byte chunks of each vector (no bank conflicts)."""
    defines = dict(R=R, G2=G2, SK=SK, NC=NC, C=C, WBF16=WBF16, GREEDY=GREEDY, VIL=VIL)
    if ACQ is not None:
        defines["ACQ"] = ACQ
    kernel = compile_cluster_kernel("wavenet_cluster", "wavenet_cluster.cu", arch, defines, C, (VOCODER_HEADER,))
    set_dynamic_shared_memory(kernel, _embed_bytes(R, NC), "the cluster vocoder kernel")
    return kernel


def _embed_bytes(R: int, NC: int) -> int:
    return NC * R * 4


VOCODER_HEADER = "vocoder_common.cuh"  # the vocoder kernels' shared device helpers
BATCH_STREAMS = tuple(range(1, 33))  # streams per cluster the batched kernel is compiled for
SHARED_MEMORY_LIMIT = 227 * 1024  # a CTA's shared memory on Hopper


def batch_shared_bytes(R: int, G2: int, SK: int, NC: int, C: int, MS: int) -> int:
    """The batched kernel's dynamic shared memory: the embedding, per stream of the cluster two exchange buffers,
    two inputs and the staging slice, and the CTA's head rows (``csrc/wavenet_cluster_batch.cu``)."""
    head = (SK // C + NC // C) * SK * 4  # this CTA's head rows (float32; bfloat16 takes half)
    return 4 * (NC * R + 2 * MS * max(G2, SK, NC) + 2 * MS * (R + 4) + MS * (max(SK // C, NC // C) + 4)) + head


def batch_streams_supported(cfg: dict, MS: int) -> bool:
    """Whether the batched kernel runs MS streams per cluster for ``vocoder_cluster_config``'s sizes."""
    R, G2, SK, NC, C = cfg["R"], cfg["G2"], cfg["SK"], cfg["NC"], cfg["C"]
    return (
        MS in BATCH_STREAMS
        and (G2 // C) % 4 == 0
        and (SK // C) % 4 == 0
        and (NC // C) % 4 == 0
        and batch_shared_bytes(R, G2, SK, NC, C, MS) + 8 * 1024 <= SHARED_MEMORY_LIMIT
    )


@functools.cache
def vocoder_cluster_batch_kernel(
    R: int, G2: int, SK: int, NC: int, C: int, MS: int, WBF16: int, GREEDY: int, arch: str
):
    """The batched kernel (MS streams per cluster) for ``vocoder_cluster_config``'s sizes."""
    defines = dict(R=R, G2=G2, SK=SK, NC=NC, C=C, MS=MS, WBF16=WBF16, GREEDY=GREEDY, VIL=1)
    kernel = compile_cluster_kernel("wavenet_cluster_batch", "wavenet_cluster_batch.cu", arch, defines, C,
                                    (VOCODER_HEADER,))  # fmt: skip
    set_dynamic_shared_memory(kernel, batch_shared_bytes(R, G2, SK, NC, C, MS), "the batched vocoder kernel")
    return kernel


def resident_clusters(kernel, threads: int, C: int, shmem: int, device: torch.device) -> int:
    """How many clusters of C CTAs of ``kernel`` the GPU holds at once (the driver's occupancy query; the SM count
    over C where the query is unavailable)."""
    n = max_active_clusters(kernel, threads, C, shmem)
    if n is None:
        n = torch.cuda.get_device_properties(device).multi_processor_count // C
    return max(1, n)


@functools.cache
def one_stream_capacity(cfg_items: tuple, arch: str, device: torch.device) -> int:
    """Resident clusters of the one-stream kernel for ``vocoder_cluster_config``'s sizes (as items)."""
    cfg = dict(cfg_items)
    kernel = vocoder_cluster_kernel(**cfg, WBF16=0, GREEDY=0, arch=arch)
    return resident_clusters(kernel, 32 * (cfg["G2"] // cfg["C"]), cfg["C"], _embed_bytes(cfg["R"], cfg["NC"]), device)


@functools.cache
def batch_capacity(cfg_items: tuple, arch: str, device: torch.device) -> int:
    """Resident clusters of the batched kernel (its largest variant: the most shared memory) for these sizes."""
    cfg = dict(cfg_items)
    ms = max(m for m in BATCH_STREAMS if batch_streams_supported(cfg, m))
    kernel = vocoder_cluster_batch_kernel(**cfg, MS=ms, WBF16=0, GREEDY=0, arch=arch)
    shmem = batch_shared_bytes(cfg["R"], cfg["G2"], cfg["SK"], cfg["NC"], cfg["C"], ms)
    return resident_clusters(kernel, 32 * (cfg["G2"] // cfg["C"]), cfg["C"], shmem, device)


def batch_kernel_plan(cfg: dict, B: int, device: torch.device) -> tuple[int, int]:
    """``batch_plan`` for the batched kernel of ``vocoder_cluster_config``'s sizes on ``device``."""
    resident = batch_capacity(tuple(cfg.items()), device_arch(device), device)
    return batch_plan(B, resident, tuple(m for m in BATCH_STREAMS if batch_streams_supported(cfg, m)))


def cluster_plan(weights: VocoderWeights, B: int, device: torch.device, C: int = 8) -> tuple[int, int]:
    """(streams per cluster, clusters) the cluster kernels run B streams with: one stream per cluster (the
    one-stream kernel, ``wavenet_cluster.cu``) while every cluster is resident at once, else the fewest streams per
    cluster of the batched kernel that keep them resident (``batch_plan``). The batched kernel is compiled (for
    its occupancy) only once B needs it."""
    w = weights
    cfg = vocoder_cluster_config(w.layers, w.residual_channels, w.gate_channels, w.skip_channels, w.classes, C)
    if B <= one_stream_capacity(tuple(cfg.items()), device_arch(device), device):
        return 1, B
    return batch_kernel_plan(cfg, B, device)


def batch_plan(B: int, resident: int, allowed=BATCH_STREAMS) -> tuple[int, int]:
    """(streams per cluster MS, clusters) for B streams and ``resident`` clusters at once: the fewest streams per
    cluster that keep every cluster resident, the most allowed beyond (more clusters then run in turn)."""
    ms = next((m for m in allowed if m * resident >= B), allowed[-1])
    return ms, -(-B // ms)


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
    import numpy as np

    w = weights
    cond, g, uniforms, temperature = inputs
    cfg = vocoder_cluster_config(w.layers, w.residual_channels, w.gate_channels, w.skip_channels, w.classes, C)
    n, B = uniforms.shape
    dev = uniforms.device
    p = cluster_layout(w, weights_dtype, C)
    cb = frame_bias(w, cond, g).contiguous()
    cb = cb.expand(B, cb.shape[1], w.layers, w.gate_channels).contiguous()
    Q = w.queue_slots
    queue = torch.zeros(B, C, Q, w.gate_channels // 2 // C, 2, device=dev)
    out = torch.empty(B, n, dtype=torch.long, device=dev)
    u = uniforms.float().contiguous()
    kernel = vocoder_cluster_kernel(**cfg, WBF16=int(weights_dtype == torch.bfloat16), GREEDY=int(temperature == 0),
                                    arch=device_arch(dev))  # fmt: skip
    nt = 32 * (cfg["G2"] // C)
    hop = w.hop_length if cond is not None else 1 << 30
    tensors = (p["wg"], p["wr"], p["br"], p["ws"], p["bs"], p["w1"], p["b1"], p["w2"], p["b2"], w.embed, cb,
               w.dilations, w.queue_offsets, queue, u, out)  # fmt: skip
    inv_temp = inverse_temperature(temperature)  # finite in float32 however small the temperature
    args = [np.uint64(x.data_ptr()) for x in tensors]
    args += [np.int32(v) for v in (B, w.layers, cb.shape[1], Q, hop, n, w.start_class)]
    args.append(np.float32(inv_temp))
    launch(kernel, dev, B, nt, args, cluster=C, shmem=_embed_bytes(cfg["R"], cfg["NC"]))
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
        vocoder_cluster_batch_kernel(**cfg, MS=ms, WBF16=int(weights_dtype == torch.bfloat16), GREEDY=int(greedy),
                                     arch=device_arch(device))  # fmt: skip
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
    import numpy as np

    w = weights
    cond, g, uniforms, temperature = inputs
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
    cb = frame_bias(w, cond, g).contiguous()
    cb = cb.expand(B, cb.shape[1], w.layers, w.gate_channels).contiguous()
    prev, phase, queue, queue_rows, queue_time = run_start(w, B, dev, cont, lambda: batch_queue(w, B, C, dev))
    out = torch.empty(B, n, dtype=torch.long, device=dev)
    u = uniforms.float().contiguous()
    kernel = vocoder_cluster_batch_kernel(**cfg, MS=MS, WBF16=int(weights_dtype == torch.bfloat16),
                                          GREEDY=int(temperature == 0), arch=arch)  # fmt: skip
    hop = w.hop_length if cond is not None else 1 << 30
    tensors = (p["wg"], p["wr"], p["br"], p["ws"], p["bs"], p["w1"], p["b1"], p["w2"], p["b2"], w.embed, cb,
               w.dilations, w.queue_offsets, queue, u, prev, phase, queue_rows, out)  # fmt: skip
    args = [np.uint64(x.data_ptr()) for x in tensors]
    args += [np.int32(v) for v in (B, w.layers, cb.shape[1], w.queue_slots, hop, n, queue_time)]
    args.append(np.float32(inverse_temperature(temperature)))
    launch(kernel, dev, K, 32 * (cfg["G2"] // C), args, cluster=C,
           shmem=batch_shared_bytes(cfg["R"], cfg["G2"], cfg["SK"], cfg["NC"], C, MS))  # fmt: skip
    return out


def batch_queue(weights: VocoderWeights, rows: int, C: int, device) -> torch.Tensor:
    """Zeroed dilation queues of the batched kernel, ``rows`` streams' worth: [rows, C, Q, G2 / C, 2] (each CTA's
    past products of its gate units, a row per queue slot)."""
    G2 = weights.gate_channels // 2
    return torch.zeros(rows, C, weights.queue_slots, G2 // C, 2, device=device)
