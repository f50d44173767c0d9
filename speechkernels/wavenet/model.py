"""A WaveNet vocoder (van den Oord et al. 2016; Fast WaveNet generation, Paine et al. 2016).

Per layer i (dilation d_i = 2 ** (i mod cycle)): a = W_past x[t - d_i] + W_cur x[t] + b + C_i c[t] + G_i g,
z = tanh(a[:half]) * sigmoid(a[half:]), skip_i = S_i z, x <- x + R_i z. The input is the embedding of the
previous sample's mu-law class; the head is relu -> 1x1 -> relu -> 1x1 over the sum of the skips, giving logits
over the classes. Local conditioning c: mel frames repeated hop_length times; global conditioning g: a speaker
embedding. ``forward`` runs teacher-forced over whole sequences; ``generate`` samples one sample at a time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def stack_layers(mods, attr: str = "weight") -> torch.Tensor:
    """A per-layer parameter of a ModuleList stacked into one [L, ...] float32 tensor."""
    return torch.stack([getattr(m, attr) for m in mods]).float()


class WaveNet(nn.Module):
    """WaveNet vocoder with mu-law softmax output.

    Args:
        layers: residual layers (20 or 30 in the benchmark).
        cycle: dilations 1, 2, ..., 2 ** (cycle - 1), repeated.
        residual_channels, gate_channels, skip_channels: widths (64, 128, 256 in the benchmark); the gate's
            two halves (tanh and sigmoid) have gate_channels // 2 channels each.
        classes: mu-law classes of the output softmax (and of the input embedding).
        cond_channels: mel bins of the local conditioning (0: none).
        hop_length: samples per conditioning frame.
        speakers: speakers of the global conditioning (0: none), embedded in speaker_channels.

    Example:
        >>> net = WaveNet(layers=4, cycle=2, cond_channels=8, hop_length=4)
        >>> audio = torch.randint(0, 256, (2, 40))
        >>> logits = net(audio, torch.randn(2, 8, 10))  # [2, 256, 40]
        >>> samples = net.generate(torch.randn(2, 8, 10), n_samples=40)  # [2, 40]
    """

    def __init__(
        self,
        layers: int = 20,
        cycle: int = 10,
        residual_channels: int = 64,
        gate_channels: int = 128,
        skip_channels: int = 256,
        classes: int = 256,
        cond_channels: int = 80,
        hop_length: int = 256,
        speakers: int = 0,
        speaker_channels: int = 16,
    ) -> None:
        super().__init__()
        if layers < 1 or cycle < 1:
            raise ValueError(f"layers and cycle must be >= 1, got {layers}, {cycle}")
        if gate_channels % 2:
            raise ValueError(f"gate_channels must be even (tanh and sigmoid halves), got {gate_channels}")
        self.layers, self.cycle, self.classes = layers, cycle, classes
        self.residual_channels, self.gate_channels, self.skip_channels = residual_channels, gate_channels, skip_channels
        self.cond_channels, self.hop_length, self.speakers = cond_channels, hop_length, speakers
        self.dilations = [2 ** (i % cycle) for i in range(layers)]
        half = gate_channels // 2
        self.embed = nn.Embedding(classes, residual_channels)
        self.w_past = nn.ModuleList(nn.Linear(residual_channels, gate_channels, bias=False) for _ in range(layers))
        self.w_cur = nn.ModuleList(nn.Linear(residual_channels, gate_channels) for _ in range(layers))
        self.w_cond = (
            nn.ModuleList(nn.Linear(cond_channels, gate_channels, bias=False) for _ in range(layers))
            if cond_channels
            else None
        )
        self.speaker_embed = nn.Embedding(speakers, speaker_channels) if speakers else None
        self.w_speaker = (
            nn.ModuleList(nn.Linear(speaker_channels, gate_channels, bias=False) for _ in range(layers))
            if speakers
            else None
        )
        self.w_res = nn.ModuleList(nn.Linear(half, residual_channels) for _ in range(layers))
        self.w_skip = nn.ModuleList(nn.Linear(half, skip_channels) for _ in range(layers))
        self.head1 = nn.Linear(skip_channels, skip_channels)
        self.head2 = nn.Linear(skip_channels, classes)

    @property
    def receptive_field(self) -> int:
        return sum(self.dilations) + 1

    def start_class(self) -> int:
        """The input before the first sample: mu-law silence."""
        return self.classes // 2

    def check_inputs(
        self, cond, speaker, batch: int | None, n_samples: int, upsample: bool = True
    ) -> torch.Tensor | None:
        """Upsampled local conditioning [B, n_samples, cond_channels] (None without, or with upsample=False),
        after the argument checks."""
        if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
            raise ValueError(f"n_samples must be an integer >= 1, got {n_samples!r}")
        if self.speakers:
            if speaker is None:
                raise ValueError(f"speaker is required: the model has {self.speakers} speakers")
            if speaker.dim() != 1 or (batch is not None and speaker.shape[0] != batch):
                raise ValueError(f"speaker must be [B={batch}], got {tuple(speaker.shape)}")
            if ((speaker < 0) | (speaker >= self.speakers)).any():
                raise ValueError(f"speaker ids must be in [0, {self.speakers})")
        if not self.cond_channels:
            return None
        if cond is None or cond.dim() != 3 or cond.shape[1] != self.cond_channels:
            shape = None if cond is None else tuple(cond.shape)
            raise ValueError(f"cond must be [B, cond_channels={self.cond_channels}, frames], got {shape}")
        if batch is not None and cond.shape[0] != batch:
            raise ValueError(f"cond has {cond.shape[0]} streams but the batch has {batch}")
        if cond.shape[0] == 0:
            raise ValueError("cond has B = 0 streams")
        if cond.shape[2] * self.hop_length < n_samples:
            raise ValueError(
                f"cond's {cond.shape[2]} frames x hop_length {self.hop_length} = "
                f"{cond.shape[2] * self.hop_length} samples do not cover n_samples={n_samples}"
            )
        if not upsample:
            return None
        up = cond.transpose(1, 2).repeat_interleave(self.hop_length, dim=1)
        return up[:, :n_samples]

    def frame_bias(self, cond: torch.Tensor | None, g: torch.Tensor | None) -> torch.Tensor:
        """Each layer's gate bias per conditioning frame, [B or 1, frames or 1, L, gate] float32: the current
        input's bias plus the conditioning terms (``layer_bias`` per frame instead of per sample; the kernels
        read it once per hop)."""
        out = stack_layers(self.w_cur, "bias")[None, None]
        if cond is not None:
            frames = cond.transpose(1, 2).float()
            out = out + torch.stack([self.w_cond[i](frames) for i in range(self.layers)], dim=2)
        if g is not None:
            out = out + torch.stack([self.w_speaker[i](g) for i in range(self.layers)], dim=1)[:, None]
        return out

    def queue_layout(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The dilation queues laid end to end, as the kernels keep them: (dilations [L] int32, each layer's
        first slot [L] int32, slots in all)."""
        dil = torch.tensor(self.dilations, dtype=torch.int32, device=device)
        first = torch.tensor([sum(self.dilations[:i]) for i in range(self.layers)], dtype=torch.int32, device=device)
        return dil, first, sum(self.dilations)

    def layer_bias(self, i: int, cond_up: torch.Tensor | None, g: torch.Tensor | None) -> torch.Tensor | float:
        """Layer i's conditioning term [B, T, gate] (or 0)."""
        out = 0.0
        if cond_up is not None:
            out = out + self.w_cond[i](cond_up)
        if g is not None:
            out = out + self.w_speaker[i](g)[:, None, :]
        return out

    def forward(
        self, audio: torch.Tensor, cond: torch.Tensor | None = None, speaker: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Teacher-forced logits: logits[:, :, t] predicts audio[:, t] from audio[:, :t].

        Args:
            audio: [B, T] int64 mu-law classes.
            cond: [B, cond_channels, frames] with frames * hop_length >= T.
            speaker: [B] int64 speaker ids (when the model has speakers).

        Returns:
            [B, classes, T] logits.
        """
        if audio.dim() != 2 or audio.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"audio must be [B, T] int64 classes, got {tuple(audio.shape)} {audio.dtype}")
        B, T = audio.shape
        if B == 0:
            raise ValueError("audio has B = 0 streams")
        cond_up = self.check_inputs(cond, speaker, B, T)
        g = self.speaker_embed(speaker) if self.speakers else None
        prev = torch.cat([torch.full_like(audio[:, :1], self.start_class()), audio[:, :-1]], dim=1)
        x = self.embed(prev.long())  # [B, T, R]
        skips = 0.0
        for i, d in enumerate(self.dilations):
            past = F.pad(x, (0, 0, d, 0))[:, :T]  # x[t - d], zeros before the start
            skip, x = self.layer(i, past, x, self.layer_bias(i, cond_up, g))
            skips = skips + skip
        return self.head(skips).transpose(1, 2)

    def layer(self, i: int, past: torch.Tensor, x: torch.Tensor, bias) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i on inputs [..., residual] (its input d_i steps back and now) and its conditioning term:
        returns (its skip output, the next layer's input)."""
        half = self.gate_channels // 2
        a = self.w_past[i](past) + self.w_cur[i](x) + bias
        z = torch.tanh(a[..., :half]) * torch.sigmoid(a[..., half:])
        return self.w_skip[i](z), x + self.w_res[i](z)

    def head(self, skips: torch.Tensor) -> torch.Tensor:
        """Logits [..., classes] from the sum of the skips."""
        return self.head2(torch.relu(self.head1(torch.relu(skips))))

    def generate(
        self,
        cond: torch.Tensor | None,
        n_samples: int,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        speaker: torch.Tensor | None = None,
        batch: int | None = None,
        kernel: str = "auto",
        weights_dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """Samples n_samples mu-law classes per stream, one at a time ([B, n_samples] int64).

        ``temperature`` 0 takes the most likely class; ``generator`` seeds the sampling (one uniform number per
        stream and sample, drawn on the model's device up front: no host synchronisation per sample). Without
        conditioning, ``batch`` gives B.

        ``kernel``: "torch" (the PyTorch incremental path: per-layer dilation queues, O(layers) work per sample;
        the CPU's), "triton" (one program per stream, all samples in one launch), "cluster" (one thread-block
        cluster per stream, CUDA C++ through cuda-core on Hopper or newer), or "auto": on CUDA the cluster kernel
        for up to 16 streams where it is available, else the Triton kernel; on the CPU the PyTorch path. Every
        path draws the same classes from the same uniform numbers (up to float32 rounding at a class boundary).
        ``weights_dtype``: torch.bfloat16 lets the cluster kernel read bfloat16 copies of the matrices (float32
        arithmetic).
        """
        from .generate import generate_incremental, generate_kernel

        if kernel not in ("auto", "torch", "triton", "cluster"):
            raise ValueError(f"kernel must be 'auto', 'torch', 'triton' or 'cluster', got {kernel!r}")
        if weights_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"weights_dtype must be torch.float32 or torch.bfloat16, got {weights_dtype}")
        on_cuda = self.embed.weight.is_cuda
        if kernel == "auto":
            kernel = "kernel" if on_cuda else "torch"
        if kernel == "torch":
            if weights_dtype != torch.float32:
                raise ValueError("weights_dtype=torch.bfloat16 needs kernel='cluster'")
            return generate_incremental(self, cond, n_samples, temperature, generator, speaker, batch)[0]
        return generate_kernel(self, cond, n_samples, temperature, generator, speaker, batch, kernel, weights_dtype)
