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

from .._args import INDEX_DTYPES, as_index_tensor, as_int, check_float_input, check_in_range
from . import generation, server


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
        layers = as_int(layers, "layers", minimum=1)
        cycle = as_int(cycle, "cycle", minimum=1)
        residual_channels = as_int(residual_channels, "residual_channels", minimum=1)
        gate_channels = as_int(gate_channels, "gate_channels", minimum=1)
        skip_channels = as_int(skip_channels, "skip_channels", minimum=1)
        classes = as_int(classes, "classes", minimum=1)
        cond_channels = as_int(cond_channels, "cond_channels", minimum=0)
        hop_length = as_int(hop_length, "hop_length", minimum=1)
        speakers = as_int(speakers, "speakers", minimum=0)
        speaker_channels = as_int(speaker_channels, "speaker_channels", minimum=1)
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
        self, cond, speaker, batch: int | None, n_samples: int, batch_name: str = "batch"
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, int]:
        """The conditioning after the argument checks: (cond [B, cond_channels, frames] in the parameters' dtype
        on their device, or None without local conditioning; speaker ids [B] int64 on that device, or None
        without speakers; B). The number of streams B comes from cond, speaker and ``batch`` (named
        ``batch_name`` in messages), which must agree. Reads the speaker ids' min and max once."""
        n_samples = as_int(n_samples, "n_samples", minimum=1)
        w = self.embed.weight
        sizes = [] if batch is None else [(batch_name, batch)]  # (argument, its number of streams)
        cond_shape = f"cond must be [B, cond_channels={self.cond_channels}, frames]"
        no_cond = "cond must be None: the model has no local conditioning (cond_channels=0)"
        if _given(cond, self.cond_channels > 0, f"{cond_shape}, got None", no_cond):
            check_float_input(cond, "cond")
            if cond.dim() != 3 or cond.shape[1] != self.cond_channels:
                shape = tuple(cond.shape)
                raise ValueError(f"{cond_shape}, got {shape}")
            if cond.shape[2] * self.hop_length < n_samples:
                raise ValueError(
                    f"cond's {cond.shape[2]} frames x hop_length {self.hop_length} = "
                    f"{cond.shape[2] * self.hop_length} samples do not cover n_samples={n_samples}"
                )
            sizes.append(("cond", cond.shape[0]))
            cond = cond.to(device=w.device, dtype=w.dtype)  # no copy when it already matches
        needs_speaker = f"speaker is required: the model has {self.speakers} speakers"
        no_speaker = "speaker must be None: the model has no speakers (speakers=0)"
        if _given(speaker, self.speakers > 0, needs_speaker, no_speaker):
            speaker = as_index_tensor(speaker, "speaker", w.device)
            sizes.append(("speaker", speaker.shape[0]))
        for other in sizes[1:]:
            if other[1] != sizes[0][1]:
                raise ValueError(f"{_streams(*sizes[0])} but {_streams(*other)}")
        B = sizes[0][1] if sizes else None
        if B is None or B < 1:
            raise ValueError(f"the number of streams must be >= 1 (from cond, speaker or batch), got {B}")
        if speaker is not None:
            check_in_range(speaker, "speaker", self.speakers, f"speakers={self.speakers}", "speaker ids")
        return cond, speaker, B

    def upsample(self, cond: torch.Tensor | None, n_samples: int) -> torch.Tensor | None:
        """Local conditioning [B, cond_channels, frames] repeated per sample: [B, n_samples, cond_channels]."""
        if cond is None:
            return None
        return cond.transpose(1, 2).repeat_interleave(self.hop_length, dim=1)[:, :n_samples]

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
            audio: [B, T] int64 (or int32) mu-law classes in [0, classes).
            cond: [B, cond_channels, frames] float with frames * hop_length >= T (converted to the parameters'
                dtype); None exactly when the model has no local conditioning.
            speaker: [B] integer speaker ids in [0, speakers); None exactly when the model has no speakers.

        The inputs are moved to the model's device; a class or speaker id out of range raises ValueError (one read
        of the tensors' min and max).

        Returns:
            [B, classes, T] logits.
        """
        if not isinstance(audio, torch.Tensor) or audio.dim() != 2 or audio.dtype not in INDEX_DTYPES:
            got = f"{tuple(audio.shape)} {audio.dtype}" if isinstance(audio, torch.Tensor) else type(audio).__name__
            raise ValueError(f"audio must be [B, T] int64 classes, got {got}")
        B, T = audio.shape
        if B == 0:
            raise ValueError("audio has B = 0 streams")
        if T == 0:
            raise ValueError("audio has T = 0 samples")
        audio = audio.to(self.embed.weight.device)
        check_in_range(audio, "audio", self.classes, f"classes={self.classes}", "audio classes")
        cond, speaker, _ = self.check_inputs(cond, speaker, B, T, batch_name="audio")
        cond_up = self.upsample(cond, T)
        g = self.speaker_embed(speaker) if speaker is not None else None
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

    generate = generation.generate
    generate_stream = server.generate_stream


def _given(value, wanted: bool, missing: str, unwanted: str) -> bool:
    """Whether an optional input is given, after checking that it is exactly when the model wants it (the
    messages of the two mistakes)."""
    if wanted and value is None:
        raise ValueError(missing)
    if not wanted and value is not None:
        raise ValueError(unwanted)
    return value is not None


def _streams(name: str, n: int) -> str:
    return f"batch={n}" if name == "batch" else f"{name} has {n} streams"
