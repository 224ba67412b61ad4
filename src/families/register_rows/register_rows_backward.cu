// register_rows' backward, dx = dy - exp(y) * sum(dy), one read of dy and y and one write of dx: rows
// of up to 256 vectors a group of lanes (warp_rows_backward_kernel), rows under 32 KB a CTA
// (cta_rows_backward_kernel).
#include <algorithm>

#include "device/backward.cuh"
#include "device/common.cuh"
#include "device/hopper.cuh"
#include "device/launch.hpp"
#include "families/register_rows/rule.hpp"

namespace softlight {
namespace {

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

cudaError_t launch_register_rows_backward(const Plan& p, const Call& a, cudaStream_t stream) {
  return with_element_type_and_vec(a.dtype, p.vec, [&](auto tag, auto vec) {
    return launch_backward_iters<decltype(tag), decltype(vec)::value>(p, a, stream);
  });
}

}  // namespace softlight
