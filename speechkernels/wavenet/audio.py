"""Audio helpers of the vocoder in plain PyTorch: mu-law companding (the classes the model predicts) and WAV output."""

from __future__ import annotations

import math
import wave

import torch

from .._args import as_int, check_float_input, check_in_range, check_integer_tensor


def mu_law_encode(audio: torch.Tensor, classes: int = 256) -> torch.Tensor:
    """Audio in [-1, 1] (clamped) to mu-law classes in [0, classes), int64.

    Args:
        audio: [...] float.
        classes: >= 2.

    Example:
        >>> mu_law_encode(torch.tensor([-1.0, 0.0, 1.0]))
        tensor([  0, 128, 255])
    """
    check_float_input(audio, "audio")
    mu = as_int(classes, "classes", minimum=2) - 1
    x = audio.clamp(-1.0, 1.0)
    y = torch.sign(x) * torch.log1p(mu * x.abs()) / math.log1p(mu)
    return ((y + 1) / 2 * mu + 0.5).floor().long()


def mu_law_decode(classes_: torch.Tensor, classes: int = 256) -> torch.Tensor:
    """Mu-law classes in [0, classes) back to audio in [-1, 1] (float32).

    Args:
        classes_: [...] integer classes in [0, classes) (one read of their min and max checks it).
        classes: >= 2.
    """
    classes = as_int(classes, "classes", minimum=2)
    check_integer_tensor(classes_, "classes_", "integer classes")
    check_in_range(classes_, "classes_", classes, f"classes={classes}")
    mu = classes - 1
    y = 2 * classes_.float() / mu - 1
    return torch.sign(y) * ((1 + mu) ** y.abs() - 1) / mu


def save_wav(path: str, audio: torch.Tensor, sample_rate: int) -> None:
    """Write mono audio in [-1, 1] ([T] float) as a 16-bit PCM WAV file (sample_rate: an integer >= 1, Hz)."""
    check_float_input(audio, "audio")
    if audio.dim() != 1:
        raise ValueError(f"audio must be 1-D [T], got shape {tuple(audio.shape)}")
    sample_rate = as_int(sample_rate, "sample_rate", minimum=1)
    pcm = (audio.detach().float().clamp(-1.0, 1.0) * 32767.0).round().to(torch.int16).cpu()
    with wave.open(path, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(sample_rate)
        f.writeframes(pcm.numpy().tobytes())
