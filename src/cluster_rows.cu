// cluster_rows (Hopper, sm_90): a cluster of C CTAs owns a row; CTA k owns the k-th slice of it.
// The grid is persistent: cluster i takes rows i, i + clusters, ...
//
// Per CTA, a ring of `ring_slots` chunks in shared memory is fed by one producer thread with bulk
// copies (cp.async.bulk, completing on a `full` mbarrier per slot). Eight consumer warps:
//   1. as each chunk of the slice lands, fold it into a running (max, sum);
//   2. reduce over the CTA, send the CTA's (max, sum) to every CTA of the cluster (st.async into
//      their shared memory, completing on their `stats` mbarrier), merge the C partials;
//   3. write y chunk by chunk from shared memory and hand each slot back (`empty` mbarrier), so
//      the producer refills it with the next row's chunk while this row is still being written.
// Resident: the slice fits the ring and is read from DRAM once. Streamed: the slice is larger
// than the ring; the producer sends every chunk twice (stats pass, then output pass).
#include "common.cuh"
#include "kernels.hpp"

namespace softlight {
namespace {

struct ClusterShape {
  int chunk_bytes;
  int ring_slots;
  int64_t chunks_per_row;
  int64_t chunks_per_cta;
  int resident;   // the slice stays in the ring: one read
  int lookahead;  // two slices fit: the next row's statistics before this row's output
};


// The kernel body exists in the sm_90 device pass only; other passes see an empty kernel.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SOFTLIGHT_HOPPER 1
#endif

#ifdef SOFTLIGHT_HOPPER
// Buffers for the cluster's partials, by row. A peer sends its partial of row j once it holds
// every partial of row j - 2 (j - 1 without lookahead); this CTA may then still have rows j - 3 to
// j - 1 unread, so four buffers keep all rows in flight apart.
constexpr int kStatsBuffers = 4;
constexpr int kBar = 1;  // named barrier over the consumer warps

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
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
// Cluster scope: the `stats` barrier completes on writes from other CTAs.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; "
        "selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst), "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
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
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::
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
};

// Everything one CTA knows about its part of the work, and the three phases of a row.
template <class T> struct ClusterCta {
  using A = acc_t<T>;
  static constexpr int V = 16 / sizeof(T);
  static constexpr int U = 4;  // 16-byte vectors in flight per thread and step

  ClusterShape sh;
  unsigned char* ring;
  uint64_t* full;
  uint64_t* empty;
  uint64_t* stats_bar;  // [kStatsBuffers]
  MaxSum<A>* partials;  // [kStatsBuffers][kMaxCluster]
  A* scratch;           // [32]
  uint32_t rank, csize;
  int consumers, tid, lane;
  int64_t first_chunk, my_chunks, row_bytes;

  __device__ __forceinline__ uint32_t bytes_of(int64_t k) const {
    return static_cast<uint32_t>(
        min(int64_t{sh.chunk_bytes}, row_bytes - (first_chunk + k) * sh.chunk_bytes));
  }
  __device__ __forceinline__ const T* slot_data(uint32_t slot) const {
    return reinterpret_cast<const T*>(ring + size_t(slot) * sh.chunk_bytes);
  }
  __device__ __forceinline__ void release(uint32_t slot) const {
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_addr(empty + slot));
  }

  // 1. Fold this CTA's slice into a running (max, sum) as its chunks land, reduce over the CTA,
  //    and send the result to every CTA of the cluster.
  __device__ __forceinline__ void stats(RingPos& pos, int64_t iter) const {
    MaxSum<A> part{neg_inf<A>(), A(0)};
    for (int64_t k = 0; k < my_chunks; ++k) {
      mbar_wait(smem_addr(full + pos.slot), pos.phase);
      const T* c = slot_data(pos.slot);
      const int vectors = static_cast<int>(bytes_of(k) / 16);
      for (int base = tid; base < vectors; base += U * consumers) {
        A v[U][V];
        A m = part.m;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int i = base + u * consumers;
          if (i < vectors) {
            load_pack<T, V>(c + i * V, v[u]);
          } else {
#pragma unroll
            for (int j = 0; j < V; ++j) v[u][j] = neg_inf<A>();
          }
#pragma unroll
          for (int j = 0; j < V; ++j) m = max_acc(m, v[u][j]);
        }
        A s = part.s * rescale(part.m, m);
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int j = 0; j < V; ++j) s += exp_shifted(v[u][j], m);
        part = {m, s};
      }
      if (!sh.resident) release(pos.slot);
      pos.advance(sh.ring_slots);
    }
    part = block_max_sum(part, scratch, consumers, kBar);
    if (tid == 0) {
      const int buf = static_cast<int>(iter % kStatsBuffers);
      const uint32_t slot_addr = smem_addr(partials + buf * kMaxCluster + rank);
      const uint32_t bar = smem_addr(stats_bar + buf);
      for (uint32_t r = 0; r < csize; ++r)
        send_pair(cluster_map(slot_addr, r), part.m, part.s, cluster_map(bar, r));
    }
  }

  // 2 and 3. Wait for the cluster's partials of row `iter`, merge them, and write the slice out
  //    from shared memory, handing each slot back as soon as it is read.
  __device__ __forceinline__ void write(RingPos& pos, int64_t iter, T* dst) const {
    const int buf = static_cast<int>(iter % kStatsBuffers);
    const uint32_t bar = smem_addr(stats_bar + buf);
    mbar_wait(bar, static_cast<uint32_t>((iter / kStatsBuffers) & 1));
    MaxSum<A> row{neg_inf<A>(), A(0)};
    for (uint32_t r = 0; r < csize; ++r) row = merge_max_sum(row, partials[buf * kMaxCluster + r]);
    // Re-arm this buffer for row iter + kStatsBuffers. No peer sends for that row before it has
    // our partial for row iter + kStatsBuffers - 1, which we send only after this point.
    if (tid == 0) mbar_arrive_expect_tx(bar, 2 * sizeof(A) * csize);
    const A log_sum = log_acc(row.s);
    for (int64_t k = 0; k < my_chunks; ++k) {
      if (!sh.resident) mbar_wait(smem_addr(full + pos.slot), pos.phase);
      const T* c = slot_data(pos.slot);
      T* out = dst + k * (sh.chunk_bytes / int64_t{sizeof(T)});
      const int vectors = static_cast<int>(bytes_of(k) / 16);
      for (int base = tid; base < vectors; base += U * consumers) {
        A v[U][V];
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (base + u * consumers < vectors) load_pack<T, V>(c + (base + u * consumers) * V, v[u]);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (base + u * consumers < vectors) {
#pragma unroll
            for (int j = 0; j < V; ++j) v[u][j] = log_softmax_out(v[u][j], row.m, log_sum);
            store_pack<T, V>(out + (base + u * consumers) * V, v[u]);
          }
        }
      }
      release(pos.slot);
      pos.advance(sh.ring_slots);
    }
  }
};

#endif  // SOFTLIGHT_HOPPER

template <class T>
__global__ void __launch_bounds__(kClusterMaxThreads, 1)
cluster_rows_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys,
                    int64_t rows, int64_t cols, ClusterShape sh) {
#ifdef SOFTLIGHT_HOPPER
  extern __shared__ __align__(128) unsigned char smem[];
  ClusterCta<T> cta;
  cta.sh = sh;
  cta.ring = smem;
  cta.full = reinterpret_cast<uint64_t*>(smem + size_t(sh.ring_slots) * sh.chunk_bytes);
  cta.empty = cta.full + sh.ring_slots;
  cta.stats_bar = cta.empty + sh.ring_slots;
  cta.partials = reinterpret_cast<MaxSum<acc_t<T>>*>(cta.stats_bar + kStatsBuffers);  // 16-aligned
  cta.scratch = reinterpret_cast<acc_t<T>*>(cta.partials + kStatsBuffers * kMaxCluster);
  cta.rank = cluster_rank();
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(cta.csize));
  cta.consumers = static_cast<int>(blockDim.x) - 32;
  cta.tid = threadIdx.x;
  cta.lane = threadIdx.x & 31;
  cta.row_bytes = cols * int64_t{sizeof(T)};
  cta.first_chunk = int64_t{cta.rank} * sh.chunks_per_cta;
  cta.my_chunks = max(int64_t{0}, min(sh.chunks_per_cta, sh.chunks_per_row - cta.first_chunk));
  const int64_t cluster_id = blockIdx.x / cta.csize;
  const int64_t clusters = gridDim.x / cta.csize;

  if (threadIdx.x == 0) {
    for (int i = 0; i < sh.ring_slots; ++i) {
      mbar_init(smem_addr(cta.full + i), 1);
      mbar_init(smem_addr(cta.empty + i), cta.consumers / 32);
    }
    for (int b = 0; b < kStatsBuffers; ++b) {
      mbar_init(smem_addr(cta.stats_bar + b), 1);
      mbar_arrive_expect_tx(smem_addr(cta.stats_bar + b), 2 * sizeof(acc_t<T>) * cta.csize);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync();

  if (threadIdx.x >= cta.consumers) {
    // Producer: one thread walks the same rows as the consumers and keeps the ring full.
    if (threadIdx.x == cta.consumers) {
      RingPos pos;
      for (int64_t row = cluster_id; row < rows; row += clusters) {
        const unsigned char* src = reinterpret_cast<const unsigned char*>(x + row * xs) +
                                   cta.first_chunk * sh.chunk_bytes;
        for (int pass = 0; pass < (sh.resident ? 1 : 2); ++pass) {
          for (int64_t k = 0; k < cta.my_chunks; ++k) {
            mbar_wait(smem_addr(cta.empty + pos.slot), pos.phase ^ 1);
            const uint32_t bytes = cta.bytes_of(k);
            mbar_arrive_expect_tx(smem_addr(cta.full + pos.slot), bytes);
            bulk_load(smem_addr(cta.ring + size_t(pos.slot) * sh.chunk_bytes),
                      src + k * sh.chunk_bytes, bytes, smem_addr(cta.full + pos.slot));
            pos.advance(sh.ring_slots);
          }
        }
      }
    }
  } else {
    auto out_of = [&](int64_t row) {
      return reinterpret_cast<T*>(reinterpret_cast<unsigned char*>(y + row * ys) +
                                  cta.first_chunk * sh.chunk_bytes);
    };
    RingPos pos;
    if (sh.lookahead) {
      // Two rows in the ring: row i + 1's statistics are folded and sent before row i is written,
      // so the cluster exchange of each row overlaps work on the next.
      RingPos cur = pos;
      if (cluster_id < rows) cta.stats(pos, 0);
      int64_t iter = 0;
      for (int64_t row = cluster_id; row < rows; row += clusters, ++iter) {
        const RingPos next = pos;
        if (row + clusters < rows) cta.stats(pos, iter + 1);
        cta.write(cur, iter, out_of(row));
        cur = next;
      }
    } else {
      int64_t iter = 0;
      for (int64_t row = cluster_id; row < rows; row += clusters, ++iter) {
        RingPos start = pos;
        cta.stats(pos, iter);
        cta.write(sh.resident ? start : pos, iter, out_of(row));
      }
    }
  }
  // No CTA may leave while a peer can still write into its shared memory.
  __syncwarp();
  cluster_sync();
#endif
}

template <class T>
cudaError_t launch(const Plan& p, const RowsArgs& a, cudaStream_t stream) {
  auto kernel = cluster_rows_kernel<T>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(p.smem_bytes));
  if (e == cudaSuccess && p.cluster > 8)
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (e != cudaSuccess) return e;

  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(p.cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cfg.blockDim = dim3(p.threads);
  cfg.gridDim = dim3(static_cast<unsigned>(p.cluster));
  cfg.dynamicSmemBytes = static_cast<size_t>(p.smem_bytes);
  cfg.stream = stream;
  int active = 0;
  e = cudaOccupancyMaxActiveClusters(&active, kernel, &cfg);
  if (e != cudaSuccess) return e;
  if (active < 1) return cudaErrorInvalidClusterSize;
  const int64_t clusters = std::min<int64_t>(p.grid, active);
  cfg.gridDim = dim3(static_cast<unsigned>(clusters * p.cluster));

  const ClusterShape sh{p.chunk_bytes, p.ring_slots, p.chunks_per_row, p.chunks_per_cta,
                        p.resident ? 1 : 0, p.lookahead ? 1 : 0};
  e = cudaLaunchKernelEx(&cfg, kernel, static_cast<const T*>(a.x), a.x_stride,
                         static_cast<T*>(a.y), a.y_stride, a.rows, a.cols, sh);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_cluster_rows(const Plan& p, const RowsArgs& a, cudaStream_t stream) {
  return with_element_type(a.dtype, [&](auto tag) { return launch<decltype(tag)>(p, a, stream); });
}

}  // namespace softlight
