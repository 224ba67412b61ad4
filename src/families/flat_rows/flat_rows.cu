// flat_rows: short contiguous rows not in 16-byte packs, in tiles through shared memory
// (flat_rows_kernel). One DRAM read, one write. The same kernel writes the consumers' outputs
// (consumer_out.cuh): cross-entropy's loss and gradient, and the row statistics
// (launch_flat_rows_ce, _stats).
#include <cuda_pipeline.h>

#include <limits>

#include "device/common.cuh"
#include "device/consumer_out.cuh"
#include "device/hopper.cuh"
#include "device/launch.hpp"

namespace softlight {
namespace {

// Flat tiles: short rows in one contiguous run from a 16-byte boundary, not in 16-byte packs
// themselves (rows of 7 or 100 bf16). A CTA moves a tile of blockDim.x * k rows between global
// memory and shared memory as 16-byte packs of the flat array (a tile starts on 16 bytes: its
// rows are a multiple of 128), and each thread does k rows in shared memory, x replaced by y in
// place. Same arithmetic as rows_in_registers_kernel. What is written of a row is `out`'s
// (consumer_out.cuh): the log-softmax (LogSoftmaxOut), cross-entropy's gradient (CrossEntropyOut),
// or nothing but the statistics (RowStatsOut: the tile is not written back; with the moment where
// its kMoment is set). A thread is its row's one lane.
template <class T, class Out>
__global__ void __launch_bounds__(kWarpRowsThreads)
flat_rows_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int cols, int k, int spread,
                 acc_t<T> scale, Out out) {
  using A = acc_t<T>;
  static_assert(!Out::kMoment || Out::kGather, "the moment's outputs write no element");
  constexpr int V = 16 / sizeof(T);
  extern __shared__ uint4 tile[];
  T* t = reinterpret_cast<T*>(tile);
  const int64_t tile_rows = int64_t{blockDim.x} * k;
  for (int64_t r0 = blockIdx.x * tile_rows; r0 < rows; r0 += int64_t{gridDim.x} * tile_rows) {
    const int n_rows = static_cast<int>(rows - r0 < tile_rows ? rows - r0 : tile_rows);
    const int n = n_rows * cols;  // elements of this tile
    const int packs = n / V;
    const int64_t e0 = r0 * cols;
    const uint4* src = reinterpret_cast<const uint4*>(x + e0);
    // Asynchronous copies (cp.async): every pack of the tile in flight at once, none through registers.
    for (int i = threadIdx.x; i < packs; i += blockDim.x) __pipeline_memcpy_async(tile + i, src + i, 16);
    __pipeline_commit();
    for (int i = packs * V + threadIdx.x; i < n; i += blockDim.x) t[i] = x[e0 + i];
    __pipeline_wait_prior(0);
    __syncthreads();
    // A warp takes 32 rows `spread` rows apart (the planner picks spread so that the lanes' rows
    // start on distinct banks of shared memory), rounds of them in turn.
    const int rounds = (n_rows + 32 * spread - 1) / (32 * spread) * spread;
    for (int round = threadIdx.x >> 5; round < rounds; round += blockDim.x >> 5) {
      const int r = round / spread * 32 * spread + round % spread + spread * (threadIdx.x & 31);
      if (r >= n_rows) continue;
      T* row = t + r * cols;
      A m = neg_inf<A>();
#pragma unroll 4
      for (int j = 0; j < cols; ++j) m = max_acc(m, to_acc(row[j]));
      if constexpr (Out::kMoment) {  // the sums of e = exp_base(u) and e u, then the row's (packs_exp_moment's)
        const Shift<A> sh = shift_of(m, scale);
        A s = A(0), w = A(0);
#pragma unroll 2
        for (int j = 0; j < cols; ++j) {
          const A d = fma(to_acc(row[j]), sh.e.f, -sh.e.hi), e = exp_base(d);
          s += e;
          w = fma(e, max_acc(d, -std::numeric_limits<A>::max()), w);
        }
        const A moment = sh.k * (w - sh.e.lo * s);
        s *= sh.r;
        out.row(r0 + r, m, s, moment, log_acc(s), 0, 1);
      } else {
        const ShiftedExp<A> ex = shifted_exp(m, scale);
        A s0 = A(0), s1 = A(0);
#pragma unroll 2
        for (int j = 0; j + 1 < cols; j += 2) {
          s0 += exp_base(fma(to_acc(row[j]), ex.f, -ex.hi));
          s1 += exp_base(fma(to_acc(row[j + 1]), ex.f, -ex.hi));
        }
        if (cols & 1) s0 += exp_base(fma(to_acc(row[cols - 1]), ex.f, -ex.hi));
        const A s = (s0 + s1) * exp_base(-ex.lo);
        const auto w = out.row(r0 + r, m, s, log_acc(s), 0, 1);
        if constexpr (!Out::kGather) {
#pragma unroll 4
          for (int j = 0; j < cols; ++j) row[j] = from_acc<T>(w.element(to_acc(row[j]), j));
        }
      }
    }
    if constexpr (Out::kGather) {
      __syncthreads();  // the tile is refilled by the next
      continue;
    }
    __syncthreads();
    uint4* dst = reinterpret_cast<uint4*>(y + e0);
    for (int i = threadIdx.x; i < packs; i += blockDim.x) store_global_v4(dst + i, tile[i]);
    for (int i = packs * V + threadIdx.x; i < n; i += blockDim.x) y[e0 + i] = t[i];
    __syncthreads();  // the tile is refilled by the next
  }
}

// flat_rows_kernel for the plan's tiles, the rows of call a, with the output `out`.
template <class T, class O> cudaError_t launch_flat(const Plan& p, const Call& a, const O& out, cudaStream_t stream) {
  flat_rows_kernel<T, O><<<static_cast<unsigned>(p.grid), p.threads, p.smem_bytes, stream>>>(
      static_cast<const T*>(a.x()), static_cast<T*>(a.y()), a.rows(), static_cast<int>(a.cols()), p.warp.flat_rows,
      p.warp.flat_spread, static_cast<acc_t<T>>(a.scale), out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_flat_rows(const Plan& p, const Call& a, cudaStream_t stream) {
  return with_element_type(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    return launch_flat<T>(p, a, LogSoftmaxOut<T>{static_cast<acc_t<T>>(a.scale), static_cast<acc_t<T>*>(a.lse)},
                          stream);
  });
}

cudaError_t launch_flat_rows_ce(const Plan& p, const Call& a, const int64_t* target,
                                const CrossEntropyArgs<float>& args, bool loss_only, cudaStream_t stream) {
  return with_cross_entropy_out(a, target, args, loss_only, [&](auto tag, const auto& out) {
    return launch_flat<decltype(tag)>(p, a, out, stream);
  });
}

cudaError_t launch_flat_rows_stats(const Plan& p, const Call& a, const ConsumerArgs<float>& args,
                                   cudaStream_t stream) {
  return with_row_stats_out(
      a, args, [&](auto tag, const auto& out) { return launch_flat<decltype(tag)>(p, a, out, stream); });
}

}  // namespace softlight
