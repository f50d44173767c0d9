"""What the generation kernels read, as plain tensors: the vocoder's weights packed once per kind of matrix
(``VocoderWeights``, built from a WaveNet's parameters by ``pack_vocoder_weights`` and cached per parameter
version by ``vocoder_weights``), the conditioning per frame (``frame_bias``) and the sampling's inverse
temperature; a run's checked inputs (``VocoderInputs``). No launcher sees the module."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32


@dataclasses.dataclass(frozen=True, eq=False)
class VocoderWeights:
    """A WaveNet's weights as the generation kernels read them (float32, contiguous, on the model's device), its
    sizes, and its dilation queues' layout. ``layouts`` keeps what a kernel derives from them once (the cluster
    kernel's packed matrices per weight dtype and cluster size)."""

    layers: int
    residual_channels: int
    gate_channels: int
    skip_channels: int
    classes: int
    hop_length: int
    start_class: int  # the input before the first sample
    queue_slots: int  # sum of the dilations: a stream's queue rows
    embed: torch.Tensor  # [classes, R]
    w_past: torch.Tensor  # [L, G, R]
    w_cur: torch.Tensor  # [L, G, R]
    b_cur: torch.Tensor  # [L, G]
    w_res: torch.Tensor  # [L, R, G/2]
    b_res: torch.Tensor  # [L, R]
    w_skip: torch.Tensor  # [L, S, G/2]
    b_skip: torch.Tensor  # [L, S]
    w_head1: torch.Tensor  # [S, S]
    b_head1: torch.Tensor  # [S]
    w_head2: torch.Tensor  # [classes, S]
    b_head2: torch.Tensor  # [classes]
    dilations: torch.Tensor  # [L] int32
    queue_offsets: torch.Tensor  # [L] int32: each layer's first row in a stream's queue block
    w_cond: torch.Tensor | None  # [L * G, cond_channels]: every layer's conditioning matrix, or None
    w_speaker: torch.Tensor | None  # [L * G, speaker_channels], or None
    layouts: dict = dataclasses.field(default_factory=dict, repr=False)


class VocoderInputs(NamedTuple):
    """A generation run's inputs after the checks (``generation.check_generation``), as the launchers take them
    beside the weights."""

    cond: torch.Tensor | None  # [B, cond_channels, frames] in the parameters' dtype, on their device; or None
    g: torch.Tensor | None  # [B, speaker_channels] speaker embeddings, or None
    uniforms: torch.Tensor  # [n_samples, B] numbers in [0, 1) to sample with, on the model's device
    temperature: float  # 0: the most likely class


def stack_layers(mods, attr: str = "weight") -> torch.Tensor:
    """A per-layer parameter of a ModuleList stacked into one [L, ...] float32 tensor."""
    return torch.stack([getattr(m, attr) for m in mods]).float()


@torch.no_grad()
def pack_vocoder_weights(model) -> VocoderWeights:
    """The weights of ``model`` (a WaveNet) in the kernels' layouts; a new copy on every call."""
    dev = model.embed.weight.device
    dil = model.dilations
    first = [sum(dil[:i]) for i in range(model.layers)]

    def rows(mods):  # the layers' conditioning matrices one above the other: one product for all layers
        return None if mods is None else torch.cat([m.weight.detach() for m in mods]).float()

    return VocoderWeights(
        layers=model.layers,
        residual_channels=model.residual_channels,
        gate_channels=model.gate_channels,
        skip_channels=model.skip_channels,
        classes=model.classes,
        hop_length=model.hop_length,
        start_class=model.start_class(),
        queue_slots=sum(dil),
        embed=model.embed.weight.detach().float().contiguous(),
        w_past=stack_layers(model.w_past),
        w_cur=stack_layers(model.w_cur),
        b_cur=stack_layers(model.w_cur, "bias"),
        w_res=stack_layers(model.w_res),
        b_res=stack_layers(model.w_res, "bias"),
        w_skip=stack_layers(model.w_skip),
        b_skip=stack_layers(model.w_skip, "bias"),
        w_head1=model.head1.weight.detach().float().contiguous(),
        b_head1=model.head1.bias.detach().float().contiguous(),
        w_head2=model.head2.weight.detach().float().contiguous(),
        b_head2=model.head2.bias.detach().float().contiguous(),
        dilations=torch.tensor(dil, dtype=torch.int32, device=dev),
        queue_offsets=torch.tensor(first, dtype=torch.int32, device=dev),
        w_cond=rows(model.w_cond),
        w_speaker=rows(model.w_speaker),
    )


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> (parameter key, VocoderWeights)


def parameter_key(model) -> tuple:
    """What the packed weights depend on: each parameter's storage, dtype, shape and version counter (bumped by
    every in-place update: optimizer steps, load_state_dict, ``copy_`` under no_grad)."""
    return tuple(
        (name, p.data_ptr(), p.dtype, p.device, tuple(p.shape), p._version) for name, p in model.named_parameters()
    )


def vocoder_weights(model) -> VocoderWeights:
    """``pack_vocoder_weights(model)``, packed again only when a parameter has changed since the last call."""
    key = parameter_key(model)
    cached = _CACHE.get(model)
    if cached is not None and cached[0] == key:
        return cached[1]
    weights = pack_vocoder_weights(model)
    _CACHE[model] = (key, weights)
    return weights


def frame_bias(weights: VocoderWeights, cond: torch.Tensor | None, g: torch.Tensor | None) -> torch.Tensor:
    """Each layer's gate bias per conditioning frame, [B or 1, frames or 1, L, G] float32: the current input's
    bias plus the conditioning terms (the model's per-sample bias, per frame instead; the kernels read it once
    per hop). cond: [B, cond_channels, frames] or None; g: [B, speaker_channels] speaker embeddings or None."""
    out = weights.b_cur[None, None]
    L, G = out.shape[2:]
    if cond is not None:
        B, C, frames = cond.shape
        rows = cond.transpose(1, 2).reshape(B * frames, C).float()
        out = out + bucketed_linear(rows, weights.w_cond).view(B, frames, L, G)
    if g is not None:
        out = out + bucketed_linear(g.float(), weights.w_speaker).view(g.shape[0], 1, L, G)
    return out


def bucketed_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, w)`` of rows x [M, K], on the GPU with M padded by zero rows to a power of two: cuBLAS picks
    its kernel by the shape and loads each kernel at its first launch (8 to 70 ms each on an H100 or H200,
    benchmarks/first_call_probe.py), so that a server whose batch changes between chunks would wait on each new
    shape; with M in a few buckets, ``WaveNetServer.warmup`` loads them all beforehand."""
    M = x.shape[0]
    if not x.is_cuda or M == 0 or M & (M - 1) == 0:
        return F.linear(x, w)
    return F.linear(F.pad(x, (0, 0, 0, (1 << (M - 1).bit_length()) - M)), w)[:M]


def inverse_temperature(temperature: float) -> float:
    """The generation kernels' float32 scalar 1 / temperature (0 for temperature 0: greedy), clamped to the largest
    finite float32 (Triton's ``_wavenet_generate_kernel`` and the cluster kernel of ``cluster_vocoder``). Unclamped,
    a temperature below ~3e-39 would make it inf, and (logits - max) * inf NaN at the maximum: every sample class 0.
    Clamped, the maximum's term stays exp(0) = 1 and the others underflow to 0: the most likely class (ties drawn
    among), as the PyTorch path's float64 softmax."""
    return min(1.0 / temperature, FLOAT32_MAX) if temperature > 0 else 0.0


class Continuation(NamedTuple):
    """Where a kernel launch continues earlier launches of its streams (``server.WaveNetServer``'s chunks); each
    field left None (0) starts anew. ``prev`` [B] int64: each stream's input class before its first sample (the
    start class); ``phase`` [B] int32: its sample index within cond's first frame at its first sample (0);
    ``queue``: the dilation queues kept between launches, in the launcher's layout (``triton_queue``,
    ``batch_queue``; zeros), stream b's at row ``rows[b]`` (int32; b); ``time``: the samples made with the queue so
    far, one clock for all its streams (0)."""

    prev: torch.Tensor | None = None
    phase: torch.Tensor | None = None
    queue: torch.Tensor | None = None
    rows: torch.Tensor | None = None
    time: int = 0


def run_start(
    weights: VocoderWeights, B: int, device, cont: Continuation | None, new_queue: Callable[[], torch.Tensor]
) -> Continuation:
    """The continuation of a launch of B streams with every field given: ``cont``'s, the start's where None
    (``new_queue()`` for the queue)."""
    prev, phase, queue, rows, time = cont if cont is not None else Continuation()
    if prev is None:
        prev = torch.full((B,), weights.start_class, dtype=torch.long, device=device)
    if phase is None:
        phase = torch.zeros(B, dtype=torch.int32, device=device)
    if queue is None:
        queue = new_queue()
    if rows is None:
        rows = torch.arange(B, dtype=torch.int32, device=device)
    return Continuation(prev, phase, queue, rows, time)
