"""Incremental WaveNet generation in PyTorch (Fast WaveNet): each layer keeps a queue of its last d_i inputs,
so a sample costs O(layers) work instead of a pass over the receptive field. Sampling draws one uniform number
per stream and sample and inverts the softmax's cumulative distribution (a GPU kernel given the same numbers
draws the same classes). The step keeps its position as a device tensor, so that one step can be captured in a
CUDA graph and replayed (the PyTorch CUDA-graph baseline)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._utils import as_bool, as_choice, as_float, as_generator, as_int, check_float_input


class IncrementalState:
    """The queues, the previous samples and the position of a batch of streams; ``step()`` makes one sample.

    Args:
        model: a WaveNet.
        cond_up: [B, n_samples, cond_channels] upsampled local conditioning, or None.
        g: [B, speaker_channels] speaker embeddings, or None.
        uniforms: [n_samples, B] numbers in [0, 1) to sample with.
        temperature: > 0 samples from softmax(logits / temperature), 0 takes the most likely class.
    """

    def __init__(self, model, cond_up, g, uniforms: torch.Tensor, temperature: float) -> None:
        self.model, self.uniforms, self.temperature = model, uniforms, temperature
        B = uniforms.shape[1]
        dev = uniforms.device
        # per layer: its inputs of the last d steps, a ring indexed by t mod d (zeros before the start)
        self.queues = [torch.zeros(B, d, model.residual_channels, device=dev) for d in model.dilations]
        # the conditioning terms do not depend on the samples: per layer [B, n_samples or 1, gate], or None
        self.bias = [model.layer_bias(i, cond_up, g) for i in range(model.layers)]
        self.bias = [None if isinstance(b, float) else b for b in self.bias]
        self.prev = torch.full((B,), model.start_class(), dtype=torch.long, device=dev)
        self.t = torch.zeros(1, dtype=torch.long, device=dev)
        self.logits = torch.empty(B, model.classes, device=dev)

    def step(self) -> torch.Tensor:
        """One sample per stream ([B] int64, also kept as the next step's input); self.logits holds its logits."""
        m = self.model
        x = m.embed(self.prev)
        skips = 0.0
        for i, d in enumerate(m.dilations):
            slot = self.t % d
            q = self.queues[i]
            b = self.bias[i]
            if b is None:
                b = 0.0
            else:  # local conditioning varies over time, global does not
                b = b.index_select(1, self.t).squeeze(1) if b.shape[1] > 1 else b[:, 0]
            skip, x_next = m.layer(i, q.index_select(1, slot).squeeze(1), x, b)
            q.index_copy_(1, slot, x.unsqueeze(1))
            skips = skips + skip
            x = x_next
        logits = m.head(skips)
        self.logits.copy_(logits)
        if self.temperature == 0:
            sample = logits.argmax(dim=1)
        else:
            u = self.uniforms.index_select(0, self.t).squeeze(0).double()
            z = logits.double()
            if self.temperature < 1e-300:  # z / temperature could overflow to inf (and the softmax to NaN):
                z = z - z.amax(dim=1, keepdim=True)  # shifted, the maximum's term stays exp(0) = 1
            cdf = torch.softmax(z / self.temperature, dim=1).cumsum(dim=1)
            sample = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).squeeze(1).clamp(max=m.classes - 1)
        self.prev.copy_(sample)
        self.t += 1
        return self.prev


class GenerationArgs(NamedTuple):
    """The normalised arguments of a generation run (``check_generation``)."""

    cond: torch.Tensor | None  # [B, cond_channels, frames] in the parameters' dtype, on the model's device
    g: torch.Tensor | None  # [B, speaker_channels] speaker embeddings
    uniforms: torch.Tensor  # [n_samples, B] on the model's device
    n_samples: int
    temperature: float


def check_generation(model, cond, n_samples, temperature, generator, speaker, batch, uniforms) -> GenerationArgs:
    """Argument checks of a generation run (once per call: one read of the speaker ids' min and max)."""
    n_samples = as_int(n_samples, "n_samples", minimum=1)
    temperature = as_float(temperature, "temperature", minimum=0.0, finite=True)
    generator = as_generator(generator)
    if batch is not None:
        batch = as_int(batch, "batch", minimum=1)
    cond, speaker, B = model.check_inputs(cond, speaker, batch, n_samples)
    dev = model.embed.weight.device
    if uniforms is None:
        uniforms = torch.rand(n_samples, B, generator=generator, device=dev if generator is None else generator.device)
    else:
        check_float_input(uniforms, "uniforms")
    uniforms = uniforms.to(dev)
    if uniforms.shape != (n_samples, B):
        raise ValueError(f"uniforms must be [n_samples={n_samples}, B={B}], got {tuple(uniforms.shape)}")
    g = model.speaker_embed(speaker) if speaker is not None else None
    return GenerationArgs(cond, g, uniforms, n_samples, temperature)


def prepare(model, cond, n_samples, temperature, generator, speaker, batch, uniforms) -> IncrementalState:
    """Argument checks and the state of a generation run."""
    a = check_generation(model, cond, n_samples, temperature, generator, speaker, batch, uniforms)
    return IncrementalState(model, model.upsample(a.cond, a.n_samples), a.g, a.uniforms, a.temperature)


@torch.no_grad()
def generate_incremental(
    model,
    cond: torch.Tensor | None,
    n_samples: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    speaker: torch.Tensor | None = None,
    batch: int | None = None,
    uniforms: torch.Tensor | None = None,
    return_logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Returns (classes [B, n_samples] int64, logits [B, classes, n_samples] or None).

    uniforms: [n_samples, B] numbers in [0, 1) to sample with (default: drawn from ``generator``).
    """
    return_logits = as_bool(return_logits, "return_logits")
    state = prepare(model, cond, n_samples, temperature, generator, speaker, batch, uniforms)
    n_samples, B = state.uniforms.shape
    out = torch.empty(B, n_samples, dtype=torch.long, device=state.prev.device)
    all_logits = torch.empty(B, model.classes, n_samples, device=out.device) if return_logits else None
    for t in range(n_samples):
        out[:, t] = state.step()
        if all_logits is not None:
            all_logits[:, :, t] = state.logits
    return out, all_logits


@torch.no_grad()
def generate_cuda_graph(
    model,
    cond: torch.Tensor | None,
    n_samples: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    speaker: torch.Tensor | None = None,
    batch: int | None = None,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """The same samples as ``generate_incremental``, one step captured in a CUDA graph and replayed per sample
    (the PyTorch CUDA-graph baseline of the benchmark; CUDA tensors only)."""
    state = prepare(model, cond, n_samples, temperature, generator, speaker, batch, uniforms)
    if not state.prev.is_cuda:
        raise ValueError(f"generate_cuda_graph needs the model on a CUDA device, got {state.prev.device}")
    n_samples, B = state.uniforms.shape
    out = torch.empty(n_samples, B, dtype=torch.long, device=state.prev.device)
    # warm-up step on a side stream (CUDA graphs need it), then rewind
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        state.step()
    torch.cuda.current_stream().wait_stream(side)
    for q in state.queues:
        q.zero_()
    state.prev.fill_(model.start_class())
    state.t.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        t = state.t.clone()  # the step advances state.t
        out.index_copy_(0, t, state.step().unsqueeze(0))
    # capturing recorded the step without running it; the position is still 0
    for _ in range(n_samples):
        graph.replay()
    return out.T.contiguous()


@torch.no_grad()
def generate_kernel(
    model,
    cond: torch.Tensor | None,
    n_samples: int,
    temperature: float,
    generator: torch.Generator | None,
    speaker: torch.Tensor | None,
    batch: int | None,
    kernel: str,
    weights_dtype: torch.dtype,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """Generation by one of the GPU kernels ("triton", "cluster", or "kernel": the cluster kernel for up to 16
    streams where it is available, else the Triton kernel); [B, n_samples] int64."""
    from .._utils import triton_interpreting
    from . import cluster_vocoder
    from .kernels import wavenet_generate

    kernel = as_choice(kernel, "kernel", ("kernel", "triton", "cluster"))
    if weights_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"weights_dtype must be torch.float32 or torch.bfloat16, got {weights_dtype}")
    # the kernels read the conditioning per frame: no upsampled copy
    a = check_generation(model, cond, n_samples, temperature, generator, speaker, batch, uniforms)
    dev = a.uniforms.device
    if not (dev.type == "cuda" or (kernel == "triton" and triton_interpreting())):
        raise ValueError(f"kernel={kernel!r} needs the model on a CUDA device")
    B = a.uniforms.shape[1]
    if kernel == "kernel":
        kernel = "cluster" if B <= 16 and cluster_vocoder.available(model) else "triton"
    if kernel == "cluster":
        if not cluster_vocoder.available(model):
            raise ValueError(
                "kernel='cluster' needs cuda-core, a GPU of compute capability >= 9.0 and a model whose widths "
                "split over the cluster (speechkernels.wavenet.cluster_vocoder.config)"
            )
        return cluster_vocoder.wavenet_generate_cluster(model, a.cond, a.g, a.uniforms, a.temperature, weights_dtype)
    if weights_dtype != torch.float32:
        raise ValueError("weights_dtype=torch.bfloat16 needs kernel='cluster'")
    return wavenet_generate(model, a.cond, a.g, a.uniforms, a.temperature)
