"""Triton helpers of the transducer lattices (a cell (n, t, u) per frame and label position, the scores of its V
classes), shared by the RNN-T, TDT and multi-blank kernels and the fused joint's, and the validation kernel of
every transducer loss: ``_validate_kernel`` (one program over the batch): lengths and labels checked against
the tensors, one flag read back."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launch import launch, next_power_of_2, prev_power_of_2, split_blocks
from .._logspace import ln2, log2e, lse_step, lse_step_rows, lse_total, neg
from .._outputs import kernel_output


@triton.jit
def sample_lengths(il_ptr, tl_ptr, n, mask, T, U1):
    """Sample n's frames and labels (int32), clamped to the tensor (unchecked input cannot index out of bounds)."""
    T_n = tl.minimum(tl.maximum(tl.load(il_ptr + n, mask=mask, other=0), 0), T).to(tl.int32)
    U_n = tl.minimum(tl.maximum(tl.load(tl_ptr + n, mask=mask, other=0), 0), U1 - 1).to(tl.int32)
    return T_n, U_n


@triton.jit
def row_cells(il_ptr, tl_ptr, T, U1, BLOCK_R: tl.constexpr):
    """This program's BLOCK_R cells: row (n, t) = program_id(0) (one scalar division), u from program_id(1).
    Returns the cells' indices (n * T + t) * (U + 1) + u, n, t, u, which exist, and sample n's lengths."""
    nt = tl.program_id(0)
    n = nt // T
    t = nt - n * T
    u = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    T_n, U_n = sample_lengths(il_ptr, tl_ptr, n, True, T, U1)
    return nt.to(tl.int64) * U1 + u, n.to(tl.int64), t.to(tl.int64), u, u < U1, T_n, U_n


@triton.jit
def grad_cells(il_ptr, tl_ptr, logp_ptr, gloss_ptr, gloss_stride, gscale, T, U1, BLOCK_R: tl.constexpr):
    """A gradient pass's cells (``row_cells``), then the sample's log2 p, which cells take part (those with
    edges, of a sample with a path), which have a label edge, and the sample's upstream gradient times gscale:
    NaN for a NaN loss ((logp - logp) is NaN), so that the gradient of every score the sample reads is NaN."""
    o_r, n, t, u, in_range, T_n, U_n = row_cells(il_ptr, tl_ptr, T, U1, BLOCK_R)
    logp = tl.load(logp_ptr + n)
    active = tl.where((t < T_n) & (logp != float("-inf")), in_range & (u <= U_n), False)
    has_label = active & (u < U_n)
    g = tl.load(gloss_ptr + n * gloss_stride).to(tl.float32) * gscale
    g = g + tl.where(active, logp - logp, 0.0).to(tl.float32)
    return o_r, n, t, u, in_range, T_n, U_n, logp, active, has_label, g


def cell_blocks(U1: int, V: int, split: bool) -> tuple[int, int]:
    """(cells per program, classes per chunk) of a pass over the cells' scores, up to BLOCK_R cells of one row (n, t)
    a program (from sweeps on an H100, benchmarks/tune_rnnt.py: 256-1024 scores a chunk). ``split`` (the lattice
    passes): the chunk the largest power of two within V, the classes past the full chunks in one of their own
    (``class_blocks``); else (the gradient passes, where the split was slower: 1.34 -> 1.44 ms a call at (4, 1200,
    200, 513), benchmarks/notes/tdt.md) the power of two at or above V, its classes past V masked."""
    block_v = min(prev_power_of_2(V) if split else next_power_of_2(V), 1024)
    return max(1, min(next_power_of_2(U1), 8, 1024 // block_v)), block_v


def class_blocks(V: int, block_v: int) -> tuple[int, int]:
    """(CHUNKS, REM) of a pass over the V scores of a cell in chunks of ``block_v`` (``split_blocks``): the full
    chunks read unmasked along the classes (CHUNKS: 0, 1, or 2 for more than one), then the classes past them in one
    chunk of width REM (0: none)."""
    full, rem = split_blocks(V, block_v)
    return min(full, 2), rem


@triton.jit
def score_grad_chunks(p_x, p_g, lse, in_range, active, lab, occ_all, occ_blank, occ_label, g, V, blank, clamp,
                      stride_v, gstride_v, skip_lo, skip_hi, FUSED: tl.constexpr, CLAMP: tl.constexpr,
                      SKIP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """The gradient of the V scores of BLOCK_R cells (p_x, into p_g), chunk by chunk, every chunk masked along the
    classes (``_grad_blocks``; the classes past the full chunks in a chunk of their own, as the lattice passes read
    them, made the TDT gradient 11% slower at (4, 1200, 200, 513 + 9): benchmarks/notes/tdt.md): g * (softmax *
    occ_all (FUSED) - occ_blank at the blank - occ_label at the label), clamped first (CLAMP), as torchaudio
    documents; with SKIP, the columns [skip_lo, skip_hi) are left for the caller."""
    o_v = tl.arange(0, BLOCK_V)
    for v0 in range(0, V, BLOCK_V):
        v = v0 + o_v
        m = in_range[:, None] & (v < V)[None, :]
        if SKIP:
            m = m & ((v < skip_lo) | (v >= skip_hi))[None, :]
        b_g = tl.zeros([BLOCK_R, BLOCK_V], tl.float32)
        if FUSED:
            b_x = tl.load(p_x[:, None] + v[None, :] * stride_v, mask=m & active[:, None], other=0.0).to(tl.float32)
            b_g = tl.exp2((b_x - lse[:, None]) * log2e()) * occ_all[:, None]
        b_g -= tl.where(v[None, :] == blank, occ_blank[:, None], 0.0)
        b_g -= tl.where(v[None, :] == lab[:, None], occ_label[:, None], 0.0)
        if CLAMP:
            b_g = tl.minimum(tl.maximum(b_g, -clamp), clamp)
        if FUSED:  # every score of a cell is read (its log-sum-exp)
            b_g = tl.where(active[:, None], g[:, None] * b_g, 0.0)
        else:  # only the blank and the next label are: a NaN loss leaves the other scores' zero gradient alone
            read = (v[None, :] == blank) | (v[None, :] == lab[:, None])
            b_g = tl.where(active[:, None] & read, g[:, None] * b_g, 0.0)
        tl.store(p_g[:, None] + v[None, :] * gstride_v, b_g.to(p_g.dtype.element_ty), mask=m)


@triton.jit
def cell_offsets(n, t, u, T, U1, RNA: tl.constexpr):
    """Offsets of cells (n, t, u) in the [N, T, U+1, 2] lattice: RNN-T's rows are skewed (see _lat_row). The
    row in 32 bits (a 64-bit remainder costs a hundred instructions)."""
    if RNA:
        row = t.to(tl.int32)
    else:
        row = (t.to(tl.int32) + u) % T
    return ((n * T + row) * U1 + u) * 2


@triton.jit
def row_lse(p_x, m_r, stride_v, V, CHUNKS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
            REM: tl.constexpr):  # fmt: skip
    """Natural-log log-sum-exp of the V scores of each of BLOCK_R cells (p_x: their first scores; 0 where m_r
    is False), in chunks (``class_blocks``)."""
    o_v = tl.arange(0, BLOCK_V)
    lse = tl.full([BLOCK_R], float("-inf"), tl.float32)
    if CHUNKS == 1:  # one exponential per score
        b_x = tl.load(p_x[:, None] + o_v[None, :] * stride_v, mask=m_r[:, None], other=float("-inf"))
        lse = lse_total(b_x.to(tl.float32) * log2e(), 1.0, 1)
    elif CHUNKS == 2:  # online over the full chunks
        b_m = tl.full([BLOCK_R, BLOCK_V], float("-inf"), tl.float32)
        b_s = tl.zeros([BLOCK_R, BLOCK_V], tl.float32)
        for v0 in range(0, V // BLOCK_V * BLOCK_V, BLOCK_V):
            b_x = tl.load(p_x[:, None] + (v0 + o_v)[None, :] * stride_v, mask=m_r[:, None], other=float("-inf"))
            b_m, b_s = lse_step(b_m, b_s, b_x.to(tl.float32) * log2e())
        lse = lse_total(b_m, b_s, 1)
    if REM > 0:  # the classes past the full chunks
        o_q = tl.arange(0, REM)
        if CHUNKS > 0:
            o_q += V // BLOCK_V * BLOCK_V
        b_x = tl.load(p_x[:, None] + o_q[None, :] * stride_v, mask=m_r[:, None] & (o_q < V)[None, :],
                      other=float("-inf")).to(tl.float32) * log2e()  # fmt: skip
        if CHUNKS == 0:  # one exponential per score
            lse = lse_total(b_x, 1.0, 1)
        else:  # the full chunks' total as one more lane
            r_m, r_s = lse_step_rows(lse, tl.full([BLOCK_R], 1.0, tl.float32), b_x)
            lse = r_m + tl.log2(r_s)
    return tl.where(m_r, lse * ln2(), 0.0)


@triton.jit
def cell_scores(o_r, n, t, u, m_r, T_n, U_n, x_ptr, lse_ptr, tgt_ptr, V, stride_n, stride_t, stride_u, stride_v,
                stride_tg, blank, FUSED: tl.constexpr, STORE_LSE: tl.constexpr, CHUNKS: tl.constexpr,
                BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, REM: tl.constexpr):  # fmt: skip
    """For a lattice pass's cells (``row_cells``): which are read (m_r: those with edges, t < T_n and u <= U_n),
    their scores' pointers, the natural-log log-sum-exp of their V scores (FUSED, else 0; stored with STORE_LSE),
    and the log2 probabilities of the blank and of the next label (neg() where there is none)."""
    # (a block mask and a scalar condition combine through where: the interpreter rejects block & scalar)
    m_r = tl.where(t < T_n, m_r & (u <= U_n), False)
    p_x = x_ptr + n * stride_n + t * stride_t + u.to(tl.int64) * stride_u
    lse = tl.zeros([BLOCK_R], tl.float32)
    if FUSED:
        lse = row_lse(p_x, m_r, stride_v, V, CHUNKS, BLOCK_R, BLOCK_V, REM)
        if STORE_LSE:
            tl.store(lse_ptr + o_r, lse, mask=m_r)
    x_blank = tl.load(p_x + blank * stride_v, mask=m_r, other=0.0).to(tl.float32)
    has_label = m_r & (u < U_n)
    lab = tl.load(tgt_ptr + n * stride_tg + u, mask=has_label, other=0).to(tl.int64)
    lab = tl.minimum(tl.maximum(lab, 0), V - 1)
    x_label = tl.load(p_x + lab * stride_v, mask=has_label, other=0.0).to(tl.float32)
    lp_y = tl.where(has_label, (x_label - lse) * log2e(), neg())
    return m_r, p_x, lse, (x_blank - lse) * log2e(), lp_y


@triton.jit
def _validate_kernel(
    tgt_ptr,  # [N, U] labels
    il_ptr,  # [N] int32/int64
    tl_ptr,  # [N] int32/int64
    flag_ptr,  # [1 + N] int32 out: nonzero if any sample's bits are, then each sample's bits (``rnnt_validate``)
    N, T, U, V, stride_tg, blank,
    BLOCK_N: tl.constexpr, BLOCK_J: tl.constexpr,
):  # fmt: skip
    """One program over the whole batch, so that one value is read back (no reduction launch); each sample's bits
    beside it, read only on error, name the sample."""
    o_n = tl.arange(0, BLOCK_N)
    o_j = tl.arange(0, BLOCK_J)
    bits = tl.zeros([BLOCK_N], tl.int32)
    for n0 in range(0, N, BLOCK_N):
        n = n0 + o_n
        m_n = n < N
        T_n = tl.load(il_ptr + n, mask=m_n, other=0)
        U_n = tl.load(tl_ptr + n, mask=m_n, other=0)
        b_n = tl.where(m_n & ((T_n < 0) | (T_n > T)), 1, 0) | tl.where(m_n & ((U_n < 0) | (U_n > U)), 2, 0)
        U_c = tl.minimum(tl.maximum(U_n, 0), U)
        for j0 in range(0, U, BLOCK_J):
            j = j0 + o_j
            m = m_n[:, None] & (j[None, :] < U_c[:, None])
            lab = tl.load(tgt_ptr + n[:, None].to(tl.int64) * stride_tg + j[None, :], mask=m, other=0).to(tl.int64)
            # one bit each: the max is their OR
            b_n |= tl.max(tl.where(m & ((lab < 0) | (lab >= V)), 4, 0), axis=1)
            b_n |= tl.max(tl.where(m & (lab == blank), 8, 0), axis=1)
        tl.store(flag_ptr + 1 + n, b_n, mask=m_n)
        bits |= b_n
    tl.store(flag_ptr, tl.max(bits, axis=0))  # nonzero if any sample's is


def validate_lengths_and_labels(
    targets: torch.Tensor, logit_lengths: torch.Tensor, target_lengths: torch.Tensor, T: int, V: int, blank: int
) -> list[int] | None:
    """None when every length and label is valid, else each sample's error bits (1 its frames,
    2 its label count, 4 a label outside [0, V), 8 a label equal to the blank); checked on the device with one
    value read back (a synchronisation), the samples' bits read only on error."""
    N, U = targets.shape
    flag = kernel_output(1 + N, dtype=torch.int32, device=targets.device)
    block_n, block_j = _validate_blocks(N, U)
    launch(_validate_kernel)[(1,)](
        targets,
        logit_lengths,
        target_lengths,
        flag,
        N,
        T,
        U,
        V,
        targets.stride(0),
        blank,
        BLOCK_N=block_n,
        BLOCK_J=block_j,
        num_warps=4,
    )
    if flag[0].item() == 0:
        return None
    return flag[1:].tolist()


def _validate_blocks(N: int, U: int) -> tuple[int, int]:
    """(samples, labels) per tile of the validation kernel's loops."""
    block_j = max(16, min(next_power_of_2(max(U, 1)), 1024))
    return max(1, min(next_power_of_2(N), 1024 // block_j)), block_j


def grad_kernel_args(
    x: torch.Tensor,
    grad: torch.Tensor,
    state: tuple[torch.Tensor, ...],
    grad_out: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    reduction: str,
) -> tuple:
    """The leading arguments of a gradient kernel over ``grad_cells``: the scores x ([N, T, U+1, ...]) and their
    gradient, the forward's state (log-sum-exps, occupancies, log2 p), the upstream gradient with its stride (0:
    one value for the batch) and scale (1 / N for a batch mean), the targets and lengths, then T and U + 1."""
    N, T, U1 = x.shape[:3]
    lse, occ, logp = state
    gstride = grad_out.stride(0) if reduction == "none" else 0
    gscale = 1.0 / N if reduction == "mean" else 1.0
    return x, grad, lse, occ, logp, grad_out, gstride, gscale, targets, logit_lengths, target_lengths, T, U1


def lattice_buffers(N: int, T: int, U1: int, device, with_lse: bool) -> tuple[torch.Tensor, ...]:
    """The lattice kernels' outputs: per-cell natural-log log-sum-exps ([N * T * (U+1)] float32, empty without
    ``with_lse``), the log2 lattice ([N * T * (U+1), 2] float32) and ``aux`` ([1 + 2N] int32: the reduction's
    counter, then the halves' NaN counts)."""
    n_cells = N * T * U1
    lse = kernel_output(n_cells if with_lse else 0, dtype=torch.float32, device=device)
    lat = kernel_output(2 * n_cells, dtype=torch.float32, device=device)
    return lse, lat, kernel_output(1 + 2 * N, dtype=torch.int32, device=device)
