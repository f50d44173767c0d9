"""Greedy decoding in PyTorch, readable and float64-capable: the CPU path and the oracle of the kernels."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Hypotheses(NamedTuple):
    """A batch of decoded hypotheses, padded to S (an allocated bound, not the longest hypothesis: no host
    synchronisation): ``tokens`` [N, S] int64, -1 past each hypothesis; ``lengths`` [N] int64; ``frames`` [N, S]
    int64, the frame of each token (-1 past); ``scores`` [N, S], each token's log-probability there (float32,
    float64 for float64 input; 0 past); ``durations`` [N, S] int64 (TDT) or None."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    frames: torch.Tensor
    scores: torch.Tensor
    durations: torch.Tensor | None = None


def compact(emit: torch.Tensor, *columns: tuple[torch.Tensor, float | int]) -> tuple[torch.Tensor, ...]:
    """The entries of each row where ``emit`` [N, T] holds, moved to the row's front in order: ``lengths`` [N]
    and, for each (values [N, T], fill), the kept values padded with fill to [N, T]. No host synchronisation."""
    N, T = emit.shape
    lengths = emit.sum(1)
    slot = torch.where(emit, emit.cumsum(1) - 1, T)  # past the end: a spare column, cut off below
    out = [lengths]
    for values, fill in columns:
        buf = torch.full((N, T + 1), fill, dtype=values.dtype, device=values.device)
        buf.scatter_(1, slot, values)
        out.append(buf[:, :T])
    return tuple(out)


def ctc_greedy_decode_reference(x: torch.Tensor, lengths: torch.Tensor, blank: int, logits: bool) -> Hypotheses:
    """Greedy (best-path) CTC decoding of x [N, T, C]: each frame's most likely class (the first one of equal
    scores, as ``torch.argmax``; a NaN counts as the largest), runs of one class merged, blanks dropped. A token
    is reported at the first frame of its run with its log-probability there (``logits``: x's log_softmax, taken
    in float32, float64 for float64 x). Frames at and past ``lengths`` [N] (clamped to [0, T]) are not read."""
    wd = torch.float64 if x.dtype == torch.float64 else torch.float32
    best = x.argmax(2)
    score = x.gather(2, best[..., None])[..., 0].to(wd)
    if logits:
        score = score - torch.logsumexp(x.to(wd), 2)
    return ctc_hypotheses(best, score, lengths, blank)


def ctc_hypotheses(best: torch.Tensor, score: torch.Tensor, lengths: torch.Tensor, blank: int) -> Hypotheses:
    """Hypotheses from each frame's most likely class ``best`` [N, T] and its ``score``: runs merged, blanks and
    the frames at and past ``lengths`` (clamped to [0, T]) dropped, each token at the first frame of its run."""
    N, T = best.shape
    dev = best.device
    t = torch.arange(T, device=dev)
    live = t[None, :] < lengths.to(dev).clamp(0, T)[:, None]
    prev = torch.cat((torch.full((N, 1), -1, dtype=best.dtype, device=dev), best[:, :-1]), 1)
    emit = live & (best != blank) & (best != prev)
    lengths_out, tokens, frames, scores = compact(emit, (best, -1), (t.expand(N, T), -1), (score, 0.0))
    return Hypotheses(tokens, lengths_out, frames, scores)
