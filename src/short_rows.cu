// Short rows (the warp_rows family's plans for rows of a few packs or elements): rows in 16-byte
// packs up to 128 bytes, a lane holding a pack of each of several rows (short_rows_kernel); short
// contiguous rows not in 16-byte packs, in tiles through shared memory (flat_rows_kernel); rows of
// one element as a flat array (single_column_kernel, single_column_packed_kernel). One DRAM read,
// one write.
#include <cuda_pipeline.h>

#include <algorithm>

#include "common.cuh"
#include "hopper.cuh"
#include "kernels.hpp"

namespace softlight {
namespace {

// Short rows in 16-byte packs, one pack per lane and several rows per lane: a group of `group`
// lanes (at least the row's packs, at most a warp) holds a row, a warp 32 / group rows per load, so
// that each of a lane's R loads covers 512 contiguous bytes of the warp's R * 32 / group rows.
// Same arithmetic as rows_in_registers_kernel, R rows reduced side by side.
// G > 0 (16-bit rows, the design notes in git history before 5e4337e "Short rows, leaner"): the group known at compile time, so that
// its butterflies unroll to their levels; and where the group has a lane for each of the R rows
// (G >= R), each row's log is taken on one lane of the group and passed to the others, one log a
// lane instead of R.
template <class T, int R, int G = 0>
__global__ void __launch_bounds__(kWarpRowsThreads)
short_rows_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys, int64_t rows, int vectors,
                  int group_arg, acc_t<T> scale, acc_t<T>* __restrict__ lse) {
  using A = acc_t<T>;
  const int group = G > 0 ? G : group_arg;
  const int lane = threadIdx.x & 31;
  const int sub = lane & (group - 1);
  const int step = 32 / group;  // rows per load of a warp
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  const int64_t warp = int64_t{blockIdx.x} * (blockDim.x / 32) + (threadIdx.x >> 5);
  for (int64_t base = warp * step * R; base < rows; base += warps * step * R) {
    uint4 p[R][1];
    bool live[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t row = base + i * step + lane / group;
      live[i] = row < rows && sub < vectors;
      p[i][0] = live[i] ? reinterpret_cast<const uint4*>(x + row * xs)[sub] : neg_inf_pack<T>();
    }
    A m[R], log_sum[R];
    if constexpr (G > 0) {
#pragma unroll
      for (int i = 0; i < R; ++i) m[i] = group_max<G>(packs_max<T, 1>(p[i]));
      A sum[R];
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const ShiftedExp<A> ex = shifted_exp(m[i], scale);
        sum[i] = group_sum<G>(packs_exp_sum<T, 1>(p[i], ex)) * exp_base(-ex.lo);
      }
      if constexpr (G >= R) {
        // Row i's sum is the same on every lane of the group: lane i takes its log for all.
        A mine = sum[0];
#pragma unroll
        for (int i = 1; i < R; ++i) mine = (sub & (R - 1)) == i ? sum[i] : mine;
        const A log_mine = log_acc(mine);
#pragma unroll
        for (int i = 0; i < R; ++i) log_sum[i] = __shfl_sync(0xffffffffu, log_mine, i, G);
      } else {
#pragma unroll
        for (int i = 0; i < R; ++i) log_sum[i] = log_acc(sum[i]);
      }
    } else {  // the group at run time: kept apart, as one path with the above changes its code (fp32)
#pragma unroll
      for (int i = 0; i < R; ++i) m[i] = group_max(packs_max<T, 1>(p[i]), group);
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const ShiftedExp<A> ex = shifted_exp(m[i], scale);
        log_sum[i] = log_acc(group_sum(packs_exp_sum<T, 1>(p[i], ex), group) * exp_base(-ex.lo));
      }
    }
#pragma unroll
    for (int i = 0; i < R; ++i) opaque(p[i][0]);
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t row = base + i * step + lane / group;
      if (lse != nullptr && row < rows && sub == 0) lse[row] = m[i] * scale + log_sum[i];
      if (live[i]) store_log_softmax_pack<T>(y + row * ys + sub * (16 / sizeof(T)), p[i][0], m[i], scale, log_sum[i]);
    }
  }
}

// Flat tiles: short rows in one contiguous run from a 16-byte boundary, not in 16-byte packs
// themselves (rows of 7 or 100 bf16). A CTA moves a tile of blockDim.x * k rows between global
// memory and shared memory as 16-byte packs of the flat array (a tile starts on 16 bytes: its
// rows are a multiple of 128), and each thread does k rows in shared memory, x replaced by y in
// place. Same arithmetic as rows_in_registers_kernel.
template <class T>
__global__ void __launch_bounds__(kWarpRowsThreads)
flat_rows_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int cols, int k, int spread,
                 acc_t<T> scale, acc_t<T>* __restrict__ lse) {
  using A = acc_t<T>;
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
      const ShiftedExp<A> ex = shifted_exp(m, scale);
      A s0 = A(0), s1 = A(0);
#pragma unroll 2
      for (int j = 0; j + 1 < cols; j += 2) {
        s0 += exp_base(fma(to_acc(row[j]), ex.f, -ex.hi));
        s1 += exp_base(fma(to_acc(row[j + 1]), ex.f, -ex.hi));
      }
      if (cols & 1) s0 += exp_base(fma(to_acc(row[cols - 1]), ex.f, -ex.hi));
      const A log_sum = log_acc((s0 + s1) * exp_base(-ex.lo));
      if (lse != nullptr) lse[r0 + r] = m * scale + log_sum;
#pragma unroll 4
      for (int j = 0; j < cols; ++j) row[j] = from_acc<T>(log_softmax_out_scaled(to_acc(row[j]), m, scale, log_sum));
    }
    __syncthreads();
    uint4* dst = reinterpret_cast<uint4*>(y + e0);
    for (int i = threadIdx.x; i < packs; i += blockDim.x) store_global_v4(dst + i, tile[i]);
    for (int i = packs * V + threadIdx.x; i < n; i += blockDim.x) y[e0 + i] = t[i];
    __syncthreads();  // the tile is refilled by the next
  }
}

// Rows of one element: the same algebra, eight rows per thread in flight (one row per lane and
// step would leave the loads latency-bound: 1 GB of one-element rows took 3x a copy).
constexpr int kSingleRows = 8;
template <class T>
__global__ void __launch_bounds__(kWarpRowsThreads)
single_column_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys, int64_t rows,
                     acc_t<T> scale, acc_t<T>* __restrict__ lse) {
  using A = acc_t<T>;
  const int64_t threads = int64_t{gridDim.x} * blockDim.x;
  for (int64_t base = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; base < rows; base += threads * kSingleRows) {
    A v[kSingleRows];
#pragma unroll
    for (int k = 0; k < kSingleRows; ++k) {
      const int64_t r = base + k * threads;
      v[k] = r < rows ? to_acc(x[r * xs]) : A(0);  // unscaled: x - max is 0 before any scale
    }
#pragma unroll
    for (int k = 0; k < kSingleRows; ++k) {
      const int64_t r = base + k * threads;
      if (r < rows) {
        const A log_sum = log_acc(exp_shifted(v[k], v[k]));
        y[r * ys] = from_acc<T>(log_softmax_out(v[k], v[k], log_sum));
        if (lse != nullptr) lse[r] = v[k] * scale + log_sum;
      }
    }
  }
}

// Contiguous one-element rows are one flat array: 16-byte packs of V rows, kSinglePacks packs per
// thread in flight (element by element, 1 GB of 16-bit rows took 2.5x a copy). Thread t of the
// grid also takes row packs * V + t of the tail.
constexpr int kSinglePacks = 4;
template <class T, int V>
__global__ void __launch_bounds__(kWarpRowsThreads)
single_column_packed_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, acc_t<T> scale,
                            acc_t<T>* __restrict__ lse) {
  using A = acc_t<T>;
  const int64_t threads = int64_t{gridDim.x} * blockDim.x;
  const int64_t tid = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t packs = rows / V;
  // A lone value's sum is exp(0) = 1 where it is finite: y = v - v (0, or NaN for NaN and +-inf),
  // the scale never applied to it (x * scale could overflow where (x - max) * scale is 0), and the
  // LSE is v * scale (NaN for +inf, as for any row holding +inf), with no exp or log to take.
  auto one = [&](A v, int64_t r) {
    if (lse != nullptr) lse[r] = v == -neg_inf<A>() ? v - v : v * scale;
    return v - v;
  };
  for (int64_t base = tid; base < packs; base += threads * kSinglePacks) {
    A v[kSinglePacks][V];
#pragma unroll
    for (int k = 0; k < kSinglePacks; ++k)
      if (base + k * threads < packs) load_pack<T, V>(x + (base + k * threads) * V, v[k]);
#pragma unroll
    for (int k = 0; k < kSinglePacks; ++k) {
      const int64_t pk = base + k * threads;
      if (pk < packs) {
#pragma unroll
        for (int j = 0; j < V; ++j) v[k][j] = one(v[k][j], pk * V + j);
        store_pack<T, V>(y + pk * V, v[k]);
      }
    }
  }
  const int64_t r = packs * V + tid;
  if (r < rows) y[r] = from_acc<T>(one(to_acc(x[r]), r));
}

template <class T>
cudaError_t launch_column(const Plan& p, const Call& a, cudaStream_t stream) {
  const T* x = static_cast<const T*>(a.x());
  T* y = static_cast<T*>(a.y());
  const auto scale = static_cast<acc_t<T>>(a.scale);
  auto* lse = static_cast<acc_t<T>*>(a.lse);
  constexpr int V = 16 / sizeof(T);
  const bool flat = (a.rows() == 1 || (a.x_stride() == 1 && a.y_stride() == 1)) &&
                    reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  if (flat && V > 1) {
    const int64_t per_cta = int64_t{kWarpRowsThreads} * kSinglePacks * V;
    const int64_t grid = std::clamp<int64_t>((a.rows() + per_cta - 1) / per_cta, 1, p.grid);
    single_column_packed_kernel<T, V><<<static_cast<unsigned>(grid), kWarpRowsThreads, 0, stream>>>(
        x, y, a.rows(), scale, lse);
    return cudaGetLastError();
  }
  const int64_t grid = std::min<int64_t>(p.grid, (a.rows() + kWarpRowsThreads * kSingleRows - 1) /
                                                     (kWarpRowsThreads * kSingleRows));
  single_column_kernel<T><<<static_cast<unsigned>(grid), kWarpRowsThreads, 0, stream>>>(
      x, a.x_stride(), y, a.y_stride(), a.rows(), scale, lse);
  return cudaGetLastError();
}

// short_rows_kernel for the plan's rows a lane: 16-bit rows as planned (four a lane, groups up to
// 8) with the group at compile time (the design notes in git history before 5e4337e, "Short rows, leaner"; fp32 rows of 32 ran 1.5 %
// slower so, and keep the group as an argument).
template <class T, class Kernel> cudaError_t choose_short_rows(const Plan& p, Kernel& k) {
  if constexpr (sizeof(T) == 2) {
    if (p.warp.rows_per_lane == kShortRowsPerLane && p.warp.group <= 8)
      return with_count(p.warp.group, [&](auto g) {
        k = short_rows_kernel<T, kShortRowsPerLane, decltype(g)::value>;
        return cudaSuccess;
      });
  }
  return with_count(p.warp.rows_per_lane, [&](auto n) {
    k = short_rows_kernel<T, decltype(n)::value>;
    return cudaSuccess;
  });
}

template <class T>
cudaError_t launch_short(const Plan& p, const Call& a, cudaStream_t stream) {
  using Kernel = void (*)(const T*, int64_t, T*, int64_t, int64_t, int, int, acc_t<T>, acc_t<T>*);
  Kernel k = nullptr;
  if (const cudaError_t e = choose_short_rows<T>(p, k); e != cudaSuccess) return e;
  constexpr int V = 16 / sizeof(T);
  k<<<static_cast<unsigned>(p.grid), p.threads, 0, stream>>>(static_cast<const T*>(a.x()), a.x_stride(),
                                                             static_cast<T*>(a.y()), a.y_stride(), a.rows(),
                                                             static_cast<int>(a.cols() / V), p.warp.group,
                                                             static_cast<acc_t<T>>(a.scale),
                                                             static_cast<acc_t<T>*>(a.lse));
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_short_rows(const Plan& p, const Call& a, cudaStream_t stream) {
  return with_element_type(a.dtype, [&](auto tag) { return launch_short<decltype(tag)>(p, a, stream); });
}

cudaError_t launch_flat_rows(const Plan& p, const Call& a, cudaStream_t stream) {
  return with_element_type(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    flat_rows_kernel<T><<<static_cast<unsigned>(p.grid), p.threads, p.smem_bytes, stream>>>(
        static_cast<const T*>(a.x()), static_cast<T*>(a.y()), a.rows(), static_cast<int>(a.cols()), p.warp.flat_rows,
        p.warp.flat_spread, static_cast<acc_t<T>>(a.scale), static_cast<acc_t<T>*>(a.lse));
    return cudaGetLastError();
  });
}

cudaError_t launch_single_column(const Plan& p, const Call& a, cudaStream_t stream) {
  return with_element_type(a.dtype, [&](auto tag) { return launch_column<decltype(tag)>(p, a, stream); });
}

}  // namespace softlight
