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
