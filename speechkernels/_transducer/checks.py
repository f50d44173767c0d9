"""The argument checks of every transducer loss (labels, lengths, blank, reduction), the device-side check of the
lengths and labels with the host's words on failure, the fake outputs of a loss's forward kernels, the batch
reduction."""

from __future__ import annotations

import torch

from .._args import INDEX_DTYPES
from .._backend import triton_missing
from .._loss_inputs import batch_lengths, check_labels, check_lengths, check_targets, labels_on, refuse_flagged

try:  # the Triton kernels; without Triton (error names it) the PyTorch path serves every call
    from . import lattice
except ImportError as error:
    lattice = triton_missing(error)


def check_contents(
    T: int, U: int, V: int, targets: torch.Tensor, il: torch.Tensor, tl: torch.Tensor, blank: int
) -> None:
    il, tl = il.cpu(), tl.cpu()
    check_lengths(il, "logit_lengths", T, f"T={T}")
    check_lengths(tl, "target_lengths", U, f"U={U}")
    valid = torch.arange(U)[None, :] < tl[:, None]
    check_labels(targets.cpu().long(), valid, V, "V", blank, lambda flat, v: f"targets[{flat // U}, {flat % U}]={v}")


def validate_on_device(T: int, U: int, V: int, targets, il, tl, blank: int) -> None:
    """The device-side check of lengths and labels (one value read back: with the device idle, so that
    afterwards the host queues every kernel ahead of it); on failure the host-side checks name the argument, the
    sample and the value in the PyTorch path's words."""
    errors = lattice.validate_lengths_and_labels(targets, il, tl, T, V, blank)
    if errors is not None:
        check_contents(T, U, V, targets, il, tl, blank)
        refuse_flagged(errors, ("logit_lengths", il, f"T={T}"), ("target_lengths", tl, f"U={U}"), V, "V", blank)


def check_loss_arguments(
    targets,
    logit_lengths,
    target_lengths,
    blank: int,
    reduction: str,
    N: int,
    U1: int,
    V: int,
    dev,
    batch_of: str,
    rows_of: str,
    classes_of: str = "",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The checks every RNN-T entry point makes of its labels, lengths, blank and reduction, naming the tensor
    the batch size (``batch_of``), the U + 1 rows (``rows_of``) and V (``classes_of``) come from. Returns the
    targets and lengths on ``dev`` as the kernels read them (contiguous) and blank in [0, V)."""
    check_targets(targets)
    if targets.dim() != 2:
        raise ValueError(f"targets must be [N, U], got shape {tuple(targets.shape)}")
    if targets.shape[0] != N:
        raise ValueError(f"targets has {targets.shape[0]} rows but {batch_of}'s batch size is {N}")
    if targets.shape[1] + 1 != U1:
        raise ValueError(f"{rows_of}={U1} must be targets.shape[1] + 1 = {targets.shape[1] + 1}")
    if not -V <= blank < V:
        raise ValueError(f"blank={blank} is outside [-V, V) for V={V}{classes_of}")
    il, tl = batch_lengths(N, dev, reduction, INDEX_DTYPES, logit_lengths=logit_lengths, target_lengths=target_lengths)
    return labels_on(targets, dev), il, tl, blank + V if blank < 0 else blank


def state_fake(like: torch.Tensor, N: int, reduction: str, lse_cells: int, occ_floats: int) -> tuple:
    """Empty tensors as a transducer loss's forward kernels return them (a fake function's): the loss ([N] or a
    scalar), the log-sum-exps and the occupancies (float32), log2 p per sample (float64)."""
    f32 = dict(dtype=torch.float32)
    return (
        like.new_empty(N if reduction == "none" else (), **f32),
        like.new_empty(lse_cells, **f32),
        like.new_empty(occ_floats, **f32),
        like.new_empty(N, dtype=torch.float64),
    )
