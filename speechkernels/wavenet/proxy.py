"""The serial-chain proxy of autoregressive WaveNet inference ("(Why you shouldn't try) Implementing WaveNet on
a GPU"): per sample, a vector through L matrices in turn, each output feeding the next; B independent streams.
This is the PyTorch path (CPU, or GPU one launch per matrix); it fixes the semantics the GPU kernels follow."""

from __future__ import annotations

import torch

from .._utils import as_choice, as_int, check_float_input, triton_interpreting
from .reference import ACTIVATIONS, activation_fn

DESIGNS = ("torch", "stream", "barrier", "cluster", "partials", "pipeline")


def serial_chain(
    weights: torch.Tensor, x0: torch.Tensor, n_samples: int, activation: str = "tanh", design: str = "torch"
) -> torch.Tensor:
    """Runs the chain for ``n_samples`` samples and returns the last vector of each stream.

    Args:
        weights: [L, H, H] float32 or bfloat16: layer i computes x <- act(weights[i] @ x).
        x0: [B, H] the streams' starting vectors (float32 arithmetic).
        n_samples: samples to generate (>= 1); each passes through all L layers.
        activation: "tanh" or "relu".
        design: "torch" (a matrix product per layer in PyTorch); "stream" (Triton, one program per stream
            streaming the weights); "barrier" (Triton, the post's design: rows split across programs, a grid
            barrier per layer); both on CUDA tensors, or on the CPU under TRITON_INTERPRET=1; "cluster" (CUDA
            C++ through cuda.core on Hopper or newer: rows split across a thread-block cluster exchanging
            through distributed shared memory; ``speechkernels.wavenet.cluster``); "partials" (likewise with the
            columns split: each CTA sends partial sums to the owners of the rows; ``cluster_partials``);
            "pipeline" (likewise, bfloat16
            weights: the layers split across the cluster's CTAs and held in their registers, the vector passed
            from CTA to CTA; ``speechkernels.wavenet.cluster_pipeline``).

    Returns:
        [B, H] float32.

    Example:
        >>> w = torch.randn(80, 128, 128) / 128**0.5
        >>> x = serial_chain(w, torch.randn(4, 128), n_samples=10)
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
    relu = activation == "relu"
    if design in ("cluster", "partials", "pipeline"):
        from . import cluster
        from .cuda_runtime import clusters_available

        if not (x0.is_cuda and clusters_available()):
            raise ValueError(
                f"design={design!r} needs CUDA tensors on a GPU of compute capability >= 9.0 and cuda-core"
            )
        if design == "pipeline":
            from .cluster_pipeline import serial_chain_pipeline

            return serial_chain_pipeline(weights, x0, n_samples, relu)
        if design == "partials":
            from .cluster_partials import serial_chain_partials

            return serial_chain_partials(weights, x0, n_samples, relu)
        return cluster.serial_chain_cluster(weights, x0, n_samples, relu)
    if design in ("stream", "barrier"):
        if not (x0.is_cuda or triton_interpreting()):
            raise ValueError(f"design={design!r} runs on CUDA tensors (or on the CPU under TRITON_INTERPRET=1)")
        from .kernels import serial_chain_barrier, serial_chain_stream

        launcher = serial_chain_stream if design == "stream" else serial_chain_barrier
        return launcher(weights, x0.float().contiguous(), n_samples, relu=relu)
    act = activation_fn(activation)
    w_t = weights.float().transpose(1, 2).contiguous()  # x @ W^T, one matrix per layer
    x = x0.float()
    for _ in range(n_samples):
        for i in range(L):
            x = act(x @ w_t[i])
    return x
