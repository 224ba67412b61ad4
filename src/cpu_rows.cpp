// The CPU backend: the same semantics as the GPU kernels (float accumulation for 16- and 32-bit
// types, double for float64, the same special-value rules), parallel over rows with std::thread.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
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

// The sum of f(0) .. f(n - 1), in blocks with independent lanes (vectorizable, and short chains
// keep rounding error near the GPU's tree reduction); block totals are carried in double.
template <class A, class F> double row_sum(int64_t n, F f) {
  constexpr int64_t kBlock = 4096, kLanes = 16;
  double total = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    A lanes[kLanes] = {};
    int64_t j = b;
    for (; j + kLanes <= e; j += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) lanes[l] += f(j + l);
    for (; j < e; ++j) lanes[0] += f(j);
    A block = 0;
    for (int64_t l = 0; l < kLanes; ++l) block += lanes[l];
    total += block;
  }
  return total;
}

// Rows up to this many elements are read once, into a worker's scratch of this size; longer rows
// are streamed (read three times, converted on the fly), so that scratch stays bounded whatever the
// row length. The scratch comes from a nothrow allocation: where it cannot be had, rows stream.
constexpr int64_t kScratchElements = int64_t{1} << 14;

// A worker's scratch: kScratchElements values of A, or none (rows then stream).
// A worker's scratch for rows of n elements: n values where n is at most kScratchElements (none
// otherwise, or where the allocation fails: the rows then stream).
template <class A> struct Scratch {
  explicit Scratch(int64_t n)
      : data(n <= kScratchElements ? new (std::nothrow) A[static_cast<size_t>(n)] : nullptr) {}
  A* get() const { return data.get(); }
  std::unique_ptr<A[]> data;
};

// One row of n elements at x (stride xs) into y (stride ys), in the order the GPU kernels use:
// m = max of x, s = sum of exp((x - m) * scale), y = (x - m) * scale - log(s) (the difference taken
// before the scale, so that elements next to a large max keep theirs). Returns the row's log-sum-exp,
// m * scale + log(s). tmp: n values of scratch, or null (the row is read three times).
template <class T>
typename Traits<T>::A log_softmax_row(const T* x, int64_t xs, T* y, int64_t ys, int64_t n,
                                      typename Traits<T>::A scale, typename Traits<T>::A* tmp) {
  using A = typename Traits<T>::A;
  const A neg_inf = -std::numeric_limits<A>::infinity();
  if (tmp != nullptr)
    for (int64_t j = 0; j < n; ++j) tmp[j] = Traits<T>::load(x[j * xs]);
  const auto at = [&](int64_t j) { return tmp != nullptr ? tmp[j] : Traits<T>::load(x[j * xs]); };
  A m = neg_inf;
  for (int64_t j = 0; j < n; ++j) {
    const A v = at(j);
    m = v > m ? v : m;  // NaN never wins the max
  }
  const A shift = m == neg_inf ? A(0) : m;  // see the (max, sum) notes in numerics.cuh
  const double total = row_sum<A>(n, [&](int64_t j) { return std::exp((at(j) - shift) * scale); });
  const A log_sum = std::log(static_cast<A>(total));
  for (int64_t j = 0; j < n; ++j) y[j * ys] = Traits<T>::store((at(j) - m) * scale - log_sum);
  return m * scale + log_sum;
}

// One row of the backward: dx = dy - exp(y) * sum(dy). dx may be dy or y (read before written).
template <class T>
void log_softmax_backward_row(const T* dy, int64_t dys, const T* y, int64_t ys, T* dx, int64_t dxs,
                              int64_t n, typename Traits<T>::A* tmp) {
  using A = typename Traits<T>::A;
  if (tmp != nullptr)
    for (int64_t j = 0; j < n; ++j) tmp[j] = Traits<T>::load(dy[j * dys]);
  const auto g = [&](int64_t j) { return tmp != nullptr ? tmp[j] : Traits<T>::load(dy[j * dys]); };
  const A total = static_cast<A>(row_sum<A>(n, g));
  for (int64_t j = 0; j < n; ++j) dx[j * dxs] = Traits<T>::store(g(j) - std::exp(Traits<T>::load(y[j * ys])) * total);
}

// Work over [0, n) positions split among threads; f(begin, end) does a range.
template <class F> void parallel_for(int64_t n, int64_t elements_per_position, int num_threads, F f) {
  constexpr int64_t kMinElementsPerThread = int64_t{1} << 16;
  // The machine's thread count, asked once: each ask reads the system's CPU list (microseconds).
  static const int64_t kHardwareThreads = std::max(1u, std::thread::hardware_concurrency());
  int64_t workers = num_threads > 0 ? num_threads : kHardwareThreads;
  workers = std::min({workers, n, std::max<int64_t>(1, n * elements_per_position / kMinElementsPerThread)});
  if (workers <= 1) return f(int64_t{0}, n);
  std::vector<std::thread> pool;
  const int64_t per = (n + workers - 1) / workers;
  int64_t next = per;  // positions [0, per) stay on this thread
  try {
    for (; next < n; next += per) pool.emplace_back(f, next, std::min(n, next + per));
  } catch (...) {  // no more threads: this thread takes the rest
    f(next, n);
  }
  f(int64_t{0}, std::min(n, per));
  for (auto& t : pool) t.join();
}

// Every call, forward or backward: position p = o * inner + i (a row where inner is 1), its axis read
// at its stride, into the worker's scratch where the axis fits it (contiguous arithmetic measured
// 15-25 % faster).
template <class T> void run(const Call& c, int num_threads) {
  using A = typename Traits<T>::A;
  const int64_t inner = c.n[2], dim = c.n[1];
  parallel_for(c.n[0] * inner, dim, num_threads, [&c, inner, dim](int64_t p0, int64_t p1) {
    const Scratch<A> scratch(dim);
    A* tmp = scratch.get();
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t o = p / inner, i = p % inner;
      auto at = [o, i](const void* base, const int64_t* s) {
        return static_cast<const T*>(base) + o * s[0] + i * s[2];
      };
      T* out = const_cast<T*>(at(c.out, c.out_s));
      if (c.backward) {
        log_softmax_backward_row(at(c.in0, c.in0_s), c.in0_s[1], at(c.in1, c.in1_s), c.in1_s[1], out, c.out_s[1],
                                 dim, tmp);
        continue;
      }
      const A l = log_softmax_row(at(c.in0, c.in0_s), c.in0_s[1], out, c.out_s[1], dim, static_cast<A>(c.scale), tmp);
      if (c.lse != nullptr) static_cast<A*>(c.lse)[p] = l;
    }
  });
}

template <class F> softlight_status with_cpu_type(softlight_dtype dtype, F&& f) {
  switch (dtype) {
    case SOFTLIGHT_FLOAT32: f(float{}); break;
    case SOFTLIGHT_FLOAT64: f(double{}); break;
    case SOFTLIGHT_FLOAT16: f(Half{}); break;
    case SOFTLIGHT_BFLOAT16: f(BFloat16{}); break;
  }
  return SOFTLIGHT_SUCCESS;
}

// A checked call (validate.hpp) on the CPU.
softlight_status run_cpu(const Call& call, int num_threads) {
  return with_cpu_type(call.dtype, [&](auto tag) { run<decltype(tag)>(call, num_threads); });
}

}  // namespace
}  // namespace softlight

extern "C" softlight_status softlight_log_softmax_forward_cpu_ex(
    const void* x, int64_t x_row_stride, void* y, int64_t y_row_stride, int64_t rows, int64_t cols,
    softlight_dtype dtype, const softlight_forward_options* options, int num_threads) {
  using namespace softlight;
  softlight_status st;
  bool noop;
  const Call call = rows_forward_call(x, x_row_stride, y, y_row_stride, rows, cols, dtype, options, &st, &noop);
  return st != SOFTLIGHT_SUCCESS || noop ? st : run_cpu(call, num_threads);
}

extern "C" softlight_status softlight_log_softmax_forward_cpu(const void* x, int64_t x_row_stride,
                                                              void* y, int64_t y_row_stride,
                                                              int64_t rows, int64_t cols,
                                                              softlight_dtype dtype, int num_threads) {
  return softlight_log_softmax_forward_cpu_ex(x, x_row_stride, y, y_row_stride, rows, cols, dtype,
                                              nullptr, num_threads);
}

extern "C" softlight_status softlight_log_softmax_forward_3d_cpu(
    const void* x, const int64_t x_strides[3], void* y, const int64_t y_strides[3], int64_t outer,
    int64_t dim, int64_t inner, softlight_dtype dtype, const softlight_forward_options* options,
    int num_threads) {
  using namespace softlight;
  softlight_status st;
  bool noop;
  const Call call = forward_call(x, x_strides, y, y_strides, outer, dim, inner, dtype, options, &st, &noop);
  return st != SOFTLIGHT_SUCCESS || noop ? st : run_cpu(call, num_threads);
}

extern "C" softlight_status softlight_log_softmax_backward_3d_cpu(
    const void* dy, const int64_t dy_strides[3], const void* y, const int64_t y_strides[3], void* dx,
    const int64_t dx_strides[3], int64_t outer, int64_t dim, int64_t inner, softlight_dtype dtype,
    int num_threads) {
  using namespace softlight;
  softlight_status st;
  bool noop;
  const Call call = backward_call(dy, dy_strides, y, y_strides, dx, dx_strides, outer, dim, inner, dtype, &st, &noop);
  return st != SOFTLIGHT_SUCCESS || noop ? st : run_cpu(call, num_threads);
}

extern "C" softlight_status softlight_log_softmax_backward_cpu(
    const void* dy, int64_t dy_row_stride, const void* y, int64_t y_row_stride, void* dx,
    int64_t dx_row_stride, int64_t rows, int64_t cols, softlight_dtype dtype, int num_threads) {
  const int64_t dys[3] = {dy_row_stride, 1, 0}, ys[3] = {y_row_stride, 1, 0}, dxs[3] = {dx_row_stride, 1, 0};
  return softlight_log_softmax_backward_3d_cpu(dy, dys, y, ys, dx, dxs, rows, cols, 1, dtype, num_threads);
}
