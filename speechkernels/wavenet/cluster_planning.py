"""Planning the thread-block cluster kernels of the WaveNet vocoder (``cluster_vocoder.py`` launches them): their
compile-time sizes for a model's widths and whether they split, their compiled variants, shared memory and
occupancy, and how many streams per cluster a batch takes (one stream per cluster while every cluster is resident
at once, else the batched kernel's fewest streams per cluster that keep them resident)."""

from __future__ import annotations

import functools

import torch

from .cuda_runtime import (
    clusters_available,
    compile_cluster_kernel,
    device_arch,
    max_active_clusters,
    set_dynamic_shared_memory,
)
from .weights import VocoderWeights

VOCODER_HEADER = "vocoder_common.cuh"  # the vocoder kernels' shared device helpers
BATCH_STREAMS = tuple(range(1, 33))  # streams per cluster the batched kernel is compiled for
SHARED_MEMORY_LIMIT = 227 * 1024  # a CTA's shared memory on Hopper


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
        and embed_bytes(R, NC) <= 160 * 1024
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
    set_dynamic_shared_memory(kernel, embed_bytes(R, NC), "the cluster vocoder kernel")
    return kernel


def embed_bytes(R: int, NC: int) -> int:
    return NC * R * 4


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
    kernel = compile_cluster_kernel(
        "wavenet_cluster_batch", "wavenet_cluster_batch.cu", arch, defines, C, (VOCODER_HEADER,)
    )
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
    return resident_clusters(kernel, 32 * (cfg["G2"] // cfg["C"]), cfg["C"], embed_bytes(cfg["R"], cfg["NC"]), device)


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
