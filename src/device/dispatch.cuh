// Host-side dispatch from a plan's run-time choices to the kernels' compile-time parameters.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>
#include <utility>

#include "softlight/softlight.h"

namespace softlight {

// Calls f(T{}) with the element type that dtype names (the caller has validated dtype).
template <class F> cudaError_t with_element_type(softlight_dtype dtype, F&& f) {
  switch (dtype) {
    case SOFTLIGHT_FLOAT32: return f(float{});
    case SOFTLIGHT_FLOAT16: return f(__half{});
    case SOFTLIGHT_BFLOAT16: return f(__nv_bfloat16{});
    case SOFTLIGHT_FLOAT64: return f(double{});
  }
  return cudaErrorInvalidValue;
}

// Calls f(T{}, std::integral_constant<int, V>{}) with the element type and the access width the
// plan chose: one element, or a 16-byte pack, or (kHalfPacks: warp_rows only) an 8-byte one.
template <bool kHalfPacks = false, class F>
cudaError_t with_element_type_and_vec(softlight_dtype dtype, int vec, F&& f) {
  return with_element_type(dtype, [&](auto tag) {
    constexpr int kPack = 16 / sizeof(tag);
    if constexpr (kHalfPacks && kPack >= 4)
      if (vec == kPack / 2) return f(tag, std::integral_constant<int, kPack / 2>{});
    return vec == 1 ? f(tag, std::integral_constant<int, 1>{})
                    : f(tag, std::integral_constant<int, kPack>{});
  });
}

// Calls f(std::integral_constant<int, N>{}) for the count n the planner chose, one of Ns (the
// unroll counts a kernel is built for); any other is an error.
template <int... Ns, class F> cudaError_t with_one_of(int n, F&& f) {
  cudaError_t r = cudaErrorInvalidValue;
  (void)((n == Ns && ((r = f(std::integral_constant<int, Ns>{})), true)) || ...);
  return r;
}
// Packs, rows or vectors a lane: 1, 2, 4 or 8.
template <class F> cudaError_t with_count(int n, F&& f) { return with_one_of<1, 2, 4, 8>(n, std::forward<F>(f)); }

}  // namespace softlight
