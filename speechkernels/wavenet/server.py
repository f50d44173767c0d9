"""Serving many voices at once: ``WaveNetServer`` generates every active request in chunks of samples, one launch
per chunk for all of them, and admits new requests between chunks; ``generate_stream`` (``WaveNet.
generate_stream``) hands out a fixed batch's samples chunk by chunk.

Between chunks a request keeps its dilation queues (a row of the server's queue tensor, zeroed when a request takes
it), its last class (the next chunk's first input) and its sample count (its conditioning frame's clock). The queue
rings of all rows run on one clock shared by every request, so that a launch needs no per-request ring position.
On a Hopper GPU with cuda-core the chunks run on the batched cluster kernel (``cluster_vocoder.
wavenet_generate_cluster_batch``), on other GPUs on the Triton kernel (``triton_vocoder.wavenet_generate``), on
the CPU on the PyTorch path (``incremental.IncrementalState``). Each request samples with its own uniform numbers,
drawn chunk by chunk from its generator (or the server's), so what it gets does not depend on which other requests
share its chunks (up to float32 rounding at a class boundary).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import torch

from .._args import as_float, as_generator, as_int
from . import generation
from .cluster_planning import cluster_plan
from .cluster_vocoder import batch_queue, compile_batch_kernels, wavenet_generate_cluster_batch
from .generation import check_kernel_runs, choose_kernel
from .incremental import IncrementalState, sample_incremental
from .weights import Continuation, VocoderInputs, bucketed_linear, vocoder_weights


@dataclasses.dataclass(eq=False)
class _Request:
    id: int
    n_samples: int
    cond: torch.Tensor | None  # [cond_channels, frames + chunk_frames] on the model's device (the last frame
    # repeated past its end, so that a chunk's frames are a slice), or None
    g: torch.Tensor | None  # [speaker_channels] speaker embedding, or None
    generator: torch.Generator | None
    row: int = -1  # its queue row once admitted
    done: int = 0  # samples handed out so far


class WaveNetServer:
    """Generates many requests at once, chunk by chunk; requests join between chunks and leave when done.

    Args:
        model: a WaveNet (its device runs the server).
        chunk: samples per request per ``step()`` (a request's last chunk may be shorter).
        temperature: as ``WaveNet.generate`` (0: the most likely class).
        generator: draws the uniform numbers of requests submitted without their own generator.
        kernel: "cluster" (the batched thread-block cluster kernel: Hopper or newer with cuda-core), "triton" (the
            Triton kernel: any CUDA GPU), "torch" (the PyTorch path) or "auto": the cluster kernel where it runs,
            else the Triton kernel on a GPU, the PyTorch path on the CPU.
        weights_dtype: torch.float32, or torch.bfloat16 for the cluster kernel's bfloat16 matrices.
        max_streams: at most this many requests generate at once (None: no limit); others wait in turn.

    Example:
        >>> from speechkernels.wavenet import WaveNet
        >>> net = WaveNet(layers=4, cycle=2, cond_channels=8, hop_length=4, speakers=0).eval()
        >>> server = WaveNetServer(net, chunk=16)
        >>> a = server.submit(40, cond=torch.randn(8, 10))
        >>> out = {a: []}
        >>> for chunks in server:  # {request id: that request's new samples}
        ...     out[a].append(chunks[a])
        >>> torch.cat(out[a]).shape
        torch.Size([40])
    """

    def __init__(
        self,
        model,
        chunk: int = 4096,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        kernel: str = "auto",
        weights_dtype: torch.dtype = torch.float32,
        max_streams: int | None = None,
    ) -> None:
        self.model = model
        self.chunk = as_int(chunk, "chunk", minimum=1)
        self.temperature = as_float(temperature, "temperature", minimum=0.0, finite=True)
        self.generator = as_generator(generator)
        self.device = model.embed.weight.device
        cuda = self.device.type == "cuda"
        kernel = choose_kernel(kernel, weights_dtype, model, cuda)
        self.max_streams = None if max_streams is None else as_int(max_streams, "max_streams", minimum=1)
        check_kernel_runs(kernel, model, cuda)
        self.kernel, self.weights_dtype = kernel, weights_dtype
        self._pending: list[_Request] = []
        self._active: list[_Request] = []
        self._free: list[int] = []  # queue rows no request holds
        self._rows = 0
        self._next_id = 0
        # one clock for every queue ring: kept modulo the dilations' common multiple (where that fits in int32)
        self._clock = 0
        period = math.lcm(*model.dilations)
        self._period = period if period < 2**30 else None
        self._prev = torch.empty(0, dtype=torch.long, device=self.device)  # [rows] each row's last class
        # the queues: "cluster" [rows, C, Q, G2 / C, 2], "triton" [rows, Q, R], "torch" per layer [rows, d, R]
        self._queue = None

    @property
    def active(self) -> list[int]:
        """Ids of the requests generating now."""
        return [r.id for r in self._active]

    @property
    def pending(self) -> list[int]:
        """Ids of the requests waiting for their first chunk."""
        return [r.id for r in self._pending]

    def warmup(self, max_streams: int | None = None) -> None:
        """Does now what the first chunks would otherwise wait for, for up to ``max_streams`` requests at once (the
        server's ``max_streams``, else 256): compiles the kernels (the cluster kernel has a variant per number of
        streams per cluster, about a second each, once per process; the Triton kernel one), and runs one chunk of
        scratch requests through a scratch server of the same settings (on a GPU, one chunk of two requests and one
        of ``max_streams``), so that the first real chunk finds every
        one-time cost paid: the weights packed in the kernel's layout, the CUDA libraries and kernels of the
        chunk's PyTorch operations loaded (cuBLAS's for the conditioning, each operation's at its first launch:
        0.2-0.35 s of a first chunk on an H100, benchmarks/notes/wavenet.md); and on a GPU the conditioning's product at
        each of its row counts' buckets (``weights.bucketed_linear``) up to what ``max_streams`` requests need, each
        of which loads a cuBLAS kernel at its first launch. The server's requests, generator and state are
        untouched."""
        if max_streams is None:
            max_streams = self.max_streams or 256
        n = as_int(max_streams, "max_streams", minimum=1)
        if self.kernel == "cluster":
            compile_batch_kernels(
                vocoder_weights(self.model), n, self.weights_dtype, self.temperature == 0, self.device
            )
        m, dev = self.model, self.device
        # requests of a whole chunk on a GPU (the chunk's shapes), of two samples on the CPU (its path is slow); on a
        # GPU two and max_streams of them: PyTorch's index kernels have one variant up to 16 indices and one beyond
        n_samples = self.chunk if dev.type == "cuda" else 2
        cond = torch.zeros(m.cond_channels, -(-n_samples // m.hop_length), device=dev) if m.cond_channels else None
        for requests in sorted({min(2, n), n}) if dev.type == "cuda" else [min(2, n)]:
            scratch = WaveNetServer(m, self.chunk, self.temperature, None, self.kernel, self.weights_dtype)
            for _ in range(requests):  # each with its own generator: the global one's state stays as it was
                scratch.submit(n_samples, cond, 0 if m.speakers else None, torch.Generator(dev).manual_seed(0))
            scratch.step()
        if dev.type == "cuda":
            w = vocoder_weights(m)
            per_request = (m.hop_length + self.chunk - 2) // m.hop_length + 1  # the most frames a chunk reads
            for weight, rows in ((w.w_cond, n * per_request), (w.w_speaker, n)):
                for k in range((rows - 1).bit_length() + 1) if weight is not None else ():
                    bucketed_linear(torch.zeros(1 << k, weight.shape[1], device=dev), weight)

    def submit(
        self,
        n_samples: int,
        cond: torch.Tensor | None = None,
        speaker: int | torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> int:
        """Queues a request of ``n_samples`` samples; returns its id (the key of its chunks in ``step()``'s dict).

        Args:
            n_samples: its length.
            cond: [cond_channels, frames] local conditioning (frames * hop_length >= n_samples), None exactly when
                the model has none.
            speaker: its speaker id (an int or a 0-d / 1-element integer tensor), None exactly when the model has
                no speakers.
            generator: draws its uniform numbers chunk by chunk (the server's generator if None).
        """
        if cond is not None and (not isinstance(cond, torch.Tensor) or cond.dim() != 2):
            raise ValueError(f"cond must be [cond_channels, frames], got {_shape(cond)}")
        if speaker is not None:
            if isinstance(speaker, torch.Tensor):
                if speaker.numel() != 1:
                    raise ValueError(f"speaker must be one id, got a tensor of shape {tuple(speaker.shape)}")
                speaker = speaker.reshape(1)
            elif isinstance(speaker, bool) or not isinstance(speaker, int):
                raise TypeError(f"speaker must be an int or a one-element integer tensor, got {type(speaker).__name__}")
            else:
                speaker = [speaker]
        generator = as_generator(generator)
        batch = 1 if cond is None and speaker is None else None  # B comes from cond or speaker where given
        cond_b, spk, _ = self.model.check_inputs(None if cond is None else cond[None], speaker, batch, n_samples)
        with torch.no_grad():
            g = self.model.speaker_embed(spk)[0].float() if spk is not None else None
        if cond_b is not None:  # the last frame repeated as far as a chunk can read past it
            reach = self._chunk_frames_max()
            cond_b = torch.cat([cond_b[0], cond_b[0, :, -1:].expand(-1, reach)], 1)
        request = _Request(self._next_id, int(n_samples), cond_b, g, generator)
        self._next_id += 1
        self._pending.append(request)
        return request.id

    def __iter__(self) -> Iterator[dict[int, torch.Tensor]]:
        """``step()`` until no request is active or pending."""
        while self._active or self._pending:
            yield self.step()

    @torch.no_grad()
    def step(self) -> dict[int, torch.Tensor]:
        """Admits waiting requests (up to ``max_streams`` at once), makes the next chunk of every active request in
        one launch and returns {request id: its new samples ([<= chunk] int64 on the model's device)}; a request
        leaves after its last chunk. Empty when no request is active or pending."""
        self._admit()
        if not self._active:
            return {}
        reqs = self._active
        B = len(reqs)
        n = min(self.chunk, max(r.n_samples - r.done for r in reqs))
        dev = self.device
        rows = torch.tensor([r.row for r in reqs], dtype=torch.long, device=dev)
        hop = self.model.hop_length
        has_cond = reqs[0].cond is not None
        phase = [r.done % hop if has_cond else 0 for r in reqs]
        cond = self._chunk_frames(reqs, n) if has_cond else None
        g = torch.stack([r.g for r in reqs]) if reqs[0].g is not None else None
        u = torch.stack([self._uniforms(r, n) for r in reqs], dim=1)  # [n, B]
        prev = self._prev.index_select(0, rows)
        inputs = VocoderInputs(cond, g, u, self.temperature)
        if self.kernel != "torch":
            cont = Continuation(
                prev, torch.tensor(phase, dtype=torch.int32, device=dev), self._queue, rows.to(torch.int32), self._clock
            )
        if self.kernel == "cluster":
            w = vocoder_weights(self.model)
            ms, _ = cluster_plan(w, B, dev)
            out = wavenet_generate_cluster_batch(w, inputs, self.weights_dtype, streams_per_cluster=ms, cont=cont)
        elif self.kernel == "triton":
            out = generation.triton_vocoder.wavenet_generate(vocoder_weights(self.model), inputs, cont=cont)
        else:
            out = self._torch_chunk(cond, g, u, prev, phase, rows)
        self._prev.index_copy_(0, rows, out[:, -1])
        self._clock += n
        if self._period is not None:
            self._clock %= self._period
        chunks = {}
        for b, r in enumerate(reqs):
            k = min(n, r.n_samples - r.done)
            chunks[r.id] = out[b, :k]
            r.done += k
        for r in [r for r in reqs if r.done >= r.n_samples]:
            self._free.append(r.row)
        self._active = [r for r in reqs if r.done < r.n_samples]
        return chunks

    def _admit(self) -> None:
        room = len(self._pending) if self.max_streams is None else self.max_streams - len(self._active)
        joining, self._pending = self._pending[:room], self._pending[room:]
        if not joining:
            return
        need = len(joining) - len(self._free)
        if need > 0:
            self._grow(self._rows + need)
        for r in joining:
            r.row = self._free.pop(0)
            self._reset_row(r.row)
        self._active += joining

    def _grow(self, rows: int) -> None:
        dev, m = self.device, self.model
        extra = rows - self._rows
        self._prev = torch.cat([self._prev, torch.empty(extra, dtype=torch.long, device=dev)])
        if self.kernel in ("cluster", "triton"):
            w = vocoder_weights(m)
            q = (
                batch_queue(w, extra, 8, dev)
                if self.kernel == "cluster"
                else generation.triton_vocoder.triton_queue(w, extra, dev)
            )
            self._queue = q if self._queue is None else torch.cat([self._queue, q])
        else:
            qs = [torch.zeros(extra, d, m.residual_channels, device=dev) for d in m.dilations]
            old = self._queue or [q[:0] for q in qs]
            self._queue = [torch.cat([a, b]) for a, b in zip(old, qs, strict=True)]
        self._free += list(range(self._rows, rows))
        self._rows = rows

    def _reset_row(self, row: int) -> None:
        self._prev[row] = self.model.start_class()
        if self.kernel in ("cluster", "triton"):
            self._queue[row].zero_()
        else:
            for q in self._queue:
                q[row].zero_()

    def _uniforms(self, r: _Request, n: int) -> torch.Tensor:
        gen = r.generator if r.generator is not None else self.generator
        return torch.rand(n, generator=gen, device=self.device if gen is None else gen.device).to(self.device)

    def _chunk_frames_max(self) -> int:
        """The most frames a chunk reads of one request."""
        return (self.model.hop_length + self.chunk - 2) // self.model.hop_length + 1

    def _chunk_frames(self, reqs: list[_Request], n: int) -> torch.Tensor:
        """[B, cond_channels, frames] the frames of each request's next n samples, from the frame of its next sample
        (past its end, its last frame: those samples are never handed out). Slices and one copy: no operation whose
        kernel depends on the shapes (a first launch of a kernel loads it)."""
        hop = self.model.hop_length
        frames = max((r.done % hop + n - 1) // hop + 1 for r in reqs)
        return torch.stack([r.cond[:, r.done // hop : r.done // hop + frames] for r in reqs])

    def _torch_chunk(self, cond, g, u, prev, phase, rows) -> torch.Tensor:
        m = self.model
        n = u.shape[0]
        cond_up = None
        if cond is not None:  # per sample from each request's phase within its first frame
            up = m.upsample(cond, cond.shape[2] * m.hop_length)
            idx = torch.tensor(phase, device=self.device)[:, None] + torch.arange(n, device=self.device)
            cond_up = up.gather(1, idx[:, :, None].expand(-1, -1, up.shape[2]))
        queues = [q.index_select(0, rows) for q in self._queue]
        state = IncrementalState(m, cond_up, g, u, self.temperature, queues=queues, prev=prev, queue_time=self._clock)
        out, _ = sample_incremental(state)
        for q, s in zip(self._queue, state.queues, strict=True):
            q.index_copy_(0, rows, s)
        return out


def generate_stream(
    model,
    cond: torch.Tensor | None,
    n_samples: int,
    chunk: int = 4096,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    speaker: torch.Tensor | None = None,
    batch: int | None = None,
    kernel: str = "auto",
    weights_dtype: torch.dtype = torch.float32,
) -> Iterator[torch.Tensor]:
    """``WaveNet.generate_stream``: the samples of ``WaveNet.generate``'s streams chunk by chunk, as they are made:
    an iterator of [B, chunk] int64 tensors (the last one shorter), B and the arguments as ``generate`` (``kernel``
    as ``WaveNetServer``'s). The arguments are checked when called, before the first chunk; the uniform numbers are
    drawn chunk by chunk."""
    cond, speaker, B = model.check_inputs(cond, speaker, batch, n_samples)
    server = WaveNetServer(model, chunk, temperature, generator, kernel, weights_dtype)
    ids = [
        server.submit(n_samples, None if cond is None else cond[b], None if speaker is None else speaker[b])
        for b in range(B)
    ]
    return (torch.stack([chunks[i] for i in ids]) for chunks in server)


def _shape(x) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__
