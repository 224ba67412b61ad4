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
  int resident;
};

// The kernel body exists in the sm_90 device pass only; other passes see an empty kernel.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SOFTLIGHT_HOPPER 1
#endif

#ifdef SOFTLIGHT_HOPPER
constexpr int kConsumerWarps = kClusterConsumerThreads / 32;
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
#endif

template <class T>
__global__ void __launch_bounds__(kClusterThreads, 1)
cluster_rows_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys,
                    int64_t rows, int64_t cols, ClusterShape sh) {
#ifdef SOFTLIGHT_HOPPER
  using A = acc_t<T>;
  constexpr int V = 16 / sizeof(T);
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* ring = smem;
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + size_t(sh.ring_slots) * sh.chunk_bytes);
  uint64_t* empty = full + sh.ring_slots;
  uint64_t* stats_bar = empty + sh.ring_slots;                      // [2], by row parity
  MaxSum<A>* partials = reinterpret_cast<MaxSum<A>*>(stats_bar + 2);  // [2][kMaxCluster]
  A* scratch = reinterpret_cast<A*>(partials + 2 * kMaxCluster);      // [32]

  const uint32_t rank = cluster_rank();
  uint32_t C;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(C));
  const int64_t cluster_id = blockIdx.x / C;
  const int64_t clusters = gridDim.x / C;
  const int64_t row_bytes = cols * int64_t{sizeof(T)};
  const int64_t first_chunk = int64_t{rank} * sh.chunks_per_cta;
  const int64_t my_chunks =
      max(int64_t{0}, min(sh.chunks_per_cta, sh.chunks_per_row - first_chunk));
  const uint32_t pair_bytes = 2 * sizeof(A) * C;
  auto chunk_bytes = [&](int64_t k) {
    return static_cast<uint32_t>(
        min(int64_t{sh.chunk_bytes}, row_bytes - (first_chunk + k) * sh.chunk_bytes));
  };
  auto slot_ptr = [&](uint32_t slot) { return ring + size_t(slot) * sh.chunk_bytes; };

  if (threadIdx.x == 0) {
    for (int i = 0; i < sh.ring_slots; ++i) {
      mbar_init(smem_addr(full + i), 1);
      mbar_init(smem_addr(empty + i), kConsumerWarps);
    }
    mbar_init(smem_addr(stats_bar + 0), 1);
    mbar_init(smem_addr(stats_bar + 1), 1);
    mbar_arrive_expect_tx(smem_addr(stats_bar + 0), pair_bytes);
    mbar_arrive_expect_tx(smem_addr(stats_bar + 1), pair_bytes);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp == kConsumerWarps) {
    // Producer: one thread walks the same rows as the consumers and keeps the ring full.
    if (lane == 0) {
      RingPos pos;
      for (int64_t row = cluster_id; row < rows; row += clusters) {
        const unsigned char* src =
            reinterpret_cast<const unsigned char*>(x + row * xs) + first_chunk * sh.chunk_bytes;
        for (int pass = 0; pass < (sh.resident ? 1 : 2); ++pass) {
          for (int64_t k = 0; k < my_chunks; ++k) {
            mbar_wait(smem_addr(empty + pos.slot), pos.phase ^ 1);
            const uint32_t bytes = chunk_bytes(k);
            mbar_arrive_expect_tx(smem_addr(full + pos.slot), bytes);
            bulk_load(smem_addr(slot_ptr(pos.slot)), src + k * sh.chunk_bytes, bytes,
                      smem_addr(full + pos.slot));
            pos.advance(sh.ring_slots);
          }
        }
      }
    }
  } else {
    const int tid = threadIdx.x;
    RingPos pos;
    int64_t iter = 0;
    auto release = [&](uint32_t slot) {
      __syncwarp();
      if (lane == 0) mbar_arrive(smem_addr(empty + slot));
    };
    for (int64_t row = cluster_id; row < rows; row += clusters, ++iter) {
      // 1. running (max, sum) over this CTA's slice, chunk by chunk as the copies land.
      const RingPos row_start = pos;
      MaxSum<A> part{neg_inf<A>(), A(0)};
      for (int64_t k = 0; k < my_chunks; ++k) {
        mbar_wait(smem_addr(full + pos.slot), pos.phase);
        const T* c = reinterpret_cast<const T*>(slot_ptr(pos.slot));
        const int vectors = static_cast<int>(chunk_bytes(k) / 16);
        A pm = part.m;
        for (int i = tid; i < vectors; i += kClusterConsumerThreads) {
          A v[V];
          load_pack<T, V>(c + i * V, v);
#pragma unroll
          for (int j = 0; j < V; ++j) pm = max_acc(pm, v[j]);
        }
        A s = part.s * rescale(part.m, pm);
        for (int i = tid; i < vectors; i += kClusterConsumerThreads) {
          A v[V];
          load_pack<T, V>(c + i * V, v);
#pragma unroll
          for (int j = 0; j < V; ++j) s += exp_shifted(v[j], pm);
        }
        part = {pm, s};
        if (!sh.resident) release(pos.slot);
        pos.advance(sh.ring_slots);
      }
      // 2. CTA partial to every CTA of the cluster; wait for all C of them; merge.
      part = block_max_sum(part, scratch, kClusterConsumerThreads, kBar);
      const int buf = static_cast<int>(iter & 1);
      const uint32_t bar = smem_addr(stats_bar + buf);
      if (tid == 0) {
        const uint32_t slot_addr = smem_addr(partials + buf * kMaxCluster + rank);
        for (uint32_t r = 0; r < C; ++r)
          send_pair(cluster_map(slot_addr, r), part.m, part.s, cluster_map(bar, r));
      }
      mbar_wait(bar, static_cast<uint32_t>((iter >> 1) & 1));
      MaxSum<A> row_stats{neg_inf<A>(), A(0)};
      for (uint32_t r = 0; r < C; ++r)
        row_stats = merge_max_sum(row_stats, partials[buf * kMaxCluster + r]);
      // Arm for row iter + 2. No peer can send that before it has our partial for iter + 1,
      // which leaves only after every consumer thread here is past this point.
      if (tid == 0) mbar_arrive_expect_tx(bar, pair_bytes);
      const A log_sum = log_acc(row_stats.s);
      // 3. output from shared memory, handing each slot back as soon as it is read.
      if (sh.resident) pos = row_start;
      T* dst = reinterpret_cast<T*>(reinterpret_cast<unsigned char*>(y + row * ys) +
                                    first_chunk * sh.chunk_bytes);
      for (int64_t k = 0; k < my_chunks; ++k) {
        if (!sh.resident) mbar_wait(smem_addr(full + pos.slot), pos.phase);
        const T* c = reinterpret_cast<const T*>(slot_ptr(pos.slot));
        T* out = dst + k * (sh.chunk_bytes / int64_t{sizeof(T)});
        const int vectors = static_cast<int>(chunk_bytes(k) / 16);
        for (int i = tid; i < vectors; i += kClusterConsumerThreads) {
          A v[V];
          load_pack<T, V>(c + i * V, v);
#pragma unroll
          for (int j = 0; j < V; ++j) v[j] = log_softmax_out(v[j], row_stats.m, log_sum);
          store_pack<T, V>(out + i * V, v);
        }
        release(pos.slot);
        pos.advance(sh.ring_slots);
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
                        p.resident ? 1 : 0};
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
