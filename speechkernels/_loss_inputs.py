"""The inputs every loss shares: the batch reduction, labels and per-sample lengths, with the checks made of
them (each raises a ValueError naming the argument and, for a tensor's contents, the offending element)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

import torch

from ._args import INDEX_DTYPES, as_index_tensor

REDUCTIONS = ("none", "mean", "sum")
Lengths = torch.Tensor | Sequence[int]  # per-sample lengths: an integer tensor on any device, or integers


def batch_first_scores(log_probs: torch.Tensor, batch_first: bool) -> tuple[torch.Tensor, bool]:
    """``log_probs`` as [N, T, C] (a view) from [N, T, C], [T, N, C] (``batch_first=False``) or unbatched [T, C],
    and whether it was unbatched; another number of dimensions is refused."""
    if log_probs.dim() not in (2, 3):
        shape = tuple(log_probs.shape)
        raise ValueError(f"log_probs must have 3 dimensions [N, T, C] (or 2 unbatched), got shape {shape}")
    if log_probs.dim() == 2:
        return log_probs.unsqueeze(0), True
    return (log_probs if batch_first else log_probs.transpose(0, 1)), False


def check_targets(targets) -> None:
    """``targets`` is an int32 or int64 tensor."""
    if not isinstance(targets, torch.Tensor):
        raise ValueError(f"targets must be a torch.Tensor, got {type(targets).__name__}")
    if targets.dtype not in INDEX_DTYPES:
        raise ValueError(f"targets must be int32 or int64, got {targets.dtype}")


def labels_on(targets: torch.Tensor, device) -> torch.Tensor:
    """``targets`` as the kernels read them: on ``device``, contiguous (a view's values copied once, else no copy),
    so that a strided, offset or expanded view gives its values, never its storage's neighbours."""
    return targets.to(device).contiguous()


def targets_padded(targets: torch.Tensor, N: int) -> bool:
    """Whether ``targets`` are padded rows [N, S] (True) or 1-D concatenated labels (False); raises ValueError for
    any other shape, or rows that are not the batch's."""
    if targets.dim() == 2:
        if targets.shape[0] != N:
            raise ValueError(f"targets has {targets.shape[0]} rows but the batch size is {N}")
        return True
    if targets.dim() == 1:
        return False
    raise ValueError(f"targets must be [N, S] padded or 1-D concatenated, got shape {tuple(targets.shape)}")


def batch_lengths(
    N: int, device, reduction: str, keep: tuple[torch.dtype, ...] = (torch.int64,), **lengths
) -> list[torch.Tensor]:
    """Each of the per-sample ``lengths`` (by name) as an index tensor on ``device`` with N entries (``keep``: as
    ``as_index_tensor``), for a batch of N samples reduced by ``reduction`` (a mean over an empty batch is
    undefined)."""
    if N == 0 and reduction == "mean":
        raise ValueError("reduction='mean' over an empty batch (N=0) is undefined: use 'sum' or 'none'")
    out = []
    for name, value in lengths.items():
        t = as_index_tensor(value, name, device, keep=keep)
        if t.numel() != N:
            raise ValueError(f"{name} has {t.numel()} entries but the batch size is {N}")
        out.append(t)
    return out


def check_lengths(lengths: torch.Tensor, name: str, high: int, bound: str) -> None:
    """Raises ValueError naming the first of the per-sample ``lengths`` outside [0, high] (``bound`` spells
    ``high``). Error paths only: it synchronises."""
    bad = (lengths < 0) | (lengths > high)
    if bad.any():
        n = first_index(bad)
        raise ValueError(f"{name}[{n}]={int(lengths[n])} is outside [0, {bound}]")


def check_labels(labels: torch.Tensor, valid: torch.Tensor, C: int, classes: str, blank: int, describe) -> None:
    """Raises ValueError naming the first label (where ``valid``) outside [0, C) (``classes`` names C) or equal
    to the blank; ``describe(flat_index, value)`` says which label it is. Error paths only: it synchronises."""
    for cond, what in (
        ((labels < 0) | (labels >= C), f"is outside [0, {classes}={C})"),
        (labels == blank, f"equals blank={blank}"),
    ):
        cond = cond & valid
        if cond.any():
            flat = first_index(cond.reshape(-1))
            raise ValueError(f"{describe(flat, int(labels.reshape(-1)[flat]))} {what}")


def refuse_flagged(
    errors: list[int],
    frames: tuple[str, torch.Tensor, str],
    counts: tuple[str, torch.Tensor, str],
    C: int,
    classes: str,
    blank: int,
) -> NoReturn:
    """Raises the ValueError for a device-side check's finding that the host-side checks, run first on every
    refusal, did not confirm: it names the first flagged sample and its argument. ``errors``: each sample's bits
    (1 its frames, 2 its label count, 4 a label outside [0, C), 8 a label equal to the blank); ``frames``,
    ``counts``: (name, lengths, bound as spelt).

    The two read the same values, so this is not expected; should the device ever read other values than the host
    (a tensor read through the wrong strides, as views once were), the refusal still names the argument, the
    sample and the value, instead of refusing with no name."""
    n = next(i for i, bits in enumerate(errors) if bits)
    bits = errors[n]
    for bit, (name, lengths, bound) in ((1, frames), (2, counts)):
        if bits & bit:
            raise ValueError(
                f"{name}[{n}] is outside [0, {bound}] as the device-side check read it, although "
                f"it reads {int(lengths[n])} here"
            )
    what = f"outside [0, {classes}={C})" if bits & 4 else f"equal to blank={blank}"
    raise ValueError(
        f"targets: the device-side check read a label {what} in sample {n}'s labels, which read as valid here"
    )


def first_index(mask: torch.Tensor) -> int:
    """Index of the first True in a 1-D bool tensor (error paths only: it synchronises)."""
    return int(mask.nonzero()[0, 0].item())


def check_label_contents(
    T: int, C: int, targets: torch.Tensor, il: torch.Tensor, tl: torch.Tensor, blank: int, padded: bool
) -> None:
    """The per-sample lengths and the labels of a CTC lattice (targets padded [N, S] or concatenated): every input
    length in [0, T], every target length within the targets, every label in [0, C) and not the blank. Reads the
    tensors (a synchronisation on the GPU)."""
    il, tl = il.cpu(), tl.cpu()
    check_lengths(il, "input_lengths", T, f"T={T}")
    tg = targets.cpu().to(torch.int64)
    if padded:
        S = tg.shape[1]
        check_lengths(tl, "target_lengths", S, f"targets.shape[1]={S}")
        valid = torch.arange(S)[None, :] < tl[:, None]
        position = lambda flat: divmod(flat, S)
    else:
        check_lengths(tl, "target_lengths", tg.numel(), f"{tg.numel()} (the concatenated targets)")
        ends = tl.cumsum(0)
        total = int(ends[-1]) if ends.numel() else 0
        if total > tg.numel():
            n = first_index(ends > tg.numel())
            raise ValueError(
                f"target_lengths[{n}]={int(tl[n])} runs past the {tg.numel()} concatenated targets "
                f"(samples 0 to {n} take {int(ends[n])} labels)"
            )
        valid = torch.arange(tg.numel()) < total

        def position(flat):
            n = int((ends <= flat).sum())
            return n, flat - (int(ends[n - 1]) if n > 0 else 0)

    def describe(flat, value):
        n, j = position(flat)
        return f"targets: label {value} of sample {n} (position {j})"

    check_labels(tg, valid, C, "C", blank, describe)


def padded_labels(targets: torch.Tensor, lengths: torch.Tensor, padded: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels as padded rows [N, S] and their counts, clamped as the kernels clamp them (unchecked input): a count
    to [0, S]; with concatenated targets, sample n's labels follow sample n-1's and are cut at the tensor's end."""
    lt = lengths.clamp(min=0)
    if padded:
        return targets, lt.clamp(max=targets.shape[1])
    ends = lt.cumsum(0).clamp(max=targets.numel())
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    lt = ends - starts
    S = int(lt.max()) if lt.numel() else 0
    idx = starts[:, None] + torch.arange(S, device=targets.device)[None, :]
    return (targets[idx.clamp(max=max(targets.numel() - 1, 0))] if targets.numel() else idx), lt
