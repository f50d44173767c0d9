"""The serial-chain proxy's Triton designs ("stream" and "barrier"); measurements: benchmarks/notes/wavenet.md.

``_serial_chain_stream_kernel``: one program per stream. Each program keeps its vector in registers and streams
the L weight matrices from L2, one per layer, the next layer's tile loaded before this layer's product is
reduced; no barrier between programs. Bound by one SM's L2 read rate.

``_serial_chain_barrier_kernel``: the post's design (rows split across programs, a grid barrier per layer
through a global atomic counter): every layer's vector makes a round trip through L2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._backend import triton_interpreting
from ..._launch import cdiv, next_power_of_2


@triton.jit
def _serial_chain_stream_kernel(
    w_ptr,  # [L, H, H] float32/bfloat16, contiguous
    x_ptr,  # [B, H] start vectors
    out_ptr,  # [B, H] float32 out: the last vector
    L,
    H,
    n_samples,
    stride_xb,
    RELU: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    i_b = tl.program_id(0).to(tl.int64)
    o_r = tl.arange(0, BLOCK_H)
    o_c = tl.arange(0, BLOCK_H)
    m_r = o_r < H
    m_c = o_c < H
    m_w = m_r[:, None] & m_c[None, :]
    # padded entries stay 0 through every layer (0 weights, act(0) = 0)
    x = tl.load(x_ptr + i_b * stride_xb + o_c, mask=m_c, other=0.0).to(tl.float32)
    # 32-bit offsets within a layer (a tile of 64-bit pointers kept across the loop would double the registers)
    o_w = o_r[:, None] * H + o_c[None, :]
    b_w = tl.load(w_ptr + o_w, mask=m_w, other=0.0).to(tl.float32)
    for k in range(0, n_samples * L):
        # the next layer's matrix (the first again after the last: the next sample) before this product
        i_next = (k + 1) % L
        b_w_next = tl.load(w_ptr + i_next * H * H + o_w, mask=m_w, other=0.0).to(tl.float32)
        y = tl.sum(b_w * x[None, :], axis=1)
        if RELU:
            y = tl.maximum(y, 0.0)
        else:
            y = 2.0 * tl.sigmoid(2.0 * y) - 1.0  # tanh
        x = y
        b_w = b_w_next
    tl.store(out_ptr + i_b * H + o_r, x, mask=m_r)


def _stream_warps(block: int) -> int:
    """Warps for a [block, block] weight tile and its prefetched successor held in registers: 16 values per
    thread each (compiled for sm_90 with Triton 3.6: 64 registers and a small spill at H = 128 with 32 warps, 255
    registers and 0.9 KB of spills with 8; not yet timed)."""
    return max(1, min(32, block * block // 512))


def serial_chain_stream(
    weights: torch.Tensor, x0: torch.Tensor, n_samples: int, relu: bool, num_warps: int | None = None
) -> torch.Tensor:
    """Launcher: one program per stream ([B, H] float32 out)."""
    L, H, _ = weights.shape
    B = x0.shape[0]
    w = weights.contiguous()
    out = torch.empty(B, H, dtype=torch.float32, device=x0.device)
    block = max(16, next_power_of_2(H))
    _serial_chain_stream_kernel[(B,)](
        w, x0, out, L, H, n_samples, x0.stride(0), RELU=relu, BLOCK_H=block, num_warps=num_warps or _stream_warps(block)
    )
    return out


@triton.jit
def _serial_chain_barrier_kernel(
    w_ptr,  # [L, H, H] float32/bfloat16, contiguous
    xbuf_ptr,  # [2, B, H] float32: the vectors of even and odd layers (xbuf[0] holds the start vectors)
    count_ptr,  # [1] int32 zero: the grid barrier's counter
    L,
    H,
    B,
    n_steps,  # n_samples * L
    RELU: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    """The post's design: program p computes rows [p BLOCK_R, (p+1) BLOCK_R) of every layer for all streams,
    the next layer's rows of weights loaded before the grid barrier (a global atomic counter) that ends each
    layer. Needs every program resident at once (grid <= SMs); under the interpreter, one program."""
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    o_r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    o_c = tl.arange(0, BLOCK_H)
    m_r = o_r < H
    m_c = o_c < H
    m_w = m_r[:, None] & m_c[None, :]
    o_w = o_r[:, None] * H + o_c[None, :]
    b_w = tl.load(w_ptr + o_w, mask=m_w, other=0.0)
    for k in range(0, n_steps):
        b_w_next = tl.load(w_ptr + ((k + 1) % L) * H * H + o_w, mask=m_w, other=0.0)
        p_src = xbuf_ptr + (k % 2) * B * H
        p_dst = xbuf_ptr + ((k + 1) % 2) * B * H
        for b0 in range(0, B, BLOCK_B):
            o_b = b0 + tl.arange(0, BLOCK_B)
            m_b = o_b < B
            # [BLOCK_H, BLOCK_B] inputs, read past L1 (other SMs wrote them)
            x_t = tl.load(p_src + o_b[None, :] * H + o_c[:, None], mask=m_c[:, None] & m_b[None, :], other=0.0,
                          cache_modifier=".cg")  # fmt: skip
            y = tl.dot(b_w.to(tl.float32), x_t, input_precision="ieee")
            if RELU:
                y = tl.maximum(y, 0.0)
            else:
                y = 2.0 * tl.sigmoid(2.0 * y) - 1.0  # tanh
            tl.store(p_dst + o_b[None, :] * H + o_r[:, None], y, mask=m_r[:, None] & m_b[None, :])
        # grid barrier: every program's rows of this layer written before any program reads the next layer
        tl.debug_barrier()
        tl.atomic_add(count_ptr, 1, sem="release")
        target = (k + 1) * n_prog
        while tl.atomic_add(count_ptr, 0, sem="acquire") < target:
            pass
        tl.debug_barrier()
        b_w = b_w_next


def serial_chain_barrier(weights: torch.Tensor, x0: torch.Tensor, n_samples: int, relu: bool) -> torch.Tensor:
    """Launcher of the post's design: H / 16 programs of 16 rows (one program under the interpreter)."""
    L, H, _ = weights.shape
    B = x0.shape[0]
    block_h = max(16, next_power_of_2(H))
    block_r = block_h if triton_interpreting() else 16
    n_prog = cdiv(H, block_r)
    if x0.is_cuda and n_prog > torch.cuda.get_device_properties(x0.device).multi_processor_count:
        raise ValueError(f"design='barrier' needs H / 16 <= SMs programs resident at once, got H={H}")
    xbuf = torch.empty(2, B, H, dtype=torch.float32, device=x0.device)
    xbuf[0] = x0
    count = torch.zeros(1, dtype=torch.int32, device=x0.device)
    block_b = min(64, max(16, next_power_of_2(B)))
    _serial_chain_barrier_kernel[(n_prog,)](
        weights.contiguous(),
        xbuf,
        count,
        L,
        H,
        B,
        n_samples * L,
        RELU=relu,
        BLOCK_R=block_r,
        BLOCK_H=block_h,
        BLOCK_B=block_b,
        num_warps=4,
    )
    return xbuf[(n_samples * L) % 2]
