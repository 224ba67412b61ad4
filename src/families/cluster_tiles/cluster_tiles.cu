// cluster_tiles (Hopper, sm_90): log-softmax along an axis that is not the last, where the inner
// positions are contiguous ("outer x dim x inner"). A tile is one outer index and W neighbouring
// inner positions (256 bytes of them) over the whole axis; a cluster of C CTAs owns a tile, and
// CTA k the k-th run of the axis. The grid is persistent: cluster i takes tiles i, i + clusters, ...
//
// The pipeline is that of cluster_rows: a producer thread fills a ring of chunks in shared memory
// with bulk tensor copies (one per chunk: a box of positions of the axis by the tile's 256
// bytes, described by a tensor map; 256-byte plain bulk copies, one per position, ran at a third
// of the bandwidth), the statistics
// warps fold tile t + 1 while the writer warps write tile t. The statistics are per column: each
// thread keeps to the same 16-byte column of the tile, folds a running (max, sum) per element of
// it, the CTA merges them per column and sends its W partials to every CTA of the cluster; the
// writers merge the C partials of each column and write the tile out of shared memory. The slice
// of the axis stays in the ring (the planner sends longer axes elsewhere): x is read once.
#include <cudaTypedefs.h>  // the tensor-map encoder's type (the function comes from the driver)


#include "device/common.cuh"
#include "device/hopper.cuh"
#include "device/launch.hpp"
#include "families/cluster_tiles/rule.hpp"

namespace softlight {
namespace {

struct TileShape {
  int64_t outer, dim, inner;
  int64_t ys_outer, ys_dim;                    // y's element strides (inner stride 1); x: a tensor map
  int64_t tiles_per_outer;                     // ceil(inner / w)
  int64_t chunks_per_cta;                      // chunks of rows_per_chunk positions of the axis
  int w;                                       // tile width, elements
  int rows_per_chunk;
  int chunk_bytes;                             // rows_per_chunk * w * sizeof(T)
  int ring_slots;
  double scale;                                // 1 / temperature (see Call)
  int hints;                                   // as cluster_rows': bit 0 loads evict-first, bit 1 streaming stores
  void* lse;                                   // optional (outer, inner) log-sum-exp, accumulation type
};

#ifdef SOFTLIGHT_HOPPER
// kTileStatsBuffers (rule.hpp) buffers of partials: the statistics warps start tile j only once
// the writers have started tile j - 1 (re-arming the buffer of tile j + 1), so a peer's partial of
// tile j arrives after our writers started tile j - 2: only tiles j - 1 and j can be pending.
constexpr int kStatsBar = 1, kWriteBar = 2;  // named barriers of the two consumer groups

template <class T> struct TileCta {
  using A = acc_t<T>;
  using P = MaxSum<A>;
  static constexpr int V = 16 / sizeof(T);
  static constexpr int U = sizeof(T) == 2 ? 2 : 4;  // vectors per statistics step (registers)

  TileShape sh;
  T* y;
  unsigned char* ring;
  uint64_t* full;
  uint64_t* empty;
  uint64_t* stats_bar;      // [kTileStatsBuffers]
  P* partials;              // [kTileStatsBuffers][C][w], written by every CTA of the cluster
  P* red;                   // [group warps][w]: the statistics warps' per-column partials
  P* fin;                   // [kTileStatsBuffers][w]: (max, log of the sum) per column
  volatile int* tiles_started;
  uint32_t rank, csize;
  int group, gtid, lane, cv;  // cv: this thread's 16-byte column of the tile
  int vw;                     // 16-byte columns per tile row
  int64_t first_chunk, my_chunks;
  A scale;

  __device__ __forceinline__ int rows_of(int64_t k) const {
    return static_cast<int>(min(int64_t{sh.rows_per_chunk}, sh.dim - (first_chunk + k) * sh.rows_per_chunk));
  }
  __device__ __forceinline__ int valid_cols(int64_t tile) const {
    return static_cast<int>(min(int64_t{sh.w}, sh.inner - (tile % sh.tiles_per_outer) * sh.w));
  }

  __device__ __forceinline__ void stats(RingPos& pos, int64_t iter, int64_t tile) const {
    while (iter >= 1 && *tiles_started < iter) __nanosleep(64);
    const bool live = cv * V < valid_cols(tile);
    const A f = exp_factor(scale);  // the maxima are of x, the sums of exp((x - max) * scale)
    P part[V];
#pragma unroll
    for (int j = 0; j < V; ++j) part[j] = {neg_inf<A>(), A(0)};
    for (int64_t k = 0; k < my_chunks; ++k) {
      mbar_wait_cta(smem_addr(full + pos.slot), pos.phase);
      const T* c = reinterpret_cast<const T*>(ring + size_t(pos.slot) * sh.chunk_bytes);
      const int n = rows_of(k) * vw;
      if (live) {
        // U vectors of the column per step: their max first, then one rescale of the running sum.
        for (int i = gtid; i < n; i += U * group) {
          A v[U][V];
#pragma unroll
          for (int u = 0; u < U; ++u) {
            if (i + u * group < n) {
              load_pack<T, V>(c + (i + u * group) * V, v[u]);
            } else {
#pragma unroll
              for (int j = 0; j < V; ++j) v[u][j] = neg_inf<A>();
            }
          }
#pragma unroll
          for (int j = 0; j < V; ++j) {
            A m = part[j].m;
#pragma unroll
            for (int u = 0; u < U; ++u) m = max_acc(m, v[u][j]);
            A s = part[j].s * rescale(part[j].m, m, f);
#pragma unroll
            for (int u = 0; u < U; ++u) s += exp_shifted(v[u][j], m, f);
            part[j] = {m, s};
          }
        }
      }
      pos.advance(sh.ring_slots);
    }
    // Merge over the threads of each column: lanes vw apart in a warp, then the warps.
#pragma unroll
    for (int j = 0; j < V; ++j)
      for (int o = 16; o >= vw; o /= 2)
        part[j] = merge_max_sum(part[j], P{__shfl_xor_sync(0xffffffffu, part[j].m, o),
                                           __shfl_xor_sync(0xffffffffu, part[j].s, o)}, f);
    const int warp = gtid >> 5, warps = group >> 5;
    if (lane < vw)
#pragma unroll
      for (int j = 0; j < V; ++j) red[warp * sh.w + cv * V + j] = part[j];
    sync_threads_named(kStatsBar, group);
    if (gtid < sh.w) {
      P r = red[gtid];
      for (int w = 1; w < warps; ++w) r = merge_max_sum(r, red[w * sh.w + gtid], f);
      const int buf = static_cast<int>(iter % kTileStatsBuffers);
      const uint32_t slot = smem_addr(partials + (buf * csize + rank) * sh.w + gtid);
      const uint32_t bar = smem_addr(stats_bar + buf);
      broadcast_pair(slot, r.m, r.s, bar, csize);
    }
    sync_threads_named(kStatsBar, group);  // `red` is refilled by the next tile
  }

  __device__ __forceinline__ void write(RingPos& pos, int64_t iter, int64_t tile) const {
    const int buf = static_cast<int>(iter % kTileStatsBuffers);
    const uint32_t bar = smem_addr(stats_bar + buf);
    mbar_wait(bar, static_cast<uint32_t>((iter / kTileStatsBuffers) & 1));
    const int64_t o = tile / sh.tiles_per_outer, c0 = (tile % sh.tiles_per_outer) * sh.w;
    const int valid = valid_cols(tile);
    P* f = fin + buf * sh.w;
    if (gtid < sh.w) {
      // The column's C partials: the max first, then the sums moved onto it.
      const P* p = partials + buf * csize * sh.w + gtid;
      A m = neg_inf<A>();
      for (uint32_t q = 0; q < csize; ++q) m = max_acc(m, p[q * sh.w].m);
      A s = 0;
      for (uint32_t q = 0; q < csize; ++q) s += p[q * sh.w].s * rescale(p[q * sh.w].m, m, exp_factor(scale));
      const A log_sum = log_acc(s);
      f[gtid] = {m, log_sum};
      if (sh.lse != nullptr && rank == 0 && gtid < valid)
        static_cast<A*>(sh.lse)[o * sh.inner + c0 + gtid] = m * scale + log_sum;
    }
    sync_threads_named(kWriteBar, group);
    if (gtid == 0) {
      mbar_arrive_expect_tx(bar, 2 * sizeof(A) * csize * sh.w);  // for tile iter + 2
      *tiles_started = static_cast<int>(iter + 1);
    }
    const bool live = cv * V < valid;
    A m[V], ls[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const P fj = f[(live ? cv * V : 0) + j];
      m[j] = fj.m;
      ls[j] = fj.s;
    }
    // This thread's vectors of a chunk are gtid, gtid + group, ...: rows gtid / vw, then every
    // group / vw rows on, always in column cv.
    const int64_t row_step = int64_t{group / vw} * sh.ys_dim;
    T* const col = y + o * sh.ys_outer + c0 + cv * V + int64_t{gtid / vw} * sh.ys_dim;
    for (int64_t k = 0; k < my_chunks; ++k) {
      mbar_wait_cta(smem_addr(full + pos.slot), pos.phase);
      const T* c = reinterpret_cast<const T*>(ring + size_t(pos.slot) * sh.chunk_bytes);
      const int n = rows_of(k) * vw;
      T* out = col + (first_chunk + k) * sh.rows_per_chunk * sh.ys_dim;
      if (live) {
#pragma unroll 2
        for (int i = gtid; i < n; i += group, out += row_step) {
          A v[V];
          load_pack<T, V>(c + i * V, v);
#pragma unroll
          for (int j = 0; j < V; ++j) v[j] = log_softmax_out_scaled(v[j], m[j], scale, ls[j]);
          store_pack<T, V>(out, v, (sh.hints & 2) != 0);
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(smem_addr(empty + pos.slot));
      pos.advance(sh.ring_slots);
    }
  }
};
#endif  // SOFTLIGHT_HOPPER

// xmap: x as a 3-d tensor (inner, dim, outer) with boxes of (w, rows_per_chunk, 1).
template <class T>
__global__ void __launch_bounds__(kClusterMaxThreads, 1)
cluster_tiles_kernel(const __grid_constant__ CUtensorMap xmap, T* __restrict__ y, TileShape sh) {
#ifdef SOFTLIGHT_HOPPER
  using A = acc_t<T>;
  extern __shared__ __align__(128) unsigned char smem[];
  TileCta<T> cta;
  cta.sh = sh;
  cta.y = y;
  cta.scale = static_cast<A>(sh.scale);
  cta.rank = cluster_rank();
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(cta.csize));
  // Layout (as the planner counts it, rule.cpp): ring, barriers, partials, red, fin, a counter.
  cta.ring = smem;
  cta.full = reinterpret_cast<uint64_t*>(smem + size_t(sh.ring_slots) * sh.chunk_bytes);
  cta.empty = cta.full + sh.ring_slots;
  cta.stats_bar = cta.empty + sh.ring_slots;
  cta.partials = reinterpret_cast<MaxSum<A>*>(cta.stats_bar + kTileStatsBuffers);
  cta.group = (static_cast<int>(blockDim.x) - 32) / 2;
  cta.red = cta.partials + kTileStatsBuffers * cta.csize * sh.w;
  cta.fin = cta.red + (cta.group / 32) * sh.w;
  cta.tiles_started = reinterpret_cast<volatile int*>(cta.fin + kTileStatsBuffers * sh.w);
  const int warp = threadIdx.x >> 5, group_warps = cta.group >> 5;
  cta.gtid = static_cast<int>(threadIdx.x) % cta.group;
  cta.lane = threadIdx.x & 31;
  cta.vw = sh.w / (16 / static_cast<int>(sizeof(T)));
  cta.cv = cta.gtid % cta.vw;
  const int64_t chunks_per_tile = (sh.dim + sh.rows_per_chunk - 1) / sh.rows_per_chunk;
  cta.first_chunk = int64_t{cta.rank} * sh.chunks_per_cta;
  cta.my_chunks = max(int64_t{0}, min(sh.chunks_per_cta, chunks_per_tile - cta.first_chunk));
  const int64_t cluster_id = blockIdx.x / cta.csize, clusters = gridDim.x / cta.csize;
  const int64_t tiles = sh.outer * sh.tiles_per_outer;

  if (threadIdx.x == 0) {
    for (int i = 0; i < sh.ring_slots; ++i) {
      mbar_init(smem_addr(cta.full + i), 1);
      mbar_init(smem_addr(cta.empty + i), group_warps);
    }
    for (int b = 0; b < kTileStatsBuffers; ++b) {
      mbar_init(smem_addr(cta.stats_bar + b), 1);
      mbar_arrive_expect_tx(smem_addr(cta.stats_bar + b), 2 * sizeof(A) * cta.csize * sh.w);
    }
    *cta.tiles_started = 0;
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync();

  if (warp < group_warps) {
    RingPos pos;
    int64_t iter = 0;
    for (int64_t t = cluster_id; t < tiles; t += clusters, ++iter) cta.stats(pos, iter, t);
  } else if (warp < 2 * group_warps) {
    RingPos pos;
    int64_t iter = 0;
    for (int64_t t = cluster_id; t < tiles; t += clusters, ++iter) cta.write(pos, iter, t);
  } else if (threadIdx.x == 2 * cta.group) {
    // Producer: one box per chunk. Boxes reaching past the axis or the inner extent are filled
    // with zeros (and counted in full), which the consumers skip.
    RingPos pos;
    const uint64_t map = reinterpret_cast<uint64_t>(&xmap);
    asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    for (int64_t t = cluster_id; t < tiles; t += clusters) {
      const int o = static_cast<int>(t / sh.tiles_per_outer), c0 = static_cast<int>((t % sh.tiles_per_outer) * sh.w);
      for (int64_t k = 0; k < cta.my_chunks; ++k) {
        const int d0 = static_cast<int>((cta.first_chunk + k) * sh.rows_per_chunk);
        const uint32_t full = smem_addr(cta.full + pos.slot);
        mbar_wait_cta(smem_addr(cta.empty + pos.slot), pos.phase ^ 1);
        mbar_arrive_expect_tx(full, static_cast<uint32_t>(sh.chunk_bytes));
        const uint32_t dst = smem_addr(cta.ring + size_t(pos.slot) * sh.chunk_bytes);
        if (sh.hints & 1) {
          asm volatile(
              "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
              "[%1, {%2, %3, %4}], [%5], %6;" ::"r"(dst),
              "l"(map), "r"(c0), "r"(d0), "r"(o), "r"(full), "l"(policy)
              : "memory");
        } else {
          asm volatile(
              "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
              "[%5];" ::"r"(dst),
              "l"(map), "r"(c0), "r"(d0), "r"(o), "r"(full)
              : "memory");
        }
        pos.advance(sh.ring_slots);
      }
    }
  }
  __syncwarp();
  cluster_sync();  // no CTA leaves while a peer may still write into its shared memory
#endif
}

// cuTensorMapEncodeTiled from the driver, looked up once (null where the driver lacks it).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// x of the call as a 3-d tensor map: (inner, dim, outer), boxes of (w, rows, 1). Element types
// by size: the copy moves bits. cudaErrorNotSupported where the driver cannot make the map.
cudaError_t encode_x(CUtensorMap* map, const Call& a, int elem, int w, int rows) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const CUtensorMapDataType type = elem == 2   ? CU_TENSOR_MAP_DATA_TYPE_UINT16
                                   : elem == 4 ? CU_TENSOR_MAP_DATA_TYPE_UINT32
                                               : CU_TENSOR_MAP_DATA_TYPE_UINT64;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(a.n[2]), static_cast<cuuint64_t>(a.n[1]),
                              static_cast<cuuint64_t>(a.n[0])};
  // A stride of an extent-1 axis is normalized to 0; the map wants one that spans the others.
  const int64_t dim_stride = a.n[1] > 1 ? a.in0_s[1] : a.n[2];
  const int64_t outer_stride = a.n[0] > 1 ? a.in0_s[0] : a.n[1] * dim_stride;
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(dim_stride * elem), static_cast<cuuint64_t>(outer_stride * elem)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(w), static_cast<cuuint32_t>(rows), 1};
  const cuuint32_t unit[3] = {1, 1, 1};
  const CUresult r = encode(map, type, 3, const_cast<void*>(a.in0), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorNotSupported;
}

template <class T>
cudaError_t launch(const Plan& p, const Call& a, cudaStream_t stream) {
  auto kernel = cluster_tiles_kernel<T>;
  ClusterLaunch l;
  cudaError_t e = prepare_cluster_launch(kernel, p, stream, &l);
  if (e != cudaSuccess) return e;
  TileShape sh;
  sh.outer = a.n[0];
  sh.dim = a.n[1];
  sh.inner = a.n[2];
  sh.ys_outer = a.out_s[0];
  sh.ys_dim = a.out_s[1];
  sh.tiles_per_outer = p.axis.tiles;
  sh.chunks_per_cta = p.ring.chunks_per_cta;
  sh.w = p.axis.lanes;
  sh.rows_per_chunk = static_cast<int>(p.ring.chunk_bytes / (p.axis.lanes * int64_t{sizeof(T)}));
  sh.chunk_bytes = p.ring.chunk_bytes;
  sh.ring_slots = p.ring.ring_slots;
  sh.scale = a.scale;
  sh.hints = p.ring.hints;
  sh.lse = a.lse;
  alignas(64) CUtensorMap xmap;
  e = encode_x(&xmap, a, static_cast<int>(sizeof(T)), sh.w, sh.rows_per_chunk);
  if (e != cudaSuccess) return e;
  e = cudaLaunchKernelEx(&l.cfg, kernel, xmap, static_cast<T*>(a.out), sh);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_cluster_tiles(const Plan& p, const Call& a, cudaStream_t stream) {
  return with_element_type(a.dtype, [&](auto tag) { return launch<decltype(tag)>(p, a, stream); });
}

}  // namespace softlight
