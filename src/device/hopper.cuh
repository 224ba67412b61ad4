// Hopper (sm_90) helpers shared by the cluster kernels: shared-memory addresses, the cluster's
// ranks and barriers, reads of another CTA's shared memory, mbarriers, bulk copies into shared
// memory and stores into another CTA's. Device code of the sm_90 pass only.
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SOFTLIGHT_HOPPER 1
#endif

namespace softlight {

#ifdef SOFTLIGHT_HOPPER
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// The address of the same shared-memory location in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t cluster_map(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// Split cluster barrier: arrive (releasing this thread's writes), later wait (acquiring the
// others'). Every thread of every CTA of the cluster takes part.
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_sync() {
  cluster_arrive();
  cluster_wait();
}
// Reads from a shared::cluster address (see cluster_map).
__device__ __forceinline__ float ld_cluster(uint32_t addr, float) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ double ld_cluster(uint32_t addr, double) {
  double v;
  asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(addr) : "memory");
  return v;
}

// --- mbarriers, bulk copies and remote stores (the rings of the cluster families) ---------------
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Waits for the phase of `parity` to complete, acquiring at cluster scope (mbar_wait) where a
// barrier may complete on writes from other CTAs (st.async), at CTA scope (kCta, mbar_wait_cta)
// for a ring's barriers, which only this CTA's threads and its own bulk copies complete (cluster
// scope also invalidates L1 after each wait).
#define SOFTLIGHT_TRY_WAIT(scope)                                                         \
  "{ .reg .pred p; mbarrier.try_wait.parity.acquire." scope ".shared::cta.b64 p, [%1], %2; " \
  "selp.u32 %0, 1, 0, p; }"
template <bool kCta> __device__ __forceinline__ void mbar_wait_at(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    if constexpr (kCta)
      asm volatile(SOFTLIGHT_TRY_WAIT("cta") : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    else
      asm volatile(SOFTLIGHT_TRY_WAIT("cluster") : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}
#undef SOFTLIGHT_TRY_WAIT
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) { mbar_wait_at<false>(bar, parity); }
// Whether the phase of `parity` has completed, without waiting (CTA scope, as mbar_wait_cta).
__device__ __forceinline__ bool mbar_done_cta(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{ .reg .pred p; mbarrier.test_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbar_wait_cta(uint32_t bar, uint32_t parity) { mbar_wait_at<true>(bar, parity); }
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst), "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
// The same with an L2 eviction policy (createpolicy.fractional.L2::evict_first or ::evict_last).
template <bool Last>
__device__ __forceinline__ void bulk_load_policy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  uint64_t policy;
  if constexpr (Last) {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  } else {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  }
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], "
      "%2, [%3], %4;" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}
// Store a (max, sum) pair into another CTA's shared memory, completing on its barrier.
__device__ __forceinline__ void send_pair(uint32_t raddr, float m, float s, uint32_t rbar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(
          raddr),
      "f"(m), "f"(s), "r"(rbar)
      : "memory");
}
__device__ __forceinline__ void send_pair(uint32_t raddr, double m, double s, uint32_t rbar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f64 [%0], {%1, %2}, [%3];" ::"r"(
          raddr),
      "d"(m), "d"(s), "r"(rbar)
      : "memory");
}
// Store a (max, sum, moment) partial of floats, as 16 bytes (the last word 0), likewise.
__device__ __forceinline__ void send_moment(uint32_t raddr, float m, float s, float t, uint32_t rbar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(raddr),
      "f"(m), "f"(s), "f"(t), "f"(0.0f), "r"(rbar)
      : "memory");
}
// Completes `bytes` of this CTA's barrier `bar` after its own stores to shared memory (the fence
// orders them before the barrier's phase).
__device__ __forceinline__ void complete_local(uint32_t bar, uint32_t bytes) {
  asm volatile("fence.acq_rel.cta;" ::: "memory");
  asm volatile("mbarrier.complete_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Sends a (max, sum) pair to `slot` in every CTA of a cluster of `csize`, completing on each one's
// barrier `bar` (shared::cta addresses of this CTA). A cluster of one CTA stores into its own shared
// memory and completes the transaction by hand (compute-sanitizer rejects distributed shared
// memory where a cluster has one CTA); the fence orders the store before the barrier's phase.
// `ranks`: the pair goes to CTAs [0, ranks) alone (1: to CTA 0).
template <class A>
__device__ __forceinline__ void broadcast_pair(uint32_t slot, A m, A s, uint32_t bar, uint32_t csize,
                                               uint32_t ranks = ~0u) {
  if (csize > 1) {
    for (uint32_t r = 0; r < min(csize, ranks); ++r) send_pair(cluster_map(slot, r), m, s, cluster_map(bar, r));
    return;
  }
  if constexpr (sizeof(A) == 4) {
    asm volatile("st.shared::cta.v2.f32 [%0], {%1, %2};" ::"r"(slot), "f"(m), "f"(s) : "memory");
  } else {
    asm volatile("st.shared::cta.v2.f64 [%0], {%1, %2};" ::"r"(slot), "d"(m), "d"(s) : "memory");
  }
  complete_local(bar, uint32_t{2 * sizeof(A)});
}
// The same for a (max, sum, moment) partial of floats (16 bytes a CTA).
__device__ __forceinline__ void broadcast_moment(uint32_t slot, float m, float s, float t, uint32_t bar,
                                                 uint32_t csize, uint32_t ranks = ~0u) {
  if (csize > 1) {
    for (uint32_t r = 0; r < min(csize, ranks); ++r) send_moment(cluster_map(slot, r), m, s, t, cluster_map(bar, r));
    return;
  }
  asm volatile("st.shared::cta.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(slot), "f"(m), "f"(s), "f"(t), "f"(0.0f)
               : "memory");
  complete_local(bar, 16);
}

// Single-copy atomic 64-bit messages between CTAs of a cooperative grid, through L2 (past L1).
__device__ __forceinline__ void store_relaxed_gpu(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t load_relaxed_gpu(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Single-copy atomic 64-bit messages within a cluster: a store into a CTA's shared memory
// (shared::cluster address, see cluster_map) and a load of this CTA's own.
__device__ __forceinline__ void store_relaxed_cluster(uint32_t addr, uint64_t v) {
  asm volatile("st.relaxed.cluster.shared::cluster.b64 [%0], %1;" ::"r"(addr), "l"(v) : "memory");
}
// The same store into every CTA of a cluster of `csize` (one CTA: its own shared memory, as above).
__device__ __forceinline__ void store_relaxed_all(uint32_t addr, uint64_t v, uint32_t csize) {
  if (csize == 1) {
    asm volatile("st.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(addr), "l"(v) : "memory");
    return;
  }
  for (uint32_t r = 0; r < csize; ++r) store_relaxed_cluster(cluster_map(addr, r), v);
}
__device__ __forceinline__ uint64_t load_relaxed_cluster(uint32_t addr) {
  uint64_t v;
  asm volatile("ld.relaxed.cluster.shared::cta.b64 %0, [%1];" : "=l"(v) : "r"(addr) : "memory");
  return v;
}

// A position in the ring: slot index and the parity of the slot's current use.
struct RingPos {
  uint32_t slot = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance(uint32_t slots) {
    if (++slot == slots) {
      slot = 0;
      phase ^= 1;
    }
  }
  __device__ __forceinline__ void advance(uint32_t slots, int64_t n) {
    for (int64_t i = 0; i < n; ++i) advance(slots);
  }
};
#endif

}  // namespace softlight
