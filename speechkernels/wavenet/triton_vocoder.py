"""The vocoder's generation kernel in Triton: the fallback of the cluster kernels (``cluster_vocoder.py``) where
they do not run (no Hopper GPU or no cuda-core). Measurements: benchmarks/notes/wavenet.md.

``_wavenet_generate_kernel``: one program per stream for all samples in one launch: per sample every layer
(dilation queues in global memory), the head and the sampling (inverse CDF of the softmax at a given uniform, as
the PyTorch path in ``incremental.py``); conditioning precomputed per frame. Weights are read from L2 each sample.
It spills (the head's 256x256 tiles held whole) but keeps its rate over 132 streams.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launch import next_power_of_2
from .weights import Continuation, VocoderInputs, VocoderWeights, frame_bias, inverse_temperature, run_start


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
    queue_ptr,  # [rows, sum(dilations), R] float32: the streams' queues (zeros for a new stream)
    u_ptr,  # [n_samples, B] uniforms
    out_ptr,  # [B, n_samples] int64 out
    prev_ptr,  # [B] int64: each stream's input class before its first sample
    phase_ptr,  # [B] int32: each stream's sample index at t = 0 within cond's first frame
    qrow_ptr,  # [B] int32: each stream's row of the queue
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
    tq0,
    inv_temp,
    GREEDY: tl.constexpr,
    CONTINUE: tl.constexpr,
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
    if CONTINUE:  # a chunk of a longer run: the stream's queue row, last class, frame phase and the queues' clock
        p_q = queue_ptr + tl.load(qrow_ptr + i_b).to(tl.int64) * Q * R
        prev = tl.load(prev_ptr + i_b).to(tl.int32)  # the loop carries the sampled class (int32)
        phase = tl.load(phase_ptr + i_b)
        tq = tq0
    else:  # a whole run (measured 1.3x faster compiled this way than through the loads above)
        p_q = queue_ptr + i_b * Q * R
        prev = start
        phase = 0
        tq = 0
    for t in range(0, n_samples):
        x = tl.load(embed_ptr + prev * R + o_r, mask=o_r < R, other=0.0).to(tl.float32)
        skip = tl.zeros([BLOCK_S], tl.float32)
        p_cb = cbias_ptr + (i_b * F + tl.minimum((phase + t) // hop, F - 1)) * L * G
        for i in range(0, L):
            d = tl.load(dil_ptr + i)
            p_slot = p_q + (tl.load(qoff_ptr + i) + (tq + t) % d) * R  # one clock for every queue row
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
    weights: VocoderWeights,
    inputs: VocoderInputs,
    cont: Continuation | None = None,
) -> torch.Tensor:
    """Launcher of ``_wavenet_generate_kernel``: one program per stream, all samples in one launch; the model's
    weights (``weights.vocoder_weights``) and a run's checked inputs. Returns [B, n_samples] int64 classes.
    ``cont`` continues earlier launches (``weights.Continuation``; its queue: ``triton_queue``)."""
    cond, g, uniforms, temperature = inputs
    n, B = uniforms.shape
    dev = uniforms.device
    w = weights
    L, R, G, S, C = w.layers, w.residual_channels, w.gate_channels, w.skip_channels, w.classes
    # conditioning per frame and layer (it changes once per hop), with the current input's bias folded in
    cb = frame_bias(w, cond, g)
    hop = w.hop_length if cond is not None else 1 << 30
    cb = cb.expand(B, cb.shape[1], L, G).contiguous()
    Q = w.queue_slots
    prev, phase, queue, queue_rows, queue_time = run_start(w, B, dev, cont, lambda: triton_queue(w, B, dev))
    out = torch.empty(B, n, dtype=torch.long, device=dev)
    _wavenet_generate_kernel[(B,)](
        w.embed,
        w.w_past,
        w.w_cur,
        cb,
        w.w_res,
        w.b_res,
        w.w_skip,
        w.b_skip,
        w.w_head1,
        w.b_head1,
        w.w_head2,
        w.b_head2,
        w.dilations,
        w.queue_offsets,
        queue,
        uniforms.float().contiguous(),
        out,
        prev,
        phase,
        queue_rows,
        B,
        L,
        R,
        G // 2,
        S,
        C,
        cb.shape[1],
        Q,
        hop,
        n,
        w.start_class,
        queue_time,
        inverse_temperature(temperature),
        GREEDY=temperature == 0,
        CONTINUE=cont is not None,
        BLOCK_R=next_power_of_2(R),
        BLOCK_G2=next_power_of_2(G // 2),
        BLOCK_S=next_power_of_2(S),
        BLOCK_C=next_power_of_2(C),
        num_warps=8,
    )
    return out


def triton_queue(weights: VocoderWeights, rows: int, device) -> torch.Tensor:
    """Zeroed dilation queues of ``_wavenet_generate_kernel``, ``rows`` streams' worth: [rows, Q, R] (each layer's
    last inputs, a row per queue slot)."""
    return torch.zeros(rows, weights.queue_slots, weights.residual_channels, device=device)
