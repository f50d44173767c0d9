"""Public CTC forced alignment: argument checks, dispatch to the Triton kernels or the CPU path, token spans."""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._args import as_bool, as_choice, as_int, check_float_input, check_integer_tensor
from .._backend import triton_missing, use_triton
from .._loss_inputs import (
    Lengths,
    batch_first_scores,
    batch_lengths,
    check_label_contents,
    check_targets,
    labels_on,
    padded_labels,
    targets_padded,
)
from .reference import ctc_forced_align_reference

try:  # the Triton kernels; without Triton (error names it) the PyTorch path serves every call
    from . import kernels
except ImportError as error:
    kernels = triton_missing(error)


def ctc_forced_align(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: Lengths | None = None,
    target_lengths: Lengths | None = None,
    blank: int = 0,
    *,
    batch_first: bool = True,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The most likely CTC alignment of each transcript to its frames (Viterbi), for a whole batch at once.

    Batched ``torchaudio.functional.forced_align``: the same path wherever the best path is unique (the scores are
    accumulated in float32 in torchaudio's order, so where its CPU version breaks no tie the two paths are equal).

    Args:
        log_probs: [N, T, C] (or [T, N, C] with ``batch_first=False``, or [T, C] unbatched) log-probabilities,
            float32/float16/bfloat16 on the GPU, any float dtype on the CPU. Scores need not be normalised.
        targets: [N, S] padded or 1-D concatenated labels, int32 or int64, on any device. Labels lie in [0, C) and
            differ from ``blank``; padded entries past ``target_lengths`` are ignored.
        input_lengths: [N] frames per sample, each in [0, T] (an integer tensor on any device, an integer numpy
            array or a sequence of integers); default: T for every sample.
        target_lengths: [N] labels per sample, in the same forms; default: S for every sample (padded targets
            only: concatenated targets need their lengths).
        blank: index of the blank class.
        batch_first: ``log_probs`` is [N, T, C] (the default, as torchaudio); False for [T, N, C].
        validate: check lengths and labels against the tensors' contents (on the GPU a read of device memory).
            Unchecked bad values cannot cause a memory fault: every path clamps lengths to the tensors and labels
            to [0, C) alike.

    Returns:
        ``(alignments, scores)``, both [N, T] (or [T] unbatched):

        - alignments, int64: each frame's token (the blank, or the label the frame is aligned to); -1 past the
          sample's input length.
        - scores, float32 (float64 for float64 input): each frame's log-probability of its token; 0 past the input
          length.

        A sample with no alignment (fewer frames than its labels need, counting a blank between repeated labels,
        or only zero-probability paths) gets -1 at every frame and -inf scores within its input length; a sample
        that reads a NaN or +inf score (its labels' or the blank's, before its input length) gets -1 and NaN
        scores. Neither raises, and neither affects the other samples.

    Ties between equally good paths are broken the same way on every device: each state keeps the nearest best
    predecessor (staying in the state, then the state before it, then the skip over a blank between two different
    labels), and the path ends in the last label when it scores the same as the final blank.

    Raises:
        ValueError: an argument of the wrong type, shape or value, naming it (and the offending element).

    Example:
        >>> emissions = torch.randn(2, 50, 20).log_softmax(-1)
        >>> targets = torch.tensor([[3, 7, 7, 2], [5, 1, 0, 0]])
        >>> alignments, scores = ctc_forced_align(emissions, targets, [50, 42], [4, 2])
        >>> spans = ctc_token_spans(alignments, scores.exp())
    """
    check_float_input(log_probs, "log_probs")
    blank = as_int(blank, "blank")
    batch_first, validate = as_bool(batch_first, "batch_first"), as_bool(validate, "validate")
    x, unbatched = batch_first_scores(log_probs, batch_first)
    check_targets(targets)
    if unbatched:
        if targets.dim() != 1:
            raise ValueError(f"unbatched targets must have 1 dimension, got shape {tuple(targets.shape)}")
        targets = targets.unsqueeze(0)
    N, T, C = x.shape
    if not 0 <= blank < C:
        raise ValueError(f"blank={blank} is outside [0, C={C})")
    padded = targets_padded(targets, N)
    dev = x.device
    if input_lengths is None:
        input_lengths = torch.full((N,), T, dtype=torch.int64, device=dev)
    if target_lengths is None:
        if not padded:
            raise ValueError("target_lengths is required with concatenated (1-D) targets")
        target_lengths = torch.full((N,), targets.shape[1], dtype=torch.int64, device=dev)
    il, tl = batch_lengths(N, dev, "none", input_lengths=input_lengths, target_lengths=target_lengths)
    targets = labels_on(targets, dev)
    if validate:
        check_label_contents(T, C, targets, il, tl, blank, padded)

    if kernels is not None and use_triton(x) and N > 0 and T > 0:
        alignments, scores = kernels.ctc_align(x, targets, il, tl, blank, padded)
    else:
        tg, lt = padded_labels(targets.cpu(), tl.cpu(), padded)
        alignments, scores = ctc_forced_align_reference(x.cpu(), tg, il.cpu().clamp(0, T), lt, blank)
        alignments, scores = alignments.to(dev), scores.to(dev)
    if unbatched:
        return alignments[0], scores[0]
    return alignments, scores


class TokenSpans(NamedTuple):
    """Per sample, the spans of frames aligned to each token, padded to the longest sample (M spans).

    tokens: [N, M] int64, the token of each span (-1 past the sample's span count);
    starts: [N, M] int64, its first frame; ends: [N, M] int64, one past its last frame (0 in padding);
    scores: [N, M], the mean (or sum) of the span's frame scores (0 in padding);
    lengths: [N] int64, spans per sample.
    """

    tokens: torch.Tensor
    starts: torch.Tensor
    ends: torch.Tensor
    scores: torch.Tensor
    lengths: torch.Tensor


def ctc_token_spans(
    alignments: torch.Tensor,
    scores: torch.Tensor | None = None,
    blank: int = 0,
    *,
    reduce: str = "mean",
) -> TokenSpans:
    """Merges each sample's frame alignment into token spans: batched ``torchaudio.functional.merge_tokens``.

    A span is a run of frames aligned to the same token other than the blank (CTC puts a blank between two
    repeated labels, so each label of the transcript gets its own span, in order: span j of a sample is its label
    j). Word timestamps follow by grouping a word's spans: it starts at its first span's start and ends at its last
    span's end, in frames (multiply by the model's frame duration for seconds).

    Args:
        alignments: [N, T] (or [T]) int64 tokens from :func:`ctc_forced_align` (-1 frames are skipped).
        scores: [N, T] (or [T]) frame scores to reduce over each span (e.g. ``scores.exp()`` from
            :func:`ctc_forced_align` for torchaudio's mean probability); None: spans' scores are 0.
        blank: the blank class.
        reduce: "mean" or "sum" of the frame scores over each span.

    Returns:
        :class:`TokenSpans` of padded [N, M] tensors (M: the most spans of any sample) on alignments' device, and
        span counts [N]; unbatched input gives [M] tensors and a 0-d count.
    """
    check_integer_tensor(alignments, "alignments", "tokens")
    blank = as_int(blank, "blank")
    reduce = as_choice(reduce, "reduce", ("mean", "sum"))
    if alignments.dim() not in (1, 2):
        raise ValueError(f"alignments must be [N, T] (or [T]), got shape {tuple(alignments.shape)}")
    if scores is not None:
        if not isinstance(scores, torch.Tensor) or not scores.dtype.is_floating_point:
            got = scores.dtype if isinstance(scores, torch.Tensor) else type(scores).__name__
            raise ValueError(f"scores must be a float tensor or None, got {got}")
        if scores.shape != alignments.shape:
            raise ValueError(f"scores has shape {tuple(scores.shape)} but alignments {tuple(alignments.shape)}")
    unbatched = alignments.dim() == 1
    a = alignments.unsqueeze(0) if unbatched else alignments
    a = a.to(torch.int64)
    N, T = a.shape
    dev = a.device
    token = (a != blank) & (a >= 0)
    before = torch.cat([a.new_full((N, 1), -2), a[:, :-1]], dim=1)
    after = torch.cat([a[:, 1:], a.new_full((N, 1), -2)], dim=1)
    first = token & (a != before)
    last = token & (a != after)
    counts = first.sum(1)
    M = int(counts.max()) if N and T else 0
    frames = torch.arange(T, device=dev).expand(N, T)
    span = first.cumsum(1) - 1  # the span each frame belongs to
    slot = torch.arange(M, device=dev)[None, :] < counts[:, None]
    tokens = torch.full((N, M), -1, dtype=torch.int64, device=dev)
    starts = torch.zeros((N, M), dtype=torch.int64, device=dev)
    ends = torch.zeros((N, M), dtype=torch.int64, device=dev)
    rows = torch.arange(N, device=dev)[:, None].expand(N, T)
    tokens[rows[first], span[first]] = a[first]
    starts[rows[first], span[first]] = frames[first]
    ends[rows[last], span[last]] = frames[last] + 1
    if scores is None:
        out_scores = torch.zeros((N, M), dtype=torch.float32, device=dev)
    else:
        s = scores.unsqueeze(0) if unbatched else scores
        total = _span_sums(torch.where(token, s.to(dev), 0), starts, ends)
        if reduce == "mean":
            total = total / (ends - starts).clamp(min=1)
        out_scores = torch.where(slot, total, 0.0).to(s.dtype)
    if unbatched:
        return TokenSpans(tokens[0], starts[0], ends[0], out_scores[0], counts[0])
    return TokenSpans(tokens, starts, ends, out_scores, counts)


def _span_sums(values: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Sums of values [N, T] over frames [starts, ends) of each span, in float64, deterministically: differences of
    cumulative sums of the finite values (exact enough over any length in float64), with a span that holds a NaN
    (or both infinities) NaN and one that holds an infinity that infinity, as a direct sum would give."""
    N = values.shape[0]
    v = values.double()
    finite = torch.isfinite(v)

    def span_sum(w: torch.Tensor) -> torch.Tensor:
        cs = torch.cat([w.new_zeros((N, 1)), w.cumsum(1)], 1)
        return cs.gather(1, ends) - cs.gather(1, starts)

    total = span_sum(torch.where(finite, v, 0.0))
    n_nan, n_pos, n_neg = (span_sum(m.double()) for m in (v.isnan(), v == float("inf"), v == float("-inf")))
    total = torch.where(n_neg > 0, float("-inf"), total)
    total = torch.where(n_pos > 0, torch.where(n_neg > 0, float("nan"), float("inf")), total)
    return torch.where(n_nan > 0, float("nan"), total)
