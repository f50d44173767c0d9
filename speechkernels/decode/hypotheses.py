"""What the decoders return and carry: ``Hypotheses`` (greedy), ``BeamHypotheses`` (beam search),
``TransducerState`` (where a transducer decode stopped), and the helpers that assemble them without a host
synchronisation (``compact``, ``fusion_start``), shared by the kernels' launchers and the PyTorch path."""

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


class BeamHypotheses(NamedTuple):
    """A batch's N-best lists, best first: ``tokens`` [N, B, S] int64 (-1 past each hypothesis), ``lengths`` [N,
    B], ``frames`` [N, B, S] (each token's frame on the hypothesis's most likely alignment, -1 past), ``scores`` [N,
    B] (the ranking: acoustic plus LM terms), ``acoustic`` [N, B] (the log-sum over the hypothesis's alignments),
    ``lm_scores`` [N, B] (the weighted LM log-probabilities, ``</s>`` included, the insertion bonuses and the
    phrase boosting's bonuses); ``durations`` [N, B, S] (a TDT search: each token's duration) or None. Where
    an utterance has fewer than B hypotheses, the rest have length 0 and score -inf."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    frames: torch.Tensor
    scores: torch.Tensor
    acoustic: torch.Tensor
    lm_scores: torch.Tensor
    durations: torch.Tensor | None = None


class TransducerState(NamedTuple):
    """Where a transducer decode stopped, to continue with the next chunk of the same utterances: ``predictor``
    (the prediction network's state: LSTM ``(h, c)`` each [L, N, H]; stateless ``(context,)`` [N, K] int64, the
    last K tokens, -1 before the start), ``output`` [N, P] (its output after the last token), ``time_jumps`` [N]
    int64 (frames a TDT duration jumped past the chunk's end, skipped at the start of the next), ``frames`` [N]
    int64 (frames decoded before: the offset of the next chunk's frames); with an LM or phrase boosting fused,
    ``lm_states`` / ``boosting_states`` [N] int64 (each utterance's state of the ``NGramLM`` / ``PhraseBooster``;
    None: their start states)."""

    predictor: tuple[torch.Tensor, ...]
    output: torch.Tensor
    time_jumps: torch.Tensor
    frames: torch.Tensor
    lm_states: torch.Tensor | None = None
    boosting_states: torch.Tensor | None = None


def fusion_start(tables, states: torch.Tensor | None, N: int, device) -> torch.Tensor | None:
    """The [N] int64 states of an ``NGramLM`` or ``PhraseBooster`` to start from (None: its start state), or None
    without one (given states are the caller's to check: ``TransducerDecoder.greedy`` does, once)."""
    if tables is None:
        return None
    if states is None:
        return torch.full((N,), tables.start, dtype=torch.int64, device=device)
    return states.to(device, torch.int64)
