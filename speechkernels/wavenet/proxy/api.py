"""The serial-chain proxy of autoregressive WaveNet inference ("(Why you shouldn't try) Implementing WaveNet on
a GPU"): per sample, a vector through L matrices in turn, each output feeding the next; B independent streams.
``serial_chain`` checks its arguments and runs one of the designs side by side: the PyTorch loop
(``reference.py``, which with the float64 loop fixes the semantics), the Triton designs (``triton_designs.py``)
and the thread-block cluster designs in CUDA C++ (``cluster.py``, ``partials.py``, ``pipeline.py``)."""

from __future__ import annotations

import torch

from ..._args import as_choice, as_int, check_float_input
from ..._backend import triton_interpreting, triton_missing
from ..cuda_runtime import clusters_available
from .cluster import row_split_fits, serial_chain_cluster
from .partials import serial_chain_partials
from .pipeline import serial_chain_pipeline
from .reference import ACTIVATIONS, serial_chain_torch

try:  # the Triton kernels; without Triton (error names it) the PyTorch path serves every call
    from . import triton_designs
except ImportError as error:
    triton_designs = triton_missing(error)

DESIGNS = ("auto", "torch", "stream", "barrier", "cluster", "partials", "pipeline")
CLUSTER_DESIGNS = ("cluster", "partials", "pipeline")
MAX_CLUSTER_STREAMS = 16  # "auto" takes the cluster design up to this many streams, the stream design beyond


def auto_design(weights: torch.Tensor, x0: torch.Tensor) -> str:
    """The design ``design="auto"`` runs: on the CPU "torch"; on a GPU "cluster" for up to 16 streams where the
    cluster designs run (``cuda_runtime.clusters_available``) and its split takes H, else "stream".

    On the H100 (benchmarks/results/wavenet_h100_history.jsonl, source wavenet_h100_2026-11-23.json; L = 80,
    H = 128) "cluster" makes 46 kHz per stream at B = 1 and 43 / 37 kHz (float32 / bfloat16 weights) at B = 8,
    against 9.5 / 15 kHz for "stream", 0.4-0.6 kHz for "torch", 3.7 kHz for "barrier" (never the fastest) and
    22-32 kHz for "partials" and "pipeline"; at 132 streams and more, one cluster of 16 CTAs per stream no longer
    fits the GPU at once and "stream" is as fast or faster (9.3 / 16.6 against 8.3 / 8.5 kHz at B = 132).
    """
    if not x0.is_cuda:
        return "torch"
    fits = row_split_fits(weights.shape[1], weights.dtype == torch.bfloat16)
    if x0.shape[0] <= MAX_CLUSTER_STREAMS and clusters_available() and fits:
        return "cluster"
    return "stream"


def serial_chain(
    weights: torch.Tensor, x0: torch.Tensor, n_samples: int, activation: str = "tanh", design: str = "auto"
) -> torch.Tensor:
    """Runs the chain for ``n_samples`` samples and returns the last vector of each stream.

    Args:
        weights: [L, H, H] float32 or bfloat16: layer i computes x <- act(weights[i] @ x).
        x0: [B, H] the streams' starting vectors (float32 arithmetic).
        n_samples: samples to generate (>= 1); each passes through all L layers.
        activation: "tanh" or "relu".
        design: "auto" (the default: the fastest design that runs here, ``auto_design``: on the CPU "torch"; on
            a GPU "cluster" for up to 16 streams where cuda-core and a GPU of compute capability >= 9.0 allow it
            and its split takes H, else "stream"); "torch" (a matrix product per layer in PyTorch); "stream"
            (Triton, one program per stream streaming the weights); "barrier" (Triton, the post's design: rows
            split across programs, a grid barrier per layer); both on CUDA tensors, or on the CPU under
            TRITON_INTERPRET=1; "cluster" (CUDA C++ through cuda.core on Hopper or newer: rows split across a
            thread-block cluster exchanging through distributed shared memory; ``proxy/cluster.py``); "partials"
            (likewise with the columns split: each CTA sends partial sums to the owners of the rows;
            ``proxy/partials.py``); "pipeline" (likewise, bfloat16 weights: the layers split across the cluster's
            CTAs and held in their registers, the vector passed from CTA to CTA; ``proxy/pipeline.py``).

    Returns:
        [B, H] float32.

    Example:
        >>> w = torch.randn(80, 128, 128) / 128**0.5
        >>> x = serial_chain(w, torch.randn(4, 128), n_samples=10)  # on the CPU: design "torch"
    """
    if not isinstance(weights, torch.Tensor) or weights.dim() != 3 or weights.shape[1] != weights.shape[2]:
        shape = tuple(weights.shape) if isinstance(weights, torch.Tensor) else type(weights).__name__
        raise ValueError(f"weights must be [L, H, H], got {shape}")
    if weights.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"weights must be float32 or bfloat16, got {weights.dtype}")
    L, H, _ = weights.shape
    if L < 1 or H < 1:
        raise ValueError(f"weights must have L >= 1 layers of H >= 1, got {tuple(weights.shape)}")
    if not isinstance(x0, torch.Tensor) or x0.dim() != 2 or x0.shape[1] != H:
        shape = tuple(x0.shape) if isinstance(x0, torch.Tensor) else type(x0).__name__
        raise ValueError(f"x0 must be [B, H={H}], got {shape}")
    if x0.shape[0] == 0:
        raise ValueError("x0 has B = 0 streams")
    check_float_input(x0, "x0")
    n_samples = as_int(n_samples, "n_samples", minimum=1)
    activation = as_choice(activation, "activation", ACTIVATIONS)
    if x0.device != weights.device:
        raise ValueError(f"x0 is on {x0.device} but weights on {weights.device}")
    design = as_choice(design, "design", DESIGNS)
    if design == "auto":
        design = auto_design(weights, x0)
    relu = activation == "relu"
    if design in CLUSTER_DESIGNS:
        if not (x0.is_cuda and clusters_available()):
            raise ValueError(
                f"design={design!r} needs CUDA tensors on a GPU of compute capability >= 9.0 and cuda-core"
            )
        if design == "pipeline":
            return serial_chain_pipeline(weights, x0, n_samples, relu)
        if design == "partials":
            return serial_chain_partials(weights, x0, n_samples, relu)
        return serial_chain_cluster(weights, x0, n_samples, relu)
    if design in ("stream", "barrier"):
        if triton_designs is None:
            raise ValueError(f"design={design!r} needs Triton (pip install triton), which is not installed")
        if not (x0.is_cuda or triton_interpreting()):
            raise ValueError(f"design={design!r} runs on CUDA tensors (or on the CPU under TRITON_INTERPRET=1)")
        launcher = triton_designs.serial_chain_stream if design == "stream" else triton_designs.serial_chain_barrier
        return launcher(weights, x0.float().contiguous(), n_samples, relu=relu)
    return serial_chain_torch(weights, x0, n_samples, activation)
