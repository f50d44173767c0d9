"""The serial-chain proxy in plain PyTorch: the float64 loop every design is checked against, and the float32
loop of ``design="torch"`` (a matrix product per layer: the CPU's path, one launch per matrix on a GPU)."""

from __future__ import annotations

import torch

from ..._args import as_choice, as_int, check_float_input

ACTIVATIONS = ("tanh", "relu")


def activation_fn(name: str):
    """torch.tanh or torch.relu by name ("tanh" or "relu")."""
    return torch.tanh if as_choice(name, "activation", ACTIVATIONS) == "tanh" else torch.relu


def serial_chain_reference(
    weights: torch.Tensor, x0: torch.Tensor, n_samples: int, activation: str = "tanh"
) -> torch.Tensor:
    """The proxy in float64: per sample x <- act(W_i x) for i = 1..L, the last x feeding the next sample.
    weights [L, H, H], x0 [B, H] float, n_samples >= 1. Returns the final x [B, H] (float64)."""
    check_float_input(weights, "weights")
    check_float_input(x0, "x0")
    if weights.dim() != 3 or weights.shape[1] != weights.shape[2]:
        raise ValueError(f"weights must be [L, H, H], got {tuple(weights.shape)}")
    if x0.dim() != 2 or x0.shape[1] != weights.shape[2]:
        raise ValueError(f"x0 must be [B, H={weights.shape[2]}], got {tuple(x0.shape)}")
    if x0.device != weights.device:
        raise ValueError(f"x0 is on {x0.device} but weights on {weights.device}")
    n_samples = as_int(n_samples, "n_samples", minimum=1)
    act = activation_fn(activation)
    w = weights.double()
    x = x0.double()
    for _ in range(n_samples):
        for i in range(w.shape[0]):
            x = act(x @ w[i].T)
    return x


def serial_chain_torch(weights: torch.Tensor, x0: torch.Tensor, n_samples: int, activation: str) -> torch.Tensor:
    """The proxy in float32, one matrix product per layer (arguments checked by ``serial_chain``): [B, H]."""
    act = activation_fn(activation)
    w_t = weights.float().transpose(1, 2).contiguous()  # x @ W^T, one matrix per layer
    x = x0.float()
    for _ in range(n_samples):
        for i in range(weights.shape[0]):
            x = act(x @ w_t[i])
    return x
