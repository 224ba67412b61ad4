// Numerics: element types and their accumulation type, exp and log as the kernels take them, the
// (max, sum) algebra that keeps special values exactly as torch.log_softmax has them, and the output
// of one element. Device code shared by every kernel family.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace softlight {

// Accumulation type: float for every type but double.
template <class T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };
template <class T> using acc_t = typename AccOf<T>::type;

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T> __device__ __forceinline__ T from_acc(acc_t<T> v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ double from_acc<double>(double v) { return v; }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <class A> __device__ __forceinline__ A neg_inf();
template <> __device__ __forceinline__ float neg_inf<float>() { return -__int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double neg_inf<double>() {
  return -__longlong_as_double(0x7ff0000000000000LL);
}

// exp(d * scale) as exp_base(d * exp_factor(scale)): for float the factor carries log2(e) and
// exp_base is the special function unit's 2^x (ex2.approx, relative error near 2^-22: the sums it
// feeds are compared against float64 in the tests); float64 keeps the accurate exp.
__device__ __forceinline__ float exp_factor(float scale) { return scale * 1.4426950408889634f; }
__device__ __forceinline__ double exp_factor(double scale) { return scale; }
__device__ __forceinline__ float exp_base(float t) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(t));
  return r;
}
__device__ __forceinline__ double exp_base(double t) { return exp(t); }
__device__ __forceinline__ float log_acc(float v) { return logf(v); }
__device__ __forceinline__ double log_acc(double v) { return log(v); }
// fmax ignores a NaN operand; a NaN still reaches the result through the sum (see exp_shifted).
__device__ __forceinline__ float max_acc(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double max_acc(double a, double b) { return fmax(a, b); }

// --- the (max, sum) algebra --------------------------------------------------------------------
// A partial (m, s) means s = sum exp(x - m) over the elements seen, with the convention that a
// partial whose max is -inf (nothing seen, or only -inf) is shifted by 0 instead: exp(-inf - -inf)
// would be NaN and would poison rows that are finite elsewhere. A NaN element still makes s NaN,
// and +inf makes it NaN through inf - inf, which is what torch gives for such rows.

// (v - m) * c for v <= m, c >= 0 a scale or an exp factor (one for scale 1: exp_factor(1)), taken so
// that it overflows only where its value does. Where c is below one's, v - m can overflow while the
// scaled difference is finite ([3e38, -1e38] at T = 5e37 in float): the halves are subtracted,
// (v/2 - m/2) * 2c, which rounds as (v - m) * c wherever v - m is finite (a power of two moves no
// rounding; a flushed subnormal half is far below the row's log-sum). Elsewhere fma(v, 1, -m) is
// v - m. h depends on c alone: loops hoist it and m * h, and an element costs an FFMA and an FMUL.
template <class A> __device__ __forceinline__ A scaled_difference(A v, A m, A c, A one) {
  const bool halve = c < one;
  const A h = halve ? A(0.5) : A(1);
  return fma(v, h, -(m * h)) * (halve ? c + c : c);
}
// exp((v - m) * scale) as exp_base((v - m) * f), f = exp_factor(scale) (by default scale 1), with
// the shift taken as 0 when m is -inf. The difference comes first, so that elements next to a large
// max keep theirs (v * scale - m * scale would round them away).
template <class A> __device__ __forceinline__ A exp_shifted(A v, A m, A f = exp_factor(A(1))) {
  return exp_base(scaled_difference(v, m == neg_inf<A>() ? A(0) : m, f, exp_factor(A(1))));
}
// The factor that moves a sum taken relative to m_old onto m_new >= m_old. With a factor f =
// exp_factor(scale), the maxima are those of x and the sums are of exp((x - m) * scale).
template <class A> __device__ __forceinline__ A rescale(A m_old, A m_new, A f = exp_factor(A(1))) {
  return m_old == neg_inf<A>() ? A(0) : exp_base(scaled_difference(m_old, m_new, f, exp_factor(A(1))));
}
template <class A> struct MaxSum {
  A m;
  A s;
};
template <class A>
__device__ __forceinline__ MaxSum<A> merge_max_sum(MaxSum<A> a, MaxSum<A> b, A f = exp_factor(A(1))) {
  const A m = max_acc(a.m, b.m);
  return {m, a.s * rescale(a.m, m, f) + b.s * rescale(b.m, m, f)};
}
// exp(d) for a scaled difference d (exp_base takes d * exp_factor(1)).
template <class A> __device__ __forceinline__ A exp_of(A d) { return exp_base(d * exp_factor(A(1))); }

// A (max, sum, moment) partial: s as MaxSum's, t = sum exp((x - m) * sc) (x - m) * sc, a term
// whose exp is 0 counting 0 (x = -inf). The entropy is log(s) - t / s. Merged onto the larger max
// with the scale sc; a partial of max -inf counts 0 times its sums, so that a NaN in them stays.
template <class A> struct MaxSumMoment {
  A m, s, t;
};
template <class A>
__device__ __forceinline__ MaxSumMoment<A> merge_moment(MaxSumMoment<A> a, MaxSumMoment<A> b, A sc) {
  const A m = max_acc(a.m, b.m);
  MaxSumMoment<A> r{m, A(0), A(0)};
  const auto move = [&](const MaxSumMoment<A>& p) {
    if (p.m == neg_inf<A>()) {
      r.s += p.s * A(0);
      r.t += p.t * A(0);
      return;
    }
    const A d = scaled_difference(p.m, m, sc, A(1));
    const A k = exp_of(d);
    r.s += p.s * k;
    r.t += k == A(0) ? p.t * A(0) : k * (p.t + (p.s == A(0) ? A(0) : p.s * d));
  };
  move(a);
  move(b);
  return r;
}
// A (max, sum) pair of fp32 values as one 64-bit word (a single-copy atomic message between CTAs,
// hopper.cuh): the max in the low half.
__device__ __forceinline__ uint64_t pack_pair(float m, float s) {
  return (uint64_t{__float_as_uint(s)} << 32) | __float_as_uint(m);
}
__device__ __forceinline__ MaxSum<float> unpack_pair(uint64_t v) {
  return {__uint_as_float(static_cast<uint32_t>(v)), __uint_as_float(static_cast<uint32_t>(v >> 32))};
}
// A power of two p with |v| * p in [2^110, 2^111) (float; [2^1000, 2^1001) for double), for a
// normal v: v * p is exact and far from overflow.
__device__ __forceinline__ float pow2_near_inverse(float v) {
  const int e = (__float_as_int(v) >> 23) & 0xff;
  return __int_as_float(min(364 - e, 254) << 23);
}
__device__ __forceinline__ double pow2_near_inverse(double v) {
  const int e = static_cast<int>((__double_as_longlong(v) >> 52) & 0x7ff);
  return __longlong_as_double(static_cast<long long>(min(3046 - e, 2046)) << 52);
}

// The output for one element where max is that of x and the sum is of exp((x - max) * scale):
// (x - max) * scale - log(sum), one rounding after the difference (exactly -log(sum) at the max,
// which x * scale - max * scale need not give).
template <class A> __device__ __forceinline__ A log_softmax_out_scaled(A v, A m, A scale, A log_sum) {
  const bool halve = scale < A(1);  // (scaled_difference)
  const A h = halve ? A(0.5) : A(1);
  return fma(fma(v, h, -(m * h)), halve ? scale + scale : scale, -log_sum);
}
// The output for one element, in the order torch evaluates it: (x - max) - log(sum).
template <class A> __device__ __forceinline__ A log_softmax_out(A v, A m, A log_sum) {
  return (v - m) - log_sum;
}

// The gradient for one element: dy - exp(y) * sum(dy), as torch evaluates it, with an accurate
// exp (exp(y) * sum(dy) can be large next to a small result, so ex2.approx's 2^-22 would show).
__device__ __forceinline__ float log_softmax_grad(float dy, float y, float sum_dy) {
  return dy - expf(y) * sum_dy;
}
__device__ __forceinline__ double log_softmax_grad(double dy, double y, double sum_dy) {
  return dy - exp(y) * sum_dy;
}

}  // namespace softlight
