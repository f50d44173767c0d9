"""WaveNet-inference kernels in Triton: the proxy's "stream" and "barrier" designs and the vocoder's generation
kernel (the fallback of the cluster kernels in ``cluster.py`` and ``cluster_vocoder.py``, and the many-stream
path). Measurements: benchmarks/NOTES.md.

``_serial_chain_stream_kernel``: the proxy with one program per stream. Each program keeps its vector in
registers and streams the L weight matrices from L2, one per layer, the next layer's tile loaded before this
layer's product is reduced; no barrier between programs. Bound by one SM's L2 read rate.

``_serial_chain_barrier_kernel``: the post's design (rows split across programs, a grid barrier per layer).

``_wavenet_generate_kernel``: the vocoder, one program per stream for all samples in one launch: per sample
every layer (dilation queues in global memory), the head and the sampling (inverse CDF of the softmax at a given
uniform, as ``generate_incremental``); conditioning precomputed per frame. It spills (the head's 256x256 tiles
held whole) but keeps its rate over 132 streams.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._utils import next_power_of_2, triton_interpreting

FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32


def inverse_temperature(temperature: float) -> float:
    """The generation kernels' float32 scalar 1 / temperature (0 for temperature 0: greedy), clamped to the largest
    finite float32 (Triton's ``_wavenet_generate_kernel`` and the cluster kernel of ``cluster_vocoder``). Unclamped,
    a temperature below ~3e-39 would make it inf, and (logits - max) * inf NaN at the maximum: every sample class 0.
    Clamped, the maximum's term stays exp(0) = 1 and the others underflow to 0: the most likely class (ties drawn
    among), as the PyTorch path's float64 softmax."""
    return min(1.0 / temperature, FLOAT32_MAX) if temperature > 0 else 0.0


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
    n_prog = triton.cdiv(H, block_r)
    if x0.is_cuda and n_prog > torch.cuda.get_device_properties(x0.device).multi_processor_count:
        raise ValueError(f"design='barrier' needs H / 16 <= SMs programs resident at once, got H={H}")
    xbuf = torch.empty(2, B, H, dtype=torch.float32, device=x0.device)
    xbuf[0] = x0
    count = torch.zeros(1, dtype=torch.int32, device=x0.device)
    block_b = min(64, max(16, next_power_of_2(B)))
    _serial_chain_barrier_kernel[(n_prog,)](
        weights.contiguous(), xbuf, count, L, H, B, n_samples * L,
        RELU=relu, BLOCK_R=block_r, BLOCK_H=block_h, BLOCK_B=block_b, num_warps=4,
    )  # fmt: skip
    return xbuf[(n_samples * L) % 2]


@triton.jit
def _matvec(p_w, o_out, o_in, n_out, n_in, x):
    """W @ x for a row-major [n_out, n_in] matrix at p_w (float32 arithmetic): rows o_out, columns o_in."""
    m = (o_out < n_out)[:, None] & (o_in < n_in)[None, :]
    b_w = tl.load(p_w + o_out[:, None] * n_in + o_in[None, :], mask=m, other=0.0).to(tl.float32)
    return tl.sum(b_w * x[None, :], axis=1)


@triton.jit
def _wavenet_generate_kernel(
    embed_ptr,  # [C, R]
    w_past_ptr,  # [L, G, R]
    w_cur_ptr,  # [L, G, R]
    cbias_ptr,  # [B, F, L, G] float32: conditioning and the current-input bias, per frame
    w_res_ptr,  # [L, R, G/2]
    b_res_ptr,  # [L, R]
    w_skip_ptr,  # [L, S, G/2]
    b_skip_ptr,  # [L, S]
    w_h1_ptr,  # [S, S]
    b_h1_ptr,
    w_h2_ptr,  # [C, S]
    b_h2_ptr,
    dil_ptr,  # [L] int32 dilations
    qoff_ptr,  # [L] int32 offsets of the layers' queues (rows of R) in a stream's queue block
    queue_ptr,  # [B, sum(dilations), R] float32 zeros
    u_ptr,  # [n_samples, B] uniforms
    out_ptr,  # [B, n_samples] int64 out
    B,
    L,
    R,
    G2,
    S,
    C,
    F,
    Q,
    hop,
    n_samples,
    start,
    inv_temp,
    GREEDY: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_G2: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """One program per stream runs all n_samples samples: per sample every layer (dilation queues in global
    memory), the head, and inverse-CDF sampling with the given uniform; weights are read from L2 each sample."""
    i_b = tl.program_id(0).to(tl.int64)
    o_r = tl.arange(0, BLOCK_R)
    o_g = tl.arange(0, BLOCK_G2)
    o_s = tl.arange(0, BLOCK_S)
    o_c = tl.arange(0, BLOCK_C)
    G = 2 * G2
    p_q = queue_ptr + i_b * Q * R
    prev = start
    for t in range(0, n_samples):
        x = tl.load(embed_ptr + prev * R + o_r, mask=o_r < R, other=0.0).to(tl.float32)
        skip = tl.zeros([BLOCK_S], tl.float32)
        p_cb = cbias_ptr + (i_b * F + tl.minimum(t // hop, F - 1)) * L * G
        for i in range(0, L):
            d = tl.load(dil_ptr + i)
            p_slot = p_q + (tl.load(qoff_ptr + i) + t % d) * R
            past = tl.load(p_slot + o_r, mask=o_r < R, other=0.0)
            wp = w_past_ptr + i * G * R
            wc = w_cur_ptr + i * G * R
            # the gate's two halves as separate products (rows 0..G/2-1: tanh, G/2..G-1: sigmoid)
            a_t = _matvec(wp, o_g, o_r, G2, R, past) + _matvec(wc, o_g, o_r, G2, R, x)
            a_s = _matvec(wp + G2 * R, o_g, o_r, G2, R, past) + _matvec(wc + G2 * R, o_g, o_r, G2, R, x)
            a_t += tl.load(p_cb + i * G + o_g, mask=o_g < G2, other=0.0)
            a_s += tl.load(p_cb + i * G + G2 + o_g, mask=o_g < G2, other=0.0)
            z = (2.0 * tl.sigmoid(2.0 * a_t) - 1.0) * tl.sigmoid(a_s)
            tl.debug_barrier()  # every lane has read the slot before it is overwritten
            tl.store(p_slot + o_r, x, mask=o_r < R)
            skip += _matvec(w_skip_ptr + i * S * G2, o_s, o_g, S, G2, z)
            skip += tl.load(b_skip_ptr + i * S + o_s, mask=o_s < S, other=0.0)
            x += _matvec(w_res_ptr + i * R * G2, o_r, o_g, R, G2, z)
            x += tl.load(b_res_ptr + i * R + o_r, mask=o_r < R, other=0.0)
        h = tl.maximum(skip, 0.0)
        h = tl.maximum(_matvec(w_h1_ptr, o_s, o_s, S, S, h) + tl.load(b_h1_ptr + o_s, mask=o_s < S, other=0.0), 0.0)
        logits = _matvec(w_h2_ptr, o_c, o_s, C, S, h) + tl.load(b_h2_ptr + o_c, mask=o_c < C, other=0.0)
        logits = tl.where(o_c < C, logits, float("-inf"))
        if GREEDY:
            top = tl.max(logits, axis=0)
            sample = tl.min(tl.where(logits == top, o_c, BLOCK_C), axis=0)
        else:
            p = tl.exp((logits - tl.max(logits, axis=0)) * inv_temp)
            cdf = tl.cumsum(p, axis=0)
            u = tl.load(u_ptr + t * B + i_b) * tl.sum(p, axis=0)
            # the first class whose cumulative mass exceeds u (as torch.searchsorted on the CDF)
            sample = tl.minimum(tl.sum(tl.where(cdf < u, 1, 0), axis=0), C - 1)
        tl.store(out_ptr + i_b * n_samples + t, sample.to(tl.int64))
        prev = sample


def wavenet_generate(
    model, cond: torch.Tensor | None, g: torch.Tensor | None, uniforms: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Launcher of ``_wavenet_generate_kernel``: one program per stream, all samples in one launch.

    Args:
        model: a WaveNet (its weights are packed per kind of matrix, float32).
        cond: [B, cond_channels, frames] or None; g: [B, speaker_channels] speaker embeddings or None.
        uniforms: [n_samples, B] numbers in [0, 1).

    Returns:
        [B, n_samples] int64 classes.
    """
    n, B = uniforms.shape
    dev = uniforms.device
    L, R, G, S, C = model.layers, model.residual_channels, model.gate_channels, model.skip_channels, model.classes

    from .model import stack_layers as stack

    # conditioning per frame and layer (it changes once per hop), with the current input's bias folded in
    cb = model.frame_bias(cond, g)
    hop = model.hop_length if cond is not None else 1 << 30
    cb = cb.expand(B, cb.shape[1], L, G).contiguous()
    dil, qoff, Q = model.queue_layout(dev)
    queue = torch.zeros(B, Q, R, device=dev)
    out = torch.empty(B, n, dtype=torch.long, device=dev)
    _wavenet_generate_kernel[(B,)](
        model.embed.weight.float().contiguous(), stack(model.w_past), stack(model.w_cur), cb,
        stack(model.w_res), stack(model.w_res, "bias"), stack(model.w_skip), stack(model.w_skip, "bias"),
        model.head1.weight.float().contiguous(), model.head1.bias.float().contiguous(),
        model.head2.weight.float().contiguous(), model.head2.bias.float().contiguous(),
        dil, qoff, queue, uniforms.float().contiguous(), out,
        B, L, R, G // 2, S, C, cb.shape[1], Q, hop, n, model.start_class(),
        inverse_temperature(temperature),
        GREEDY=temperature == 0, BLOCK_R=next_power_of_2(R), BLOCK_G2=next_power_of_2(G // 2),
        BLOCK_S=next_power_of_2(S), BLOCK_C=next_power_of_2(C), num_warps=8,
    )  # fmt: skip
    return out
