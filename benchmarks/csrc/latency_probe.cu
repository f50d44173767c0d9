
typedef unsigned int u32;
__device__ __forceinline__ long long clk() {
  long long c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c) :: "memory");
  return c;
}
__device__ __forceinline__ u32 bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
#define N 64
extern "C" __global__ void lat(float* out, long long* t, float seed) {
  __shared__ u32 sm[1024];
  const int lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < 1024; i += blockDim.x) sm[i] = (i * 7 + 3) & 1023;
  __syncthreads();
  float x = seed + lane, c[4] = {x, x, x, x};
  u32 a[4] = {__float_as_uint(x), 1u, 2u, 3u}, b0 = 5u, b1 = 7u;
  long long t0, t1;
  float acc = 0.f;
  // 0: mma chain
  t0 = clk();
#pragma unroll
  for (int i = 0; i < N; i++)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  acc += c[0] + c[1] + c[2] + c[3];
  t1 = clk(); if (threadIdx.x == 0) t[0] = t1 - t0;
  // 1: shuffle + add chain
  float y = acc; t0 = clk();
#pragma unroll
  for (int i = 0; i < N; i++) y += __shfl_xor_sync(0xffffffffu, y, 1 << (i % 5));
  t1 = clk(); if (threadIdx.x == 0) t[1] = t1 - t0; acc += y;
  // 2: tanh chain (exp and division, as in the kernels)
  y = acc * 1e-30f; t0 = clk();
#pragma unroll
  for (int i = 0; i < N; i++) y = 1.0f - __fdividef(2.0f, __expf(2.0f * y) + 1.0f);
  t1 = clk(); if (threadIdx.x == 0) t[2] = t1 - t0; acc += y;
  // 3: split chain (hi, mid, lo of two values, fed back)
  float v0 = acc, v1 = acc * 0.5f; t0 = clk();
#pragma unroll
  for (int i = 0; i < N; i++) {
    u32 p0 = bf16x2(v0, v1);
    float r0 = v0 - __uint_as_float(p0 << 16), r1 = v1 - __uint_as_float(p0 & 0xffff0000u);
    u32 p1 = bf16x2(r0, r1);
    u32 p2 = bf16x2(r0 - __uint_as_float(p1 << 16), r1 - __uint_as_float(p1 & 0xffff0000u));
    v0 = __uint_as_float(p2 ^ p1 ^ p0); v1 = v0;
  }
  t1 = clk(); if (threadIdx.x == 0) t[3] = t1 - t0; acc += v0;
  // 4: shared-memory load chain
  u32 k = (u32)lane; t0 = clk();
#pragma unroll
  for (int i = 0; i < N; i++) k = sm[k];
  t1 = clk(); if (threadIdx.x == 0) t[4] = t1 - t0; acc += k;
  // 5: block barrier
  t0 = clk();
  for (int i = 0; i < N; i++) __syncthreads();
  t1 = clk(); if (threadIdx.x == 0) t[5] = t1 - t0;
  // 6: shared store, barrier, load (the exchange between layers)
  u32 v = (u32)lane; t0 = clk();
  for (int i = 0; i < N; i++) {
    sm[(threadIdx.x + 1) & 255] = v;
    __syncthreads();
    v = sm[threadIdx.x & 255] + 1u;
    __syncthreads();
  }
  t1 = clk(); if (threadIdx.x == 0) t[6] = t1 - t0;
  // 7: tanh.approx chain (for comparison)
  y = acc * 1e-30f; t0 = clk();
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("tanh.approx.f32 %0, %0;" : "+f"(y));
  t1 = clk(); if (threadIdx.x == 0) t[7] = t1 - t0; acc += y;
  // 8: fma chain
  y = acc; t0 = clk();
#pragma unroll
  for (int i = 0; i < N; i++) y = fmaf(y, 0.999f, 0.001f);
  t1 = clk(); if (threadIdx.x == 0) t[8] = t1 - t0; acc += y;
  // 9: mma throughput: 8 independent accumulators, 16 rounds (128 mma per warp)
  float d[8][4];
#pragma unroll
  for (int q = 0; q < 8; q++) d[q][0] = d[q][1] = d[q][2] = d[q][3] = acc + q;
  __syncthreads();
  t0 = clk();
  for (int r = 0; r < 16; r++) {
#pragma unroll
    for (int q = 0; q < 8; q++)
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                   "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                   : "+f"(d[q][0]), "+f"(d[q][1]), "+f"(d[q][2]), "+f"(d[q][3])
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  float dd = 0.f;
#pragma unroll
  for (int q = 0; q < 8; q++) dd += d[q][0] + d[q][3];
  t1 = clk();
  if (threadIdx.x == 0) t[9] = t1 - t0;
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc + v + dd;
}
