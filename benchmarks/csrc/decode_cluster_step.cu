// A design probe for the transducer decoder's steps at 128 rows (benchmarks/decode_cluster_probe.py): the
// prediction network's LSTM layers, its output projection and the joint's output layer, every row through every
// phase in every step (the worst case: every row emits), with the weights resident in shared memory across the
// steps. Compiled after ../../speechkernels/wavenet/csrc/cluster_common.cuh.
//
// Layout: NCL clusters of CS CTAs (one per SM, 8 warps). Cluster c owns a range of every phase's output columns
// (UPC hidden units = 4 UPC gate rows of each LSTM layer, PPC projection columns, JPC joint columns; the last
// cluster's range masked past the end); CTA r of the cluster owns the r-th of CS ranges of K. Each CTA multiplies
// all N = 128 rows (8 warps x 16) by its weights slice (mma.sync m16n8k16, bfloat16 operands, float32 sums). A
// warp's operand A comes straight from L2 into registers, all of its K range at once (one round trip): a thread
// reads 16 bytes per row and 32 columns, and K is relabelled inside each 32 (thread t's columns 8t .. 8t + 7 are
// the fragment's 2t, 2t + 1, 2t + 8, 2t + 9 of two k-steps; the weights' fragments are read at the same places,
// so the sum is the same). Warp w's partial sums are rows 16 w .. 16 w + 15, which CTA w % CS of the cluster owns:
// warp w pushes them into that CTA's shared memory (one slot per source CTA), and after a cluster barrier the
// owner's threads sum the CS partials in rank order (deterministic) and finish the rows: the LSTM cell (the 4
// gates of a unit in one thread; c stays in that thread's registers across the steps), the projection's bias, or
// the joint's bias and each row's best column over the cluster's range (a packed key). One grid-wide barrier
// after each phase. Bytes per phase out of L2: each CTA reads its K range of the 128 rows' inputs (128 x KS x 2
// B), never the weights.
#define KS_L (2 * H / CS)     // an LSTM layer's K range per CTA (input then own output: 2H)
#define GR (4 * UPC)          // gate rows per cluster
#define NT_L (GR / 8)         // n-tiles of 8 per LSTM layer
#define KS_P (H / CS)         // the projection's K range per CTA
#define NT_P (PPC / 8)
#define KS_J (P / CS)         // the joint's K range per CTA
#define NT_J (JPC / 8)
// weights' row strides (bfloat16): 16 mod 32 words, so a quarter warp's 16-byte reads of two rows miss each other
#define PADW(k) ((k) + ((32 - (k) % 64) % 64 + 64) % 64)
#define WST_L PADW(KS_L)
#define WST_P PADW(KS_P)
#define WST_J PADW(KS_J)
#define NT_MAX NT_L
#define WPO (8 / CS)          // warps whose rows one CTA owns
#define KC_MAX (KS_L / 32)

typedef unsigned short bf16;  // bfloat16 bits
__device__ __forceinline__ float bf2f(bf16 x) { return __uint_as_float((u32)x << 16); }
__device__ __forceinline__ bf16 f2bf(float f) {  // round to nearest even (finite values)
  u32 u = __float_as_uint(f);
  return (bf16)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ u32 pack2(float lo, float hi) { return (u32)f2bf(lo) | ((u32)f2bf(hi) << 16); }

__device__ __forceinline__ void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void st_cluster_v4(u32 addr, float4 v) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1,%2,%3,%4};" ::"r"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}
__device__ __forceinline__ float sigm(float x) { return 0.5f * tanh_fast(0.5f * x) + 0.5f; }
__device__ __forceinline__ float4 add4(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }

// all CTAs of the grid: arrive on a monotonic counter (zeroed before the launch) and wait for the generation;
// BAR 0: every CTA's thread 0 arrives, BAR 1: one per cluster, between two cluster barriers. It also orders a
// phase's reads of its slots before the next phase's pushes into them.
__device__ __forceinline__ void grid_barrier(unsigned* counter, unsigned gen) {
#if BAR
  cluster_sync();
  if (threadIdx.x == 0 && cluster_rank() == 0) {
    __threadfence();
    atomicAdd(counter, 1u);
    while (*(volatile unsigned*)counter < gen * NCL) {}
    __threadfence();
  }
  cluster_sync();
#else
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1u);
    while (*(volatile unsigned*)counter < gen * NCL * CS) {}
    __threadfence();
  }
  __syncthreads();
#endif
}

template <int NT, int KC>
__device__ __forceinline__ void products(float (*acc)[4], const uint4 (*a)[2], const bf16* Ws, int wst) {
  int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
  for (int c = 0; c < KC; c++) {
#pragma unroll
    for (int j = 0; j < NT; j++) {
      uint4 b = *(const uint4*)(Ws + (j * 8 + g) * wst + 32 * c + 8 * t);
      mma16816(acc[j], a[c][0].x, a[c][1].x, a[c][0].y, a[c][1].y, b.x, b.y);
      mma16816(acc[j], a[c][0].z, a[c][1].z, a[c][0].w, a[c][1].w, b.z, b.w);
    }
  }
}

// every warp's partials into slot [rank][w / CS] of CTA w % CS (its own included)
template <int NT>
__device__ __forceinline__ void push(const float (*acc)[4], float4* slots, u32 rank) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  u32 base = mapa(smem_addr(slots), warp % CS);
  int slot = rank * WPO + warp / CS;
#pragma unroll
  for (int j = 0; j < NT; j++)
    st_cluster_v4(base + (u32)(((slot * NT_MAX + j) * 32 + lane) * 16), make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]));
}
// the sum over the CS sources, in rank order, of tile j of owned warp wi, lane
__device__ __forceinline__ float4 summed(const float4* slots, int wi, int j, int lane) {
  float4 v = slots[((0 * WPO + wi) * NT_MAX + j) * 32 + lane];
#pragma unroll
  for (int src = 1; src < CS; src++) v = add4(v, slots[((src * WPO + wi) * NT_MAX + j) * 32 + lane]);
  return v;
}

// weights: w_ih [L, 4H, H], w_hh [L, 4H, H], b [L, 4H] (b_ih + b_hh), emb [V, H], pw [P, H], pb [P], ow [VJ, P],
// ob [VJ]; enc [N, T, P] (the encoder's projection); h [2 (parity), L, N, H] bf16; g [N, P]; keys [N, NCL] u64;
// tokens [STEPS, N] int32 out; counter zeroed; prof: CTA 0's clock after each phase's products, sums and barrier
extern "C" __global__ void __launch_bounds__(256, 1)
decode_cluster_step(const bf16* __restrict__ w_ih, const bf16* __restrict__ w_hh, const float* __restrict__ b,
                    const bf16* __restrict__ emb, const bf16* __restrict__ pw, const float* __restrict__ pb,
                    const bf16* __restrict__ ow, const float* __restrict__ ob, const bf16* __restrict__ enc,
                    bf16* h, bf16* g, unsigned long long* keys, int* tokens, unsigned* counter, int steps,
                    unsigned long long* prof) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Wl = (bf16*)smem;                          // [L][GR][WST_L]
  bf16* Wp = Wl + L * GR * WST_L;                  // [PPC][WST_P]
  bf16* Wj = Wp + PPC * WST_P;                     // [JPC][WST_J]
  float4* slots = (float4*)(Wj + JPC * WST_J);     // [CS][WPO][NT_MAX][32] float4
  int* tok_s = (int*)(slots + CS * WPO * NT_MAX * 32);  // [N]

  const u32 rank = cluster_rank();
  const int cl = blockIdx.x / CS;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, tq = lane & 3;
  const int r0 = 16 * warp + gq;  // this thread's A rows: r0, r0 + 8

  for (int l = 0; l < L; l++)
    for (int i = tid; i < GR * KS_L; i += blockDim.x) {
      int q = i / KS_L, k = i % KS_L;
      int unit = cl * UPC + q % UPC, grow = (q / UPC) * H + unit, kk = rank * KS_L + k;
      bf16 v = unit >= H ? (bf16)0
               : kk < H  ? w_ih[((size_t)l * 4 * H + grow) * H + kk]
                         : w_hh[((size_t)l * 4 * H + grow) * H + kk - H];
      Wl[(l * GR + q) * WST_L + k] = v;
    }
  for (int i = tid; i < PPC * KS_P; i += blockDim.x) {
    int q = i / KS_P, k = i % KS_P;
    Wp[q * WST_P + k] = cl * PPC + q < P ? pw[(size_t)(cl * PPC + q) * H + rank * KS_P + k] : (bf16)0;
  }
  for (int i = tid; i < JPC * KS_J; i += blockDim.x) {
    int q = i / KS_J, k = i % KS_J, col = cl * JPC + q;
    Wj[q * WST_J + k] = col < VJ ? ow[(size_t)col * P + rank * KS_J + k] : (bf16)0;
  }
  for (int i = tid; i < N; i += blockDim.x) tok_s[i] = BLANK;
  // the cells' owner threads: tid < 2 * 3 * 32 with UPC 24 (WPO owned warps x UPC / 8 unit tiles x lanes)
  const int c_wi = tid / (32 * (UPC / 8)), c_jj = (tid / 32) % (UPC / 8);
  const bool c_owner = tid < WPO * (UPC / 8) * 32;
  const int c_row = 16 * (c_wi * CS + rank) + gq, c_unit = cl * UPC + 8 * c_jj + 2 * tq;
  float cst[L][4];
#pragma unroll
  for (int l = 0; l < L; l++) cst[l][0] = cst[l][1] = cst[l][2] = cst[l][3] = 0.f;
  cluster_sync();

  unsigned gen = 0;
  int n_stamp = 0;
  auto stamp = [&]() {
    if (prof != nullptr && blockIdx.x == 0 && tid == 0) {
      unsigned long long tm;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(tm));
      prof[n_stamp] = tm;
    }
    n_stamp++;
  };
  stamp();
  float acc[NT_MAX][4];
  uint4 a[KC_MAX][2];
  for (int step = 0; step < steps; step++) {
    const int par = step & 1;
    const bf16* h_old = h + (size_t)par * L * N * H;
    bf16* h_new = h + (size_t)(par ^ 1) * L * N * H;
    // ---- LSTM layers
#pragma unroll
    for (int l = 0; l < L; l++) {
#pragma unroll
      for (int c = 0; c < KS_L / 32; c++) {
        int kk = rank * KS_L + 32 * c + 8 * tq;  // a chunk is all input or all own output (H % 32 == 0)
#pragma unroll
        for (int r = 0; r < 2; r++) {
          int row = r0 + 8 * r;
          const bf16* src = kk < H ? (l == 0 ? emb + (size_t)tok_s[row] * H + kk : h_new + ((size_t)(l - 1) * N + row) * H + kk)
                                   : h_old + ((size_t)l * N + row) * H + kk - H;
          a[c][r] = __ldcg((const uint4*)src);
        }
      }
      products<NT_L, KS_L / 32>(acc, a, Wl + l * GR * WST_L, WST_L);
      stamp();
      push<NT_L>(acc, slots, rank);
      cluster_sync();
      if (c_owner) {
        // gate tiles: i at c_jj, f at UPC / 8 + c_jj, g, o; components (row, unit): (g, 2t), (g, 2t + 1), (g + 8, ..)
        float4 gi = summed(slots, c_wi, c_jj, lane), gf = summed(slots, c_wi, UPC / 8 + c_jj, lane);
        float4 gg = summed(slots, c_wi, 2 * (UPC / 8) + c_jj, lane), go = summed(slots, c_wi, 3 * (UPC / 8) + c_jj, lane);
        const float* bl = b + (size_t)l * 4 * H + min(c_unit, H - 2);
        float2 bi = __ldg((const float2*)bl), bf = __ldg((const float2*)(bl + H));
        float2 bg = __ldg((const float2*)(bl + 2 * H)), bo = __ldg((const float2*)(bl + 3 * H));
        float vi[4] = {gi.x + bi.x, gi.y + bi.y, gi.z + bi.x, gi.w + bi.y};
        float vf[4] = {gf.x + bf.x, gf.y + bf.y, gf.z + bf.x, gf.w + bf.y};
        float vg[4] = {gg.x + bg.x, gg.y + bg.y, gg.z + bg.x, gg.w + bg.y};
        float vo[4] = {go.x + bo.x, go.y + bo.y, go.z + bo.x, go.w + bo.y};
        float hv[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
          float c = sigm(vf[i]) * cst[l][i] + sigm(vi[i]) * tanh_fast(vg[i]);
          cst[l][i] = c;
          hv[i] = sigm(vo[i]) * tanh_fast(c);
        }
        if (c_unit < H) {  // H is even: a pair is in or out together
          *(u32*)(h_new + ((size_t)l * N + c_row) * H + c_unit) = pack2(hv[0], hv[1]);
          *(u32*)(h_new + ((size_t)l * N + c_row + 8) * H + c_unit) = pack2(hv[2], hv[3]);
        }
      }
      stamp();
      grid_barrier(counter, ++gen);
      stamp();
    }
    // ---- projection g = h_L @ pw^T + pb
#pragma unroll
    for (int c = 0; c < KS_P / 32; c++)
#pragma unroll
      for (int r = 0; r < 2; r++)
        a[c][r] = __ldcg((const uint4*)(h_new + ((size_t)(L - 1) * N + r0 + 8 * r) * H + rank * KS_P + 32 * c + 8 * tq));
    products<NT_P, KS_P / 32>(acc, a, Wp, WST_P);
    stamp();
    push<NT_P>(acc, slots, rank);
    cluster_sync();
    if (tid < WPO * NT_P * 32) {
      int wi = tid / (32 * NT_P), j = (tid / 32) % NT_P;
      float4 v = summed(slots, wi, j, lane);
      int col = cl * PPC + 8 * j + 2 * tq, row = 16 * (wi * CS + rank) + gq;
      if (col < P) {
        float2 bb = __ldg((const float2*)(pb + col));
        *(u32*)(g + (size_t)row * P + col) = pack2(v.x + bb.x, v.y + bb.y);
        *(u32*)(g + (size_t)(row + 8) * P + col) = pack2(v.z + bb.x, v.w + bb.y);
      }
    }
    stamp();
    grid_barrier(counter, ++gen);
    stamp();
    // ---- joint: relu(enc[t] + g) @ ow^T + ob, each row's best column of the cluster's range
#pragma unroll
    for (int c = 0; c < KS_J / 32; c++)
#pragma unroll
      for (int r = 0; r < 2; r++) {
        int row = r0 + 8 * r, k = rank * KS_J + 32 * c + 8 * tq;
        uint4 e = __ldcg((const uint4*)(enc + ((size_t)row * T + step % T) * P + k));
        uint4 q = __ldcg((const uint4*)(g + (size_t)row * P + k));
        const bf16* ep = (const bf16*)&e;
        const bf16* qp = (const bf16*)&q;
        bf16 o[8];
#pragma unroll
        for (int j = 0; j < 8; j++) o[j] = f2bf(fmaxf(bf2f(ep[j]) + bf2f(qp[j]), 0.f));
        a[c][r] = *(uint4*)o;
      }
    products<NT_J, KS_J / 32>(acc, a, Wj, WST_J);
    stamp();
    push<NT_J>(acc, slots, rank);
    cluster_sync();
    if (tid < WPO * 32) {
      int wi = tid / 32;
      unsigned long long best[2] = {0, 0};
#pragma unroll
      for (int j = 0; j < NT_J; j++) {
        float4 v = summed(slots, wi, j, lane);
        float vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
          int col = cl * JPC + 8 * j + 2 * tq + (i & 1);
          if (col < VJ) {
            u32 bits = __float_as_uint(vv[i] + __ldg(ob + col));
            bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
            unsigned long long key = ((unsigned long long)bits << 32) | (u32)(0xFFFFFFFFu - col);
            best[i >> 1] = key > best[i >> 1] ? key : best[i >> 1];
          }
        }
      }
#pragma unroll
      for (int r2 = 0; r2 < 2; r2++) {
        unsigned long long bk = best[r2];
        bk = max(bk, __shfl_xor_sync(0xffffffffu, bk, 1));
        bk = max(bk, __shfl_xor_sync(0xffffffffu, bk, 2));
        if (tq == 0) keys[(size_t)(16 * (wi * CS + rank) + gq + 8 * r2) * NCL + cl] = bk;
      }
    }
    stamp();
    grid_barrier(counter, ++gen);
    stamp();
    // ---- decision (every CTA, for the embedding rows of the next step)
    for (int row = tid; row < N; row += blockDim.x) {
      unsigned long long best = 0;
      unsigned long long k[NCL];
#pragma unroll
      for (int c = 0; c < NCL; c++) k[c] = __ldcg(keys + (size_t)row * NCL + c);
#pragma unroll
      for (int c = 0; c < NCL; c++) best = max(best, k[c]);
      int col = (int)(0xFFFFFFFFu - (u32)best);
      tok_s[row] = col % V;
      if (blockIdx.x == 0) tokens[(size_t)step * N + row] = col;
    }
    __syncthreads();
  }
}
