"""WaveNet references in plain PyTorch: mu-law companding, the serial-chain proxy in float64, WAV output."""

from __future__ import annotations

import math
import wave

import torch

ACTIVATIONS = ("tanh", "relu")


def mu_law_encode(audio: torch.Tensor, classes: int = 256) -> torch.Tensor:
    """Audio in [-1, 1] (clamped) to mu-law classes in [0, classes), int64.

    Example:
        >>> mu_law_encode(torch.tensor([-1.0, 0.0, 1.0]))
        tensor([  0, 128, 255])
    """
    mu = classes - 1
    x = audio.clamp(-1.0, 1.0)
    y = torch.sign(x) * torch.log1p(mu * x.abs()) / math.log1p(mu)
    return ((y + 1) / 2 * mu + 0.5).floor().long()


def mu_law_decode(classes_: torch.Tensor, classes: int = 256) -> torch.Tensor:
    """Mu-law classes in [0, classes) back to audio in [-1, 1] (float32)."""
    mu = classes - 1
    y = 2 * classes_.float() / mu - 1
    return torch.sign(y) * ((1 + mu) ** y.abs() - 1) / mu


def activation_fn(name: str):
    return torch.tanh if name == "tanh" else torch.relu


def serial_chain_reference(
    weights: torch.Tensor, x0: torch.Tensor, n_samples: int, activation: str = "tanh"
) -> torch.Tensor:
    """The proxy in float64: per sample x <- act(W_i x) for i = 1..L, the last x feeding the next sample.
    Returns the final x [B, H] (float64)."""
    act = activation_fn(activation)
    w = weights.double()
    x = x0.double()
    for _ in range(n_samples):
        for i in range(w.shape[0]):
            x = act(x @ w[i].T)
    return x


def save_wav(path: str, audio: torch.Tensor, sample_rate: int) -> None:
    """Write mono audio in [-1, 1] ([T] float) as a 16-bit PCM WAV file."""
    if audio.dim() != 1:
        raise ValueError(f"audio must be 1-D [T], got shape {tuple(audio.shape)}")
    pcm = (audio.detach().float().clamp(-1.0, 1.0) * 32767.0).round().to(torch.int16).cpu()
    with wave.open(path, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(int(sample_rate))
        f.writeframes(pcm.numpy().tobytes())
