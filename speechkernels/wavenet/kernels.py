"""WaveNet-inference kernels in Triton.

``_serial_chain_stream_kernel``: the proxy with one program per stream. Each program keeps its vector in
registers and streams the L weight matrices from L2, one per layer, the next layer's tile loaded before this
layer's product is reduced (so the load overlaps the arithmetic); no barrier between programs. Its floor for one
stream is the weights' bytes per sample over one SM's share of L2 bandwidth (benchmarks/NOTES.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._utils import next_power_of_2


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


def serial_chain_stream(weights: torch.Tensor, x0: torch.Tensor, n_samples: int, relu: bool) -> torch.Tensor:
    """Launcher: one program per stream ([B, H] float32 out)."""
    L, H, _ = weights.shape
    B = x0.shape[0]
    w = weights.contiguous()
    out = torch.empty(B, H, dtype=torch.float32, device=x0.device)
    block = max(16, next_power_of_2(H))
    _serial_chain_stream_kernel[(B,)](
        w, x0, out, L, H, n_samples, x0.stride(0), RELU=relu, BLOCK_H=block, num_warps=_stream_warps(block)
    )
    return out
