// Reductions by tier above the thread's own (packs.cuh): a group of lanes and a warp by shuffles,
// a CTA through shared memory, as (max, sum) pairs or plain sums.
#pragma once

#include "device/numerics.cuh"

namespace softlight {

template <class A> __device__ __forceinline__ A group_max(A v, int width) {
  for (int o = width / 2; o > 0; o /= 2) v = max_acc(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <class A> __device__ __forceinline__ A group_sum(A v, int width) {
  for (int o = width / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// The same over a width known at compile time, unrolled to its levels: the loops above compile to
// eight instructions a level, a convergence check before each shuffle.
template <int W, class A> __device__ __forceinline__ A group_max(A v) {
#pragma unroll
  for (int o = W / 2; o > 0; o /= 2) v = max_acc(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <int W, class A> __device__ __forceinline__ A group_sum(A v) {
#pragma unroll
  for (int o = W / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A (max, sum) pair merged over the lanes of a warp (butterfly: every lane gets the result).
template <class A> __device__ __forceinline__ MaxSum<A> shfl_merge_max_sum(MaxSum<A> p, A f) {
  for (int o = 16; o > 0; o /= 2)
    p = merge_max_sum(p, MaxSum<A>{__shfl_xor_sync(0xffffffffu, p.m, o), __shfl_xor_sync(0xffffffffu, p.s, o)}, f);
  return p;
}

// Barrier over the first `threads` threads of the CTA (a multiple of 32), on hardware barrier `id`.
__device__ __forceinline__ void sync_threads_named(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Block-wide max and sum over the first `threads` threads; `scratch` holds 32 values. Every
// participating thread gets the result. Safe to call back to back (a barrier guards the scratch).
template <class A> __device__ __forceinline__ A block_max(A v, A* scratch, int threads, int bar) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = threads >> 5;
  v = group_max(v, 32);
  if (lane == 0) scratch[warp] = v;
  sync_threads_named(bar, threads);
  A r = lane < warps ? scratch[lane] : neg_inf<A>();
  r = group_max(r, 32);
  sync_threads_named(bar, threads);
  return r;
}
template <class A> __device__ __forceinline__ A block_sum(A v, A* scratch, int threads, int bar) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = threads >> 5;
  v = group_sum(v, 32);
  if (lane == 0) scratch[warp] = v;
  sync_threads_named(bar, threads);
  A r = lane < warps ? scratch[lane] : A(0);
  r = group_sum(r, 32);
  sync_threads_named(bar, threads);
  return r;
}
// Merge per-thread partials across the block: the max first, then the sums moved onto it.
template <class A>
__device__ __forceinline__ MaxSum<A> block_max_sum(MaxSum<A> p, A* scratch, int threads, int bar,
                                                  A f = exp_factor(A(1))) {
  const A m = block_max(p.m, scratch, threads, bar);
  return {m, block_sum(p.s * rescale(p.m, m, f), scratch, threads, bar)};
}

}  // namespace softlight
