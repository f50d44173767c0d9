// Device helpers of the vocoder kernels (wavenet_cluster.cu, wavenet_cluster_batch.cu), compiled after their
// #defines (R, G2, SK, NC, C, WBF16, GREEDY, VIL) and cluster_common.cuh.

// The split over a cluster of C CTAs: CTA r owns ZC gate units, one warp each; a warp's 4 groups of 8 lanes hold
// a unit's 4 gate rows (tanh/sigmoid of the current and past input) with RCL columns per lane, RR residual rows
// and SR skip rows (ZCL columns per lane), and SR head1 and H2R logit rows (HCL columns per lane).
#define ZC (G2 / C)
#define NW ZC
#define NT (NW * 32)
#define NG (NW * 4)
#define RCL (R / 8)
#define ZCL (G2 / 8)
#define HCL (SK / 8)
#define RR (R / NG)
#define SR (SK / C / NG)
#define H2R (NC / C / NG)
#define EXW (G2 > SK ? (G2 > NC ? G2 : NC) : (SK > NC ? SK : NC))  // the widest exchanged vector
#define MAXL 512  // layers the kernels hold the dilations of

// A lane's columns of a vector come in chunks of WPV = 4: with VIL chunk k of lane l holds columns (l + 8 k) 4 + ..,
// so that the 8 lanes of a group read 16 contiguous bytes each (no shared-memory bank conflicts); without, lane l
// holds a contiguous run. dotv's x: chunk k at x + XS k (CSTEP in shared memory, WPV in a register copy).
#if WBF16
typedef uint2 wv;  // 4 bfloat16
typedef unsigned short wtype;
__device__ __forceinline__ float4 wfloat4(wv v) {
  return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                     __uint_as_float(v.y & 0xffff0000u));
}
#else
typedef float4 wv;
typedef float wtype;
__device__ __forceinline__ float4 wfloat4(wv v) { return v; }
#endif
#define WPV 4
template <int XS>
__device__ __forceinline__ float dotv(const wv* w, const float* x, int nv) {
  float a0 = 0.f, a1 = 0.f;
#pragma unroll
  for (int k = 0; k < nv; k++) {
    const float4 xv = *(const float4*)(x + XS * k), wk = wfloat4(w[k]);
    a0 = fmaf(wk.x, xv.x, a0); a1 = fmaf(wk.y, xv.y, a1);
    a0 = fmaf(wk.z, xv.z, a0); a1 = fmaf(wk.w, xv.w, a1);
  }
  return a0 + a1;
}
#if VIL
#define CSTEP (8 * WPV)      // from one chunk of a lane to its next, in a row or a vector
#define LOFF(N) (l * WPV)    // a lane's first column (N: its column count)
#else
#define CSTEP WPV
#define LOFF(N) (l * (N))
#endif
__device__ __forceinline__ void ldw(wv* dst, const wtype* p, int nv) {
#pragma unroll
  for (int k = 0; k < nv; k++) dst[k] = __ldg((const wv*)(p + CSTEP * k));
}
// ldw from shared memory
__device__ __forceinline__ void ldws(wv* dst, const wtype* p, int nv) {
#pragma unroll
  for (int k = 0; k < nv; k++) dst[k] = *(const wv*)(p + CSTEP * k);
}
// this lane's N columns of a shared vector into registers, chunk after chunk
template <int N>
__device__ __forceinline__ void ldx(float* dst, const float* v, int l) {
#pragma unroll
  for (int k = 0; k < N; k += 4) *(float4*)&dst[k] = *(const float4*)&v[LOFF(N) + CSTEP * (k / WPV) + k % WPV];
}
__device__ __forceinline__ float red8(float a) {
  a += __shfl_xor_sync(0xffffffffu, a, 4);
  a += __shfl_xor_sync(0xffffffffu, a, 2);
  return a + __shfl_xor_sync(0xffffffffu, a, 1);
}
__device__ __forceinline__ float sigm(float a) { return 1.0f / (1.0f + expf(-a)); }

// The class drawn from NC logits at v (lane owns [lane NC / 32, (lane + 1) NC / 32)) by a whole warp: with GREEDY the
// first maximum, else the inverse CDF of softmax(v inv_temp) at the uniform u (as the PyTorch path), at most NC - 1.
__device__ __forceinline__ int sample_class(const float* v_all, int lane, float u, float inv_temp) {
  constexpr int VPL = NC / 32;
  float v[VPL];
#pragma unroll
  for (int k = 0; k < VPL; k++) v[k] = v_all[lane * VPL + k];
  float m = v[0];
#pragma unroll
  for (int k = 1; k < VPL; k++) m = fmaxf(m, v[k]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  int cnt = 0;
#if GREEDY
  int first = NC;
#pragma unroll
  for (int k = VPL - 1; k >= 0; k--) first = (v[k] == m) ? lane * VPL + k : first;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
  cnt = first;
#else
  float c[VPL], run = 0.0f;
#pragma unroll
  for (int k = 0; k < VPL; k++) { run += expf((v[k] - m) * inv_temp); c[k] = run; }
  float incl = run;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  const float total = __shfl_sync(0xffffffffu, incl, 31), before = incl - run;
  const float target = u * total;
#pragma unroll
  for (int k = 0; k < VPL; k++) cnt += (before + c[k] < target) ? 1 : 0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
#endif
  return min(cnt, NC - 1);
}

// ---- the prologue both vocoder kernels share
// the two exchange mbarriers, initialised by thread 0 and made visible to the cluster
__device__ __forceinline__ void init_exchange_bars(const u32* bar) {
  if (threadIdx.x == 0) {
    mbar_init(bar[0], 1);
    mbar_init(bar[1], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
}
// the layers' dilations and queue offsets into shared memory
__device__ __forceinline__ void load_dilations(int* s_dil, int* s_qoff, const int* dil, const int* qoff, int L) {
  for (int i = threadIdx.x; i < L; i += NT) {
    s_dil[i] = dil[i];
    s_qoff[i] = qoff[i];
  }
}
// biases of this lane's skip, head1 and logit rows (constants: off the critical path)
__device__ __forceinline__ void load_head_biases(float* bsk, float* bh1, float* bh2, const float* bs, const float* b1,
                                                 const float* b2, u32 rank, int gi) {
#pragma unroll
  for (int k = 0; k < SR; k++) {
    bsk[k] = bs[rank * (SK / C) + gi * SR + k];
    bh1[k] = b1[rank * (SK / C) + gi * SR + k];
  }
#pragma unroll
  for (int k = 0; k < H2R; k++) bh2[k] = b2[rank * (NC / C) + gi * H2R + k];
}
// layer i's weights of this lane (l: its lane in the group of 8) into w (either kernel's LW): its gate row, its
// residual and skip rows, the residual rows' biases
template <class LWT>
__device__ __forceinline__ void load_layer_weights(LWT& w, const wtype* wg, const wtype* wr, const float* br,
                                                   const wtype* ws, int i, u32 rank, int warp, int grp, int gi, int l) {
  ldw(w.g, wg + ((((long long)i * C + rank) * NW + warp) * 4 + grp) * R + LOFF(RCL), RCL / WPV);
#pragma unroll
  for (int k = 0; k < RR; k++) ldw(w.r[k], wr + ((long long)i * R + gi * RR + k) * G2 + LOFF(ZCL), ZCL / WPV);
#pragma unroll
  for (int k = 0; k < SR; k++)
    ldw(w.s[k], ws + ((long long)i * SK + rank * (SK / C) + gi * SR + k) * G2 + LOFF(ZCL), ZCL / WPV);
#pragma unroll
  for (int k = 0; k < RR; k++) w.br[k] = __ldg(br + (long long)i * R + gi * RR + k);
}
// the generation loop of either kernel: ``steps`` layer steps (samples x layers), each computing a layer with the
// weights in its first argument while it loads the next layer's into its second, the two alternating (loaded
// first: layer 0 of sample 0)
template <class LWT, class Load, class Step>
__device__ __forceinline__ void run_layer_steps(Load&& load_layer, Step&& step, long long steps) {
  LWT wa, wb;
  load_layer(wa, 0, 0);
  for (long long k = 0; k < steps; k += 2) {
    step(wa, wb);
    if (k + 1 < steps) step(wb, wa);
  }
}
// the parameters both vocoder kernels take first: the packed weights (``weights.vocoder_weights``' layout), the
// embedding, the conditioning, the dilations, the queue and the uniforms
#define VOCODER_KERNEL_INPUTS                                                                                     \
  const wtype* __restrict__ wg,                               /* [L][C][NW][4][R]: rows cur_t, cur_s, past_t, past_s */ \
      const wtype* __restrict__ wr, const float* __restrict__ br, /* [L][R][G2], [L][R] */                          \
      const wtype* __restrict__ ws, const float* __restrict__ bs, /* [L][SK][G2], [SK] (summed) */                  \
      const wtype* __restrict__ w1, const float* __restrict__ b1, /* [SK][SK], [SK] */                              \
      const wtype* __restrict__ w2, const float* __restrict__ b2, /* [NC][SK], [NC] */                              \
      const float* __restrict__ embed,                            /* [NC][R] */                                     \
      const float* __restrict__ cb, /* [B][F][L][2 G2]: conditioning and current-input bias */                      \
      const int* __restrict__ dil, const int* __restrict__ qoff,  /* [L] */                                         \
      float* __restrict__ queue,                                  /* [B or rows][C][Q][NW][2], zeros at the start */ \
      const float* __restrict__ uni                               /* [n][B] */
