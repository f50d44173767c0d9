"""WaveNet generation: the argument checks (once per call), the uniform numbers drawn up front, and the choice of
path: the PyTorch incremental path (``incremental.py``, the CPU's and the reference), the Triton kernel
(``triton_vocoder.py``) or the thread-block cluster kernel (``cluster_vocoder.py``). The kernels take the
model's weights as plain tensors (``weights.vocoder_weights``, packed once per parameter version)."""

from __future__ import annotations

import torch

from .._args import as_bool, as_choice, as_float, as_generator, as_int, check_float_input
from .._backend import triton_interpreting, triton_missing
from .cluster_planning import cluster_plan, vocoder_cluster_supported
from .cluster_vocoder import wavenet_generate_cluster, wavenet_generate_cluster_batch
from .incremental import IncrementalState, sample_incremental
from .weights import VocoderInputs, vocoder_weights

KERNELS = ("auto", "torch", "triton", "cluster")  # generate()'s paths; "auto" chooses (``generate``)
try:  # the Triton kernels; without Triton (error names it) the PyTorch path serves every call
    from . import triton_vocoder
except ImportError as error:
    triton_vocoder = triton_missing(error)


def check_triton_kernel() -> None:
    """The Triton kernel can run: Triton is installed."""
    if triton_vocoder is None:
        raise ValueError("kernel='triton' needs Triton (pip install triton), which is not installed")


def check_generation(model, cond, n_samples, temperature, generator, speaker, batch, uniforms) -> VocoderInputs:
    """Argument checks of a generation run (once per call: one read of the speaker ids' min and max); draws the
    uniforms from ``generator`` unless given."""
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
    return VocoderInputs(cond, g, uniforms, temperature)


def incremental_state(model, cond, n_samples, temperature, generator, speaker, batch, uniforms) -> IncrementalState:
    """Argument checks and the PyTorch path's state of a generation run (``sample_incremental`` runs it: the
    reference path; ``uniforms``: [n_samples, B] numbers in [0, 1) to sample with, or None: drawn from
    ``generator``)."""
    a = check_generation(model, cond, n_samples, temperature, generator, speaker, batch, uniforms)
    return IncrementalState(model, model.upsample(a.cond, a.uniforms.shape[0]), a.g, a.uniforms, a.temperature)


def cluster_kernel_available(model, C: int = 8) -> bool:
    """Whether ``generate(kernel="cluster")`` can run ``model`` here: cuda-core, a GPU of compute capability 9.0 or
    newer, and widths that split over clusters of C CTAs (``cluster_planning.vocoder_cluster_config``)."""
    sizes = (model.layers, model.residual_channels, model.gate_channels, model.skip_channels, model.classes)
    return vocoder_cluster_supported(*sizes, C)


def check_weights_dtype(weights_dtype: torch.dtype) -> None:
    if weights_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"weights_dtype must be torch.float32 or torch.bfloat16, got {weights_dtype}")


def choose_kernel(kernel: str, weights_dtype: torch.dtype, model, cuda: bool) -> str:
    """The generation path (one of ``KERNELS`` but "auto") that ``kernel`` names for ``model`` on a CUDA device
    (``cuda``) or not, with its weights' dtype checked: "auto" is the cluster kernel where it runs, else the Triton
    kernel on a GPU, the PyTorch path on the CPU; bfloat16 weights need the cluster kernel. Whether a named kernel
    runs here is ``check_kernel_runs``'s (callers check their other arguments in between)."""
    kernel = as_choice(kernel, "kernel", KERNELS)
    check_weights_dtype(weights_dtype)
    if kernel == "auto":
        kernel = ("cluster" if cluster_kernel_available(model) else "triton") if cuda else "torch"
    if kernel != "cluster" and weights_dtype != torch.float32:
        raise ValueError("weights_dtype=torch.bfloat16 needs kernel='cluster'")
    return kernel


def check_kernel_runs(kernel: str, model, cuda: bool) -> None:
    """A ValueError where the chosen path cannot run ``model`` here: the Triton kernel without Triton or off a CUDA
    device (but under the interpreter), the cluster kernel off a CUDA device or without what it needs."""
    if kernel == "triton":
        check_triton_kernel()
        if not (cuda or triton_interpreting()):
            raise ValueError("kernel='triton' needs the model on a CUDA device")
    elif kernel == "cluster":
        if not cuda:
            raise ValueError("kernel='cluster' needs the model on a CUDA device")
        if not cluster_kernel_available(model):
            raise ValueError(
                "kernel='cluster' needs cuda-core, a GPU of compute capability >= 9.0 and a model whose widths "
                "split over the cluster (speechkernels.wavenet.cluster_planning.vocoder_cluster_config)"
            )


def generate(
    model,
    cond: torch.Tensor | None,
    n_samples: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    speaker: torch.Tensor | None = None,
    batch: int | None = None,
    kernel: str = "auto",
    weights_dtype: torch.dtype = torch.float32,
    progress: bool = False,
) -> torch.Tensor:
    """``WaveNet.generate`` (this function is the module's method): samples n_samples mu-law classes per stream,
    one at a time ([B, n_samples] int64).

    ``temperature`` 0 takes the most likely class; ``generator`` seeds the sampling (one uniform number per
    stream and sample, drawn on the model's device up front: no host synchronisation per sample). Without
    conditioning, ``batch`` gives B; given with conditioning, it must agree with cond's and speaker's B.
    ``cond``: [B, cond_channels, frames] float (converted to the parameters' dtype), None exactly when the model
    has no local conditioning; ``speaker``: [B] integer ids (a tensor, or a sequence or numpy array of ints),
    None exactly when the model has no speakers.

    ``kernel``: "torch" (the PyTorch incremental path: per-layer dilation queues, O(layers) work per sample;
    the CPU's), "triton" (one program per stream, all samples in one launch), "cluster" (thread-block clusters,
    CUDA C++ through cuda-core on Hopper or newer: one stream per cluster while the GPU holds a cluster per
    stream, beyond that several streams per cluster, as few as keep every cluster resident), or "auto": on CUDA
    the cluster kernels where they are available, else the Triton kernel; on the CPU the PyTorch path. Every
    path draws the same classes from the same uniform numbers (up to float32 rounding at a class boundary).
    ``weights_dtype``: torch.bfloat16 lets the cluster kernel read bfloat16 copies of the matrices (float32
    arithmetic). The kernels read the weights packed once per parameter version (``weights.vocoder_weights``:
    packed again after an in-place update, an optimizer step or load_state_dict).
    ``progress``: the PyTorch path (the CPU's, about 0.6 kHz per stream for 20 layers) reports its progress on
    stderr about every second; the kernels make all samples in one launch and report nothing.
    """
    kernel = choose_kernel(kernel, weights_dtype, model, model.embed.weight.is_cuda)
    progress = as_bool(progress, "progress")
    if kernel == "torch":
        with torch.no_grad():
            state = incremental_state(model, cond, n_samples, temperature, generator, speaker, batch, None)
            return sample_incremental(state, progress=progress)[0]
    return generate_kernel(model, cond, n_samples, temperature, generator, speaker, batch, kernel, weights_dtype)


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
    """Generation by one of the GPU kernels ("triton", "cluster", or "auto": the cluster kernels where they are
    available, else the Triton kernel); [B, n_samples] int64."""
    kernel = as_choice(kernel, "kernel", ("auto", "triton", "cluster"))
    kernel = choose_kernel(kernel, weights_dtype, model, True)
    # the kernels read the conditioning per frame: no upsampled copy
    a = check_generation(model, cond, n_samples, temperature, generator, speaker, batch, uniforms)
    dev = a.uniforms.device
    check_kernel_runs(kernel, model, dev.type == "cuda")  # after the arguments' checks
    B = a.uniforms.shape[1]
    if kernel == "cluster":
        w = vocoder_weights(model)
        streams_per_cluster, _ = cluster_plan(w, B, dev)
        if streams_per_cluster == 1:
            return wavenet_generate_cluster(w, a, weights_dtype)
        return wavenet_generate_cluster_batch(w, a, weights_dtype, streams_per_cluster=streams_per_cluster)
    return triton_vocoder.wavenet_generate(vocoder_weights(model), a)
