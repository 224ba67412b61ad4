// The CPU backend: the same semantics as the GPU kernels (float accumulation for 16- and 32-bit
// types, double for float64, the same special-value rules), parallel over rows with std::thread.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "softlight/softlight.h"
#include "validate.hpp"

namespace softlight {
namespace {

template <class To, class From> To bits_as(From v) {
  static_assert(sizeof(To) == sizeof(From));
  To r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}

// IEEE binary16 and bfloat16 storage types with round-to-nearest-even conversions.
struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };

float to_float(Half h) {
  const uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu, man = h.bits & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_as<float>(sign | 0x7f800000u | (man << 13));
  return bits_as<float>(sign | ((exp + 112) << 23) | (man << 13));
}

Half to_half(float f) {
  const uint32_t u = bits_as<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return {uint16_t(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u))};
  if (a >= 0x477ff000u) return {uint16_t(sign | 0x7c00u)};  // rounds past 65504
  if (a < 0x38800000u) {  // below 2^-14: subnormal or zero, in units of 2^-24
    const float scaled = bits_as<float>(a) * 16777216.0f;  // exact: a power-of-two scale
    return {uint16_t(sign | static_cast<uint16_t>(std::nearbyint(scaled)))};
  }
  a += 0xc8000fffu + ((a >> 13) & 1u);  // rebias the exponent and round half to even
  return {uint16_t(sign | (a >> 13))};
}

float to_float(BFloat16 b) { return bits_as<float>(uint32_t(b.bits) << 16); }

BFloat16 to_bfloat16(float f) {
  const uint32_t u = bits_as<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40u)};  // quiet the NaN
  return {uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

template <class T> struct Traits;
template <> struct Traits<float> {
  using A = float;
  static A load(float v) { return v; }
  static float store(A v) { return v; }
};
template <> struct Traits<double> {
  using A = double;
  static A load(double v) { return v; }
  static double store(A v) { return v; }
};
template <> struct Traits<Half> {
  using A = float;
  static A load(Half v) { return to_float(v); }
  static Half store(A v) { return to_half(v); }
};
template <> struct Traits<BFloat16> {
  using A = float;
  static A load(BFloat16 v) { return to_float(v); }
  static BFloat16 store(A v) { return to_bfloat16(v); }
};

// One row, in the order the GPU kernels and torch use: max, sum of exp(x - max), (x - max) - log.
// Returns the row's log-sum-exp, m + log(s).
template <class T>
typename Traits<T>::A log_softmax_row(const T* x, T* y, int64_t cols, typename Traits<T>::A scale,
                                      typename Traits<T>::A* tmp) {
  using A = typename Traits<T>::A;
  const A neg_inf = -std::numeric_limits<A>::infinity();
  for (int64_t j = 0; j < cols; ++j) tmp[j] = Traits<T>::load(x[j]) * scale;
  A m = neg_inf;
  for (int64_t j = 0; j < cols; ++j) m = tmp[j] > m ? tmp[j] : m;  // NaN never wins the max
  const A shift = m == neg_inf ? A(0) : m;  // see the (max, sum) notes in common.cuh
  // Sums in blocks with independent lanes (vectorizable, and short chains keep rounding error
  // near the GPU's tree reduction); block totals are carried in double.
  constexpr int64_t kBlock = 4096, kLanes = 16;
  double total = 0;
  for (int64_t b = 0; b < cols; b += kBlock) {
    const int64_t e = std::min(cols, b + kBlock);
    A lanes[kLanes] = {};
    int64_t j = b;
    for (; j + kLanes <= e; j += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) lanes[l] += std::exp(tmp[j + l] - shift);
    for (; j < e; ++j) lanes[0] += std::exp(tmp[j] - shift);
    A block = 0;
    for (int64_t l = 0; l < kLanes; ++l) block += lanes[l];
    total += block;
  }
  const A log_sum = std::log(static_cast<A>(total));
  for (int64_t j = 0; j < cols; ++j) y[j] = Traits<T>::store((tmp[j] - m) - log_sum);
  return m + log_sum;
}

template <class T>
void log_softmax_rows(const RowsCall& c, int64_t r0, int64_t r1) {
  using A = typename Traits<T>::A;
  std::vector<A> tmp(static_cast<size_t>(c.cols));
  const T* x = static_cast<const T*>(c.x);
  T* y = static_cast<T*>(c.y);
  A* lse = static_cast<A*>(c.lse);
  const A scale = static_cast<A>(c.scale);
  for (int64_t r = r0; r < r1; ++r) {
    const A l = log_softmax_row(x + r * c.x_stride, y + r * c.y_stride, c.cols, scale, tmp.data());
    if (lse != nullptr) lse[r] = l;
  }
}

template <class T> void run(const RowsCall& c, int num_threads) {
  constexpr int64_t kMinElementsPerThread = int64_t{1} << 16;
  int64_t workers = num_threads > 0 ? num_threads : std::max(1u, std::thread::hardware_concurrency());
  workers = std::min({workers, c.rows, std::max<int64_t>(1, c.rows * c.cols / kMinElementsPerThread)});
  if (workers <= 1) return log_softmax_rows<T>(c, 0, c.rows);
  std::vector<std::thread> pool;
  const int64_t per = (c.rows + workers - 1) / workers;
  int64_t next = per;  // rows [0, per) stay on this thread
  try {
    for (; next < c.rows; next += per)
      pool.emplace_back(log_softmax_rows<T>, std::cref(c), next, std::min(c.rows, next + per));
  } catch (...) {  // no more threads: this thread takes the rest
    log_softmax_rows<T>(c, next, c.rows);
  }
  log_softmax_rows<T>(c, 0, std::min(c.rows, per));
  for (auto& t : pool) t.join();
}

}  // namespace
}  // namespace softlight

extern "C" softlight_status softlight_log_softmax_forward_cpu_ex(
    const void* x, int64_t x_row_stride, void* y, int64_t y_row_stride, int64_t rows, int64_t cols,
    softlight_dtype dtype, const softlight_forward_options* options, int num_threads) {
  using namespace softlight;
  RowsCall call{x, x_row_stride, y, y_row_stride, rows, cols, dtype};
  bool noop = false;
  softlight_status st = apply_options(options, &call);
  if (st == SOFTLIGHT_SUCCESS) st = validate_rows_call(call, &noop);
  if (st != SOFTLIGHT_SUCCESS || noop) return st;
  switch (dtype) {
    case SOFTLIGHT_FLOAT32: run<float>(call, num_threads); break;
    case SOFTLIGHT_FLOAT64: run<double>(call, num_threads); break;
    case SOFTLIGHT_FLOAT16: run<Half>(call, num_threads); break;
    case SOFTLIGHT_BFLOAT16: run<BFloat16>(call, num_threads); break;
  }
  return SOFTLIGHT_SUCCESS;
}

extern "C" softlight_status softlight_log_softmax_forward_cpu(const void* x, int64_t x_row_stride,
                                                              void* y, int64_t y_row_stride,
                                                              int64_t rows, int64_t cols,
                                                              softlight_dtype dtype, int num_threads) {
  return softlight_log_softmax_forward_cpu_ex(x, x_row_stride, y, y_row_stride, rows, cols, dtype,
                                              nullptr, num_threads);
}
