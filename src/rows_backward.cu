// The backward of rows held in registers, dx = dy - exp(y) * sum(dy), one read of dy and y and one
// write of dx: rows of up to 32 packs a pack of each of several rows a lane
// (short_rows_backward_kernel), rows of up to 256 vectors a group of lanes
// (warp_rows_backward_kernel), rows under 32 KB a CTA (cta_rows_backward_kernel).
#include <algorithm>

#include "common.cuh"
#include "hopper.cuh"
#include "kernels.hpp"

namespace softlight {
namespace {

// The backward's steps on a pack of dy (g) and y (p) as load_raw gave them: dy's elements added to
// s in order; dx = dy - exp(y) * s.
template <class T, int V> __device__ __forceinline__ void add_raw(acc_t<T>& s, const T (&g)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) s += to_acc(g[j]);
}
template <class T, int V>
__device__ __forceinline__ void grad_pack(acc_t<T> (&d)[V], const T (&g)[V], const T (&p)[V], acc_t<T> s) {
#pragma unroll
  for (int j = 0; j < V; ++j) d[j] = log_softmax_grad(to_acc(g[j]), to_acc(p[j]), s);
}

// The backward, dx = dy - exp(y) * sum(dy): the group holds a row of dy and of y in registers.
template <class T, int V, int ITERS>
__global__ void __launch_bounds__(kWarpRowsThreads)
warp_rows_backward_kernel(const T* __restrict__ dy, int64_t dys, const T* __restrict__ y, int64_t ys,
                          T* __restrict__ dx, int64_t dxs, int64_t rows, int cols, int group) {
  using A = acc_t<T>;
  const int lane = threadIdx.x & 31;
  const int sub = lane & (group - 1);
  const int rows_per_warp = 32 / group;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  const int64_t warp = int64_t{blockIdx.x} * (blockDim.x / 32) + (threadIdx.x >> 5);
  for (int64_t base = warp * rows_per_warp; base < rows; base += warps * rows_per_warp) {
    const int64_t row = base + lane / group;
    const bool live = row < rows;
    // dy and y as loaded (zeros past the row), every load issued before any is converted or summed.
    T g[ITERS][V], p[ITERS][V];
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int e = (i * group + sub) * V;
      load_raw<T, V>(dy + row * dys + e, live && e < cols, g[i]);
      load_raw<T, V>(y + row * ys + e, live && e < cols, p[i]);
    }
    A s = 0;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) add_raw(s, g[i]);
    s = group_sum(s, group);
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int e = (i * group + sub) * V;
      if (live && e < cols) {
        A d[V];
        grad_pack(d, g[i], p[i], s);
        store_pack<T, V>(dx + row * dxs + e, d);
      }
    }
  }
}

// The same backward for rows of at most 32 packs, a pack of each of R rows a lane (as the forward's
// short rows), so that each load of a warp covers 512 contiguous bytes where groups of fewer than
// eight lanes, several packs each, read runs of 32 or 64 bytes.
template <class T, int V, int R>
__global__ void __launch_bounds__(kWarpRowsThreads)
short_rows_backward_kernel(const T* __restrict__ dy, int64_t dys, const T* __restrict__ y, int64_t ys,
                           T* __restrict__ dx, int64_t dxs, int64_t rows, int cols, int group) {
  using A = acc_t<T>;
  const int lane = threadIdx.x & 31;
  const int e = (lane & (group - 1)) * V;
  const int span = 32 / group;  // rows one load of a warp covers
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  const int64_t warp = int64_t{blockIdx.x} * (blockDim.x / 32) + (threadIdx.x >> 5);
  for (int64_t base = warp * span * R; base < rows; base += warps * span * R) {
    T g[R][V], p[R][V];  // dy and y as loaded, every load issued before any is summed
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = base + r * span + lane / group;
      load_raw<T, V>(dy + row * dys + e, row < rows && e < cols, g[r]);
      load_raw<T, V>(y + row * ys + e, row < rows && e < cols, p[r]);
    }
    A s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      s[r] = 0;
      add_raw(s[r], g[r]);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = group_sum(s[r], group);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = base + r * span + lane / group;
      if (row < rows && e < cols) {
        A d[V];
        grad_pack(d, g[r], p[r], s[r]);
        store_pack<T, V>(dx + row * dxs + e, d);
      }
    }
  }
}

// The same backward where the group is the CTA (rows past a warp's eight packs a thread): a row a
// CTA, the sum over the CTA. The kernels share the pack steps only: sharing one row function changed
// warp_rows_backward_kernel's code as measured.
template <class T, int V, int ITERS>
__global__ void __launch_bounds__(kBackwardCtaThreads, 2)
cta_rows_backward_kernel(const T* __restrict__ dy, int64_t dys, const T* __restrict__ y, int64_t ys,
                         T* __restrict__ dx, int64_t dxs, int64_t rows, int cols) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  const int t = threadIdx.x, threads = blockDim.x;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    T g[ITERS][V], p[ITERS][V];  // dy and y as loaded, every load issued before any is summed
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int e = (i * threads + t) * V;
      load_raw<T, V>(dy + row * dys + e, e < cols, g[i]);
      load_raw<T, V>(y + row * ys + e, e < cols, p[i]);
    }
    A s = 0;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) add_raw(s, g[i]);
    s = block_sum(s, scratch, threads, 1);
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int e = (i * threads + t) * V;
      if (e < cols) {
        A d[V];
        grad_pack(d, g[i], p[i], s);
        store_pack<T, V>(dx + row * dxs + e, d);
      }
    }
  }
}

template <class T, int V>
cudaError_t launch_backward_iters(const Plan& p, const Call& a, cudaStream_t stream) {
  const auto dy = static_cast<const T*>(a.in0), y = static_cast<const T*>(a.in1);
  const auto dx = static_cast<T*>(a.out);
  const int64_t rows = a.n[0];
  const int cols = static_cast<int>(a.n[1]);
  const dim3 grid(static_cast<unsigned>(p.grid)), block(p.threads);
  if (p.warp.rows_per_lane > 0)  // short rows: a pack of each of rows_per_lane rows a lane
    return with_count(p.warp.rows_per_lane, [&](auto per_lane) {
      short_rows_backward_kernel<T, V, decltype(per_lane)::value><<<grid, block, 0, stream>>>(
          dy, a.in0_s[0], y, a.in1_s[0], dx, a.out_s[0], rows, cols, p.warp.group);
      return cudaGetLastError();
    });
  if (p.warp.group > 32) {  // a CTA a row, four packs a thread (the planner's only count there)
    if (p.warp.iters != 4) return cudaErrorInvalidValue;
    cta_rows_backward_kernel<T, V, 4><<<grid, block, 0, stream>>>(dy, a.in0_s[0], y, a.in1_s[0], dx, a.out_s[0],
                                                                  rows, cols);
    return cudaGetLastError();
  }
  return with_count(p.warp.iters, [&](auto iters) {
    warp_rows_backward_kernel<T, V, decltype(iters)::value><<<grid, block, 0, stream>>>(
        dy, a.in0_s[0], y, a.in1_s[0], dx, a.out_s[0], rows, cols, p.warp.group);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t launch_warp_rows_backward(const Plan& p, const Call& a, cudaStream_t stream) {
  return with_element_type_and_vec(a.dtype, p.vec, [&](auto tag, auto vec) {
    return launch_backward_iters<decltype(tag), decltype(vec)::value>(p, a, stream);
  });
}

}  // namespace softlight
