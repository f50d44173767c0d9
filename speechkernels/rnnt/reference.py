"""RNN-Transducer loss in pure PyTorch: the CPU path and the float64 oracle of the GPU kernels.

The lattice of Graves (2012): node (t, u) means t frames consumed and u labels emitted, for t in [0, T_n] and
u in [0, U_n]. From a node at t < T_n two edges leave:

- blank, to (t + 1, u), weight lp[t, u, blank];
- label u + 1 (when u < U_n), weight lp[t, u, y_u], to (t, u + 1) for RNN-T, or to (t + 1, u + 1) for the
  Recurrent Neural Aligner ("rna": at most one label per frame, and emitting it consumes the frame).

Paths run from (0, 0) to (T_n, U_n); with alpha (from the start) and beta (to the end),

    log p(y | x) = alpha[T_n, U_n] = beta[0, 0]
    occupancy of an edge e from (t, u) to v = exp(alpha[t, u] + w_e + beta[v] - log p)

and the loss is -log p. The gradient with respect to the log-probabilities is minus the edge occupancies,
exactly; through a fused log_softmax it is softmax * (total occupancy of the node) - occupancy. FastEmit
(Yu et al. 2021, as warp-rnnt and NeMo define it) multiplies the label edges' gradient by 1 + lambda; NeMo
also reports the loss times 1 + lambda, warp-rnnt the plain loss (``fastemit_loss_scale``). ``clamp`` > 0
clamps the gradient to [-clamp, clamp].

RNN-T's alpha is computed along anti-diagonals (t + u constant), RNA's row by row; both vectorised over the
batch. Samples with no path (T_n = 0, or U_n > T_n for RNA) get an infinite loss and a zero gradient; a NaN
a sample reads stays in that sample.
"""

from __future__ import annotations

import torch

from .._reference import LossWithGradient

NEG_INF = float("-inf")
RNNT_TYPES = ("rnnt", "rna")


def lattice_log_probs(
    logits: torch.Tensor, targets: torch.Tensor, blank: int, fused_log_softmax: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The log-probabilities, and per node those of the blank and of the next label.

    Args:
        logits: [N, T, U+1, V].
        targets: [N, U] labels (padding past the target lengths must still index [0, V)).

    Returns:
        lp [N, T, U+1, V], blank [N, T, U+1], emit [N, T, U+1] (-inf in the last row u = U).
    """
    lp = torch.log_softmax(logits, dim=-1) if fused_log_softmax else logits
    lp_blank = lp[..., blank]
    N, T, U1, _ = lp.shape
    idx = targets.long().clamp(0, lp.shape[-1] - 1)[:, None, :, None].expand(N, T, U1 - 1, 1)
    lp_emit = torch.gather(lp[:, :, : U1 - 1], 3, idx).squeeze(3)
    lp_emit = torch.nn.functional.pad(lp_emit, (0, 1), value=NEG_INF)
    return lp, lp_blank, lp_emit


def lattice_masks(T_n: torch.Tensor, U_n: torch.Tensor, T: int, U1: int):
    t = torch.arange(T + 1, device=T_n.device)[None, :, None]
    u = torch.arange(U1, device=T_n.device)[None, None, :]
    node = (t <= T_n[:, None, None]) & (u <= U_n[:, None, None])
    has_edges = node & (t < T_n[:, None, None])  # frames left to consume
    return t, u, node, has_edges


def pad_frame(x: torch.Tensor) -> torch.Tensor:
    """[N, T, U+1] edge weights -> [N, T+1, U+1] (the row t = T has no edges)."""
    return torch.nn.functional.pad(x, (0, 0, 0, 1), value=NEG_INF)


def alpha_beta(
    lp_blank: torch.Tensor, lp_emit: torch.Tensor, T_n: torch.Tensor, U_n: torch.Tensor, rnnt_type: str = "rnnt"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward and backward variables over the nodes, and log p(y | x).

    Args:
        lp_blank, lp_emit: [N, T, U+1] edge weights (from ``lattice_log_probs``).
        T_n, U_n: [N] frames and labels of each sample (T_n in [0, T], U_n in [0, U]).

    Returns:
        alpha, beta: [N, T+1, U+1], -inf outside each sample's lattice; log_p: [N].
    """
    N, T, U1 = lp_blank.shape
    rna = rnnt_type == "rna"
    t, u, node, has_edges = lattice_masks(T_n, U_n, T, U1)
    wb = torch.where(has_edges, pad_frame(lp_blank), NEG_INF)
    we = torch.where(has_edges & (u < U_n[:, None, None]), pad_frame(lp_emit), NEG_INF)
    alpha = torch.full((N, T + 1, U1), NEG_INF, dtype=lp_blank.dtype, device=lp_blank.device)
    beta = torch.full_like(alpha, NEG_INF)
    alpha[:, 0, 0] = 0.0
    n_idx = torch.arange(N, device=alpha.device)
    beta[n_idx, T_n, U_n] = 0.0
    if rna:
        for ti in range(1, T + 1):
            from_blank = alpha[:, ti - 1] + wb[:, ti - 1]
            from_emit = torch.nn.functional.pad(alpha[:, ti - 1, :-1] + we[:, ti - 1, :-1], (1, 0), value=NEG_INF)
            alpha[:, ti] = torch.where(node[:, ti], torch.logaddexp(from_blank, from_emit), NEG_INF)
        for ti in range(T - 1, -1, -1):
            to_blank = wb[:, ti] + beta[:, ti + 1]
            to_emit = torch.nn.functional.pad(we[:, ti, :-1] + beta[:, ti + 1, 1:], (0, 1), value=NEG_INF)
            end = (ti == T_n)[:, None] & (u[0, 0] == U_n[:, None])
            beta[:, ti] = torch.where(end, 0.0, torch.where(node[:, ti], torch.logaddexp(to_blank, to_emit), NEG_INF))
    else:
        # anti-diagonal d holds the nodes t + u = d; both predecessors of a node lie on diagonal d - 1
        for d in range(1, T + U1):
            ui = torch.arange(max(0, d - T), min(d, U1 - 1) + 1, device=alpha.device)
            ti = d - ui
            from_blank = torch.where(ti > 0, alpha[:, ti - 1, ui] + wb[:, (ti - 1).clamp(min=0), ui], NEG_INF)
            from_emit = torch.where(ui > 0, alpha[:, ti, ui - 1] + we[:, ti, (ui - 1).clamp(min=0)], NEG_INF)
            alpha[:, ti, ui] = torch.where(node[:, ti, ui], torch.logaddexp(from_blank, from_emit), NEG_INF)
        for d in range(T + U1 - 2, -1, -1):
            ui = torch.arange(max(0, d - T), min(d, U1 - 1) + 1, device=alpha.device)
            ti = d - ui
            to_blank = torch.where(ti < T, wb[:, ti.clamp(max=T - 1), ui] + beta[:, (ti + 1).clamp(max=T), ui], NEG_INF)
            to_emit = torch.where(ui < U1 - 1, we[:, ti, ui] + beta[:, ti, (ui + 1).clamp(max=U1 - 1)], NEG_INF)
            end = (ti[None, :] == T_n[:, None]) & (ui[None, :] == U_n[:, None])
            value = torch.where(node[:, ti, ui], torch.logaddexp(to_blank, to_emit), NEG_INF)
            beta[:, ti, ui] = torch.where(end, 0.0, value)
    log_p = alpha[n_idx, T_n, U_n]
    # a NaN among the edge weights a sample reads makes its log p NaN, also off every complete path (an RNA cell
    # that cannot reach the end), as the kernels count NaN apart
    read_nan = (torch.isnan(wb) | torch.isnan(we)).flatten(1).any(1)
    log_p = torch.where(read_nan, float("nan"), log_p)
    return alpha, beta, log_p


def rnnt_forward_backward_reference(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    fused_log_softmax: bool = True,
    fastemit_lambda: float = 0.0,
    clamp: float = -1.0,
    rnnt_type: str = "rnnt",
    need_grad: bool = True,
    fastemit_loss_scale: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-sample loss and its gradient with respect to ``logits``, in float64.

    Args:
        logits: [N, T, U+1, V] scores (``fused_log_softmax``) or log-probabilities.
        targets: [N, U] labels; entries past ``target_lengths`` are ignored.
        logit_lengths: [N] in [0, T]; target_lengths: [N] in [0, U].
        blank: index of the blank class in [0, V).

    Returns:
        loss [N] float64 (+inf where no path exists), grad [N, T, U+1, V] float64 or None (zero outside the
        cells with edges, t < T_n and u <= U_n, whatever the scores there).
    """
    x = logits.to(torch.float64)
    N, T, U1, V = x.shape
    T_n = logit_lengths.to(x.device, torch.long).clamp(0, T)
    U_n = target_lengths.to(x.device, torch.long).clamp(0, U1 - 1)
    valid_label = torch.arange(U1 - 1, device=x.device)[None, :] < U_n[:, None]
    tg = torch.where(valid_label, targets.to(x.device).long().clamp(0, V - 1), 0)  # unchecked labels: clamped
    lp, lp_blank, lp_emit = lattice_log_probs(x, tg, blank, fused_log_softmax)
    alpha, beta, log_p = alpha_beta(lp_blank, lp_emit, T_n, U_n, rnnt_type)
    loss = -(1.0 + fastemit_lambda if fastemit_loss_scale else 1.0) * log_p
    if not need_grad:
        return loss, None
    t, u, node, has_edges = lattice_masks(T_n, U_n, T, U1)
    possible = (log_p > NEG_INF)[:, None, None]
    lp_ = log_p[:, None, None]
    wb = torch.where(has_edges, pad_frame(lp_blank), NEG_INF)[:, :T]
    we = torch.where(has_edges & (u < U_n[:, None, None]), pad_frame(lp_emit), NEG_INF)[:, :T]
    beta_next = beta[:, 1:]  # node (t + 1, u)
    beta_emit = beta[:, 1:] if rnnt_type == "rna" else beta[:, :T]
    beta_emit = torch.nn.functional.pad(beta_emit[..., 1:], (0, 1), value=NEG_INF)  # node (t or t + 1, u + 1)
    occ_b = torch.where(possible, torch.exp(alpha[:, :T] + wb + beta_next - lp_), 0.0)
    occ_e = torch.where(possible, torch.exp(alpha[:, :T] + we + beta_emit - lp_), 0.0)
    # NaN anywhere in the sample (log p is NaN then): the gradient of every score it reads is NaN, each blank
    # of its lattice and each next label (and every score of those cells through a fused log_softmax)
    nan = torch.isnan(lp_) & has_edges[:, :T]
    occ_b = torch.where(nan, float("nan"), occ_b)
    occ_e = torch.where(nan & (u < U_n[:, None, None])[:, :T], float("nan"), occ_e)
    g_lp = torch.zeros_like(x)
    g_lp[..., blank] -= occ_b
    g_lp.scatter_add_(3, tg[:, None, :, None].expand(N, T, U1 - 1, 1), -(1.0 + fastemit_lambda) * occ_e[..., :-1, None])
    if fused_log_softmax:
        grad = g_lp - torch.exp(lp) * g_lp.sum(-1, keepdim=True)
    else:
        grad = g_lp
    if clamp > 0:
        grad = grad.clamp(-clamp, clamp)
    # cells a sample does not read get no gradient, even where their scores are NaN (softmax * 0 above)
    grad = torch.where(has_edges[:, :T, :, None], grad, 0.0)
    return loss, grad


def rnnt_losses_reference(logits, targets, logit_lengths, target_lengths, blank, fused, fastemit_lambda, clamp,
                          rnnt_type, fastemit_loss_scale=True) -> torch.Tensor:  # fmt: skip
    """Per-sample losses with the analytic gradient of ``rnnt_forward_backward_reference`` (gradcheck'd), in
    float32 for every input dtype but float64, as the kernels return them."""

    def compute(x):
        return rnnt_forward_backward_reference(
            x, targets, logit_lengths, target_lengths, blank, fused, fastemit_lambda, clamp, rnnt_type,
            need_grad=x.requires_grad, fastemit_loss_scale=fastemit_loss_scale,
        )  # fmt: skip

    return LossWithGradient.apply(logits, compute, 0)


def reduce_loss(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.mean()


def rnnt_loss_reference(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int = -1,
    clamp: float = -1.0,
    reduction: str = "mean",
    fused_log_softmax: bool = True,
    fastemit_lambda: float = 0.0,
    rnnt_type: str = "rnnt",
    fastemit_loss_scale: bool = True,
) -> torch.Tensor:
    """The reference with torchaudio's signature (no argument checks): float64 arithmetic, any device."""
    V = logits.shape[-1]
    blank = blank + V if blank < 0 else blank
    loss = rnnt_losses_reference(
        logits, targets, logit_lengths, target_lengths, blank, fused_log_softmax, fastemit_lambda, clamp, rnnt_type,
        fastemit_loss_scale,
    )  # fmt: skip
    return reduce_loss(loss, reduction)
