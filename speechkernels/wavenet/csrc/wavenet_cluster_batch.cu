// MS streams per cluster of C CTAs (wavenet_cluster.cu carries one): every layer is a small matrix product, the
// weights held in registers once and applied to the MS streams' vectors from shared memory, so that the per-layer
// exchange latency is paid once per group of streams instead of once per stream.
//
// Work of a CTA per layer and stream: its ZC gate units (4 rows each: tanh/sigmoid of the current and the past
// input, R columns), the whole residual update (R x G2: every CTA needs the whole next input, so no second
// exchange) and its SK / C skip rows (G2 columns, summed un-reduced per lane until the head). A group of 8 lanes
// splits the columns of a row; the 8 lanes' partial sums of up to 8 streams are reduced with 7 shuffles
// (reduce-scatter: lane l ends with stream l's sum) instead of 3 per stream.
// Exchanges: a CTA's slice of a vector (z: ZC values; relu(skip), head1, logits: SK / C or NC / C rows) per stream
// is staged in shared memory, then sent to every CTA of the cluster in 16-byte st.async chunks that complete the
// bytes on the receivers' mbarrier. Two exchange buffers: a CTA sends the next vector only after it has read the
// last one, so the buffer a peer writes next is never one still being read. Skip rows are summed with the residual
// update, when z arrives (measured faster than leaving them to the next layer's wait: benchmarks/notes/wavenet.md).
// Serving: the queue ring is indexed by a time shared by all streams (tq0 + t), the conditioning frame by each
// stream's own phase (phase[b] + t) / hop; the input before the first sample of the launch is prev[b], and a stream's
// queue is row qslot[b] of the queue tensor (streams join and leave between launches).
#define EXS EXW  // a stream's stride in an exchange buffer
// strides of a stream in the staging buffer (>= ZC) and in the inputs, padded by 4 floats: the lanes that write
// one row of 8 streams then hit different banks
#define LOCW ((SK / C > NC / C ? SK / C : NC / C) + 4)
#define XST (R + 4)
#define FULL 0xffffffffu

__device__ __forceinline__ void st_async4(u32 addr, float4 v, u32 bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];"
               :: "r"(addr), "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(__float_as_uint(v.z)),
                  "r"(__float_as_uint(v.w)), "r"(bar) : "memory");
}

// Streams go in blocks of up to 8: block k holds streams [8 k, 8 k + bsz(k)); its sums are spread over the 8 lanes of
// a group as over P = bsz rounded up to a power of two streams, lane l holding stream (l & (P - 1)) of the block.
#define NBLK ((MS + 7) / 8)
__device__ __forceinline__ constexpr int bsz(int k) { return MS - 8 * k < 8 ? MS - 8 * k : 8; }
__device__ __forceinline__ constexpr int pow2up(int n) { return n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8; }

// v[s]: this lane's partial sums of n streams (n <= 8, known at compile time once inlined); returns the sum over
// the 8 lanes of its group of stream (l & (pow2up(n) - 1)): a round halves the values a lane keeps while there are
// more of them than the rounds left can split (with n not a power of two, the missing streams count as zeros)
__device__ __forceinline__ float red_scatter(const float* v, int n, int l) {
  float a[8];
#pragma unroll
  for (int k = 0; k < 8; k++) a[k] = k < n ? v[k] : 0.0f;
  int p = pow2up(n);
#pragma unroll
  for (int o = 4; o >= 1; o >>= 1) {
    if (p == 2 * o) {
      const bool hi = (l & o) != 0;
#pragma unroll
      for (int k = 0; k < o; k++) {
        const float send = hi ? a[k] : a[k + o], keep = hi ? a[k + o] : a[k];
        a[k] = keep + __shfl_xor_sync(FULL, send, o);
      }
      p = o;
    } else {
#pragma unroll
      for (int k = 0; k < 8; k++)
        if (k < p) a[k] += __shfl_xor_sync(FULL, a[k], o);
    }
  }
  return a[0];
}

// NR rows of this lane's group (row gi NR + r) from the lanes' partial sums acc[r][m] of every stream m: reduced
// over the group, plus bias (relu with RELU), staged in loc for the exchange
template <int NR, bool RELU>
__device__ __forceinline__ void stage_rows(const float (&acc)[NR][MS], const float* bias, float* loc, int gi, int l) {
#pragma unroll
  for (int k = 0; k < NBLK; k++)
#pragma unroll
    for (int r = 0; r < NR; r++) {
      const float y = red_scatter(acc[r] + 8 * k, bsz(k), l) + bias[r];
      if (l < bsz(k)) loc[(8 * k + l) * LOCW + gi * NR + r] = RELU ? fmaxf(y, 0.0f) : y;
    }
}

// this lane's partial sums of NR rows (w: its N columns of each) times every stream's vector in v: acc[r][m], or
// added to it with ADD
template <int N, int NR, bool ADD>
__device__ __forceinline__ void rows_times_streams(float (&acc)[NR][MS], const wv (&w)[NR][N / WPV], const float* v,
                                                   int l) {
#pragma unroll
  for (int m = 0; m < MS; m++) {
    float c[N];
    ldx<N>(c, v + m * EXS, l);
#pragma unroll
    for (int r = 0; r < NR; r++) {
      const float d = dotv<WPV>(w[r], c, N / WPV);
      acc[r][m] = ADD ? acc[r][m] + d : d;
    }
  }
}

// NR head rows of this lane's group (w: the CTA's rows, row gi NR + r) applied to every stream's vector in hv, plus
// bias (relu with RELU), staged in loc for the exchange
template <int NR, bool RELU>
__device__ __forceinline__ void head_rows(const wtype* w, const float* bias, const float* hv, float* loc, int gi,
                                          int l) {
  wv hw[NR][HCL / WPV];
#pragma unroll
  for (int r = 0; r < NR; r++) ldws(hw[r], w + (gi * NR + r) * SK + LOFF(HCL), HCL / WPV);
  float acc[NR][MS];
  rows_times_streams<HCL, NR, false>(acc, hw, hv, l);
  stage_rows<NR, RELU>(acc, bias, loc, gi, l);
}

// one layer's weights of this lane: its gate row, residual rows and skip rows, and its streams' step terms
struct LW {
  wv g[RCL / WPV];
  wv r[RR][ZCL / WPV];
  wv s[SR][ZCL / WPV];
  float br[RR];
  float cb[NBLK];  // conditioning + bias of the gate row, per block (groups 0 and 1; lane l: stream l of the block)
  float q[NBLK];   // the queued past product of this step (groups 2 and 3)
  int slot;      // its place in the queue (the same for every stream)
};

extern "C" __global__ void __launch_bounds__(NT, 1)
wavenet_cluster_batch(VOCODER_KERNEL_INPUTS,
                      const long long* __restrict__ prev,  // [B]: the input class before the first sample
                      const int* __restrict__ phase,  // [B]: a stream's sample index at t = 0 (its frame's clock)
                      const int* __restrict__ qslot,  // [B]: a stream's row of the queue
                      long long* __restrict__ out,  // [B][n]
                      int B, int L, int F, int Q, int hop, int n, int tq0, float inv_temp) {
  extern __shared__ __align__(16) float smem[];
  float* s_embed = smem;             // [NC][R]: the next sample's input without a trip to L2
  float* ex = s_embed + NC * R;      // [2][MS][EXS]
  float* xs = ex + 2 * MS * EXS;     // [2][MS][XST]
  float* loc = xs + 2 * MS * XST;      // [MS][LOCW]: this CTA's slice of the vector to exchange
  wtype* s_head = (wtype*)(loc + MS * LOCW);  // [SK / C + NC / C][SK]: this CTA's rows of head1 and the logits
  __shared__ __align__(8) u64 bars[2];
  __shared__ int s_sample[MS];
  __shared__ int s_dil[MAXL], s_qoff[MAXL];
  const u32 rank = cluster_rank();
  const int cl = blockIdx.x / C;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = lane >> 3, l = lane & 7;
  const int gi = warp * 4 + grp;
  const int j = rank * ZC + warp;
  int ls[NBLK];  // the stream of each block whose reduced sums this lane holds (within the cluster's MS)
#pragma unroll
  for (int k = 0; k < NBLK; k++) ls[k] = min(8 * k + (l & (pow2up(bsz(k)) - 1)), MS - 1);
  const u32 bar[2] = {smem_addr(&bars[0]), smem_addr(&bars[1])};
  float* qb = queue + (long long)rank * Q * NW * 2 + warp * 2 + (grp & 1);  // + qslot C Q NW 2: a stream's
  init_exchange_bars(bar);
  for (int i = threadIdx.x; i < NC * R; i += NT) s_embed[i] = embed[i];
  // this CTA's head rows (SK / C of head1, then NC / C of the logits)
  for (int i = threadIdx.x; i < (SK / C) * SK; i += NT) s_head[i] = w1[(long long)rank * (SK / C) * SK + i];
  for (int i = threadIdx.x; i < (NC / C) * SK; i += NT)
    s_head[(SK / C) * SK + i] = w2[(long long)rank * (NC / C) * SK + i];
  load_dilations(s_dil, s_qoff, dil, qoff, L);
  __syncthreads();
  for (int i = threadIdx.x; i < MS * R; i += NT) {
    const int bg = min(cl * MS + i / R, B - 1);
    xs[(i / R) * XST + i % R] = s_embed[(int)prev[bg] * R + i % R];
  }
  int ph[NBLK];  // the phase of this lane's stream in each block
  long long qo[NBLK];  // its queue's offset
  bool own[NBLK];  // whether the lane writes that queue: a stream of B (the last cluster's spare ones repeat B - 1)
#pragma unroll
  for (int k = 0; k < NBLK; k++) {
    const int bg = min(cl * MS + ls[k], B - 1);
    ph[k] = phase[bg];
    qo[k] = (long long)qslot[bg] * C * Q * NW * 2;
    own[k] = l < bsz(k) && cl * MS + 8 * k + l < B;
  }
  float bsk[SR], bh1[SR], bh2[H2R];
  load_head_biases(bsk, bh1, bh2, bs, b1, b2, rank, gi);
  cluster_sync();
  if (threadIdx.x == 0) mbar_arrive_expect(bar[0], MS * G2 * 4);  // event 0: layer 0's z


  auto load_layer = [&](LW& w, int t, int i) {
    load_layer_weights(w, wg, wr, br, ws, i, rank, warp, grp, gi, l);
    w.slot = (s_qoff[i] + (int)((unsigned)(tq0 + t) % (unsigned)s_dil[i])) * NW * 2;
#pragma unroll
    for (int k = 0; k < NBLK; k++) {
      const int m = ls[k];
      const int bg = min(cl * MS + m, B - 1);
      const int frame = min((ph[k] + t) / hop, F - 1);
      w.cb[k] = (grp < 2) ? __ldg(cb + (((long long)bg * F + frame) * L + i) * 2 * G2 + grp * G2 + j) : 0.0f;
      w.q[k] = (grp >= 2 && t < n) ? qb[qo[k] + w.slot] : 0.0f;
    }
  };
  // this CTA's slice (W values per stream in loc) to every CTA's exchange buffer eb at offset rank W
  auto send = [&](int W, u32 eb) {
    __syncthreads();
    const int chunks = W / 4, total = MS * chunks * C;
    for (int k = threadIdx.x; k < total; k += NT) {
      const int d = k % C, h = (k / C) % chunks, m = k / (C * chunks);
      const float4 v = *(const float4*)&loc[m * LOCW + 4 * h];
      st_async4(mapa(smem_addr(&ex[(eb * MS + m) * EXS + rank * W + 4 * h]), d), v, mapa(bar[eb], d));
    }
  };
  // the uniforms of this warp's streams (m = warp + NW c), read one sample ahead
  float uu[(MS + NW - 1) / NW];
  auto load_uniforms = [&](int t) {
#pragma unroll
    for (int c = 0; c < (MS + NW - 1) / NW; c++) {
      const int bg = min(cl * MS + warp + NW * c, B - 1);
      uu[c] = (GREEDY || t >= n) ? 0.0f : __ldg(uni + (long long)t * B + bg);
    }
  };
  load_uniforms(0);
  long long e = 0;  // exchange events so far: L per sample (z), then relu(skip), head1, logits
  int xb = 0, t = 0, i = 0;
  float sk[SR][MS];
#pragma unroll
  for (int k = 0; k < SR; k++)
#pragma unroll
    for (int m = 0; m < MS; m++) sk[k][m] = 0.0f;
  auto wait = [&](u32 eb, int next_bytes) {
    mbar_try_wait(bar[eb], (u32)((e >> 1) & 1));
    if (threadIdx.x == 0) mbar_arrive_expect(bar[eb ^ 1], next_bytes);
    e++;
  };

  auto step = [&](LW& cur, LW& nxt) {
    const u32 eb = (u32)(e & 1);
    const float* xv = xs + xb * MS * XST;
    // ---- gate unit j of layer i for every stream, z staged in loc
    float pa[MS];
#pragma unroll
    for (int m = 0; m < MS; m++) pa[m] = dotv<CSTEP>(cur.g, xv + m * XST + LOFF(RCL), RCL / WPV);
    float ar[NBLK];
#pragma unroll
    for (int k = 0; k < NBLK; k++) ar[k] = red_scatter(pa + 8 * k, bsz(k), l);
#pragma unroll
    for (int k = 0; k < NBLK; k++) {
      const float a = ar[k];
      const float a_s = __shfl_sync(FULL, a, (lane + 8) & 31);
      const float q_t = __shfl_sync(FULL, cur.q[k], (lane + 16) & 31);
      const float q_s = __shfl_sync(FULL, cur.q[k], (lane + 24) & 31);
      const float cb_s = __shfl_sync(FULL, cur.cb[k], (lane + 8) & 31);
      if (grp == 0 && l < bsz(k)) {
        const float at = a + q_t + cur.cb[k], as = a_s + q_s + cb_s;
        loc[(8 * k + l) * LOCW + warp] = (1.0f - 2.0f / (expf(2.0f * at) + 1.0f)) * sigm(as);
      }
      if (grp >= 2 && own[k]) qb[qo[k] + cur.slot] = a;
    }
    send(ZC, eb);
    // the next layer's weights into nxt while z travels
    if (i + 1 == L) load_layer(nxt, t + 1, 0); else load_layer(nxt, t, i + 1);
    // ---- the whole z of every stream: the skip rows and the residual update (none after the last layer)
    wait(eb, (i + 1 == L ? SK : G2) * MS * 4);
    const float* zv = ex + eb * MS * EXS;
    float* xn = xs + (xb ^ 1) * MS * XST;
    float acc[RR][MS];
    rows_times_streams<ZCL, SR, true>(sk, cur.s, zv, l);
    rows_times_streams<ZCL, RR, false>(acc, cur.r, zv, l);
    if (i + 1 < L) {
#pragma unroll
      for (int k = 0; k < NBLK; k++)
#pragma unroll
        for (int r = 0; r < RR; r++) {
          const float y = red_scatter(acc[r] + 8 * k, bsz(k), l);
          const int row = gi * RR + r, m = 8 * k + l;
          if (l < bsz(k)) xn[m * XST + row] = xv[m * XST + row] + y + cur.br[r];
        }
    }
    __syncthreads();
    xb ^= 1;
    if (++i < L) return;
    // ---- head: relu(skip) rows -> all, head1 rows -> all, logit rows -> all, then sampling
    u32 hb = (u32)(e & 1);
    stage_rows<SR, true>(sk, bsk, loc, gi, l);
#pragma unroll
    for (int r = 0; r < SR; r++)
#pragma unroll
      for (int m = 0; m < MS; m++) sk[r][m] = 0.0f;
    send(SK / C, hb);
    wait(hb, SK * MS * 4);
    const float* hv = ex + hb * MS * EXS;
    hb ^= 1;
    head_rows<SR, true>(s_head, bh1, hv, loc, gi, l);
    send(SK / C, hb);
    wait(hb, NC * MS * 4);
    hv = ex + hb * MS * EXS;
    hb ^= 1;
    head_rows<H2R, false>(s_head + (SK / C) * SK, bh2, hv, loc, gi, l);
    send(NC / C, hb);
    wait(hb, G2 * MS * 4);
    const float* lv = ex + hb * MS * EXS;
#pragma unroll
    for (int c = 0; c < (MS + NW - 1) / NW; c++) {  // sampling: a warp per stream
      const int m = warp + NW * c;
      if (m >= MS) break;
      const int smp = sample_class(lv + m * EXS, lane, uu[c], inv_temp);
      if (lane == 0) {
        s_sample[m] = smp;
        if (rank == 0 && cl * MS + m < B) out[(long long)(cl * MS + m) * n + t] = smp;
      }
    }
    __syncthreads();
    float* x0 = xs + xb * MS * XST;
    for (int k = threadIdx.x; k < MS * R; k += NT) x0[(k / R) * XST + k % R] = s_embed[s_sample[k / R] * R + k % R];
    __syncthreads();
    i = 0;
    t++;
    load_uniforms(t);
  };

  run_layer_steps<LW>(load_layer, step, (long long)n * L);
  cluster_sync();
}
