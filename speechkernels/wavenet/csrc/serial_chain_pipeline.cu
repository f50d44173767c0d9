#define KT (H / 16)      // k tiles of 16 columns; also row tiles = warps
#define NT (KT * 32)
#define WORDS (3 * 4 * 2 * KT)  // the split vector: [piece][lane % 4][2 KT] 32-bit words
#if NACC > KT
#undef NACC
#define NACC KT  // independent accumulators of the tensor-core products
#endif

__device__ __forceinline__ float trunc16(float v) { return __uint_as_float(__float_as_uint(v) & 0xffff0000u); }
// the bfloat16 halves (upper 16 bits) of two floats that are exact in bfloat16, v0 in the low half
__device__ __forceinline__ u32 pack_hi(float v0, float v1) {
  return __byte_perm(__float_as_uint(v0), __float_as_uint(v1), 0x7632);
}

// x = hi + mid + lo exactly, for two consecutive rows (v0 in the low halves): each piece the leading 8
// significant bits of what the previous left (the subtractions are exact, and the last remainder has at most 8)
__device__ __forceinline__ void split3(float v0, float v1, u32 p[3]) {
  const float h0 = trunc16(v0), h1 = trunc16(v1);
  const float r0 = v0 - h0, r1 = v1 - h1;
  const float m0 = trunc16(r0), m1 = trunc16(r1);
  p[0] = pack_hi(h0, h1);
  p[1] = pack_hi(m0, m1);
  p[2] = pack_hi(r0 - m0, r1 - m1);
}

__device__ __forceinline__ void mma(float c[4], const u32 a[4], u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// probe builds (PROF): thread 0 of each CTA records the SM clock at points of samples PROF .. PROF + 3
#if PROF
#define MARK(j, point)                                                                                        \
  if (threadIdx.x == 0 && n >= PROF && n < PROF + 4) {                                                         \
    long long c;                                                                                               \
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(c) :: "memory");                                           \
    prof[((blockIdx.x * 4 + (n - PROF)) * (LPC + 1) + (j)) * 4 + (point)] = c;                                  \
  }
// and the global timer (ns) of every sample's start (input arrived) and end (vector sent), after the clocks
#define GMARK(point)                                                                                          \
  if (threadIdx.x == 0 && n < 1024) {                                                                          \
    long long c;                                                                                               \
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(c) :: "memory");                                       \
    prof[gridDim.x * 4 * (LPC + 1) * 4 + (blockIdx.x * 1024 + n) * 2 + (point)] = c;                          \
  }
#else
#define MARK(j, point) {}
#define GMARK(point) {}
#endif

extern "C" __global__ void __launch_bounds__(NT, 1)
serial_chain_pipeline(const unsigned short* __restrict__ w, const float* __restrict__ x0, float* __restrict__ out,
                      int L, int n_samples
#if PROF
                      , long long* __restrict__ prof
#endif
) {
  __shared__ __align__(16) u32 xin[WORDS];     // the vector from the previous CTA (CTA 0: from the last)
  __shared__ __align__(16) u32 xb[2][WORDS];   // between this CTA's layers
  __shared__ __align__(8) u64 bar_s;
  const u32 rank = cluster_rank();
  const int stream = blockIdx.x / C;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int first = (rank * L) / C, nl = ((rank + 1) * L) / C - first;
  const u32 bar = smem_addr(&bar_s);

  // this CTA's layers as A fragments of this warp's row tile; fragment rows g and g + 8 hold matrix rows
  // 16 warp + rg and rg + 1, rg = 8 (g % 2) + 2 (g / 2), so that the lane of t = 0 ends with the two consecutive
  // rows that one 32-bit word of the split layout takes (columns 16 kt + 2 t, + 8 as they are)
  const int rg = 8 * (g & 1) + 2 * (g >> 1);
  const int gl = g < 3 ? g : 2;                   // the piece whose B words this lane loads
  const u32 bmask = g < 3 ? 0xffffffffu : 0u;     // and keeps
  u32 a[LPC][KT][4];
#pragma unroll
  for (int j = 0; j < LPC; j++)
#pragma unroll
    for (int kt = 0; kt < KT; kt++) {
      const int layer = first + (j < nl ? j : 0);
      const unsigned short* p = w + ((long long)layer * H + 16 * warp + rg) * H + 16 * kt + 2 * t;
      a[j][kt][0] = __ldg((const u32*)p);
      a[j][kt][1] = __ldg((const u32*)(p + H));
      a[j][kt][2] = __ldg((const u32*)(p + 8));
      a[j][kt][3] = __ldg((const u32*)(p + H + 8));
    }

  // lanes with t == 0 produce rows 16 warp + rg, + 1: one 32-bit word per piece at word index
  // (piece, g / 2, 2 warp + g % 2) of the split layout (k = 16 warp + 8 (g % 2) + 2 (g / 2), + 1)
  const int wofs = ((g >> 1) * 2 * KT) + 2 * warp + (g & 1);
  const int next = (rank + 1 == C) ? 0 : rank + 1;
  u32 rx[3];
#pragma unroll
  for (int q = 0; q < 3; q++) rx[q] = mapa(smem_addr(&xin[q * 8 * KT + wofs]), next);
  const u32 rbar = mapa(bar, next);

  if (threadIdx.x == 0) {
    mbar_init(bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    mbar_arrive_expect(bar, WORDS * 4);
  }
  if (rank == 0 && t == 0) {  // the starting vector, split, into CTA 0's input
    const float* xs = x0 + (long long)stream * H + 16 * warp + rg;
    u32 p[3];
    split3(xs[0], xs[1], p);
#pragma unroll
    for (int q = 0; q < 3; q++) xin[q * 8 * KT + wofs] = p[q];
  }
  cluster_sync();  // barriers initialised and the input written in every CTA before anyone writes remotely

  u32 phase = 0;
  for (int n = 0; n < n_samples; n++) {
    const bool final_out = (rank == C - 1) && (n == n_samples - 1);  // this CTA writes the result, not sends
    GMARK(0)
    if (rank != 0 || n != 0) {
#if TW
      mbar_test_wait(bar, phase);
#else
      mbar_try_wait(bar, phase);
#endif
      phase ^= 1;
      MARK(LPC, 0)
      GMARK(0)
      if (threadIdx.x == 0) mbar_arrive_expect(bar, WORDS * 4);  // the next sample's input
    }
#pragma unroll
    for (int j = 0; j < LPC; j++) {
      if (j < nl) {
        MARK(j, 0)
        const u32* src = (j == 0) ? xin : xb[j & 1];
        // B fragments: lanes with g < 3 take piece g's words for k = 16 kt + 2 t, + 1 (b0) and + 8, + 9 (b1), the
        // others zeros (every lane loads, so that the warp stays converged for mma.sync)
        u32 b[2 * KT];
#pragma unroll
        for (int i = 0; i < 2 * KT; i += 4) {
          const uint4 v = *(const uint4*)&src[(gl * 4 + t) * 2 * KT + i];
          b[i] = v.x & bmask; b[i + 1] = v.y & bmask; b[i + 2] = v.z & bmask; b[i + 3] = v.w & bmask;
        }
        float acc[NACC][4];
#pragma unroll
        for (int i = 0; i < NACC; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
#pragma unroll
        for (int kt = 0; kt < KT; kt++) mma(acc[kt % NACC], a[j][kt], b[2 * kt], b[2 * kt + 1]);
#pragma unroll
        for (int i = 1; i < NACC; i++)
#pragma unroll
          for (int e = 0; e < 4; e++) acc[0][e] += acc[i][e];
        // row rg: columns 0, 1 (pieces hi, mid) in lane t = 0, column 2 (lo) in lane t = 1; row rg + 1 likewise
        MARK(j, 1)
        const float o0 = __shfl_down_sync(0xffffffffu, acc[0][0], 1);
        const float o2 = __shfl_down_sync(0xffffffffu, acc[0][2], 1);
        const float ya = act((acc[0][0] + acc[0][1]) + o0), yb = act((acc[0][2] + acc[0][3]) + o2);
        const bool last = (j == nl - 1);
        if (t == 0) {
          if (last && final_out) {
            float* o = out + (long long)stream * H + 16 * warp + rg;
            o[0] = ya;
            o[1] = yb;
          } else {
            u32 p[3];
            split3(ya, yb, p);
            if (last) {
#pragma unroll
              for (int q = 0; q < 3; q++)
                asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                             :: "r"(rx[q]), "r"(p[q]), "r"(rbar) : "memory");
            } else {
              u32* dst = xb[(j + 1) & 1];
#pragma unroll
              for (int q = 0; q < 3; q++) dst[q * 8 * KT + wofs] = p[q];
            }
          }
        }
        MARK(j, 2)
        if (last) { GMARK(1) }
        if (!last) __syncthreads();
        MARK(j, 3)
      }
    }
  }
  cluster_sync();  // no CTA leaves while another may still write into its shared memory
}
