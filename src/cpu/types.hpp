// The CPU backend's element types: IEEE binary16 and bfloat16 storage with round-to-nearest-even
// conversions, and each type's accumulation type (Traits). Every function has internal linkage: the
// vector kernels (cpu_simd_*.cpp) are compiled for other instruction sets than the rest, and no
// inline definition may be shared between them.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace softlight {
namespace cpu {

struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };

namespace {

template <class To, class From> static inline To bits_as(From v) {
  static_assert(sizeof(To) == sizeof(From));
  To r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}

// Round-to-nearest-even conversions.

static inline float to_float(Half h) {
  const uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu, man = h.bits & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_as<float>(sign | 0x7f800000u | (man << 13));
  return bits_as<float>(sign | ((exp + 112) << 23) | (man << 13));
}

static inline Half to_half(float f) {
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

static inline float to_float(BFloat16 b) { return bits_as<float>(uint32_t(b.bits) << 16); }

static inline BFloat16 to_bfloat16(float f) {
  const uint32_t u = bits_as<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40u)};  // quiet the NaN
  return {uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

template <class T> struct Traits;
template <> struct Traits<float> {
  using A = float;
  static inline A load(float v) { return v; }
  static inline float store(A v) { return v; }
};
template <> struct Traits<double> {
  using A = double;
  static inline A load(double v) { return v; }
  static inline double store(A v) { return v; }
};
template <> struct Traits<Half> {
  using A = float;
  static inline A load(Half v) { return to_float(v); }
  static inline Half store(A v) { return to_half(v); }
};
template <> struct Traits<BFloat16> {
  using A = float;
  static inline A load(BFloat16 v) { return to_float(v); }
  static inline BFloat16 store(A v) { return to_bfloat16(v); }
};

// (v - s) * c for a row's value v <= s (its max, or a shift below it) and c = 1/T. Where c < 1 the
// difference can overflow while the scaled one is finite ([3e38, -1e38] at T = 1e38 in float32): the
// halves are subtracted then, (v/2 - s/2) * 2c, which rounds as (v - s) * c does wherever v - s is
// finite (a power of two moves no rounding; a subnormal half may lose its last bit, far below the
// row's log-sum). Where c >= 1 a difference that overflows overflows scaled as well: -inf is right.
// X: A, or a vector of A (simd.hpp).
template <class A> struct Scaling {
  A half, c;
  explicit Scaling(A scale) : half(scale < A(1) ? A(0.5) : A(1)), c(scale < A(1) ? scale + scale : scale) {}
  template <class X> X operator()(X v, X s) const { return (v * half - s * half) * c; }
};

}  // namespace
}  // namespace cpu
}  // namespace softlight
