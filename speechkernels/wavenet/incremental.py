"""Incremental WaveNet generation in PyTorch (Fast WaveNet): each layer keeps a queue of its last d_i inputs,
so a sample costs O(layers) work instead of a pass over the receptive field. This is the reference the kernels
follow: sampling draws one uniform number per stream and sample and inverts the softmax's cumulative
distribution (a GPU kernel given the same numbers draws the same classes). The step keeps its position as a
device tensor, so that one step can be captured in a CUDA graph and replayed (the benchmark's baseline)."""

from __future__ import annotations

import sys
import time

import torch

from .._backend import loop_threads


class IncrementalState:
    """The queues, the previous samples and the position of a batch of streams; ``step()`` makes one sample.

    Args:
        model: a WaveNet.
        cond_up: [B, n_samples, cond_channels] upsampled local conditioning, or None.
        g: [B, speaker_channels] speaker embeddings, or None.
        uniforms: [n_samples, B] numbers in [0, 1) to sample with.
        temperature: > 0 samples from softmax(logits / temperature), 0 takes the most likely class.
        queues, prev, queue_time: where an earlier run of the same streams stopped (chunks of a longer run:
            ``server.WaveNetServer``): each layer's queue [B, d_i, residual_channels] (a ring indexed by the clock
            mod d_i; the state writes into these tensors), the last samples [B], and the rings' clock at this
            run's first sample; by default the start (zero queues, the start class, clock 0).
    """

    def __init__(
        self,
        model,
        cond_up,
        g,
        uniforms: torch.Tensor,
        temperature: float,
        *,
        queues: list[torch.Tensor] | None = None,
        prev: torch.Tensor | None = None,
        queue_time: int = 0,
    ) -> None:
        self.model, self.uniforms, self.temperature = model, uniforms, temperature
        B = uniforms.shape[1]
        dev = uniforms.device
        # per layer: its inputs of the last d steps, a ring indexed by t mod d (zeros before the start)
        if queues is None:
            queues = [torch.zeros(B, d, model.residual_channels, device=dev) for d in model.dilations]
        self.queues = queues
        # the conditioning terms do not depend on the samples: per layer [B, n_samples or 1, gate], or None
        self.bias = [model.layer_bias(i, cond_up, g) for i in range(model.layers)]
        self.bias = [None if isinstance(b, float) else b for b in self.bias]
        self.prev = torch.full((B,), model.start_class(), dtype=torch.long, device=dev)
        if prev is not None:
            self.prev.copy_(prev)
        self.t = torch.zeros(1, dtype=torch.long, device=dev)
        self.queue_time = queue_time
        self.logits = torch.empty(B, model.classes, device=dev)

    def step(self) -> torch.Tensor:
        """One sample per stream ([B] int64, also kept as the next step's input); self.logits holds its logits."""
        m = self.model
        x = m.embed(self.prev)
        skips = 0.0
        for i, d in enumerate(m.dilations):
            slot = (self.t + self.queue_time) % d
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


@torch.no_grad()
def sample_incremental(
    state: IncrementalState, return_logits: bool = False, progress: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Runs ``state`` for all its samples: (classes [B, n_samples] int64, logits [B, classes, n_samples] or None).
    With ``progress``, a line on stderr about every second: samples made, rate, time left."""
    n_samples, B = state.uniforms.shape
    out = torch.empty(B, n_samples, dtype=torch.long, device=state.prev.device)
    all_logits = torch.empty(B, state.model.classes, n_samples, device=out.device) if return_logits else None
    report = _Progress(n_samples, B) if progress else None
    m = state.model
    with loop_threads(out.device, B * max(m.gate_channels, m.skip_channels, m.classes)):
        for t in range(n_samples):
            out[:, t] = state.step()
            if all_logits is not None:
                all_logits[:, :, t] = state.logits
            if report is not None:
                report.update(t + 1)
    return out, all_logits


class _Progress:
    """Progress of a generation on stderr: a line about every second and one at the end."""

    def __init__(self, total: int, streams: int, every_s: float = 1.0) -> None:
        self.total, self.streams, self.every_s = total, streams, every_s
        self.t0 = self.last = time.perf_counter()

    def update(self, done: int) -> None:
        now = time.perf_counter()
        if now - self.last < self.every_s and done < self.total:
            return
        self.last = now
        rate = done / max(now - self.t0, 1e-9)
        left = (self.total - done) / rate
        print(
            f"generated {done}/{self.total} samples per stream ({100 * done / self.total:.0f} %, {self.streams} "
            f"stream{'s' if self.streams > 1 else ''}, {rate / 1e3:.2f} kHz per stream, {left:.0f} s left)",
            file=sys.stderr,
            flush=True,
        )
