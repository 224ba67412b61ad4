// The CPU backend's vector kernels, written once with GCC vector types and compiled once per
// instruction set (simd_generic.cpp, simd_avx2.cpp); rows.cpp picks the widest the CPU
// has. Semantics are the GPU kernels': the max of x (NaN never wins), sums of exp((x - shift) *
// scale) taken against a running max (shift 0 while it is -inf, numerics.cuh), y = (x - max) * scale
// - log(sum). exp is a polynomial after a Cody-Waite reduction (relative error near 2^-23 for float,
// 2^-52 for double), its results below the smallest normal flushed to 0, as the GPU's ex2.approx.ftz.
#pragma once

#include <cstdint>

#include "cpu/types.hpp"

namespace softlight {
namespace cpu {

// One storage type's forward kernels (A: its accumulation type), lse (if not null) one per row or lane.
//   rows:   `count` rows of n contiguous elements, rows xs / ys elements apart.
//   tiles:  `width` contiguous lanes (inner positions), the softmax axis of n steps, x's xs and y's
//           ys elements apart.
template <class T, class A> struct Kernels {
  void (*rows)(const T* x, int64_t xs, T* y, int64_t ys, int64_t count, int64_t n, A scale, A* lse);
  void (*tiles)(const T* x, int64_t xs, T* y, int64_t ys, int64_t width, int64_t n, A scale, A* lse);
  // `count` rows of n <= kShortRow contiguous elements, rows xs / ys apart, a row a lane.
  void (*short_rows)(const T* x, int64_t xs, T* y, int64_t ys, int64_t count, int64_t n, A scale, A* lse);
  // A contiguous span of n elements holding p interleaved positions (element j belongs to position
  // j % p; p divides `lanes` or is a multiple of it up to 8 of them): each position's max and sum
  // of exp((x - max) * scale) (flat_stats), then y = (x - m) * scale - log_sum per position
  // (flat_write). A row is the case p = 1, a middle axis over a few contiguous inner positions the
  // case p = inner. A span may be a piece of a row or block that starts at a multiple of p.
  void (*flat_stats)(const T* x, int64_t n, int p, A scale, A* m, double* s);
  void (*flat_write)(const T* x, T* y, int64_t n, int p, const A* m, const A* log_sum, A scale);
  // An axis of one element, n positions contiguous: y = (x - x) * scale (0, or NaN where x is not
  // finite), lse = x * scale (NaN where x is +inf), what the general kernels give for it.
  void (*unit)(const T* x, T* y, int64_t n, A scale, A* lse);
  // The backward of `count` rows of n contiguous elements: dx = dy - exp(y) * sum(dy), each array's
  // rows its own stride apart; dx may be dy or y (each element read before it is written).
  void (*backward_rows)(const T* dy, int64_t dys, const T* y, int64_t ys, T* dx, int64_t dxs, int64_t count,
                        int64_t n);
  // The statistics of a contiguous row of n elements (consumers.cpp): m = max of x, and in double
  // s = sum of e_j = exp(d_j), t = sum of e_j d_j (0 where e_j is 0), d_j = (x_j - m) * scale, and
  // sum = sum of x_j (in long double: the sum of a row of the largest finite values is finite, and so
  // its mean). x is read twice a block of kRowBlock, the second time from L1.
  void (*row_stats)(const T* x, int64_t n, A scale, A* m, double* s, double* t, long double* sum);
  // dx = scale * (p * (a - e * (log p + h)) + c), log p = (x - m) * scale - log_sum, over n
  // contiguous elements (dx may be x).
  void (*stats_grad)(const T* x, T* dx, int64_t n, A scale, A m, A log_sum, A a, A e, A h, A c);
  A (*row_max)(const T* x, int64_t n);  // the max of n contiguous elements (NaN never wins; -inf for none)
  void (*scale)(T* x, int64_t n, A k);  // x *= k over n contiguous elements, rounded once
  int lanes;  // elements a vector holds
};

constexpr int64_t kShortRow = 16;  // rows up to this long take short_rows
constexpr int kTileVectors = 8;    // vectors of lanes a tile reads a step (whole cache lines)

struct KernelSet {
  Kernels<float, float> f32;
  Kernels<double, double> f64;
  Kernels<Half, float> f16;
  Kernels<BFloat16, float> bf16;
};

KernelSet kernels_generic();
KernelSet kernels_avx2();  // x86-64 only

}  // namespace cpu
}  // namespace softlight

// The body, included by each cpu_simd_<isa>.cpp with SOFTLIGHT_VECTOR_BYTES set: everything below
// has internal linkage and compiles to that file's instruction set.
#ifdef SOFTLIGHT_VECTOR_BYTES
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace softlight {
namespace cpu {
namespace {

constexpr int kBytes = SOFTLIGHT_VECTOR_BYTES;
template <class A> struct Vec;
template <> struct Vec<float> {
  typedef float type __attribute__((vector_size(kBytes)));
  typedef int32_t bits __attribute__((vector_size(kBytes)));
  typedef uint32_t ubits __attribute__((vector_size(kBytes)));
  typedef uint16_t half_bits __attribute__((vector_size(kBytes / 2)));
};
template <> struct Vec<double> {
  typedef double type __attribute__((vector_size(kBytes)));
  typedef int64_t bits __attribute__((vector_size(kBytes)));
};
template <class A> using V = typename Vec<A>::type;
template <class A> using VB = typename Vec<A>::bits;
template <class A> constexpr int kLanes = kBytes / static_cast<int>(sizeof(A));

template <class A> inline V<A> splat(A v) { return V<A>{} + v; }
template <class To, class From> inline To as(From v) {
  static_assert(sizeof(To) == sizeof(From));
  To r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}

// float16 bits, one to a 32-bit lane, as float: exactly to_float's values (types.hpp), NaN
// payloads kept (builds with F16C or AVX-512 convert by instruction instead: vload, vstore). The
// exponent and mantissa move into place and are rebiased (infinities and NaNs once more); zeros and
// subnormals are renormalised by a float subtraction, which is exact.
inline V<float> half_to_float(VB<float> h) {
  using B = VB<float>;
  const B sign = (h & 0x8000) << 16;
  const B em = (h & 0x7fff) << 13;
  const B exp = em & (0x1f << 23);
  const B o = em + ((127 - 15) << 23);
  const B special = o + ((128 - 16) << 23);
  const V<float> small = as<V<float>>(o + (1 << 23)) - as<V<float>>(B{} + (113 << 23));  // man * 2^-24
  const B bits = exp == (0x1f << 23) ? special : (exp == 0 ? as<B>(small) : o);
  return as<V<float>>(bits | sign);
}
// float as float16 bits, one to a 32-bit lane, rounded to nearest even: exactly to_half's results (a
// NaN quieted to 0x7e00 with its sign, anything that rounds past 65504 infinity, values below 2^-14
// rounded to a subnormal by adding 0.5f, whose rounding is the one wanted).
inline typename Vec<float>::ubits float_to_half(V<float> v) {
  using U = typename Vec<float>::ubits;
  const U u = as<U>(v);
  const U sign = (u >> 16) & 0x8000u;
  const U a = u & 0x7fffffffu;
  const U big = a > 0x7f800000u ? U{} + 0x7e00u : U{} + 0x7c00u;
  const U small = as<U>(as<V<float>>(a) + splat(0.5f)) - as<U>(splat(0.5f));
  const U normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
  return sign | (a >= 0x477ff000u ? big : (a < 0x38800000u ? small : normal));
}

// A vector of kLanes<A> elements of storage type T from p, and back.
template <class T> inline V<typename Traits<T>::A> vload(const T* p) {
  using A = typename Traits<T>::A;
  if constexpr (std::is_same_v<T, A>) {
    V<A> v;
    std::memcpy(&v, p, sizeof v);  // (p need not be aligned to the vector)
    return v;
  } else if constexpr (std::is_same_v<T, BFloat16>) {
#if defined(__AVX2__)
    if constexpr (kBytes == 32) {  // one widening load (GCC splits the generic form in two halves)
      const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      return as<V<float>>(as<VB<float>>(w) << 16);
    }
#endif
    typename Vec<float>::half_bits h;
    std::memcpy(&h, p, sizeof h);
    return as<V<float>>(__builtin_convertvector(h, VB<float>) << 16);
  } else {
    static_assert(std::is_same_v<T, Half>);
#if defined(__F16C__)
    if constexpr (kBytes == 32)  // (the same values; a signalling NaN comes out quiet)
      return as<V<float>>(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#endif
#if defined(__AVX512F__)
    if constexpr (kBytes == 64)
      return as<V<float>>(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#endif
    typename Vec<float>::half_bits h;
    std::memcpy(&h, p, sizeof h);
    return half_to_float(__builtin_convertvector(h, VB<float>));
  }
}
template <class T> inline void vstore(T* p, V<typename Traits<T>::A> v) {
  using A = typename Traits<T>::A;
  if constexpr (std::is_same_v<T, A>) {
    std::memcpy(p, &v, sizeof v);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    using U = typename Vec<float>::ubits;
    const U u = as<U>(v);
    const U nan = (u & 0x7fffffffu) > 0x7f800000u;  // all ones where NaN: quiet it
    const U r = (nan & ((u >> 16) | 0x40u)) | (~nan & ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16));
    const typename Vec<float>::half_bits h = __builtin_convertvector(r, typename Vec<float>::half_bits);
    std::memcpy(p, &h, sizeof h);
  } else {
    static_assert(std::is_same_v<T, Half>);
    // (F16C and AVX-512: the same values, nearest even; a NaN keeps its payload's top bits)
#if defined(__F16C__)
    if constexpr (kBytes == 32) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(as<__m256>(v), _MM_FROUND_TO_NEAREST_INT));
      return;
    }
#endif
#if defined(__AVX512F__)
    if constexpr (kBytes == 64) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(as<__m512>(v), _MM_FROUND_TO_NEAREST_INT));
      return;
    }
#endif
    const typename Vec<float>::half_bits h = __builtin_convertvector(float_to_half(v), typename Vec<float>::half_bits);
    std::memcpy(p, &h, sizeof h);
  }
}

// The running max a and a value b: b where it is larger, so a NaN b never wins (one maxps). Every
// running max starts at -inf and is never NaN.
template <class A> inline V<A> vmax(V<A> a, V<A> b) { return b > a ? b : a; }
template <class A> inline A smax(A a, A b) { return b > a ? b : a; }

// exp(t) for t <= 0 or NaN (shifted, scaled inputs): 2^n p(r), t = n ln2 + r, |r| <= ln2 / 2.
inline V<float> vexp(V<float> t) {
  const V<float> tc = t < splat(-88.0f) ? splat(-88.0f) : t;  // (NaN compares false: kept)
  const V<float> magic = splat(12582912.0f);                   // 1.5 * 2^23: rounds to an integer
  const V<float> kf = tc * splat(1.44269504088896341f) + magic;
  const V<float> n = kf - magic;
  const VB<float> ni = as<VB<float>>(kf) - 0x4b400000;  // n as an integer, from magic + n's bits
  V<float> r = tc - n * splat(0.693145751953125f);       // ln2 in two parts
  r = r - n * splat(1.428606765330187045e-06f);
  V<float> p = splat(1.0f / 5040.0f);
  p = p * r + splat(1.0f / 720.0f);
  p = p * r + splat(1.0f / 120.0f);
  p = p * r + splat(1.0f / 24.0f);
  p = p * r + splat(1.0f / 6.0f);
  p = p * r + splat(0.5f);
  p = p * r + splat(1.0f);
  p = p * r + splat(1.0f);
  const V<float> res = p * as<V<float>>((ni + 127) << 23);  // (NaN for a NaN t: p is)
  return tc < splat(-87.33654475f) ? splat(0.0f) : res;
}
inline V<double> vexp(V<double> t) {
  const V<double> tc = t < splat(-709.0) ? splat(-709.0) : t;
  const V<double> magic = splat(6755399441055744.0);  // 1.5 * 2^52
  const V<double> kf = tc * splat(1.4426950408889634074) + magic;
  const V<double> n = kf - magic;
  const VB<double> ni = as<VB<double>>(kf) - 0x4338000000000000LL;
  V<double> r = tc - n * splat(6.93147180369123816490e-01);
  r = r - n * splat(1.90821492927058770002e-10);
  V<double> p = splat(1.0 / 479001600.0);  // Taylor to r^12: the rest is under 2e-16
  for (const double c : {1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0,
                         1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0})
    p = p * r + splat(c);
  const V<double> res = p * as<V<double>>((ni + 1023) << 52);  // (NaN for a NaN t: p is)
  return tc < splat(-708.3964185322641) ? splat(0.0) : res;
}
template <class A> inline A sexp(A t) { return vexp(splat(t))[0]; }  // one value, the same results

// log(v) for the sums (v = 0, v >= 1, or NaN; any positive normal v is exact to about an ulp): v =
// 2^e m with m in [sqrt(1/2), sqrt(2)), log(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716.
template <class A> inline V<A> vlog(V<A> v) {
  using B = VB<A>;
  constexpr bool f32 = std::is_same_v<A, float>;
  constexpr int kMant = f32 ? 23 : 52;
  const B bits = as<B>(v);
  const B mask = (B{} + 1) << kMant;
  B e = ((bits >> kMant) & (f32 ? 0xff : 0x7ff)) - (f32 ? 127 : 1023);
  V<A> m = as<V<A>>((bits & (mask - 1)) | as<B>(splat(A(1))));
  const B big = m > splat(A(1.4142135623730951));
  m = big ? m * splat(A(0.5)) : m;
  e -= big;  // (true is all ones: -1)
  const V<A> f = m - splat(A(1));
  const V<A> sv = f / (f + splat(A(2)));
  const V<A> z = sv * sv;
  V<A> r = splat(A(2) / A(f32 ? 9 : 21));
  for (int k = f32 ? 7 : 19; k >= 3; k -= 2) r = r * z + splat(A(2) / A(k));
  const V<A> ef = __builtin_convertvector(e, V<A>);
  const V<A> ln2_hi = splat(f32 ? A(0.693145751953125) : A(6.93147180369123816490e-01));
  const V<A> ln2_lo = splat(f32 ? A(1.428606765330187045e-06) : A(1.90821492927058770002e-10));
  const V<A> res = ef * ln2_hi + (sv * splat(A(2)) + (sv * z * r + ef * ln2_lo));
  const V<A> inf = splat(std::numeric_limits<A>::infinity());
  return v != v || v == inf ? v : (v == splat(A(0)) ? -inf : res);
}

template <class T, class A = typename Traits<T>::A> A max_of(const T* x, int64_t n) {
  constexpr int W = kLanes<A>;
  V<A> m0 = splat(-std::numeric_limits<A>::infinity()), m1 = m0;
  int64_t j = 0;
  for (; j + 2 * W <= n; j += 2 * W) {
    m0 = vmax<A>(m0, vload(x + j));
    m1 = vmax<A>(m1, vload(x + j + W));
  }
  const V<A> m2 = vmax<A>(m0, m1);
  A m = m2[0];
  for (int l = 1; l < W; ++l) m = smax(m, m2[l]);
  for (; j < n; ++j) m = smax(m, Traits<T>::load(x[j]));
  return m;
}

// f(std::true_type) where scale is not 1, f(std::false_type) where it is: (x - m) * 1 is x - m, so
// the kernels' loops below leave the multiply out then, with the same results.
template <class A, class F> inline auto with_scale(A scale, F&& f) {
  return scale == A(1) ? f(std::false_type{}) : f(std::true_type{});
}
// (v - s) * c (Scaling, types.hpp), or v - s where c is 1 (Scaled false).
template <class Scaled, class VA, class A> inline VA shifted(VA v, VA s, Scaling<A> k) {
  if constexpr (Scaled::value) return k(v, s);
  else return v - s;
}

template <class T, class A = typename Traits<T>::A> double sumexp(const T* x, int64_t n, A shift, A scale) {
  constexpr int W = kLanes<A>;
  const V<A> vs = splat(shift);
  const Scaling<A> k(scale);
  V<A> s0 = splat(A(0)), s1 = s0;
  int64_t j = 0;
  with_scale(scale, [&](auto scaled) {
    using S = decltype(scaled);
    for (; j + 2 * W <= n; j += 2 * W) {
      s0 += vexp(shifted<S>(vload(x + j), vs, k));
      s1 += vexp(shifted<S>(vload(x + j + W), vs, k));
    }
    return 0;
  });
  const V<A> s2 = s0 + s1;
  double s = 0;
  for (int l = 0; l < W; ++l) s += s2[l];
  for (; j < n; ++j) s += sexp<A>(k(Traits<T>::load(x[j]), shift));
  return s;
}

template <class T, class A = typename Traits<T>::A>
void write(const T* x, T* y, int64_t n, A m, A scale, A log_sum) {
  constexpr int W = kLanes<A>;
  const V<A> vm = splat(m), vl = splat(log_sum);
  const Scaling<A> k(scale);
  int64_t j = 0;
  with_scale(scale, [&](auto scaled) {
    using S = decltype(scaled);
    for (; j + W <= n; j += W) vstore(y + j, shifted<S>(vload(x + j), vm, k) - vl);
    return 0;
  });
  for (; j < n; ++j) y[j] = Traits<T>::store(k(Traits<T>::load(x[j]), m) - log_sum);
}

constexpr int64_t kRowBlock = 2048;  // elements a block of a long row: read twice while in L1

// Each row's (max, sum) folded block by block (the block's max, then one rescale of the sum), then
// y written: x is read twice, the second time from cache where the row fits.
template <class T, class A = typename Traits<T>::A>
void rows(const T* x, int64_t xs, T* y, int64_t ys, int64_t count, int64_t n, A scale, A* lse) {
  const A ninf = -std::numeric_limits<A>::infinity();
  const Scaling<A> k(scale);
  for (int64_t r = 0; r < count; ++r) {
    const T* xr = x + r * xs;
    A m = ninf;
    double s = 0;
    for (int64_t b = 0; b < n; b += kRowBlock) {
      const int64_t len = std::min(kRowBlock, n - b);
      const A bm = max_of(xr + b, len);
      if (bm > m) {  // (NaN never wins the max)
        if (m != ninf) s *= static_cast<double>(sexp<A>(k(m, bm)));
        m = bm;
      }
      s += sumexp(xr + b, len, m == ninf ? A(0) : m, scale);
    }
    const A log_sum = std::log(static_cast<A>(s));
    write(xr, y + r * ys, n, m, scale, log_sum);
    if (lse != nullptr) lse[r] = m * scale + log_sum;
  }
}

// Lanes' running (max, sum), the sum's blocks added in double: a block's max raises the max, and the
// sums of lanes whose max rose move onto it (not those whose max was -inf: numerics.cuh). Returns the
// shift of the block's exponents (0 where the max is still -inf).
template <class A> inline V<A> raise_max(V<A>& m, double (&s)[kLanes<A>], V<A> bm, Scaling<A> k) {
  const V<A> vninf = splat(-std::numeric_limits<A>::infinity());
  const V<A> nm = vmax<A>(m, bm);
  const V<A> factor = vexp(k(m, nm));
  for (int l = 0; l < kLanes<A>; ++l)
    if (m[l] != vninf[l] && nm[l] != m[l]) s[l] *= static_cast<double>(factor[l]);
  m = nm;
  return nm == vninf ? splat(A(0)) : nm;
}

// The axis folded in blocks of this many steps: each block's max per lane, then one rescale.
constexpr int64_t kTileSteps = 32;

template <class T, class A = typename Traits<T>::A>
void tiles(const T* x, int64_t xs, T* y, int64_t ys, int64_t width, int64_t n, A scale, A* lse) {
  constexpr int W = kLanes<A>, G = kTileVectors;
  const A ninf = -std::numeric_limits<A>::infinity();
  const V<A> vninf = splat(ninf), zero = splat(A(0));
  const Scaling<A> k(scale);
  for (int64_t i0 = 0; i0 < width; i0 += G * W) {
    const int64_t lanes = std::min<int64_t>(G * W, width - i0);
    const int g_count = static_cast<int>((lanes + W - 1) / W);
    const auto get = [&](int64_t d, int g) {  // vector g of step d (a short last one padded with -inf)
      const T* p = x + d * xs + i0 + g * W;
      const int64_t have = lanes - g * W;
      if (have >= W) return vload(p);
      V<A> v = vninf;
      for (int64_t l = 0; l < have; ++l) v[l] = Traits<T>::load(p[l]);
      return v;
    };
    V<A> m[G];
    double s[G][W] = {};  // per lane: each block's sum in A, their total in double
    for (int g = 0; g < g_count; ++g) m[g] = vninf;
    for (int64_t b = 0; b < n; b += kTileSteps) {
      const int64_t e = std::min(n, b + kTileSteps);
      V<A> bm[G], shift[G], bs[G];
      for (int g = 0; g < g_count; ++g) bm[g] = vninf;
      for (int64_t d = b; d < e; ++d)
        for (int g = 0; g < g_count; ++g) bm[g] = vmax<A>(bm[g], get(d, g));
      for (int g = 0; g < g_count; ++g) {
        shift[g] = raise_max<A>(m[g], s[g], bm[g], k);
        bs[g] = zero;
      }
      with_scale(scale, [&](auto scaled) {
        for (int64_t d = b; d < e; ++d)
          for (int g = 0; g < g_count; ++g) bs[g] += vexp(shifted<decltype(scaled)>(get(d, g), shift[g], k));
        return 0;
      });
      for (int g = 0; g < g_count; ++g)
        for (int l = 0; l < W; ++l) s[g][l] += bs[g][l];
    }
    V<A> log_sum[G];
    for (int g = 0; g < g_count; ++g) {
      V<A> sum;
      for (int l = 0; l < W; ++l) sum[l] = static_cast<A>(s[g][l]);
      log_sum[g] = vlog<A>(sum);
    }
    with_scale(scale, [&](auto scaled) {
      for (int64_t d = 0; d < n; ++d) {
        for (int g = 0; g < g_count; ++g) {
          const V<A> out = shifted<decltype(scaled)>(get(d, g), m[g], k) - log_sum[g];
          T* yp = y + d * ys + i0 + g * W;
          const int64_t have = lanes - g * W;
          if (have >= W) {
            vstore(yp, out);
          } else {
            for (int64_t l = 0; l < have; ++l) yp[l] = Traits<T>::store(out[l]);
          }
        }
      }
      return 0;
    });
    if (lse != nullptr)
      for (int64_t l = 0; l < lanes; ++l) lse[i0 + l] = m[l / W][l % W] * scale + log_sum[l / W][l % W];
  }
}

// Rows of n <= kShortRow: kLanes rows at once, a row a lane, each element read once into registers.
template <class T, class A = typename Traits<T>::A>
void short_rows(const T* x, int64_t xs, T* y, int64_t ys, int64_t count, int64_t n, A scale, A* lse) {
  constexpr int W = kLanes<A>;
  const V<A> vninf = splat(-std::numeric_limits<A>::infinity()), zero = splat(A(0));
  const Scaling<A> k(scale);
  V<A> v[kShortRow];
  for (int64_t r0 = 0; r0 < count; r0 += W) {
    const int64_t lanes = std::min<int64_t>(W, count - r0);
    V<A> m = vninf;
    for (int64_t d = 0; d < n; ++d) {
      v[d] = vninf;
      for (int64_t l = 0; l < lanes; ++l) v[d][l] = Traits<T>::load(x[(r0 + l) * xs + d]);
      m = vmax<A>(m, v[d]);
    }
    const V<A> shift = m == vninf ? zero : m;
    V<A> s = zero;
    for (int64_t d = 0; d < n; ++d) s += vexp(k(v[d], shift));
    const V<A> log_sum = vlog<A>(s);
    for (int64_t d = 0; d < n; ++d) {
      const V<A> out = k(v[d], m) - log_sum;
      for (int64_t l = 0; l < lanes; ++l) y[(r0 + l) * ys + d] = Traits<T>::store(out[l]);
    }
    if (lse != nullptr)
      for (int64_t l = 0; l < lanes; ++l) lse[r0 + l] = m[l] * scale + log_sum[l];
  }
}

// A vector of the span's elements j0 .. j0 + kLanes - 1 (those at or past n: -inf).
template <class T, class A = typename Traits<T>::A> inline V<A> span_at(const T* x, int64_t j0, int64_t n) {
  if (j0 + kLanes<A> <= n) return vload(x + j0);
  V<A> v = splat(-std::numeric_limits<A>::infinity());
  for (int64_t j = j0; j < n; ++j) v[j - j0] = Traits<T>::load(x[j]);
  return v;
}

// flat_stats and flat_write: p divides kLanes, or is a multiple of it up to kFlatGroups of them.
// Element j of a span is lane j % kLanes of vector group (j / kLanes) % groups, position j % p.
constexpr int kFlatGroups = 8;
template <class A> inline int flat_groups(int p) { return p > kLanes<A> ? p / kLanes<A> : 1; }

template <class T, class A = typename Traits<T>::A>
void flat_stats(const T* x, int64_t n, int p, A scale, A* m_out, double* s_out) {
  constexpr int W = kLanes<A>;
  const int groups = flat_groups<A>(p);
  const A ninf = -std::numeric_limits<A>::infinity();
  const V<A> vninf = splat(ninf), zero = splat(A(0));
  const Scaling<A> k(scale);
  V<A> m[kFlatGroups];
  double s[kFlatGroups][W] = {};  // per lane: blocks' sums in A, their total in double
  for (int g = 0; g < groups; ++g) m[g] = vninf;
  // Blocks of whole rounds of the groups, so that each block starts at group 0 (p = 24 is 3 groups
  // of 8 lanes, and 2048 is no multiple of 24).
  const int64_t block = kRowBlock / (W * groups) * (W * groups);
  for (int64_t b = 0; b < n; b += block) {
    const int64_t e = std::min(n, b + block);
    V<A> bm[kFlatGroups], shift[kFlatGroups], bs[kFlatGroups];
    for (int g = 0; g < groups; ++g) bm[g] = vninf;
    for (int64_t j = b, g = 0; j < e; j += W, g = g + 1 == groups ? 0 : g + 1) bm[g] = vmax<A>(bm[g], span_at(x, j, n));
    for (int g = 0; g < groups; ++g) {
      shift[g] = raise_max<A>(m[g], s[g], bm[g], k);
      bs[g] = zero;
    }
    with_scale(scale, [&](auto scaled) {
      for (int64_t j = b, g = 0; j < e; j += W, g = g + 1 == groups ? 0 : g + 1)
        bs[g] += vexp(shifted<decltype(scaled)>(span_at(x, j, n), shift[g], k));
      return 0;
    });
    for (int g = 0; g < groups; ++g)
      for (int l = 0; l < W; ++l) s[g][l] += bs[g][l];
  }
  // The lanes of each position merged (numerics.cuh's merge: a lane whose max is -inf counts 0
  // times its sum, which keeps a NaN).
  if (p >= W) {  // a lane a position
    for (int g = 0; g < groups; ++g)
      for (int l = 0; l < W; ++l) {
        m_out[g * W + l] = m[g][l];
        s_out[g * W + l] = m[g][l] == ninf ? s[g][l] * 0.0 : s[g][l];
      }
    return;
  }
  for (int q = 0; q < p; ++q) {
    A mq = ninf;
    for (int l = q; l < W; l += p) mq = smax(mq, m[0][l]);
    double sq = 0;
    for (int l = q; l < W; l += p)
      sq += s[0][l] * (m[0][l] == ninf  ? 0.0
                       : m[0][l] == mq ? 1.0
                                       : std::exp(static_cast<double>(k(m[0][l], mq))));
    m_out[q] = mq;
    s_out[q] = sq;
  }
}

template <class T, class A = typename Traits<T>::A>
void flat_write(const T* x, T* y, int64_t n, int p, const A* m, const A* log_sum, A scale) {
  constexpr int W = kLanes<A>;
  const int groups = flat_groups<A>(p);
  V<A> vm[kFlatGroups], vl[kFlatGroups];
  for (int g = 0; g < groups; ++g) {
    if (p >= W) {
      std::memcpy(&vm[g], m + g * W, sizeof vm[g]);
      std::memcpy(&vl[g], log_sum + g * W, sizeof vl[g]);
      continue;
    }
    for (int l = 0; l < W; ++l) {
      vm[g][l] = m[l % p];
      vl[g][l] = log_sum[l % p];
    }
  }
  const Scaling<A> k(scale);
  int64_t j = 0;
  with_scale(scale, [&](auto scaled) {
    for (int g = 0; j + W <= n; j += W, g = g + 1 == groups ? 0 : g + 1)
      vstore(y + j, shifted<decltype(scaled)>(vload(x + j), vm[g], k) - vl[g]);
    return 0;
  });
  for (; j < n; ++j) y[j] = Traits<T>::store(k(Traits<T>::load(x[j]), m[j % p]) - log_sum[j % p]);
}

template <class T, class A = typename Traits<T>::A> void unit(const T* x, T* y, int64_t n, A scale, A* lse) {
  constexpr int W = kLanes<A>;
  const V<A> vc = splat(scale), inf = splat(std::numeric_limits<A>::infinity()), nan = inf - inf;
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    const V<A> v = vload(x + j);
    vstore(y + j, (v - v) * vc);
    if (lse != nullptr) {
      const V<A> l = v == inf ? nan : v * vc;
      std::memcpy(lse + j, &l, sizeof l);
    }
  }
  for (; j < n; ++j) {
    const A v = Traits<T>::load(x[j]);
    y[j] = Traits<T>::store((v - v) * scale);
    if (lse != nullptr) lse[j] = v == inf[0] ? nan[0] : v * scale;
  }
}

// exp(v) for any v: vexp, and +inf past the largest finite result (the backward's y is anything).
template <class A> inline V<A> vexp_any(V<A> v) {
  const A big = std::is_same_v<A, float> ? A(88.72283) : A(709.782712893384);
  const V<A> inf = splat(std::numeric_limits<A>::infinity());
  return v > splat(big) ? inf : vexp(v > splat(big) ? splat(A(0)) : v);
}

template <class T, class A = typename Traits<T>::A>
void backward_rows(const T* dy, int64_t dys, const T* y, int64_t ys, T* dx, int64_t dxs, int64_t count, int64_t n) {
  constexpr int W = kLanes<A>;
  for (int64_t r = 0; r < count; ++r) {
    const T* g = dy + r * dys;
    const T* yr = y + r * ys;
    T* d = dx + r * dxs;
    double total = 0;  // blocks' sums in A, their total in double
    for (int64_t b = 0; b < n; b += kRowBlock) {
      const int64_t e = std::min(n, b + kRowBlock);
      V<A> s0 = splat(A(0)), s1 = s0;
      int64_t j = b;
      for (; j + 2 * W <= e; j += 2 * W) {
        s0 += vload(g + j);
        s1 += vload(g + j + W);
      }
      const V<A> s2 = s0 + s1;
      for (int l = 0; l < W; ++l) total += s2[l];
      for (; j < e; ++j) total += Traits<T>::load(g[j]);
    }
    const A t = static_cast<A>(total);
    const V<A> vt = splat(t);
    int64_t j = 0;
    for (; j + W <= n; j += W) vstore(d + j, vload(g + j) - vexp_any<A>(vload(yr + j)) * vt);
    for (; j < n; ++j) {
      const A e = vexp_any<A>(splat(Traits<T>::load(yr[j])))[0];
      d[j] = Traits<T>::store(Traits<T>::load(g[j]) - e * t);
    }
  }
}

template <class T, class A = typename Traits<T>::A>
void row_stats(const T* x, int64_t n, A scale, A* m_out, double* s_out, double* t_out, long double* sum_out) {
  constexpr int W = kLanes<A>;
  const A ninf = -std::numeric_limits<A>::infinity();
  const V<A> zero = splat(A(0));
  const Scaling<A> k(scale);
  A m = ninf;
  double s = 0, t = 0;
  long double sum = 0;
  for (int64_t b = 0; b < n; b += kRowBlock) {
    const int64_t len = std::min(kRowBlock, n - b);
    const T* xb = x + b;
    const A bm = max_of(xb, len);
    if (bm > m) {  // the max rose (NaN never wins): the sums move onto it
      if (m != ninf) {
        const A delta = k(m, bm);
        const double f = static_cast<double>(sexp<A>(delta));
        // (f = 0: every earlier e_j is 0 on the new max, and so is its term, whatever delta is)
        t = f == 0.0 ? 0.0 : f * (t + s * static_cast<double>(delta));
        s *= f;
      }
      m = bm;
    }
    const V<A> vs = splat(m == ninf ? A(0) : m);
    V<A> vsum = zero, vt = zero, vx = zero;
    int64_t j = 0;
    with_scale(scale, [&](auto scaled) {
      for (; j + W <= len; j += W) {
        const V<A> v = vload(xb + j);
        const V<A> d = shifted<decltype(scaled)>(v, vs, k);
        const V<A> e = vexp(d);
        vsum += e;
        vt += e == zero ? zero : e * d;
        vx += v;
      }
      return 0;
    });
    long double bx = 0;  // the block's sum of x
    for (int l = 0; l < W; ++l) {
      s += vsum[l];
      t += vt[l];
      bx += vx[l];
    }
    for (; j < len; ++j) {
      const A v = Traits<T>::load(xb[j]);
      const A d = k(v, vs[0]);
      const A e = sexp<A>(d);
      s += e;
      t += e == A(0) ? A(0) : e * d;
      bx += v;
    }
    if (!std::isfinite(bx)) {  // a lane's sum overflowed A (or the block holds inf or NaN): again, wide
      bx = 0;
      for (int64_t i = 0; i < len; ++i) bx += Traits<T>::load(xb[i]);
    }
    sum += bx;
  }
  *m_out = m;
  *s_out = s;
  *t_out = t;
  *sum_out = sum;
}

template <class T, class A = typename Traits<T>::A>
void stats_grad(const T* x, T* dx, int64_t n, A scale, A m, A log_sum, A a, A e, A h, A c) {
  constexpr int W = kLanes<A>;
  const V<A> vc = splat(scale), vm = splat(m), vl = splat(log_sum), va = splat(a), ve = splat(e), vh = splat(h),
             vk = splat(c);
  const Scaling<A> k(scale);
  const auto grad = [&](V<A> v) {
    const V<A> lp = k(v, vm) - vl;
    const V<A> p = vexp_any<A>(lp);
    // (p = 0 adds nothing: its log is -inf for an element of -inf)
    const V<A> term = e == A(0) ? p * va : (p == splat(A(0)) ? splat(A(0)) : p * (va - ve * (lp + vh)));
    return term * vc + vk * vc;
  };
  int64_t j = 0;
  for (; j + W <= n; j += W) vstore(dx + j, grad(vload(x + j)));
  for (; j < n; ++j) dx[j] = Traits<T>::store(grad(splat(Traits<T>::load(x[j])))[0]);
}

template <class T, class A = typename Traits<T>::A> void scale(T* x, int64_t n, A k) {
  constexpr int W = kLanes<A>;
  const V<A> vk = splat(k);
  int64_t j = 0;
  for (; j + W <= n; j += W) vstore(x + j, vload(x + j) * vk);
  for (; j < n; ++j) x[j] = Traits<T>::store(Traits<T>::load(x[j]) * k);
}

template <class T> Kernels<T, typename Traits<T>::A> kernels_of() {
  return {rows<T>,      tiles<T>,     short_rows<T>, flat_stats<T>, flat_write<T>, unit<T>, backward_rows<T>,
          row_stats<T>, stats_grad<T>, max_of<T>,    scale<T>,      kLanes<typename Traits<T>::A>};
}

inline KernelSet kernel_set() {
  return {kernels_of<float>(), kernels_of<double>(), kernels_of<Half>(), kernels_of<BFloat16>()};
}

}  // namespace
}  // namespace cpu
}  // namespace softlight
#endif  // SOFTLIGHT_VECTOR_BYTES
