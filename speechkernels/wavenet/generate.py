"""Incremental WaveNet generation in PyTorch (Fast WaveNet): each layer keeps a queue of its last d_i inputs,
so a sample costs O(layers) work instead of a pass over the receptive field. Sampling draws one uniform number
per stream and sample and inverts the softmax's cumulative distribution (a GPU kernel given the same numbers
draws the same classes)."""

from __future__ import annotations

import torch


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
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    B = cond.shape[0] if cond is not None else (speaker.shape[0] if speaker is not None else batch)
    if B is None or B < 1:
        raise ValueError(f"the number of streams must be >= 1 (from cond, speaker or batch), got {B}")
    cond_up = model.check_inputs(cond, speaker, B, n_samples)
    dev = model.embed.weight.device
    if uniforms is None:
        uniforms = torch.rand(n_samples, B, generator=generator, device=generator.device if generator else dev)
    uniforms = uniforms.to(dev)
    if uniforms.shape != (n_samples, B):
        raise ValueError(f"uniforms must be [n_samples={n_samples}, B={B}], got {tuple(uniforms.shape)}")
    g = model.speaker_embed(speaker.to(dev)) if model.speakers else None
    half = model.gate_channels // 2
    # per layer: its inputs of the last d steps, a ring indexed by t mod d (zeros before the start)
    queues = [torch.zeros(B, d, model.residual_channels, device=dev) for d in model.dilations]
    # the conditioning terms per layer and sample do not depend on the samples: computed once
    bias = [model.layer_bias(i, cond_up, g) for i in range(model.layers)]
    prev = torch.full((B,), model.start_class(), dtype=torch.long, device=dev)
    out = torch.empty(B, n_samples, dtype=torch.long, device=dev)
    all_logits = torch.empty(B, model.classes, n_samples, device=dev) if return_logits else None
    for t in range(n_samples):
        x = model.embed(prev)
        skips = 0.0
        for i, d in enumerate(model.dilations):
            slot = t % d
            past = queues[i][:, slot]
            a = model.w_past[i](past) + model.w_cur[i](x)
            b = bias[i]
            if not isinstance(b, float):  # [B, T or 1, gate]: local conditioning varies over time, global does not
                a = a + b[:, min(t, b.shape[1] - 1)]
            z = torch.tanh(a[:, :half]) * torch.sigmoid(a[:, half:])
            queues[i][:, slot] = x
            skips = skips + model.w_skip[i](z)
            x = x + model.w_res[i](z)
        logits = model.head2(torch.relu(model.head1(torch.relu(skips))))
        if all_logits is not None:
            all_logits[:, :, t] = logits
        if temperature == 0:
            prev = logits.argmax(dim=1)
        else:
            cdf = torch.softmax(logits.double() / temperature, dim=1).cumsum(dim=1)
            prev = torch.searchsorted(cdf, uniforms[t].double()[:, None] * cdf[:, -1:]).squeeze(1)
            prev = prev.clamp(max=model.classes - 1)
        out[:, t] = prev
    return out, all_logits
