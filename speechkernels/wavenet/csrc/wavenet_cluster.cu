
__device__ __forceinline__ void st_async1(u32 addr, float v, u32 bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
               :: "r"(addr), "r"(__float_as_uint(v)), "r"(bar) : "memory");
}


// one layer's weights of this lane: its gate row (8 lanes x RCL), its residual rows and skip rows (ZCL each)
struct LW {
  wv g[RCL / WPV];
  wv r[RR][ZCL / WPV];
  wv s[SR][ZCL / WPV];
  float br[RR];  // residual biases of the rows
  float cb;  // conditioning + bias of the gate row (groups 0 and 1)
  float q;   // the queued past product for this step (groups 2 and 3)
  int slot;  // its place in the queue (the product of this step replaces it)
};

extern "C" __global__ void __launch_bounds__(NT, 1)
wavenet_cluster(VOCODER_KERNEL_INPUTS,
                long long* __restrict__ out,  // [B][n]
                int B, int L, int F, int Q, int hop, int n, int start, float inv_temp) {
  __shared__ __align__(16) float xs[2][R];
  __shared__ __align__(16) float ex[2][EXW];
  __shared__ __align__(8) u64 bars[2];
  __shared__ int s_sample;
  __shared__ int s_dil[MAXL], s_qoff[MAXL];
  extern __shared__ __align__(16) float s_embed[];  // [NC][R]: the next sample's input without a trip to L2
  const u32 rank = cluster_rank();
  const int b = blockIdx.x / C;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = lane >> 3, l = lane & 7;
  const int gi = warp * 4 + grp;
  const int j = rank * ZC + warp;
  const u32 bar[2] = {smem_addr(&bars[0]), smem_addr(&bars[1])};
  float* qb = queue + ((long long)b * C + rank) * Q * NW * 2 + warp * 2 + (grp & 1);
  init_exchange_bars(bar);
  for (int i = threadIdx.x; i < R; i += NT) xs[0][i] = embed[(long long)start * R + i];
  for (int i = threadIdx.x; i < NC * R; i += NT) s_embed[i] = embed[i];
  load_dilations(s_dil, s_qoff, dil, qoff, L);
  float bsk[SR], bh1[SR], bh2[H2R];
  load_head_biases(bsk, bh1, bh2, bs, b1, b2, rank, gi);
  cluster_sync();
  if (threadIdx.x == 0) mbar_arrive_expect(bar[0], G2 * 4);  // event 0: layer 0's z

  // head rows of this lane, kept in registers
  wv h1w[SR][HCL / WPV], h2w[H2R][HCL / WPV];
#pragma unroll
  for (int k = 0; k < SR; k++)
    ldw(h1w[k], w1 + (long long)(rank * (SK / C) + gi * SR + k) * SK + LOFF(HCL), HCL / WPV);
#pragma unroll
  for (int k = 0; k < H2R; k++)
    ldw(h2w[k], w2 + (long long)(rank * (NC / C) + gi * H2R + k) * SK + LOFF(HCL), HCL / WPV);

  auto load_layer = [&](LW& w, int t, int i) {
    load_layer_weights(w, wg, wr, br, ws, i, rank, warp, grp, gi, l);
    const int frame = min(t / hop, F - 1);
    w.cb = (grp < 2) ? __ldg(cb + (((long long)b * F + frame) * L + i) * 2 * G2 + grp * G2 + j) : 0.0f;
    w.slot = (s_qoff[i] + t % s_dil[i]) * NW * 2;
    w.q = (grp >= 2 && t < n) ? qb[w.slot] : 0.0f;
  };
  long long e = 0;  // exchange events so far: L per sample (z), then relu(skip), head1, logits
  int xb = 0, t = 0, i = 0;
  float sk[SR];
#pragma unroll
  for (int k = 0; k < SR; k++) sk[k] = 0.0f;
  float u = GREEDY ? 0.0f : __ldg(uni + b);
  float zprev[ZCL];  // the last z seen by this lane (its ZCL columns), for the skip rows one layer late

  // one layer (and the head after the last): weights in cur, the next layer's loaded into nxt meanwhile
  auto step = [&](LW& cur, LW& nxt) {
    // ---- gate unit j of layer i on x = xs[xb]
    const float a = red8(dotv<CSTEP>(cur.g, &xs[xb][LOFF(RCL)], RCL / WPV));
    const float a_s = __shfl_sync(0xffffffffu, a, (lane + 8) & 31);
    const float q_t = __shfl_sync(0xffffffffu, cur.q, (lane + 16) & 31);
    const float q_s = __shfl_sync(0xffffffffu, cur.q, (lane + 24) & 31);
    const float cb_s = __shfl_sync(0xffffffffu, cur.cb, (lane + 8) & 31);
    u32 eb = (u32)(e & 1);
    if (grp == 0 && l < C) {
      const float at = a + q_t + cur.cb, as = a_s + q_s + cb_s;
      const float z = (1.0f - 2.0f / (expf(2.0f * at) + 1.0f)) * sigm(as);
      st_async1(mapa(smem_addr(&ex[eb][j]), l), z, mapa(bar[eb], l));
    }
    // off the critical path while z travels: queue W_past x, the previous layer's skip rows (its weights are
    // still in nxt), then the next layer's weights into nxt
    if (grp >= 2 && l == 0) qb[cur.slot] = a;
    if (i > 0) {
#pragma unroll
      for (int k = 0; k < SR; k++) sk[k] += dotv<WPV>(nxt.s[k], zprev, ZCL / WPV);
    }
    if (i + 1 == L) load_layer(nxt, t + 1, 0); else load_layer(nxt, t, i + 1);
    // ---- the whole z: the residual update and this CTA's skip rows
    mbar_try_wait(bar[eb], (u32)((e >> 1) & 1));
    if (threadIdx.x == 0) mbar_arrive_expect(bar[eb ^ 1], (i + 1 == L ? SK : G2) * 4);
    e++;
    float* zc = zprev;
    ldx<ZCL>(zc, ex[eb], l);
    if (i + 1 == L) {  // the last layer's skip rows now: the head needs them
#pragma unroll
      for (int k = 0; k < SR; k++) sk[k] += dotv<WPV>(cur.s[k], zc, ZCL / WPV);
    }
    if (i + 1 < L) {
#pragma unroll
      for (int k = 0; k < RR; k++) {
        const int row = gi * RR + k;
        const float y = red8(dotv<WPV>(cur.r[k], zc, ZCL / WPV));
        if (l == 0) xs[xb ^ 1][row] = xs[xb][row] + y + cur.br[k];
      }
    }
    __syncthreads();
    xb ^= 1;
    if (++i < L) return;
    // ---- head: relu(skip) rows -> all, head1 rows -> all, logit rows -> all, then sampling
    eb = (u32)(e & 1);
#pragma unroll
    for (int k = 0; k < SR; k++) {
      const int row = rank * (SK / C) + gi * SR + k;
      const float h = fmaxf(red8(sk[k]) + bsk[k], 0.0f);
      sk[k] = 0.0f;
      for (int d = l; d < C; d += 8) st_async1(mapa(smem_addr(&ex[eb][row]), d), h, mapa(bar[eb], d));
    }
    mbar_try_wait(bar[eb], (u32)((e >> 1) & 1));
    if (threadIdx.x == 0) mbar_arrive_expect(bar[eb ^ 1], SK * 4);
    e++;
    float hc[HCL];
    ldx<HCL>(hc, ex[eb], l);
    eb ^= 1;
#pragma unroll
    for (int k = 0; k < SR; k++) {
      const int row = rank * (SK / C) + gi * SR + k;
      const float h = fmaxf(red8(dotv<WPV>(h1w[k], hc, HCL / WPV)) + bh1[k], 0.0f);
      for (int d = l; d < C; d += 8) st_async1(mapa(smem_addr(&ex[eb][row]), d), h, mapa(bar[eb], d));
    }
    mbar_try_wait(bar[eb], (u32)((e >> 1) & 1));
    if (threadIdx.x == 0) mbar_arrive_expect(bar[eb ^ 1], NC * 4);
    e++;
    ldx<HCL>(hc, ex[eb], l);
    eb ^= 1;
#pragma unroll
    for (int k = 0; k < H2R; k++) {
      const int row = rank * (NC / C) + gi * H2R + k;
      const float y = red8(dotv<WPV>(h2w[k], hc, HCL / WPV)) + bh2[k];
      for (int d = l; d < C; d += 8) st_async1(mapa(smem_addr(&ex[eb][row]), d), y, mapa(bar[eb], d));
    }
    mbar_try_wait(bar[eb], (u32)((e >> 1) & 1));
    if (threadIdx.x == 0) mbar_arrive_expect(bar[eb ^ 1], G2 * 4);
    e++;
    if (warp == 0) {  // sampling (every CTA draws the same class)
      const int cnt = sample_class(ex[eb], lane, u, inv_temp);
      if (lane == 0) {
        s_sample = cnt;
        if (rank == 0) out[(long long)b * n + t] = cnt;
      }
    }
    __syncthreads();
    const int smp = s_sample;
    for (int r = threadIdx.x; r < R; r += NT) xs[xb][r] = s_embed[smp * R + r];
    __syncthreads();
    i = 0;
    t++;
    if (!GREEDY && t < n) u = __ldg(uni + (long long)t * B + b);
  };

  run_layer_steps<LW>(load_layer, step, (long long)n * L);
  cluster_sync();
}
