// l2_rows: rows too long for a cluster's shared memory to hold twice (a million elements and
// more), read twice, the second time from the L2 cache. A row is cut into items of `chunks` chunks
// of threads * ITERS 16-byte packs. Half the CTAs (one an SM) read: each claims the next item from a
// counter, folds it into a (max, sum) partial kept in a table, and the CTA whose item is a row's
// last to land merges the row's partials and posts its (max, log-sum). The other half write: each
// claims the next item from a second counter, waits for its row's stats, reads the item again
// (from L2: the first read marked it evict-last) and writes y. Claimed items keep every SM busy
// however fast it drains; no CTA waits on a row's other CTAs as a cluster's do, only a writer on a
// row still being read. The readers stay at most `lag` items ahead of the writers, so that L2 holds
// the items between their two reads; lag >= a row's items, so the earliest item claimed and not
// done can always finish (no deadlock, and no cooperative launch).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "common.cuh"
#include "kernels.hpp"

namespace softlight {
namespace {

constexpr int kL2RowsMaxThreads = 512;
// Two CTAs of kL2RowsMaxThreads an SM at least: 64 registers a thread.
constexpr int kL2RowsMinBlocks = 2;

// A posted pair (two fp32 values) is never all ones: its second half is the result of arithmetic,
// whose NaN is 0x7fffffff (see cluster_rows' table).
constexpr uint64_t kUnposted = ~uint64_t{0};

// A 16-byte load through L1 unallocated, with an L2 eviction policy.
__device__ __forceinline__ uint4 load_policy(const uint4* p, uint64_t policy) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
}

// The workspace, all ones before the launch: the two counters, each row's posted (max, log-sum),
// each row's count of first reads done, and the partials by row and item. A partial (one 64-bit
// store) is its own flag, so no fence orders it before the count: the CTA that counts a row's last
// first read waits on the slots that are not yet visible to it.
struct L2Work {
  unsigned long long* read;   // items claimed by readers, less one
  unsigned long long* write;  // items claimed by writers, less one
  uint64_t* stats;
  unsigned* landed;
  uint64_t* partials;
};

// A CTA's packs of one chunk (threads * ITERS packs from `first`), -inf past the row's end.
template <class T, int ITERS>
__device__ __forceinline__ void load_chunk(uint4 (&p)[ITERS], const uint4* xr, int first, int vectors, uint64_t policy) {
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int e = first + i * static_cast<int>(blockDim.x);
    p[i] = e < vectors ? load_policy(xr + e, policy) : neg_inf_pack<T>();
  }
}

// Persistent CTAs, each an item at a time: `chunks` chunks of threads * ITERS packs, each loaded two
// chunks ahead of its use (two chunks' packs a thread), the next item's first two as soon as the
// CTA knows it. CTAs [0, readers) read, the rest write. Thread 0 claims the next item at the start
// of each, and its other trips through L2 (a reader's count of a row's items, a writer's wait for
// its row's stats) overlap the loads in flight.
template <class T, int ITERS>
__global__ void __launch_bounds__(kL2RowsMaxThreads, kL2RowsMinBlocks)
l2_rows_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys, int64_t rows, int vectors,
               int items, int chunks, int64_t lag, int readers, acc_t<T> scale, acc_t<T>* __restrict__ lse,
               L2Work w, int hints) {
  using A = acc_t<T>;
  static_assert(sizeof(A) == 4, "partials are traded as fp32 pairs");
  constexpr int V = 16 / sizeof(T);
  __shared__ unsigned long long s_item[2];
  __shared__ uint64_t s_stats[2];
  __shared__ MaxSum<A> s_warp[kL2RowsMaxThreads / 32];
  __shared__ A s_scratch[32];
  const int tid = threadIdx.x, threads = blockDim.x, chunk_packs = threads * ITERS;
  const A f = exp_factor(scale);
  const bool reader = static_cast<int>(blockIdx.x) < readers;
  const int64_t n_items = rows * items;
  unsigned long long* counter = reader ? w.read : w.write;
  uint64_t policy;
  if ((hints & 1) == 0) {
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  } else if (reader) {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  } else {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  }
  // Item t's packs of chunk j (threads * ITERS from this thread's first).
  auto load = [&](uint4(&p)[ITERS], int64_t t, int j) {
    const int64_t row = t / items;
    const int first = (static_cast<int>(t - row * items) * chunks + j) * chunk_packs + tid;
    load_chunk<T>(p, reinterpret_cast<const uint4*>(x + row * xs), first, vectors, policy);
  };
  if (tid == 0) s_item[0] = atomicAdd(counter, 1ull) + 1ull;  // all ones + 1: the first is 0
  __syncthreads();
  uint4 pa[ITERS], pb[ITERS];
  int64_t t = static_cast<int64_t>(s_item[0]);
  if (t < n_items) {
    load(pa, t, 0);
    load(pb, t, 1);
  }
  uint64_t writers = 0;  // thread 0 of a reader: the writers' counter as last loaded
  for (int b = 0; t < n_items; b ^= 1) {
    const int64_t row = t / items;
    const int first = (static_cast<int>(t - row * items) * chunks) * chunk_packs + tid;
    unsigned long long next = 0;
    if (reader) {
      if (tid == 0) {
        // Held until the writers have claimed all but `lag` of the items before this one (it waits
        // on no later item: its own row's writers need it, but lag >= a row's items).
        while (static_cast<int64_t>(writers + 1) < t - lag) {
          __nanosleep(64);
          writers = load_relaxed_gpu(reinterpret_cast<const uint64_t*>(w.write));
        }
        next = atomicAdd(counter, 1ull) + 1ull;
      }
      MaxSum<A> q{neg_inf<A>(), A(0)};
      for (int j = 0; j < chunks; j += 2) {
        q = merge_max_sum(q, packs_max_sum<T, ITERS>(pa, scale), f);
        if (j + 2 < chunks) load_chunk<T>(pa, reinterpret_cast<const uint4*>(x + row * xs), first + (j + 2) * chunk_packs, vectors, policy);
        q = merge_max_sum(q, packs_max_sum<T, ITERS>(pb, scale), f);
        if (j + 3 < chunks) load_chunk<T>(pb, reinterpret_cast<const uint4*>(x + row * xs), first + (j + 3) * chunk_packs, vectors, policy);
      }
      q = shfl_merge_max_sum(q, f);
      if ((tid & 31) == 0) s_warp[tid >> 5] = q;
      if (tid == 0) s_item[b ^ 1] = next;
      __syncthreads();
      const int64_t t_next = static_cast<int64_t>(s_item[b ^ 1]);
      if (t_next < n_items) {
        load(pa, t_next, 0);
        load(pb, t_next, 1);
      }
      bool last = false;
      if (tid == 0) {
        MaxSum<A> c{neg_inf<A>(), A(0)};
        for (int j = 0; j < threads / 32; ++j) c = merge_max_sum(c, s_warp[j], f);
        store_relaxed_gpu(w.partials + t, pack_pair(c.m, c.s));
        writers = load_relaxed_gpu(reinterpret_cast<const uint64_t*>(w.write));
        last = atomicAdd(w.landed + row, 1u) + 1u == static_cast<unsigned>(items - 1);  // from all ones
      }
      if (__syncthreads_or(last)) {
        // The row's partials, each waited for until visible, merged; its stats posted.
        MaxSum<A> r{neg_inf<A>(), A(0)};
        for (int j = tid; j < items; j += threads) {
          uint64_t v;
          while ((v = load_relaxed_gpu(w.partials + row * items + j)) == kUnposted) __nanosleep(32);
          r = merge_max_sum(r, unpack_pair(v), f);
        }
        r = block_max_sum(r, s_scratch, threads, 1, f);
        if (tid == 0) {
          const A log_sum = log_acc(r.s);
          store_relaxed_gpu(w.stats + row, pack_pair(r.m, log_sum));
          if (lse != nullptr) lse[row] = r.m * scale + log_sum;
        }
      }
      t = t_next;
    } else {
      if (tid == 0) {
        next = atomicAdd(counter, 1ull) + 1ull;
        uint64_t v;
        while ((v = load_relaxed_gpu(w.stats + row)) == kUnposted) __nanosleep(32);
        s_stats[b] = v;
        s_item[b ^ 1] = next;
      }
      __syncthreads();
      const MaxSum<A> st = unpack_pair(s_stats[b]);  // (max, log-sum)
      const int64_t t_next = static_cast<int64_t>(s_item[b ^ 1]);
      T* yr = y + row * ys;
      const bool stream_stores = (hints & 2) != 0;
      auto write = [&](const uint4(&p)[ITERS], int from) {
#pragma unroll
        for (int i = 0; i < ITERS; ++i) {
          const int e = from + i * threads;
          if (e < vectors) store_log_softmax_pack<T>(yr + e * V, p[i], st.m, scale, st.s, stream_stores);
        }
      };
      for (int j = 0; j < chunks; j += 2) {
        write(pa, first + j * chunk_packs);
        if (j + 2 < chunks) {
          load_chunk<T>(pa, reinterpret_cast<const uint4*>(x + row * xs), first + (j + 2) * chunk_packs, vectors, policy);
        } else if (t_next < n_items) {
          load(pa, t_next, 0);
        }
        write(pb, first + (j + 1) * chunk_packs);
        if (j + 3 < chunks) {
          load_chunk<T>(pb, reinterpret_cast<const uint4*>(x + row * xs), first + (j + 3) * chunk_packs, vectors, policy);
        } else if (t_next < n_items) {
          load(pb, t_next, 1);
        }
      }
      t = t_next;
    }
  }
}

template <class T>
cudaError_t launch(const Plan& p, const RowsArgs& a, cudaStream_t stream) {
  if constexpr (sizeof(T) == 8) {
    return cudaErrorInvalidValue;  // partials are fp32 pairs (the planner sends no float64 here)
  } else {
    auto kernel = p.iters == 4 ? l2_rows_kernel<T, 4> : l2_rows_kernel<T, 2>;
    if ((p.iters != 2 && p.iters != 4) || p.threads > kL2RowsMaxThreads || p.threads % 32 != 0)
      return cudaErrorInvalidValue;
    int device = 0, sms = 0, per_sm = 0;
    cudaError_t e;
    if ((e = cudaGetDevice(&device)) || (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) ||
        (e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, p.threads, 0)))
      return e;
    const int64_t n_items = a.rows * p.chunks_per_row;
    // Readers and writers, as many of each as fit an SM's half (one each where one CTA fits).
    const int64_t half = std::max<int64_t>(1, int64_t{per_sm} * sms / 2);
    const int64_t grid = 2 * half;
    const int64_t lag = std::min<int64_t>(p.segment, n_items);
    if (std::getenv("SOFTLIGHT_VERBOSE"))
      std::fprintf(stderr, "softlight: l2_rows threads=%d iters=%d chunks/item=%lld items/row=%lld lag=%lld grid=%lld hints=%d\n",
                   p.threads, p.iters, static_cast<long long>(p.chunks_per_cta), static_cast<long long>(p.chunks_per_row), static_cast<long long>(lag),
                   static_cast<long long>(grid), p.hints);
    // Counters, stats by row, counts by row (padded to 8 bytes), partials by item: all ones.
    const size_t words = 2 + 2 * static_cast<size_t>(a.rows) - static_cast<size_t>(a.rows) / 2 + static_cast<size_t>(n_items);
    cudaMemPool_t pool;
    void* work = nullptr;
    if ((e = workspace_pool(&pool)) || (e = cudaMallocFromPoolAsync(&work, 8 * words, pool, stream))) return e;
    e = cudaMemsetAsync(work, 0xff, 8 * words, stream);
    auto* table = static_cast<uint64_t*>(work) + 2;
    const L2Work wk{static_cast<unsigned long long*>(work), static_cast<unsigned long long*>(work) + 1, table, reinterpret_cast<unsigned*>(table + a.rows),
                    table + a.rows + (a.rows + 1) / 2};
    if (e == cudaSuccess) {
      kernel<<<static_cast<unsigned>(grid), p.threads, 0, stream>>>(
          static_cast<const T*>(a.x), a.x_stride, static_cast<T*>(a.y), a.y_stride, a.rows,
          static_cast<int>(a.cols / (16 / sizeof(T))), static_cast<int>(p.chunks_per_row),
          static_cast<int>(p.chunks_per_cta), lag, static_cast<int>(half),
          static_cast<acc_t<T>>(a.scale), static_cast<acc_t<T>*>(a.lse), wk, p.hints);
      e = cudaGetLastError();
    }
    const cudaError_t f = cudaFreeAsync(work, stream);
    return e != cudaSuccess ? e : f;
  }
}

}  // namespace

cudaError_t launch_l2_rows(const Plan& plan, const RowsArgs& a, cudaStream_t stream) {
  return with_element_type(a.dtype, [&](auto tag) { return launch<decltype(tag)>(plan, a, stream); });
}

}  // namespace softlight
