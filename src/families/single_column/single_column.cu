// single_column: rows of one element as a flat array (single_column_kernel, single_column_packed_kernel
// where contiguous rows start on 16 bytes). One DRAM read, one write.
#include <algorithm>

#include "device/common.cuh"
#include "device/hopper.cuh"
#include "device/launch.hpp"

namespace softlight {
namespace {

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

}  // namespace

cudaError_t launch_single_column(const Plan& p, const Call& a, cudaStream_t stream) {
  return with_element_type(a.dtype, [&](auto tag) { return launch_column<decltype(tag)>(p, a, stream); });
}

}  // namespace softlight
