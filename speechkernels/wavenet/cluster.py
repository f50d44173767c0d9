"""The serial-chain proxy on a thread-block cluster (CUDA C++ compiled at run time through ``cuda.core``;
optional: ``pip install speechkernels[cuda]``, Hopper or newer).

Why not Triton: one SM streams the weights from L2 at most at its own L2 bandwidth, and the per-layer exchange
between SMs that spreading a stream over several SMs needs costs 0.7-1.0 us through global memory (a grid
barrier), 80 times per sample. A thread-block cluster exchanges through distributed shared memory instead, which
Triton cannot express (benchmarks/NOTES.md has the measurements).

Design: one cluster of ``C`` CTAs per group of ``S`` streams. CTA r owns rows [r H/C, (r+1) H/C) of every
matrix; a group of ``LPR`` lanes owns one row (lane l the columns 4 (l + LPR j) + 0..3: the group reads
contiguous bytes of the vector, free of shared-memory bank conflicts) and keeps the next ``D`` layers' weights of
that row in registers (loaded D layers ahead, straight from L2). Per layer each CTA waits on its own mbarrier until
the whole input vector has arrived in its shared memory, computes its rows (the row's partial sums fetched in one
round of shuffles), and writes each result into every CTA's next buffer with ``st.async`` that completes bytes on
that CTA's mbarrier: point-to-point, no cluster-wide barrier.
Two buffers alternate by layer parity (a CTA can only write buffer b for layer k+2 after every CTA has sent its
layer-k+1 rows, which each sends only after reading buffer b for layer k).
"""

from __future__ import annotations

import functools

import torch

# cluster helpers shared with cluster_vocoder.py
COMMON = r"""
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ u32 cluster_rank() {
  u32 r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r;
}
__device__ __forceinline__ u32 mapa(u32 addr, u32 rank) {
  u32 r; asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank)); return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
// 1 once the mbarrier's phase of this parity has completed (try_wait may suspend the thread a while, test_wait
// returns at once), with the bytes that completed it visible. ACQ 1: a relaxed poll and, once it succeeds, an
// acquire fence restricted to shared::cluster (PTX 8.6), which costs nothing; ACQ 0: the poll acquires at cluster
// scope, which also invalidates the L1 cache (CCTL.IVALL) on the critical path. The kernels read nothing but
// shared memory from their peers, so the restricted fence suffices; _compile defaults to 0, the row-split proxy
// kernel asks for 1.
#if ACQ
#define MBAR_SEM "relaxed"
#define MBAR_ACQUIRE() asm volatile("fence.acquire.sync_restrict::shared::cluster.cluster;" ::: "memory")
#else
#define MBAR_SEM "acquire"
#define MBAR_ACQUIRE() {}
#endif
#define MBAR_POLL(NAME, OP)                                                                        \
  __device__ __forceinline__ u32 NAME(u32 bar, u32 parity) {                                       \
    u32 ok;                                                                                        \
    asm volatile("{\n\t.reg .pred p;\n\t"                                                       \
                 "mbarrier." OP ".parity." MBAR_SEM ".cluster.shared::cta.b64 p, [%1], %2;\n\t"   \
                 "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(ok) : "r"(bar), "r"(parity) : "memory");    \
    return ok;                                                                                     \
  }
MBAR_POLL(mbar_test_poll, "test_wait")
MBAR_POLL(mbar_try_poll, "try_wait")
// spin until the phase of this parity has completed, then acquire what completed it
__device__ __forceinline__ void mbar_try_wait(u32 bar, u32 parity) {
  while (!mbar_try_poll(bar, parity)) {}
  MBAR_ACQUIRE();
}
__device__ __forceinline__ void mbar_test_wait(u32 bar, u32 parity) {
  while (!mbar_test_poll(bar, parity)) {}
  MBAR_ACQUIRE();
}

// tanh(y) = 1 - 2 / (exp(2 y) + 1) with the approximate exp2 and reciprocal (relative errors about 2^-22),
// flushing subnormals so that no range fix-ups sit on the critical path; +-1 at the ends, 0 at 0
__device__ __forceinline__ float tanh_fast(float y) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(y * 2.88539008177792681f));  // 2 log2(e) y
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(e + 1.0f));
  return fmaf(-2.0f, r, 1.0f);
}
"""

_SOURCE = r"""
#define CPL (H / LPR)
#define RPW (32 / LPR)
#define RC (H / C)
#define NW (RC / RPW)
#define NT (NW * 32)
#define PK (RPW < 4 ? RPW : 4)  // consecutive rows packed into one message

// PK consecutive floats into another CTA's shared memory, completing their bytes on its mbarrier
__device__ __forceinline__ void st_async(u32 addr, const float* v, u32 bar) {
#if PK == 4
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];"
               :: "r"(addr), "r"(__float_as_uint(v[0])), "r"(__float_as_uint(v[1])), "r"(__float_as_uint(v[2])),
                  "r"(__float_as_uint(v[3])), "r"(bar) : "memory");
#elif PK == 2
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];"
               :: "r"(addr), "r"(__float_as_uint(v[0])), "r"(__float_as_uint(v[1])), "r"(bar) : "memory");
#else
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
               :: "r"(addr), "r"(__float_as_uint(v[0])), "r"(bar) : "memory");
#endif
}

// weight loads as volatile asm: they stay where the source puts them (after the layer's sends), never between
// the wait and the layer's shared-memory reads
#if WBF16
typedef uint2 wvec;  // 4 bfloat16
__device__ __forceinline__ wvec wload(const unsigned short* p) {
  wvec v;
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ float4 wfloat(wvec v) {
  return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u),
                     __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xffff0000u));
}
__device__ __forceinline__ float4 wfloat_v(wvec v) {
  u32 a, b, c, e;
  asm volatile("shl.b32 %0, %4, 16;\n\tand.b32 %1, %4, 0xffff0000;\n\t"
               "shl.b32 %2, %5, 16;\n\tand.b32 %3, %5, 0xffff0000;"
               : "=r"(a), "=r"(b), "=r"(c), "=r"(e) : "r"(v.x), "r"(v.y));
  return make_float4(__uint_as_float(a), __uint_as_float(b), __uint_as_float(c), __uint_as_float(e));
}
typedef unsigned short wtype;
#else
typedef float4 wvec;
__device__ __forceinline__ wvec wload(const float* p) {
  wvec v;
  asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ float4 wfloat(wvec v) { return v; }
typedef float wtype;
#endif

__device__ __forceinline__ float act(float y) {
#if RELU
  return fmaxf(y, 0.0f);
#else
  return tanh_fast(y);
#endif
}

extern "C" __global__ void __launch_bounds__(NT, 1)
serial_chain_cluster(const wtype* __restrict__ w, const float* __restrict__ x0, float* __restrict__ out,
                     int L, long long K, int B) {
  __shared__ __align__(16) float xs[2][S][H];
  __shared__ __align__(8) u64 bars[2];
  const u32 rank = cluster_rank();
  const int s0 = (blockIdx.x / C) * S;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int l = lane % LPR;
  const int row = rank * RC + warp * RPW + lane / LPR;
  // this lane's j-th group of 4 columns: CIL 1 interleaves the lanes of a row (lane l: 4 (l + LPR j)), so that
  // the row's LPR lanes read 16 LPR contiguous bytes of the vector (no bank conflicts) and of the weights
  const int col0 = l * CPL;
#if CIL
#define COL(j) (4 * (l + LPR * (j)))
#else
#define COL(j) (col0 + 4 * (j))
#endif
  const bool sender = (lane / LPR) % PK == 0;  // the first row group of each PK sends their rows
  const u32 bar[2] = {smem_addr(&bars[0]), smem_addr(&bars[1])};
  if (threadIdx.x == 0) {
    mbar_init(bar[0], 1);
    mbar_init(bar[1], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  for (int i = threadIdx.x; i < S * H; i += NT) {
    const int s = i / H;
    xs[0][s][i % H] = (s0 + s < B) ? x0[(long long)(s0 + s) * H + i % H] : 0.0f;
  }
  cluster_sync();  // barriers initialised and inputs loaded in every CTA before anyone writes remotely

  // this lane's sends: pairs p = l, l + LPR, ... < C * S of (stream p / C, destination CTA p % C)
  wvec wr[D][CPL / 4];
  int li = 0;  // layer of the next prefetch
#pragma unroll
  for (int d = 0; d < D; d++) {
#pragma unroll
    for (int j = 0; j < CPL / 4; j++) wr[d][j] = wload(w + ((long long)li * H + row) * H + COL(j));
    li = (li + 1 == L) ? 0 : li + 1;
  }
  for (long long k0 = 0; k0 < K; k0 += D) {
#pragma unroll
    for (int d = 0; d < D; d++) {
      const long long k = k0 + d;
      if (k < K) {
        const int b = (int)(k & 1);
        // this layer's weights as floats
        float4 wf[CPL / 4];
#if !(WIL && WBF16 && LIW)
#pragma unroll
        for (int j = 0; j < CPL / 4; j++) wf[j] = wfloat(wr[d][j]);
#endif
        float4 xr[S][CPL / 4];  // this lane's columns of the input vector
#if LIW
        // the loads inside the polling loop (volatile, after each poll): they issue right after the poll that
        // succeeds, ahead of anything else the scheduler would put first; the failed polls' loads are discarded
        {
          const u32 parity = (u32)(((k - 1) >> 1) & 1);
          u32 ok = (k == 0);
          do {
#if WIL && WBF16
            // bfloat16 to float inside the loop, before the poll (volatile: it stays there, where it costs
            // nothing once the poll waits)
#pragma unroll
            for (int j = 0; j < CPL / 4; j++) wf[j] = wfloat_v(wr[d][j]);
#endif
#if TW
            if (!ok) ok = mbar_test_poll(bar[b], parity);
#else
            if (!ok) ok = mbar_try_poll(bar[b], parity);
#endif
            MBAR_ACQUIRE();
#pragma unroll
            for (int s = 0; s < S; s++)
#pragma unroll
              for (int j = 0; j < CPL / 4; j++)
                asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                             : "=f"(xr[s][j].x), "=f"(xr[s][j].y), "=f"(xr[s][j].z), "=f"(xr[s][j].w)
                             : "r"(smem_addr(&xs[b][s][COL(j)])) : "memory");
          } while (!ok);
        }
#else
        if (k > 0) {
          const u32 parity = (u32)(((k - 1) >> 1) & 1);
#if TW
          mbar_test_wait(bar[b], parity);
#else
          mbar_try_wait(bar[b], parity);
#endif
        }
#pragma unroll
        for (int s = 0; s < S; s++)
#pragma unroll
          for (int j = 0; j < CPL / 4; j++) xr[s][j] = *(const float4*)&xs[b][s][COL(j)];
#endif
        float acc[S];
#pragma unroll
        for (int s = 0; s < S; s++) {
          float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;  // FCH independent chains (2 or 4)
#pragma unroll
          for (int j = 0; j < CPL / 4; j++) {
            const float4 xv = xr[s][j];
            const float4 wv = wf[j];
#if FCH == 4
            a0 = fmaf(wv.x, xv.x, a0);
            a1 = fmaf(wv.y, xv.y, a1);
            a2 = fmaf(wv.z, xv.z, a2);
            a3 = fmaf(wv.w, xv.w, a3);
#else
            a0 = fmaf(wv.x, xv.x, a0);
            a1 = fmaf(wv.y, xv.y, a1);
            a0 = fmaf(wv.z, xv.z, a0);
            a1 = fmaf(wv.w, xv.w, a1);
#endif
          }
          acc[s] = (a0 + a1) + (a2 + a3);
        }
#pragma unroll
        for (int s = 0; s < S; s++) {
#if RED
          // every lane of a row fetches the row's LPR partial sums at once (one round of independent shuffles
          // instead of log2(LPR) dependent ones) and adds them in the butterfly's order: the same bits
          float v[LPR];
#pragma unroll
          for (int j = 0; j < LPR; j++) v[j] = __shfl_sync(0xffffffffu, acc[s], j, LPR);
#pragma unroll
          for (int o = LPR / 2; o > 0; o >>= 1)
#pragma unroll
            for (int j = 0; j < o; j++) v[j] += v[j + o];
          acc[s] = act(v[0]);
#else
#pragma unroll
          for (int o = LPR / 2; o > 0; o >>= 1) acc[s] += __shfl_xor_sync(0xffffffffu, acc[s], o);
          acc[s] = act(acc[s]);
#endif
        }
        if (k + 1 < K) {
          // the first group of each PK groups gathers their rows and sends them as one message per (stream,
          // destination) pair: pairs p = l, l + LPR, ... < C * S of (stream p / C, destination p % C)
          float pk[S][PK];
#pragma unroll
          for (int s = 0; s < S; s++)
#pragma unroll
            for (int q = 0; q < PK; q++) pk[s][q] = q ? __shfl_down_sync(0xffffffffu, acc[s], q * LPR) : acc[s];
          if (sender) {
#pragma unroll
            for (int p0 = 0; p0 < C * S; p0 += LPR) {
              const int p = p0 + l;
              if (p < C * S) {
                const int s = p / C, dst = p % C;
                float v[PK];
#pragma unroll
                for (int q = 0; q < PK; q++) {
                  v[q] = pk[0][q];
#pragma unroll
                  for (int t = 1; t < S; t++) v[q] = (s == t) ? pk[t][q] : v[q];
                }
                st_async(mapa(smem_addr(&xs[b ^ 1][s][row]), dst), v, mapa(bar[b ^ 1], dst));
              }
            }
          }
        }
        // off the critical path: the next layer's mbarrier arrival, the layer D ahead into the registers just used
        if (threadIdx.x == 0) mbar_arrive_expect(bar[b ^ 1], S * H * 4);
#pragma unroll
        for (int j = 0; j < CPL / 4; j++) wr[d][j] = wload(w + ((long long)li * H + row) * H + COL(j));
        li = (li + 1 == L) ? 0 : li + 1;
        if (k + 1 == K && l == 0) {
#pragma unroll
          for (int s = 0; s < S; s++)
            if (s0 + s < B) out[(long long)(s0 + s) * H + row] = acc[s];
        }
      }
    }
  }
  cluster_sync();  // no CTA leaves while another may still write into its shared memory
}
"""


def available() -> bool:
    """Whether the cluster kernels can run here: cuda.core importable and a CUDA GPU of compute capability 9.0
    or newer."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        return False
    try:
        import cuda.core  # noqa: F401
    except ImportError:
        return False
    return True


def _core():
    try:
        import cuda.core as core
    except ImportError:  # cuda-core < 0.4 kept the API under experimental
        import cuda.core.experimental as core
    return core


def config(H: int, C: int, S: int, bf16: bool) -> dict:
    """Launch parameters for H rows over C CTAs and S streams per cluster: lanes per row LPR (a power of 2
    dividing 32; each lane holds H / LPR columns of its row; fewer when a CTA would need more than 32 warps) and
    the prefetch depth D (layers, even): 4, or fewer where the registers left per thread do not hold 4 (at
    H = 128, C = 16 on the H100 depth 4 ran 3-5 % faster than 8 and 2, benchmarks/NOTES.md)."""
    lpr = 8
    while lpr > 1 and ((H // lpr) % 4 or (H // C) * lpr // 32 > 32):
        lpr //= 2
    threads = max(32, (H // C) * lpr)
    per_layer = (H // lpr) // (2 if bf16 else 1)  # registers per prefetched layer
    d = max(2, min(4, (min(255, 65536 // threads) - 40 - 8 * S) // max(1, per_layer)))
    d -= d % 2  # even: the buffer parity of an unrolled step is then known at compile time
    # the critical path's options (benchmarks/NOTES.md, v15-v21): interleaved columns (no bank conflicts on the
    # vector's reads), four FMA chains, the indexed reduction at one or two streams per cluster; with bfloat16
    # weights the loads (and conversions) placed in the polling loop
    opts = dict(TW=0, RED=int(S <= 2), FCH=4, LIW=int(bf16), WIL=int(bf16), CIL=1)
    return dict(H=H, C=C, S=S, LPR=lpr, D=d, WBF16=int(bf16), **opts)


def check_config(cfg: dict) -> None:
    H, C, lpr = cfg["H"], cfg["C"], cfg["LPR"]
    rpw = 32 // lpr
    if H % C or (H // C) % rpw or (H // lpr) % 4 or (H // C) // rpw > 32 or C > 16 or cfg["D"] % 2:
        raise ValueError(f"the cluster design cannot split H={H} over C={C} CTAs with {lpr} lanes per row")


@functools.cache
def _kernel(arch: str, ACQ: int | None = None, **defines):
    """The row-split kernel for ``config()``'s parameters plus RELU; ACQ the wait's semantics (COMMON), by default
    the relaxed poll with the restricted fence where this NVRTC compiles it (PTX 8.6, NVRTC 12.8 or newer). The
    other cluster kernels keep the acquiring poll: with the fence the compiler schedules them 2-5 % slower
    (benchmarks/NOTES.md)."""
    if ACQ is None:
        try:
            return _kernel(arch, 1, **defines)
        except Exception:  # noqa: BLE001 - older NVRTC
            return _kernel(arch, 0, **defines)
    return _compile("serial_chain_cluster", _SOURCE, arch, defines["C"], {**defines, "ACQ": ACQ})


def _arch(device=None) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def _compile(name: str, source: str, arch: str, C: int, defines: dict, common: bool = True):
    """Kernel ``name`` compiled by NVRTC for ``arch``: integer ``#define``s, the cluster helpers above (``common``)
    and ``source``; clusters of more than 8 CTAs allowed where C asks for them."""
    core = _core()
    if common and "ACQ" not in defines:
        defines = {**defines, "ACQ": 0}
    text = "".join(f"#define {k} {int(v)}\n" for k, v in defines.items()) + (COMMON if common else "") + source
    opts = core.ProgramOptions(arch=arch, std="c++17", name=name)
    kernel = core.Program(text, "c++", opts).compile("cubin").get_kernel(name)
    _kernel_attributes(kernel, C)
    return kernel


def _launch(kernel, device, grid: int, block: int, args, cluster: int = 0, shmem: int = 0) -> None:
    """One launch on PyTorch's current stream of ``device``; with ``cluster``, ``grid`` counts clusters."""
    core = _core()
    core.Device(device.index or 0).set_current()
    extra = {"cluster": cluster} if cluster else {}
    if shmem:
        extra["shmem_size"] = shmem
    core.launch(_current_stream(device), core.LaunchConfig(grid=grid, block=block, **extra), kernel, *args)


def _kernel_attributes(kernel, C: int) -> None:
    """Clusters of more than 8 CTAs are opt-in (Hopper allows 16)."""
    if C > 8:
        from cuda.bindings import driver

        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
        dev = driver.CUdevice(torch.cuda.current_device())
        (err,) = driver.cuKernelSetAttribute(attr, 1, kernel.handle, dev)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise ValueError(f"clusters of C={C} CTAs are not available here ({err})")


class _TorchStream:
    """A stream handle in the __cuda_stream__ protocol (cuda-core releases without Stream.from_handle)."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def _current_stream(device=None):
    """PyTorch's current stream on ``device`` as a cuda.core stream, for ``cuda.core.launch``."""
    handle = torch.cuda.current_stream(device).cuda_stream
    stream_cls = getattr(_core(), "Stream", None)
    if hasattr(stream_cls, "from_handle"):
        return stream_cls.from_handle(handle)
    return _TorchStream(handle)


def serial_chain_cluster(
    weights: torch.Tensor, x0: torch.Tensor, n_samples: int, relu: bool, C: int | None = None, S: int = 1, **over
) -> torch.Tensor:
    """Launcher: ceil(B / S) clusters of C CTAs ([B, H] float32 out); ``over`` overrides LPR or D. C defaults to
    16 CTAs with 8 lanes per row where the GPU allows clusters of 16, else 8 (benchmarks/NOTES.md)."""
    if C is None:
        H = weights.shape[1]
        try:
            if H % 16:
                raise ValueError("H")
            return serial_chain_cluster(weights, x0, n_samples, relu, 16, S, **{"LPR": 8, **over})
        except ValueError:
            C = 8
    import numpy as np

    L, H, _ = weights.shape
    B = x0.shape[0]
    cfg = {**config(H, C, S, weights.dtype == torch.bfloat16), **over}
    check_config(cfg)
    w = weights.contiguous()
    x = x0.float().contiguous()
    out = torch.empty(B, H, dtype=torch.float32, device=x0.device)
    kernel = _kernel(**cfg, RELU=int(relu), arch=_arch(x0.device))
    nw = (H // C) // (32 // cfg["LPR"])
    args = (np.uint64(w.data_ptr()), np.uint64(x.data_ptr()), np.uint64(out.data_ptr()), np.int32(L),
            np.int64(n_samples * L), np.int32(B))  # fmt: skip
    _launch(kernel, x0.device, (B + S - 1) // S, 32 * nw, args, cluster=C)
    return out
