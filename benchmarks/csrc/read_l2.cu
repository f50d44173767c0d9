
extern "C" __global__ void read_l2(const float4* __restrict__ p, long long n4, int reps, float* out) {
  float a = 0.f, b = 0.f, c = 0.f, d = 0.f;
  for (int r = 0; r < reps; r++) {
#pragma unroll 8
    for (long long i = threadIdx.x; i < n4; i += blockDim.x) {
      float4 v = __ldg(p + i);
      a += v.x; b += v.y; c += v.z; d += v.w;
    }
  }
  if (a + b + c + d == 1234.5f) out[blockIdx.x] = a;
}
