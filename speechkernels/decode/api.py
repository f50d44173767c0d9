"""Public greedy decoding: argument checks and dispatch for ``ctc_greedy_decode``."""

from __future__ import annotations

import torch

from .._loss_inputs import Lengths, batch_first_scores, batch_lengths, check_lengths
from .._utils import as_bool, as_int, check_float_input, kernel_layout, optional_kernels, use_triton
from .reference import Hypotheses, ctc_greedy_decode_reference, ctc_hypotheses

kernels = optional_kernels(__package__ + ".kernels")


def ctc_greedy_decode(
    log_probs: torch.Tensor,
    input_lengths: Lengths | None = None,
    blank: int = 0,
    *,
    batch_first: bool = True,
    logits: bool = False,
    validate: bool = True,
) -> Hypotheses:
    """Greedy (best-path) CTC decoding of a batch: each frame's most likely class, runs of one class merged,
    blanks dropped.

    Args:
        log_probs: [N, T, C] (or [T, N, C] with ``batch_first=False``, or [T, C] unbatched) log-probabilities, or
            raw scores with ``logits=True``: float32/float16/bfloat16 on the GPU (one read of the scores by a
            kernel), any float dtype on the CPU.
        input_lengths: [N] frames per sample, each in [0, T] (an integer tensor on any device, an integer numpy
            array or a sequence of integers); default: T for every sample. Frames past a sample's length are not
            read.
        blank: index of the blank class, in [0, C).
        batch_first: ``log_probs`` is [N, T, C] (the default); False for [T, N, C].
        logits: the scores are raw (a model's output): the reported scores are their log_softmax.
        validate: check the lengths' values (on the GPU a read of device memory); unchecked, they are clamped to
            [0, T].

    Returns:
        ``Hypotheses`` with S = T (the longest possible hypothesis; no host synchronisation): ``tokens`` [N, T]
        int64 padded with -1, ``lengths`` [N], ``frames`` [N, T] (the first frame of each token's run, -1 past),
        ``scores`` [N, T] (the token's log-probability at that frame; float32, float64 for float64 input; 0
        past), ``durations`` None. Unbatched input gives [T] rows and a 0-d length. Ties between classes go to
        the lowest index and a NaN counts as the largest score (``torch.argmax``'s rules).

    Raises:
        ValueError: an argument of the wrong type, shape or value, naming it (and the offending element).

    Example:
        >>> hyp = ctc_greedy_decode(torch.randn(2, 50, 20).log_softmax(-1), [50, 42])
        >>> transcripts = [hyp.tokens[n, : hyp.lengths[n]].tolist() for n in range(2)]
    """
    check_float_input(log_probs, "log_probs")
    blank = as_int(blank, "blank")
    batch_first, logits = as_bool(batch_first, "batch_first"), as_bool(logits, "logits")
    validate = as_bool(validate, "validate")
    x, unbatched = batch_first_scores(log_probs, batch_first)
    N, T, C = x.shape
    if not 0 <= blank < C:
        raise ValueError(f"blank={blank} is outside [0, C={C})")
    dev = x.device
    if input_lengths is None:
        input_lengths = torch.full((N,), T, dtype=torch.int64, device=dev)
    (il,) = batch_lengths(N, dev, "none", input_lengths=input_lengths)
    if validate:
        check_lengths(il, "input_lengths", T, f"T={T}")
    if kernels is not None and use_triton(x) and N > 0 and T > 0:
        best, score = kernels.ctc_best(kernel_layout(x), il, logits)
        hyp = ctc_hypotheses(best, score, il, blank)
    else:
        hyp = ctc_greedy_decode_reference(x, il, blank, logits)
    if unbatched:
        return Hypotheses(*(None if v is None else v[0] for v in hyp))
    return hyp
