"""Triton kernels of greedy decoding.

``_ctc_best_kernel`` (a block of frames of one sample per program): each frame's most likely class and its score,
reading the scores once in blocks of classes: the running maximum and its first index (a NaN counts as the largest,
its first index wins, as ``torch.argmax``), and with ``LOGITS`` the running log-sum-exp, so that the score is the
log_softmax value. Frames at and past the sample's length are not read. The merge of runs and the compaction are
[N, T] operations in ``api`` (shared with the PyTorch path).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._utils import kernel_output, next_power_of_2


@triton.jit
def _ctc_best_kernel(x_ptr, len_ptr, best_ptr, score_ptr, T, C, n_t_blocks,
                     LOGITS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    n = pid // n_t_blocks
    o_t = (pid % n_t_blocks) * BLOCK_T + tl.arange(0, BLOCK_T)
    L = tl.minimum(tl.maximum(tl.load(len_ptr + n).to(tl.int32), 0), T)
    live = o_t < L
    p_row = x_ptr + (n.to(tl.int64) * T + o_t) * C
    run_max = tl.full((BLOCK_T,), float("-inf"), tl.float32)
    run_idx = tl.zeros((BLOCK_T,), tl.int32)
    nan_idx = tl.zeros((BLOCK_T,), tl.int32) + C  # the first NaN's class, C if none
    run_sum = tl.zeros((BLOCK_T,), tl.float32)  # of exp(x - run_max), with LOGITS
    for c0 in range(0, C, BLOCK_C):
        o_c = c0 + tl.arange(0, BLOCK_C)
        mask = live[:, None] & (o_c < C)[None, :]
        b_x = tl.load(p_row[:, None] + o_c[None, :], mask=mask, other=float("-inf")).to(tl.float32)
        is_nan = b_x != b_x
        nan_idx = tl.minimum(nan_idx, tl.min(tl.where(is_nan, o_c[None, :], C), 1))
        b_v = tl.where(is_nan, float("-inf"), b_x)
        b_max = tl.max(b_v, 1)
        b_idx = tl.min(tl.where((b_v == b_max[:, None]) & mask, o_c[None, :], C), 1)
        take = b_max > run_max
        if LOGITS:
            new_max = tl.maximum(run_max, b_max)
            safe = tl.where(new_max == float("-inf"), 0.0, new_max)
            run_sum = run_sum * tl.exp(run_max - safe) + tl.sum(tl.exp(b_v - safe[:, None]), 1)
        run_idx = tl.where(take, b_idx, run_idx)
        run_max = tl.where(take, b_max, run_max)
    best = tl.where(nan_idx < C, nan_idx, run_idx)
    score = tl.load(p_row + best, mask=live, other=0.0).to(tl.float32)
    if LOGITS:
        safe = tl.where(run_max == float("-inf"), 0.0, run_max)
        score = score - (safe + tl.log(run_sum))
    o = n.to(tl.int64) * T + o_t
    tl.store(best_ptr + o, best.to(tl.int64), mask=o_t < T)
    tl.store(score_ptr + o, score, mask=o_t < T)


def ctc_best(x: torch.Tensor, lengths: torch.Tensor, logits: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(best [N, T] int64, score [N, T] float32) of x [N, T, C] (contiguous): each frame's most likely class and
    its score (its log_softmax value with ``logits``); frames past ``lengths`` hold anything."""
    N, T, C = x.shape
    best = kernel_output((N, T), dtype=torch.int64, device=x.device)
    score = kernel_output((N, T), dtype=torch.float32, device=x.device)
    BLOCK_C = min(next_power_of_2(C), 1024)
    BLOCK_T = max(1, min(16, 4096 // BLOCK_C))
    n_t_blocks = triton.cdiv(T, BLOCK_T)
    _ctc_best_kernel[(N * n_t_blocks,)](x, lengths, best, score, T, C, n_t_blocks, LOGITS=logits, BLOCK_T=BLOCK_T,
                                        BLOCK_C=BLOCK_C)  # fmt: skip
    return best, score
