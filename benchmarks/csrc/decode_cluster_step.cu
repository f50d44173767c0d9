// A design probe for the transducer decoder's steps at 128 rows (benchmarks/decode_cluster_probe.py): the
// prediction network's LSTM layers, its output projection and the joint's output layer, every row through every
// phase in every step (the worst case: every row emits), with the weights resident in shared memory across the
// steps. Compiled after ../../speechkernels/wavenet/csrc/cluster_common.cuh.
//
// Layout: NCL clusters of CS CTAs (one per SM, 8 warps). Cluster c owns a range of every phase's output columns
// (UPC hidden units = 4 UPC gate rows of each LSTM layer, PPC projection columns, JPC joint columns; the last
// cluster's range masked past the end); CTA r of the cluster owns the r-th of CS ranges of K. Each CTA multiplies
// all N = 128 rows (8 warps x 16) by its weights slice (mma.sync m16n8k16, bfloat16 operands, float32 sums). Warp
// w's partial sums are rows 16 w .. 16 w + 15, which CTA w % CS of the cluster owns: warp w pushes them into that
// CTA's shared memory (one slot per source CTA), and after a cluster barrier warp w of the owner sums the CS
// partials in rank order (deterministic) and finishes its 16 rows: the LSTM cell (the 4 gates of a unit fall in
// one thread; c stays in registers across the steps), the projection's bias, or the joint's bias and each row's
// best column over the cluster's range (a packed key). One grid-wide barrier after each phase. Bytes per phase
// out of L2: each CTA reads its K range of the 128 rows' inputs (128 x KS x 2 B), never the weights.
#define KS_L (2 * H / CS)     // an LSTM layer's K range per CTA (input then own output: 2H)
#define GR (4 * UPC)          // gate rows per cluster
#define NT_L (GR / 8)         // n-tiles of 8 per LSTM layer
#define KS_P (H / CS)         // the projection's K range per CTA
#define NT_P (PPC / 8)
#define KS_J (P / CS)         // the joint's K range per CTA
#define NT_J (JPC / 8)
#define HALF 80               // the A operand is staged 80 columns at a time
#define AST (HALF + 8)        // its row stride (bfloat16), bank-conflict free for the fragments' loads
#define WST_L (KS_L + 8)
#define WST_P (KS_P + 8)
#define WST_J (KS_J + 8)
#define NT_MAX NT_L
#define WPO (8 / CS)         // warps per owner CTA

typedef unsigned short bf16;  // bfloat16 bits
__device__ __forceinline__ float bf2f(bf16 x) { return __uint_as_float((u32)x << 16); }
__device__ __forceinline__ bf16 f2bf(float f) {  // round to nearest even (finite values)
  u32 u = __float_as_uint(f);
  return (bf16)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ u32 pack2(float lo, float hi) { return (u32)f2bf(lo) | ((u32)f2bf(hi) << 16); }

__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void st_cluster_v4(u32 addr, float4 v) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1,%2,%3,%4};" ::"r"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}
__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + __expf(-x)); }

// all CTAs of the grid (called right after a cluster barrier): arrive on a monotonic counter (zeroed before the
// launch) and wait for the generation; BAR 0: every CTA's thread 0 arrives, BAR 1: one per cluster, then a cluster
// barrier
__device__ __forceinline__ void grid_barrier(unsigned* counter, unsigned gen) {
#if BAR
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

// A [128, HALF] from rows of a source (row stride ld elements), columns k0 .. k0 + HALF, read past L1 (other CTAs
// wrote them); with RELU_ENC the joint's input relu(enc[row, t] + g[row]) instead
__device__ __forceinline__ void stage(bf16* As, const bf16* src, int ld, int k0, const int* rows_idx) {
  for (int i = threadIdx.x; i < N * (HALF / 8); i += blockDim.x) {
    int row = i / (HALF / 8), ch = i % (HALF / 8);
    int srow = rows_idx ? rows_idx[row] : row;
    uint4 v = __ldcg((const uint4*)(src + (size_t)srow * ld + k0 + ch * 8));
    *(uint4*)(As + row * AST + ch * 8) = v;
  }
}
__device__ __forceinline__ void stage_joint(bf16* As, const bf16* enc, const bf16* g, int t, int k0) {
  for (int i = threadIdx.x; i < N * (HALF / 8); i += blockDim.x) {
    int row = i / (HALF / 8), ch = i % (HALF / 8);
    uint4 e = __ldcg((const uint4*)(enc + ((size_t)row * T + t) * P + k0 + ch * 8));
    uint4 q = __ldcg((const uint4*)(g + (size_t)row * P + k0 + ch * 8));
    const bf16* ep = (const bf16*)&e;
    const bf16* qp = (const bf16*)&q;
    bf16 o[8];
#pragma unroll
    for (int j = 0; j < 8; j++) o[j] = f2bf(fmaxf(bf2f(ep[j]) + bf2f(qp[j]), 0.f));
    *(uint4*)(As + row * AST + ch * 8) = *(uint4*)o;
  }
}

// acc[NT][4] += As (this warp's 16 rows, HALF columns) @ Ws[n-tiles][kw0 .. kw0 + HALF]^T
template <int NT>
__device__ __forceinline__ void mma_half(float (*acc)[4], const bf16* As, const bf16* Ws, int wst, int kw0) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const bf16* a_base = As + (warp * 16 + g) * AST + 2 * t;
#pragma unroll
  for (int k = 0; k < HALF; k += 16) {
    u32 a[4];
    a[0] = *(const u32*)(a_base + k);
    a[1] = *(const u32*)(a_base + 8 * AST + k);
    a[2] = *(const u32*)(a_base + k + 8);
    a[3] = *(const u32*)(a_base + 8 * AST + k + 8);
#pragma unroll
    for (int j = 0; j < NT; j++) {
      const bf16* b = Ws + (j * 8 + g) * wst + kw0 + k + 2 * t;
      mma16816(acc[j], a, *(const u32*)b, *(const u32*)(b + 8));
    }
  }
}

// warp w's partials to CTA w's slot of this CTA; then (after the cluster barrier) warp `rank` sums them in rank
// order into acc
template <int NT>
__device__ __forceinline__ void push(float (*acc)[4], float4* slots, u32 rank) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  u32 owner = warp % CS;
  if (owner == rank) return;
  int slot = (rank < owner ? rank : rank - 1) * WPO + warp / CS;
  u32 base = mapa(smem_addr(slots), owner);
#pragma unroll
  for (int j = 0; j < NT; j++)
    st_cluster_v4(base + (u32)(((slot * NT_MAX + j) * 32 + lane) * 16), make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]));
}
template <int NT>
__device__ __forceinline__ void reduce(float (*acc)[4], const float4* slots, u32 rank) {
  int lane = threadIdx.x & 31, wi = (threadIdx.x >> 5) / CS;
  float s[NT][4];
#pragma unroll
  for (int j = 0; j < NT; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
  for (int src = 0; src < CS; src++) {
#pragma unroll
    for (int j = 0; j < NT; j++) {
      float4 v;
      if ((u32)src == rank) v = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
      else v = slots[(((src < (int)rank ? src : src - 1) * WPO + wi) * NT_MAX + j) * 32 + lane];
      s[j][0] += v.x; s[j][1] += v.y; s[j][2] += v.z; s[j][3] += v.w;
    }
  }
#pragma unroll
  for (int j = 0; j < NT; j++) { acc[j][0] = s[j][0]; acc[j][1] = s[j][1]; acc[j][2] = s[j][2]; acc[j][3] = s[j][3]; }
}
template <int NT>
__device__ __forceinline__ void zero(float (*acc)[4]) {
#pragma unroll
  for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
}

// weights: w_ih [L, 4H, H], w_hh [L, 4H, H], b [L, 4H] (b_ih + b_hh), emb [V, H], pw [P, H], pb [P], ow [VJ, P],
// ob [VJ]; enc [N, T, P] (the encoder's projection); h [2 (parity), L, N, H] bf16; g [N, P]; keys [N, NCL] u64;
// tokens [STEPS, N] int32 out; counter zeroed
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
  bf16* As = Wj + JPC * WST_J;                     // [N][AST]
  float4* slots = (float4*)(As + N * AST);         // [CS - 1][WPO][NT_MAX][32] float4
  int* tok_s = (int*)(slots + (CS - 1) * WPO * NT_MAX * 32);  // [N]

  const u32 rank = cluster_rank();
  const int cl = blockIdx.x / CS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;

  // the weights' slices, once
  for (int l = 0; l < L; l++)
    for (int i = threadIdx.x; i < GR * KS_L; i += blockDim.x) {
      int q = i / KS_L, k = i % KS_L;
      int unit = cl * UPC + q % UPC, grow = (q / UPC) * H + unit, kk = rank * KS_L + k;
      bf16 v = unit >= H ? (bf16)0
               : kk < H  ? w_ih[((size_t)l * 4 * H + grow) * H + kk]
                         : w_hh[((size_t)l * 4 * H + grow) * H + kk - H];
      Wl[(l * GR + q) * WST_L + k] = v;
    }
  for (int i = threadIdx.x; i < PPC * KS_P; i += blockDim.x) {
    int q = i / KS_P, k = i % KS_P;
    Wp[q * WST_P + k] = cl * PPC + q < P ? pw[(size_t)(cl * PPC + q) * H + rank * KS_P + k] : (bf16)0;
  }
  for (int i = threadIdx.x; i < JPC * KS_J; i += blockDim.x) {
    int q = i / KS_J, k = i % KS_J, col = cl * JPC + q;
    Wj[q * WST_J + k] = col < VJ ? ow[(size_t)col * P + rank * KS_J + k] : (bf16)0;
  }
  for (int i = threadIdx.x; i < N; i += blockDim.x) tok_s[i] = BLANK;
  float cst[L][NT_L / 4][4];  // this thread's cells (warp `rank` only): [layer][unit pair jj][e + 2 * (row half)]
#pragma unroll
  for (int l = 0; l < L; l++)
#pragma unroll
    for (int jj = 0; jj < NT_L / 4; jj++) cst[l][jj][0] = cst[l][jj][1] = cst[l][jj][2] = cst[l][jj][3] = 0.f;
  cluster_sync();

  unsigned gen = 0;
  int n_stamp = 0;
  // with prof: CTA 0's clock after each phase's products, its cluster's sums and the grid barrier
  auto stamp = [&]() {
    if (prof != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
      unsigned long long t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      prof[n_stamp] = t;
    }
    n_stamp++;
  };
  stamp();
  float acc[NT_MAX][4];
  for (int step = 0; step < steps; step++) {
    const int par = step & 1;
    const bf16* h_old = h + (size_t)par * L * N * H;
    bf16* h_new = h + (size_t)(par ^ 1) * L * N * H;
    // ---- LSTM layers
#pragma unroll
    for (int l = 0; l < L; l++) {
      zero<NT_L>(acc);
#pragma unroll
      for (int half = 0; half < KS_L / HALF; half++) {
        int kk = rank * KS_L + half * HALF;  // in [0, 2H)
        __syncthreads();
        if (kk < H) {
          if (l == 0) stage(As, emb, H, kk, tok_s);
          else stage(As, h_new + (size_t)(l - 1) * N * H, H, kk, nullptr);
        } else {
          stage(As, h_old + (size_t)l * N * H, H, kk - H, nullptr);
        }
        __syncthreads();
        mma_half<NT_L>(acc, As, Wl + l * GR * WST_L, WST_L, half * HALF);
      }
      stamp();
      push<NT_L>(acc, slots, rank);
      cluster_sync();
      if ((u32)warp % CS == rank) {
        reduce<NT_L>(acc, slots, rank);
        // gate n-tiles: i 0..NT_L/4-1, f, g, o; this thread's units 8 jj + 2 tq + e, rows 16 rank + gq (+8)
#pragma unroll
        for (int jj = 0; jj < NT_L / 4; jj++) {
#pragma unroll
          for (int r2 = 0; r2 < 2; r2++) {
            float hv[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
              int u = 8 * jj + 2 * tq + e, idx = 2 * r2 + e;
              const float* bl = b + (size_t)l * 4 * H + min(cl * UPC + u, H - 1);  // past H: masked below
              float gi = acc[jj][idx] + __ldg(bl);
              float gf = acc[NT_L / 4 + jj][idx] + __ldg(bl + H);
              float gg = acc[2 * NT_L / 4 + jj][idx] + __ldg(bl + 2 * H);
              float go = acc[3 * NT_L / 4 + jj][idx] + __ldg(bl + 3 * H);
              float c = sigm(gf) * cst[l][jj][idx] + sigm(gi) * tanhf(gg);
              cst[l][jj][idx] = c;
              hv[e] = sigm(go) * tanhf(c);
            }
            int row = 16 * warp + gq + 8 * r2;
            if (cl * UPC + 8 * jj + 2 * tq < H)  // H is even: a pair is in or out together
              *(u32*)(h_new + ((size_t)l * N + row) * H + cl * UPC + 8 * jj + 2 * tq) = pack2(hv[0], hv[1]);
          }
        }
      }
      cluster_sync();  // the slots are free again
      stamp();
      grid_barrier(counter, ++gen);
      stamp();
    }
    // ---- projection g = h_L @ pw^T + pb
    zero<NT_P>(acc);
#pragma unroll
    for (int half = 0; half < KS_P / HALF; half++) {
      __syncthreads();
      stage(As, h_new + (size_t)(L - 1) * N * H, H, rank * KS_P + half * HALF, nullptr);
      __syncthreads();
      mma_half<NT_P>(acc, As, Wp, WST_P, half * HALF);
    }
    stamp();
    push<NT_P>(acc, slots, rank);
    cluster_sync();
    if ((u32)warp % CS == rank) {
      reduce<NT_P>(acc, slots, rank);
#pragma unroll
      for (int j = 0; j < NT_P; j++)
#pragma unroll
        for (int r2 = 0; r2 < 2; r2++) {
          int col = cl * PPC + 8 * j + 2 * tq, row = 16 * warp + gq + 8 * r2;
          if (col >= P) continue;
          float v0 = acc[j][2 * r2] + __ldg(pb + col), v1 = acc[j][2 * r2 + 1] + __ldg(pb + col + 1);
          *(u32*)(g + (size_t)row * P + col) = pack2(v0, v1);
        }
    }
    cluster_sync();
    stamp();
    grid_barrier(counter, ++gen);
    stamp();
    // ---- joint: relu(enc[t] + g) @ ow^T + ob, each row's best column of the cluster's range
    zero<NT_J>(acc);
#pragma unroll
    for (int half = 0; half < KS_J / HALF; half++) {
      __syncthreads();
      stage_joint(As, enc, g, step % T, rank * KS_J + half * HALF);
      __syncthreads();
      mma_half<NT_J>(acc, As, Wj, WST_J, half * HALF);
    }
    stamp();
    push<NT_J>(acc, slots, rank);
    cluster_sync();
    if ((u32)warp % CS == rank) {
      reduce<NT_J>(acc, slots, rank);
#pragma unroll
      for (int r2 = 0; r2 < 2; r2++) {
        unsigned long long best = 0;
#pragma unroll
        for (int j = 0; j < NT_J; j++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            int col = cl * JPC + 8 * j + 2 * tq + e;
            if (col < VJ) {
              float v = acc[j][2 * r2 + e] + __ldg(ob + col);
              u32 bits = __float_as_uint(v);
              bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
              unsigned long long key = ((unsigned long long)bits << 32) | (u32)(0xFFFFFFFFu - col);
              best = key > best ? key : best;
            }
          }
        best = max(best, __shfl_xor_sync(0xffffffffu, best, 1));
        best = max(best, __shfl_xor_sync(0xffffffffu, best, 2));
        if (tq == 0) keys[(size_t)(16 * warp + gq + 8 * r2) * NCL + cl] = best;
      }
    }
    cluster_sync();
    stamp();
    grid_barrier(counter, ++gen);
    stamp();
    // ---- decision (every CTA, for the embedding rows of the next step)
    for (int row = threadIdx.x; row < N; row += blockDim.x) {
      unsigned long long best = 0;
      for (int c = 0; c < NCL; c++) best = max(best, __ldcg(keys + (size_t)row * NCL + c));
      int col = (int)(0xFFFFFFFFu - (u32)best);
      tok_s[row] = col % V;
      if (blockIdx.x == 0) tokens[(size_t)step * N + row] = col;
    }
  }
}
