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
