typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ u32 cluster_rank() {
  u32 r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r;
}
__device__ __forceinline__ u32 mapa(u32 addr, u32 rank) {
  u32 r; asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank)); return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
// 1 once the mbarrier's phase of this parity has completed (try_wait may suspend the thread a while, test_wait
// returns at once), with the bytes that completed it visible. ACQ 1: a relaxed poll and, once it succeeds, an
// acquire fence restricted to shared::cluster (PTX 8.6), which costs nothing; ACQ 0: the poll acquires at cluster
// scope, which also invalidates the L1 cache (CCTL.IVALL) on the critical path. The kernels read nothing but
// shared memory from their peers, so the restricted fence suffices; _compile defaults to 0, the row-split proxy
// kernel asks for 1.
#if ACQ
#define MBAR_SEM "relaxed"
#define MBAR_ACQUIRE() asm volatile("fence.acquire.sync_restrict::shared::cluster.cluster;" ::: "memory")
#else
#define MBAR_SEM "acquire"
#define MBAR_ACQUIRE() {}
#endif
#define MBAR_POLL(NAME, OP)                                                                        \
  __device__ __forceinline__ u32 NAME(u32 bar, u32 parity) {                                       \
    u32 ok;                                                                                        \
    asm volatile("{\n\t.reg .pred p;\n\t"                                                       \
                 "mbarrier." OP ".parity." MBAR_SEM ".cluster.shared::cta.b64 p, [%1], %2;\n\t"   \
                 "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(ok) : "r"(bar), "r"(parity) : "memory");    \
    return ok;                                                                                     \
  }
MBAR_POLL(mbar_test_poll, "test_wait")
MBAR_POLL(mbar_try_poll, "try_wait")
// spin until the phase of this parity has completed, then acquire what completed it
__device__ __forceinline__ void mbar_try_wait(u32 bar, u32 parity) {
  while (!mbar_try_poll(bar, parity)) {}
  MBAR_ACQUIRE();
}
__device__ __forceinline__ void mbar_test_wait(u32 bar, u32 parity) {
  while (!mbar_test_poll(bar, parity)) {}
  MBAR_ACQUIRE();
}

// tanh(y) = 1 - 2 / (exp(2 y) + 1) with the approximate exp2 and reciprocal (relative errors about 2^-22),
// flushing subnormals so that no range fix-ups sit on the critical path; +-1 at the ends, 0 at 0
__device__ __forceinline__ float tanh_fast(float y) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(y * 2.88539008177792681f));  // 2 log2(e) y
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(e + 1.0f));
  return fmaf(-2.0f, r, 1.0f);
}

// the serial chain's activation (the proxy designs): relu where compiled with RELU 1, else tanh
__device__ __forceinline__ float act(float y) {
#if RELU
  return fmaxf(y, 0.0f);
#else
  return tanh_fast(y);
#endif
}
