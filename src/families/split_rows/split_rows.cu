// split_rows: log-softmax (or its backward) along any axis, for every (outer, inner) position.
// A position's axis is split into `cluster` segments, one per CTA of a cluster (Hopper; one CTA
// elsewhere, or for short axes). A CTA covers `lanes` neighbouring inner positions at once, so that
// a strided axis is still read in coalesced runs along inner; for rows (lanes = 1) it reads 16-byte
// vectors along the axis.
//   pass 1: each thread folds its part of the segment (forward: running max and sum of exp;
//           backward: the sum of dy); the CTA reduces; the cluster exchanges its partials
//           through distributed shared memory, every CTA merging them in the same order;
//   pass 2: the segment is read again and written. Segments are sized (kSplitSegmentBytes) so
//           that the L2 cache can still hold them for the second read. The grid is persistent
//           (as many CTAs as fit, each walking positions): launching a cluster per position
//           left SMs idle while whole clusters waited to be placed.
#include <algorithm>

#include "device/common.cuh"
#include "device/hopper.cuh"
#include "device/launch.hpp"
#include "families/split_rows/rule.hpp"

namespace softlight {
namespace {

struct Strides {
  int64_t outer, dim, inner;
};

struct SplitShape {
  int64_t outer, inner;
  int64_t tiles;    // ceil(inner / lanes)
  int64_t units;    // along the axis: vectors (V > 1) or elements
  int64_t segment;  // units per CTA
  int lanes;
  int cluster;
};

// The running partial of a position: (max, sum) forward, the sum of dy backward.
template <class A, bool Backward> struct Part;
template <class A> struct Part<A, false> {
  MaxSum<A> v{neg_inf<A>(), A(0)};
  // f = exp_factor(scale): the maxima are of x, the sums of exp((x - max) * scale).
  __device__ __forceinline__ void merge(const Part& o, A f) { v = merge_max_sum(v, o.v, f); }
  __device__ __forceinline__ Part shfl_xor(int offset) const {
    Part r;
    r.v = {__shfl_xor_sync(0xffffffffu, v.m, offset), __shfl_xor_sync(0xffffffffu, v.s, offset)};
    return r;
  }
#ifdef SOFTLIGHT_HOPPER
  __device__ __forceinline__ static Part remote(const Part* local, uint32_t rank) {
    Part r;
    r.v.m = ld_cluster(cluster_map(smem_addr(&local->v.m), rank), A{});
    r.v.s = ld_cluster(cluster_map(smem_addr(&local->v.s), rank), A{});
    return r;
  }
#endif
};
template <class A> struct Part<A, true> {
  A v = 0;
  __device__ __forceinline__ void merge(const Part& o, A) { v += o.v; }
  __device__ __forceinline__ Part shfl_xor(int offset) const {
    Part r;
    r.v = __shfl_xor_sync(0xffffffffu, v, offset);
    return r;
  }
#ifdef SOFTLIGHT_HOPPER
  __device__ __forceinline__ static Part remote(const Part* local, uint32_t rank) {
    Part r;
    r.v = ld_cluster(cluster_map(smem_addr(&local->v), rank), A{});
    return r;
  }
#endif
};

template <class T, int V, bool Backward>
__global__ void __launch_bounds__(kSplitThreads)
split_rows_kernel(const T* __restrict__ in0, Strides s0, const T* __restrict__ in1, Strides s1,
                  T* out, Strides so, SplitShape sh, acc_t<T> scale, acc_t<T>* __restrict__ lse) {
  using A = acc_t<T>;
  using P = Part<A, Backward>;
  const A f = exp_factor(scale);  // forward: the maxima are of x, the sums of exp((x - max) * scale)
  constexpr int U = V == 1 ? 8 : V >= 8 || (Backward && V >= 4) ? 2 : 4;  // units in flight per thread and step
  // Dynamic shared memory: [red: one per thread][mine: L][total: L].
  extern __shared__ __align__(16) unsigned char smem[];
  const int L = sh.lanes, tid = threadIdx.x, nthreads = blockDim.x;
  P* red = reinterpret_cast<P*>(smem);
  P* mine = red + nthreads;  // this CTA's partial per inner lane (read by the cluster)
  P* total = mine + L;
  const int li = tid % L, along = tid / L, stride = nthreads / L;
  const int lane = tid & 31, warp = tid >> 5;
  // Partials per inner lane after the warp step: one per warp (L < 32) or per thread (L >= 32).
  const int per_lane = L < 32 ? nthreads / 32 : nthreads / L;
  const int C = sh.cluster;
  uint32_t rank = 0;
#ifdef SOFTLIGHT_HOPPER
  if (C > 1) rank = cluster_rank();
#endif
  const int64_t begin = int64_t{rank} * sh.segment;
  const int64_t end = min(sh.units, begin + sh.segment);
  // Units are vectors of V elements along a contiguous axis, or single elements a stride apart.
  const int64_t step0 = V > 1 ? V : s0.dim, step1 = V > 1 ? V : s1.dim, step_o = V > 1 ? V : so.dim;
  bool first = true;
  for (int64_t w = blockIdx.x / C; w < sh.outer * sh.tiles; w += gridDim.x / C) {
    const int64_t o = w / sh.tiles, c = (w % sh.tiles) * L + li;
    const bool live = c < sh.inner;
    const T* a = in0 + o * s0.outer + c * s0.inner;
    const T* b = in1 + o * s1.outer + c * s1.inner;  // backward: y
    T* d = out + o * so.outer + c * so.inner;

    // Pass 1.
    P part;
    if (live) {
      for (int64_t u0 = begin + along; u0 < end; u0 += int64_t{stride} * U) {
        A v[U][V];
#pragma unroll
        for (int k = 0; k < U; ++k) {
          const int64_t u = u0 + int64_t{k} * stride;
          if (u < end) {
            load_pack<T, V>(a + u * step0, v[k]);
          } else {
#pragma unroll
            for (int j = 0; j < V; ++j) v[k][j] = Backward ? A(0) : neg_inf<A>();
          }
        }
        if constexpr (Backward) {
#pragma unroll
          for (int k = 0; k < U; ++k)
#pragma unroll
            for (int j = 0; j < V; ++j) part.v += v[k][j];
        } else {
          A m = part.v.m;
#pragma unroll
          for (int k = 0; k < U; ++k)
#pragma unroll
            for (int j = 0; j < V; ++j) m = max_acc(m, v[k][j]);
          A s = part.v.s * rescale(part.v.m, m, f);
#pragma unroll
          for (int k = 0; k < U; ++k)
#pragma unroll
            for (int j = 0; j < V; ++j) s += exp_shifted(v[k][j], m, f);
          part.v = {m, s};
        }
      }
    }
    // Threads of one inner lane differ by multiples of L: within a warp first (L < 32), then
    // through shared memory.
    for (int offset = 16; offset >= L; offset /= 2) part.merge(part.shfl_xor(offset), f);
    if (L >= 32) {
      red[tid] = part;
    } else if (lane < L) {
      red[warp * L + lane] = part;
    }
#ifdef SOFTLIGHT_HOPPER
    if (C > 1 && !first) cluster_wait();  // the cluster has read `mine` of the last position
#endif
    __syncthreads();
    if (tid < L) {
      P r;
      for (int k = 0; k < per_lane; ++k) r.merge(red[k * L + tid], f);
      mine[tid] = r;
      total[tid] = r;
    }
#ifdef SOFTLIGHT_HOPPER
    if (C > 1) {
      cluster_sync();  // every CTA's `mine` is written
      if (tid < L) {
        P r;
        for (int q = 0; q < C; ++q) r.merge(P::remote(&mine[tid], q), f);
        total[tid] = r;
      }
      cluster_arrive();  // done reading the others' `mine`
    }
#endif
    __syncthreads();
    const P fin = total[li];
    first = false;

    // Pass 2.
    if (!live) continue;
    A log_sum = 0;
    if constexpr (!Backward) {
      log_sum = log_acc(fin.v.s);
      if (lse != nullptr && rank == 0 && along == 0) lse[o * sh.inner + c] = fin.v.m * scale + log_sum;
    }
    for (int64_t u0 = begin + along; u0 < end; u0 += int64_t{stride} * U) {
      A v[U][V];
      A g[Backward ? U : 1][V];
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const int64_t u = u0 + int64_t{k} * stride;
        if (u < end) {
          load_pack<T, V>(a + u * step0, v[k]);
          if constexpr (Backward) load_pack<T, V>(b + u * step1, g[k]);
        }
      }
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const int64_t u = u0 + int64_t{k} * stride;
        if (u < end) {
#pragma unroll
          for (int j = 0; j < V; ++j) {
            if constexpr (Backward) {
              v[k][j] = log_softmax_grad(v[k][j], g[k][j], fin.v);
            } else {
              v[k][j] = log_softmax_out_scaled(v[k][j], fin.v.m, scale, log_sum);
            }
          }
          store_pack<T, V>(d + u * step_o, v[k]);
        }
      }
    }
  }
#ifdef SOFTLIGHT_HOPPER
  if (C > 1 && !first) cluster_wait();  // no CTA leaves while another may read its `mine`
#endif
}

template <class T, int V, bool Backward>
cudaError_t launch(const Plan& p, const Call& a, cudaStream_t stream) {
  auto kernel = split_rows_kernel<T, V, Backward>;
  const SplitShape sh{a.n[0], a.n[2], p.axis.tiles, (a.n[1] + V - 1) / V, p.segment, p.axis.lanes, p.cluster};
  using P = Part<acc_t<T>, Backward>;
  const size_t smem = sizeof(P) * (size_t(p.threads) + 2 * size_t(p.axis.lanes));
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  const Strides s0{a.in0_s[0], a.in0_s[1], a.in0_s[2]}, s1{a.in1_s[0], a.in1_s[1], a.in1_s[2]},
      so{a.out_s[0], a.out_s[1], a.out_s[2]};
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  cfg.blockDim = dim3(p.threads);
  cfg.gridDim = dim3(static_cast<unsigned>(p.grid * p.cluster));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  if (p.cluster > 1) {
    if (p.cluster > 8) {
      const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      if (e != cudaSuccess) return e;
    }
    set_cluster_dim(&cfg, attr, p.cluster);
  }
  // Persistent: as many CTAs (clusters) as fit at once, each walking positions; launching a
  // cluster per position leaves SMs idle while whole clusters wait to be placed.
  int active = 0;
  if (p.cluster > 1) {
    const cudaError_t e = cudaOccupancyMaxActiveClusters(&active, kernel, &cfg);
    if (e != cudaSuccess) return e;
    if (active < 1) return cudaErrorInvalidClusterSize;
  } else {
    int device = 0, sms = 0, per_sm = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, p.threads, smem);
    if (e != cudaSuccess) return e;
    active = std::max(1, sms * per_sm);
  }
  cfg.gridDim = dim3(static_cast<unsigned>(std::min<int64_t>(p.grid, active) * p.cluster));
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<const T*>(a.in0), s0,
                                           static_cast<const T*>(a.in1), s1, static_cast<T*>(a.out), so,
                                           sh, static_cast<acc_t<T>>(a.scale), static_cast<acc_t<T>*>(a.lse));
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_split_rows(const Plan& p, const Call& a, cudaStream_t stream) {
  return with_element_type_and_vec(a.dtype, p.vec, [&](auto tag, auto vec) {
    using T = decltype(tag);
    constexpr int V = decltype(vec)::value;
    return a.backward ? launch<T, V, true>(p, a, stream) : launch<T, V, false>(p, a, stream);
  });
}

}  // namespace softlight
