"""The joint network and the RNN-T loss in pure PyTorch: the CPU path and, in float64, the oracle of the fused
kernels.

Per lattice cell (n, t, u) the joint network scores the V classes,

    h = dropout(act(enc[n, t] + pred[n, u]))        [H]
    logits = weight @ h + bias                     [V]

and the loss is ``rnnt_loss`` of those logits (with its fused log_softmax). Materialising the [N, T, U+1, V]
logits at once is what the fused kernels avoid; here they are made a chunk of frames at a time, twice: the
forward keeps per cell only the log-sum-exp and the two log-probabilities the lattice needs, and the backward
makes each chunk again and runs autograd through it with the logits' gradient from the edge occupancies
(softmax * (occ_blank + s occ_label) - occ_blank [blank] - s occ_label [label], s = 1 + FastEmit's lambda). Memory
is O(N T (U+1)) plus one chunk.

Dropout keeps element k of cell c's hidden vector when a hash of (seed, c, k) clears the drop probability
(``dropout_keep``): a counter-based mask that the kernels compute the same way, so that a seed gives the same
mask on every path and nothing is stored between the forward and the backward.
"""

from __future__ import annotations

import torch

from .._transducer.joint_reference import joint_hidden
from .reference import alpha_beta, lattice_masks, pad_frame

NEG_INF = float("-inf")


def _chunk_frames(N: int, U1: int, V: int, H: int) -> int:
    """Frames per chunk: about 2^25 elements of logits or hidden vectors at a time."""
    return max(1, (1 << 25) // max(1, N * U1 * max(V, H)))


class RNNTJointLossReferenceFunction(torch.autograd.Function):
    """Per-sample loss of the joint network's logits, with gradients for enc, pred, weight and bias.

    The forward's arithmetic is in ``compute_dtype`` (float64 for the oracle), the lattice recursion in
    float64."""

    @staticmethod
    def forward(ctx, enc, pred, weight, bias, targets, il, tl, opts, net, compute_dtype):
        """``opts``: the loss's TransducerOptions (``opts.blank`` an index); ``net``: the JointNetworkOptions."""
        blank, rnnt_type = opts.blank, opts.rnnt_type
        activation, dropout, seed = net.activation, net.dropout, net.seed
        N, T, H = enc.shape
        U1 = pred.shape[1]
        V = weight.shape[0]
        cd = compute_dtype
        e, p, w = enc.detach().to(cd), pred.detach().to(cd), weight.detach().to(cd)
        b = None if bias is None else bias.detach().to(cd)
        T_n = il.long().clamp(0, T)
        U_n = tl.long().clamp(0, U1 - 1)
        valid_label = torch.arange(U1 - 1, device=enc.device)[None, :] < U_n[:, None]
        tg = torch.where(valid_label, targets.long().clamp(0, V - 1), 0)
        lse = torch.empty(N, T, U1, dtype=cd, device=enc.device)
        lp_blank = torch.empty(N, T, U1, dtype=torch.float64, device=enc.device)
        lp_emit = torch.full((N, T, U1), NEG_INF, dtype=torch.float64, device=enc.device)
        step = _chunk_frames(N, U1, V, H)
        for t0 in range(0, T, step):
            t1 = min(T, t0 + step)
            x = torch.nn.functional.linear(joint_hidden(e[:, t0:t1], p, t0, T, activation, dropout, seed), w, b)
            lse[:, t0:t1] = torch.logsumexp(x, -1)
            lp_blank[:, t0:t1] = (x[..., blank] - lse[:, t0:t1]).double()
            idx = tg[:, None, :, None].expand(N, t1 - t0, U1 - 1, 1)
            lp_emit[:, t0:t1, :-1] = (torch.gather(x[:, :, :-1], 3, idx).squeeze(3) - lse[:, t0:t1, :-1]).double()
        alpha, beta, log_p = alpha_beta(lp_blank, lp_emit, T_n, U_n, rnnt_type)
        loss = -opts.loss_scale * log_p
        ctx.save_for_backward(enc, pred, weight, bias, tg)
        if any(ctx.needs_input_grad[:4]):
            # edge occupancies, as rnnt_forward_backward_reference forms them
            t, u, node, has_edges = lattice_masks(T_n, U_n, T, U1)
            possible = (log_p > NEG_INF)[:, None, None]
            lp_ = log_p[:, None, None]
            wb = torch.where(has_edges, pad_frame(lp_blank), NEG_INF)[:, :T]
            we = torch.where(has_edges & (u < U_n[:, None, None]), pad_frame(lp_emit), NEG_INF)[:, :T]
            beta_emit = beta[:, 1:] if rnnt_type == "rna" else beta[:, :T]
            beta_emit = torch.nn.functional.pad(beta_emit[..., 1:], (0, 1), value=NEG_INF)
            occ_b = torch.where(possible, torch.exp(alpha[:, :T] + wb + beta[:, 1:] - lp_), 0.0)
            occ_e = torch.where(possible, torch.exp(alpha[:, :T] + we + beta_emit - lp_), 0.0)
            nan = torch.isnan(lp_) & has_edges[:, :T]
            occ_b = torch.where(nan, float("nan"), occ_b)
            occ_e = torch.where(nan & (u < U_n[:, None, None])[:, :T], float("nan"), occ_e)
            ctx.state = (lse, occ_b, occ_e, has_edges[:, :T])
        ctx.args = (opts, net, cd)
        out_dtype = torch.float64 if enc.dtype == torch.float64 else torch.float32
        return loss.to(out_dtype)

    @staticmethod
    def backward(ctx, grad_loss):
        enc, pred, weight, bias, tg = ctx.saved_tensors
        lse, occ_b, occ_e, has_edges = ctx.state
        opts, net, cd = ctx.args
        blank, clamp = opts.blank, opts.clamp
        N, T, H = enc.shape
        U1 = pred.shape[1]
        V = weight.shape[0]
        leaves = [x.detach().to(cd).requires_grad_() for x in (enc, pred, weight)]
        leaves.append(None if bias is None else bias.detach().to(cd).requires_grad_())
        e, p, w, b = leaves
        g = grad_loss.to(cd)[:, None, None, None]
        scale = opts.label_scale
        step = _chunk_frames(N, U1, V, H)
        with torch.enable_grad():
            for t0 in range(0, T, step):
                t1 = min(T, t0 + step)
                h = joint_hidden(e[:, t0:t1], p, t0, T, net.activation, net.dropout, net.seed)
                # cells a sample does not read take no part (their scores are never formed by the kernels)
                h = torch.where(has_edges[:, t0:t1, :, None], h, 0.0)
                x = torch.nn.functional.linear(h, w, b)
                ob = occ_b[:, t0:t1, :, None].to(cd)
                oe = occ_e[:, t0:t1, :, None].to(cd) * scale
                dx = torch.exp(x.detach() - lse[:, t0:t1, :, None]) * (ob + oe)
                dx[..., blank : blank + 1] -= ob
                idx = tg[:, None, :, None].expand(N, t1 - t0, U1 - 1, 1)
                dx[:, :, :-1].scatter_add_(3, idx, -oe[:, :, :-1])
                if clamp > 0:
                    dx = dx.clamp(-clamp, clamp)
                dx = torch.where(has_edges[:, t0:t1, :, None], g * dx, 0.0)
                x.backward(dx)
        grads = [
            None if x is None else (torch.zeros_like(x) if x.grad is None else x.grad).to(y.dtype)
            for x, y in zip(leaves, (enc, pred, weight, bias), strict=True)
        ]
        return (*grads,) + (None,) * 6
