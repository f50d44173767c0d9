"""Helpers of the WaveNet tests: a small model and the incremental path's samples."""

from __future__ import annotations

import torch

from speechkernels.wavenet import (
    WaveNet,
)
from speechkernels.wavenet.generation import incremental_state
from speechkernels.wavenet.incremental import sample_incremental


def incremental_path(net, cond, n, temperature, generator, speaker, batch=None, uniforms=None, return_logits=False):
    """The PyTorch path (the reference): (classes [B, n], logits [B, classes, n] or None)."""
    with torch.no_grad():
        state = incremental_state(net, cond, n, temperature, generator, speaker, batch, uniforms)
        return sample_incremental(state, return_logits)


def small_model(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(
        layers=6,
        cycle=3,
        residual_channels=8,
        gate_channels=12,
        skip_channels=10,
        classes=32,
        cond_channels=5,
        hop_length=4,
        speakers=3,
        speaker_channels=4,
    )
    cfg.update(kw)
    return WaveNet(**cfg).eval()
