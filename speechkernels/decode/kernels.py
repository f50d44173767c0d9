"""Triton kernels of greedy CTC decoding: two launches, no PyTorch operation between them.

``_ctc_best_kernel`` (a block of frames of one sample per program): each frame's most likely class and its score,
reading the scores once in blocks of classes: the full blocks unmasked along the classes, then the classes past
them in one block of their own (power-of-two) width, so that C = 1025 reads 1024 + 1 lanes a frame, not 2048. Per
block, each frame's maximum with NaNs propagated and the first class holding it or a NaN (-0.0 equals +0.0); a
later block takes over only with a larger value or a NaN over a number: the first maximum, a NaN counting as the
largest and its first index winning (``torch.argmax``'s rules), the value itself kept as the score. float32
comparisons and int32 minima (one int64 key a value, the kernel before, took twice the time:
benchmarks/notes/decode.md); with ``LOGITS`` the running log-sum-exp, so that the score is the log_softmax value.
Frames at and past the sample's length are neither read nor written. It writes a scratch [N, 2, T] int32: each
sample's classes (row 0) and scores (row 1, float32 bits), 8 bytes a frame.

``_ctc_compact_kernel`` (one sample per program): the merge of runs and the compaction, over the sample's live
frames in blocks of ``BLOCK_T``: a frame emits where its class is not the blank and differs from the previous
frame's (read shifted by one from the scratch, so a run that crosses a block boundary needs no carried label);
an emitting frame's slot is the count of the blocks before plus an inclusive ``tl.cumsum`` of the block's emits,
minus one. Then the tails past each hypothesis are filled (-1, -1, 0), so that every output element is written
once by the kernel.

Memory traffic: the scores [N, T, C] read once (the floor: N T C elements of their dtype); the scratch written
once (8 bytes a live frame) and read once more (its classes twice, the shifted read from cache; a score only where
a token is emitted); the outputs written once (20 bytes a frame, 8 a sample). [N, T] traffic is about 1/C of the
scores'; past the scores' read, the cost is the second launch's latency.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launch import cdiv, launch, next_power_of_2, split_blocks
from .._outputs import kernel_output

COMPACT_BLOCK_T = 1024  # frames per step of the compaction (a power of two; tests lower it to cross blocks)
# the argmax's tiles: classes per block (a power of two; tests lower it to cross blocks), frames per program (at
# most, and at most elements // classes), warps
CTC_TILES = {"block_c": 1024, "block_t": 64, "elements": 2048, "warps": 4}


@triton.jit
def _nan_max(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _block_best(b_x, o_c):
    """Each row's maximum (a NaN if the row holds one) and the first class where it is (or the first NaN)."""
    m = tl.reduce(b_x, 1, _nan_max)
    hit = (b_x == m[:, None]) | (b_x != b_x)  # -0.0 == +0.0: the first of the two
    return m, tl.min(tl.where(hit, o_c[None, :], 2147483647), 1)


@triton.jit
def _ctc_best_block(b_x, o_c, best, cls, run_max, run_sum, LOGITS: tl.constexpr):
    """The running best (value, class) and, with LOGITS, the running log-sum-exp, after a block of classes: a
    later block wins only with a larger value, or a NaN over a number."""
    m, i = _block_best(b_x, o_c)
    take = (m > best) | ((m != m) & (best == best))
    best = tl.where(take, m, best)
    cls = tl.where(take, i, cls)
    if LOGITS:
        b_v = tl.where(b_x != b_x, float("-inf"), b_x)
        new_max = tl.maximum(run_max, tl.max(b_v, 1))
        safe = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - safe) + tl.sum(tl.exp(b_v - safe[:, None]), 1)
        run_max = new_max
    return best, cls, run_max, run_sum


@triton.jit
def _ctc_best_kernel(x_ptr, len_ptr, work_ptr, T, C, C_FULL, n_t_blocks, LOGITS: tl.constexpr,
                     BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, REM: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    n = pid // n_t_blocks
    o_t = (pid % n_t_blocks) * BLOCK_T + tl.arange(0, BLOCK_T)
    L = tl.minimum(tl.maximum(tl.load(len_ptr + n).to(tl.int32), 0), T)
    live = o_t < L
    p_row = x_ptr + (n.to(tl.int64) * T + o_t) * C
    best = tl.full((BLOCK_T,), float("-inf"), tl.float32)
    cls = tl.zeros((BLOCK_T,), tl.int32)
    run_max = tl.full((BLOCK_T,), float("-inf"), tl.float32)  # with LOGITS: of the non-NaN values
    run_sum = tl.zeros((BLOCK_T,), tl.float32)  # of exp(x - run_max), with LOGITS
    for c0 in range(0, C_FULL, BLOCK_C):  # the full blocks of classes, unmasked along the classes
        o_c = c0 + tl.arange(0, BLOCK_C)
        b_x = tl.load(p_row[:, None] + o_c[None, :], mask=live[:, None], other=float("-inf")).to(tl.float32)
        best, cls, run_max, run_sum = _ctc_best_block(b_x, o_c, best, cls, run_max, run_sum, LOGITS)
    if REM > 0:  # the classes past them, in a block of their own width
        o_c = C_FULL + tl.arange(0, REM)
        mask = live[:, None] & (o_c < C)[None, :]
        b_x = tl.load(p_row[:, None] + o_c[None, :], mask=mask, other=float("-inf")).to(tl.float32)
        best, cls, run_max, run_sum = _ctc_best_block(b_x, o_c, best, cls, run_max, run_sum, LOGITS)
    score = best
    if LOGITS:
        safe = tl.where(run_max == float("-inf"), 0.0, run_max)
        score = score - (safe + tl.log(run_sum))
    p_work = work_ptr + n.to(tl.int64) * (2 * T) + o_t
    tl.store(p_work, cls, mask=live)
    tl.store(p_work + T, score.to(tl.int32, bitcast=True), mask=live)


@triton.jit
def _ctc_compact_kernel(work_ptr, len_ptr, tokens_ptr, frames_ptr, scores_ptr, n_out_ptr, T, blank,
                        BLOCK_T: tl.constexpr):  # fmt: skip
    n = tl.program_id(0)
    L = tl.minimum(tl.maximum(tl.load(len_ptr + n).to(tl.int32), 0), T)
    p_best = work_ptr + n.to(tl.int64) * (2 * T)
    row = n.to(tl.int64) * T
    count = tl.zeros((), tl.int32)  # tokens of the blocks before
    for t0 in range(0, L, BLOCK_T):
        o_t = t0 + tl.arange(0, BLOCK_T)
        m_t = o_t < L
        b_best = tl.load(p_best + o_t, mask=m_t, other=blank)
        # the previous frame's class, blank or not (a blank between two equal labels makes two tokens)
        b_prev = tl.load(p_best + o_t - 1, mask=m_t & (o_t > 0), other=-1)
        emit = (b_best != blank) & (b_best != b_prev)
        e = emit.to(tl.int32)
        o_s = row + (count + tl.cumsum(e, 0) - 1)
        b_score = tl.load(p_best + T + o_t, mask=emit, other=0).to(tl.float32, bitcast=True)
        tl.store(tokens_ptr + o_s, b_best.to(tl.int64), mask=emit)
        tl.store(frames_ptr + o_s, o_t.to(tl.int64), mask=emit)
        tl.store(scores_ptr + o_s, b_score, mask=emit)
        count += tl.sum(e, 0)
    tl.store(n_out_ptr + n, count.to(tl.int64))
    for t0 in range((count // BLOCK_T) * BLOCK_T, T, BLOCK_T):  # the padding past the hypothesis
        o_t = t0 + tl.arange(0, BLOCK_T)
        m_t = (o_t >= count) & (o_t < T)
        tl.store(tokens_ptr + row + o_t, tl.full((BLOCK_T,), -1, tl.int64), mask=m_t)
        tl.store(frames_ptr + row + o_t, tl.full((BLOCK_T,), -1, tl.int64), mask=m_t)
        tl.store(scores_ptr + row + o_t, tl.zeros((BLOCK_T,), tl.float32), mask=m_t)


def ctc_greedy(
    x: torch.Tensor, lengths: torch.Tensor, blank: int, logits: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy CTC decoding of x [N, T, C] (contiguous, N, T > 0) with ``lengths`` [N] (contiguous, clamped to
    [0, T] here): (tokens [N, T] int64 -1 past, lengths [N] int64, frames [N, T] int64 -1 past, scores [N, T]
    float32 0 past), the semantics of ``reference.ctc_greedy_decode_reference``. Two launches and five
    allocations, no other operation and no host synchronisation."""
    N, T, C = x.shape
    dev = x.device
    work = kernel_output(N, 2, T, dtype=torch.int32, device=dev)  # classes, then scores' bits, of each sample
    BLOCK_C = min(next_power_of_2(C), CTC_TILES["block_c"])
    n_full, rem = split_blocks(C, BLOCK_C)
    BLOCK_T = max(1, min(CTC_TILES["block_t"], CTC_TILES["elements"] // BLOCK_C))
    n_t_blocks = cdiv(T, BLOCK_T)
    launch(_ctc_best_kernel)[(N * n_t_blocks,)](
        x,
        lengths,
        work,
        T,
        C,
        n_full * BLOCK_C,
        n_t_blocks,
        LOGITS=logits,
        BLOCK_T=BLOCK_T,
        BLOCK_C=BLOCK_C,
        REM=rem,
        num_warps=CTC_TILES["warps"],
    )
    # the outputs allocated after the first launch: the device starts on the scores sooner
    tokens = kernel_output(N, T, dtype=torch.int64, device=dev)
    frames = kernel_output(N, T, dtype=torch.int64, device=dev)
    scores = kernel_output(N, T, dtype=torch.float32, device=dev)
    n_out = kernel_output(N, dtype=torch.int64, device=dev)
    block = min(COMPACT_BLOCK_T, max(16, next_power_of_2(T)))
    launch(_ctc_compact_kernel)[(N,)](work, lengths, tokens, frames, scores, n_out, T, blank, BLOCK_T=block)
    return tokens, n_out, frames, scores
