"""The serial-chain proxy on a thread-block cluster with the columns split across its CTAs (CUDA C++ compiled at
run time through ``cuda.core``; optional: ``pip install speechkernels[cuda]``, Hopper or newer).

The row-split design (``cluster.py``) reduces each row's dot product across lanes with three rounds of warp
shuffles before it sends the row out, and every CTA needs the whole vector. Here CTA s owns the slice
[s KS, (s + 1) KS) of the vector (KS = H / C) and the same columns of every matrix: per layer each of its H
threads multiplies one row's KS columns by the slice and sends that partial sum straight to the CTA that owns
the row (``st.async`` completing bytes on that CTA's mbarrier). The owner adds the C partials of each of its
elements (a few adds from shared memory, no shuffle reduction), applies the activation, and passes its KS new
elements to its threads with KS independent shuffles; then the next layer's partial sums. One exchange per
layer as before, with a shorter path around it; measured slower all the same (22-24 against 46 kHz on the
H100, benchmarks/NOTES.md): 128 four-byte messages arrive at each CTA per layer instead of 32 sixteen-byte ones.

Thread t = 32 w + l handles row NW l + w (NW warps), so that every warp sends to every CTA: a CTA's partial
sums for a layer complete only after all warps of every CTA have read the previous layer's partials, which is
what lets two buffers alternate by layer parity.
"""

from __future__ import annotations

import functools

import torch

from .cluster import _arch, _compile, _launch

_SOURCE = r"""
#define KS (H / C)      // vector elements per CTA
#define NW (H / 32)     // warps: one thread per row

#if WBF16
typedef unsigned short wtype;
#define WREGS (KS / 2)
__device__ __forceinline__ void wload(const wtype* p, u32* r) {
#pragma unroll
  for (int i = 0; i < KS / 8; i++) {
    const uint4 v = __ldg((const uint4*)p + i);
    r[4 * i] = v.x; r[4 * i + 1] = v.y; r[4 * i + 2] = v.z; r[4 * i + 3] = v.w;
  }
}
__device__ __forceinline__ float wget(const u32* r, int j) {
  return (j & 1) ? __uint_as_float(r[j / 2] & 0xffff0000u) : __uint_as_float(r[j / 2] << 16);
}
#else
typedef float wtype;
#define WREGS KS
__device__ __forceinline__ void wload(const wtype* p, u32* r) {
#pragma unroll
  for (int i = 0; i < KS / 4; i++) {
    const uint4 v = __ldg((const uint4*)p + i);
    r[4 * i] = v.x; r[4 * i + 1] = v.y; r[4 * i + 2] = v.z; r[4 * i + 3] = v.w;
  }
}
__device__ __forceinline__ float wget(const u32* r, int j) { return __uint_as_float(r[j]); }
#endif

__device__ __forceinline__ float act(float y) {
#if RELU
  return fmaxf(y, 0.0f);
#else
  return tanh_fast(y);
#endif
}

extern "C" __global__ void __launch_bounds__(H, 1)
serial_chain_partials(const wtype* __restrict__ w, const float* __restrict__ x0, float* __restrict__ out, int L,
                      long long K) {
  __shared__ __align__(16) float part[2][KS][C];  // [layer parity][element of the slice][source CTA]
  __shared__ __align__(8) u64 bars[2];
  const u32 rank = cluster_rank();
  const int stream = blockIdx.x / C;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row = NW * lane + warp;
  const int xi = lane % KS;  // the slice element this lane adds up
  const u32 bar[2] = {smem_addr(&bars[0]), smem_addr(&bars[1])};
  // where this thread's partial sum goes: the owner of its row, at [parity][row % KS][rank]
  const int owner = row / KS;
  const u32 dst[2] = {mapa(smem_addr(&part[0][row % KS][rank]), owner),
                      mapa(smem_addr(&part[1][row % KS][rank]), owner)};
  const u32 dbar[2] = {mapa(bar[0], owner), mapa(bar[1], owner)};
  if (threadIdx.x == 0) {
    mbar_init(bar[0], 1);
    mbar_init(bar[1], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    mbar_arrive_expect(bar[0], H * 4);  // layer 0's partials
    mbar_arrive_expect(bar[1], H * 4);  // layer 1's
  }
  const wtype* wrow = w + (long long)row * H + rank * KS;  // + layer * H * H
  u32 wr[D][WREGS];
  int li = 0;  // layer of the next prefetch
#pragma unroll
  for (int d = 0; d < D; d++) {
    wload(wrow + (long long)li * H * H, wr[d]);
    li = (li + 1 == L) ? 0 : li + 1;
  }
  float x = x0[(long long)stream * H + rank * KS + xi];  // this lane's element of the slice
  cluster_sync();  // barriers initialised in every CTA before anyone writes remotely

  for (long long k0 = 0; k0 < K; k0 += D) {
#pragma unroll
    for (int d = 0; d < D; d++) {
      const long long k = k0 + d;
      if (k < K) {
        const int b = d & 1;  // D even: the parity of layer k
        // the slice to every lane, this row's partial sum of layer k, to the row's owner
        float xv[KS];
#pragma unroll
        for (int j = 0; j < KS; j++) xv[j] = __shfl_sync(0xffffffffu, x, j);
        float p0 = 0.0f, p1 = 0.0f;
#pragma unroll
        for (int j = 0; j < KS; j += 2) {
          p0 = fmaf(wget(wr[d], j), xv[j], p0);
          p1 = fmaf(wget(wr[d], j + 1), xv[j + 1], p1);
        }
        const float p = p0 + p1;
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                     :: "r"(dst[b]), "r"(__float_as_uint(p)), "r"(dbar[b]) : "memory");
        // the C partial sums of this lane's element
        mbar_try_wait(bar[b], (u32)((k >> 1) & 1));
        float4 v[C / 4];
#pragma unroll
        for (int r = 0; r < C / 4; r++) v[r] = *(const float4*)&part[b][xi][4 * r];
#pragma unroll
        for (int h = C / 8; h > 0; h >>= 1)
#pragma unroll
          for (int r = 0; r < h; r++) {
            v[r].x += v[r + h].x; v[r].y += v[r + h].y; v[r].z += v[r + h].z; v[r].w += v[r + h].w;
          }
        x = act((v[0].x + v[0].y) + (v[0].z + v[0].w));
        // off the critical path: the mbarrier phase of layer k + 2, the layer D ahead into the registers just used
        if (threadIdx.x == 0) mbar_arrive_expect(bar[b], H * 4);
        wload(wrow + (long long)li * H * H, wr[d]);
        li = (li + 1 == L) ? 0 : li + 1;
      }
    }
  }
  if (warp == 0 && lane < KS) out[(long long)stream * H + rank * KS + lane] = x;
  cluster_sync();  // no CTA leaves while another may still write into its shared memory
}
"""


def config(H: int, C: int, bf16: bool) -> dict | None:
    """C CTAs of H threads (H a multiple of 32 up to 1024), H / C elements each (a multiple of 8, at most 32, and
    of 4 CTAs at least, for the 16-byte loads); the prefetch depth D (even) that fits the registers; None where
    the shape does not fit."""
    if H % 32 or H > 1024 or H % C or C < 4 or C > 16:
        return None
    ks = H // C
    if ks % 8 or ks > 32:
        return None
    per_layer = ks // 2 if bf16 else ks
    budget = min(255, 65536 // H) - 40 - ks  # registers left for the prefetched layers
    d = max(2, min(8, budget // per_layer))
    d -= d % 2
    return {"H": H, "C": C, "D": d, "WBF16": int(bf16)}


@functools.cache
def _kernel(H: int, C: int, D: int, WBF16: int, RELU: int, arch: str):
    return _compile("serial_chain_partials", _SOURCE, arch, C, dict(H=H, C=C, D=D, WBF16=WBF16, RELU=RELU))


def serial_chain_partials(
    weights: torch.Tensor, x0: torch.Tensor, n_samples: int, relu: bool, C: int | None = None, **over
) -> torch.Tensor:
    """Launcher: one cluster of C CTAs per stream ([B, H] float32 out); C defaults to 16 where H allows it and
    clusters of 16 are available, else 8; ``over`` overrides D."""
    import numpy as np

    L, H, _ = weights.shape
    bf16 = weights.dtype == torch.bfloat16
    if C is None:
        for c in (16, 8):
            if config(H, c, bf16) is not None:
                try:
                    return serial_chain_partials(weights, x0, n_samples, relu, c, **over)
                except ValueError:
                    continue
        raise ValueError(f"the partials design cannot split H={H} over a cluster")
    cfg = config(H, C, bf16)
    if cfg is None:
        raise ValueError(f"the partials design cannot split H={H} over C={C} CTAs")
    cfg.update(over)
    B = x0.shape[0]
    w = weights.contiguous()
    x = x0.float().contiguous()
    out = torch.empty(B, H, dtype=torch.float32, device=x0.device)
    kernel = _kernel(**cfg, RELU=int(relu), arch=_arch(x0.device))
    args = (np.uint64(w.data_ptr()), np.uint64(x.data_ptr()), np.uint64(out.data_ptr()), np.int32(L),
            np.int64(n_samples * L))  # fmt: skip
    _launch(kernel, x0.device, B, H, args, cluster=C)
    return out
