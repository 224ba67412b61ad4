// 16-byte packs (and 8-byte half packs): loads and stores of whole packs, a peeled row's edge
// blocks, and the per-thread tier of the reductions (a thread's max and sum over its packs).
#pragma once

#include <limits>

#include "device/numerics.cuh"

namespace softlight {

// 16-byte packs move as one 16-byte access. Stores are written out as st.v4 because, left to
// itself, the compiler splits a vector whose lanes are computed one by one into scalar stores.
__device__ __forceinline__ void store_v4(void* p, uint4 v) {
  asm volatile("st.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ void store_global_v4(void* p, uint4 v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}
__device__ __forceinline__ void unpack_words(const uint32_t (&w)[4], float (&out)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = __uint_as_float(w[i]);
}
__device__ __forceinline__ void unpack_words(const uint32_t (&w)[4], double (&out)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) out[i] = __hiloint2double(int(w[2 * i + 1]), int(w[2 * i]));
}
template <class T> __device__ __forceinline__ void unpack_words16(const uint32_t (&w)[4], float (&out)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      // A bfloat16 is the upper half of a float: one shift or mask per element.
      out[2 * i] = __uint_as_float(w[i] << 16);
      out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
      continue;
    }
    T lo, hi;
    const unsigned short l = static_cast<unsigned short>(w[i] & 0xffffu);
    const unsigned short h = static_cast<unsigned short>(w[i] >> 16);
    memcpy(&lo, &l, 2);
    memcpy(&hi, &h, 2);
    out[2 * i] = to_acc(lo);
    out[2 * i + 1] = to_acc(hi);
  }
}
// Element j of a 16-byte pack of 2- or 4-byte T, in the accumulation type: selects of its word and
// half, no array (which the compiler would index through local memory).
template <class T> __device__ __forceinline__ acc_t<T> pack_element(uint4 p, int j) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "2- or 4-byte elements");
  const int w = j / static_cast<int>(4 / sizeof(T));
  const uint32_t u = w == 0 ? p.x : w == 1 ? p.y : w == 2 ? p.z : p.w;
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(u);
  } else {
    const uint32_t bits = (j & 1) != 0 ? u >> 16 : u & 0xffffu;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      return __uint_as_float(bits << 16);
    } else {
      T h;
      const unsigned short b = static_cast<unsigned short>(bits);
      memcpy(&h, &b, 2);
      return to_acc(h);
    }
  }
}
__device__ __forceinline__ uint32_t pair_bits(__half, float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}
__device__ __forceinline__ uint32_t pair_bits(__nv_bfloat16, float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}

template <class T, int V> __device__ __forceinline__ void unpack(uint4 u, acc_t<T> (&out)[V]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
  if constexpr (sizeof(T) == 2) {
    unpack_words16<T>(w, out);
  } else {
    unpack_words(w, out);
  }
}

template <class T, int V>
__device__ __forceinline__ void load_pack(const T* p, acc_t<T> (&out)[V]) {
  if constexpr (sizeof(T) * V == 16) {
    unpack<T, V>(*reinterpret_cast<const uint4*>(p), out);
  } else if constexpr (sizeof(T) * V == 8 && sizeof(T) < 8) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    acc_t<T> wide[2 * V];
    unpack<T, 2 * V>(make_uint4(u.x, u.y, 0, 0), wide);
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = wide[i];
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = to_acc(p[i]);
  }
}

// V elements at p as they lie in memory (one 16- or 8-byte load where they make one), or zeros
// where !load: kept unconverted until used, so that a thread's loads all issue before it waits on
// any (converting at the load made each load wait before the next issued; tools/sass_loads.py).
template <class T, int V> __device__ __forceinline__ void load_raw(const T* p, bool load, T (&out)[V]) {
  if constexpr (sizeof(T) * V == 16) {
    const uint4 u = load ? *reinterpret_cast<const uint4*>(p) : make_uint4(0u, 0u, 0u, 0u);
    memcpy(out, &u, 16);
  } else if constexpr (sizeof(T) * V == 8) {
    const uint2 u = load ? *reinterpret_cast<const uint2*>(p) : make_uint2(0u, 0u);
    memcpy(out, &u, 8);
  } else {
    const T zero = from_acc<T>(acc_t<T>(0));
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = load ? p[i] : zero;
  }
}

// A 16-byte pack of -inf: the stand-in for packs past the end of a row in a (max, sum) step.
template <class T> __device__ __forceinline__ uint4 neg_inf_pack() {
  if constexpr (sizeof(T) == 2) {
    const uint32_t w = std::is_same_v<T, __half> ? 0xfc00fc00u : 0xff80ff80u;
    return make_uint4(w, w, w, w);
  } else if constexpr (sizeof(T) == 4) {
    return make_uint4(0xff800000u, 0xff800000u, 0xff800000u, 0xff800000u);
  } else {
    return make_uint4(0u, 0xfff00000u, 0u, 0xfff00000u);
  }
}

// Elements [from, to) of xr (fewer than a pack), element from + j at place j of a pack, the places
// below `first` and the rest -inf (I: the index type the callers' arithmetic is in).
template <class T, class I> __device__ __forceinline__ uint4 load_places(const T* xr, I from, I to, int first) {
  constexpr int V = 16 / sizeof(T);
  const uint4 none = neg_inf_pack<T>();
  T e[V];
  memcpy(e, &none, 16);
#pragma unroll
  for (int j = 0; j < V; ++j)
    if (j >= first && from + j < to) e[j] = xr[from + j];
  uint4 u;
  memcpy(&u, e, 16);
  return u;
}
// Elements [from, to) of a row (fewer than a pack: a peeled row's edge) as a pack, the rest -inf.
template <class T> __device__ __forceinline__ uint4 edge_pack(const T* xr, int64_t from, int64_t to) {
  return load_places<T, int64_t>(xr, from, to, 0);
}
// `pack` with its elements outside [lo, hi) set to -inf.
template <class T> __device__ __forceinline__ uint4 mask_pack(uint4 pack, int lo, int hi) {
  constexpr int V = 16 / sizeof(T);
  const uint4 none = neg_inf_pack<T>();
  T e[V], n[V];
  memcpy(e, &pack, 16);
  memcpy(n, &none, 16);
#pragma unroll
  for (int k = 0; k < V; ++k)
    if (k < lo || k >= hi) e[k] = n[k];
  memcpy(&pack, e, 16);
  return pack;
}
// A peeled row's first or last 16-byte block cut to the row's elements [lo, hi) of it, -inf
// elsewhere: `loaded` (the block at `b`, read whole) masked, or, where the block would leave the
// array (`outside`: the first row's first block, the last row's last), the row's part read element
// by element from `b`.
template <class T> __device__ __forceinline__ uint4 cut_block(const T* b, uint4 loaded, int lo, int hi, bool outside) {
  return outside ? load_places<T, int>(b, 0, hi, lo) : mask_pack<T>(loaded, lo, hi);
}

// Bytes from `row` to its first 16-byte boundary (0 on one): the head of a peeled row, the part
// before the 16-byte packs of its interior.
__device__ __forceinline__ uintptr_t head_bytes16(const void* row) {
  return (16 - reinterpret_cast<uintptr_t>(row) % 16) % 16;
}
// Elements of T before `row` in its 16-byte block (0 on a boundary): a peeled row's `lead`, block k
// of the row holding its elements [k * V - lead, (k + 1) * V - lead).
template <class T> __device__ __forceinline__ int lead_elements(const T* row) {
  return static_cast<int>(reinterpret_cast<uintptr_t>(row) % 16 / sizeof(T));
}
// y for elements [lo, hi) of the 16-byte block at `yb` from `pack`, x's block as loaded (element k
// at yb[k]), so x is not read a second time (it measured even with a second read): a peeled row's first
// and last blocks.
template <class T>
__device__ __forceinline__ void store_log_softmax_part(T* yb, uint4 pack, int lo, int hi, acc_t<T> m, acc_t<T> scale,
                                                       acc_t<T> log_sum) {
  constexpr int V = 16 / sizeof(T);
  T e[V];
  memcpy(e, &pack, 16);
#pragma unroll
  for (int k = 0; k < V; ++k)
    if (k >= lo && k < hi) yb[k] = from_acc<T>(log_softmax_out_scaled(to_acc(e[k]), m, scale, log_sum));
}

// Halves w[0, n) onto w[0] with `op` in a tree (a chain would be n long). An odd n keeps its
// middle element for the next level.
template <int n, class W, class Op> __device__ __forceinline__ void fold_tree(W* w, Op op) {
  if constexpr (n > 1) {
    constexpr int half = (n + 1) / 2;
#pragma unroll
    for (int i = 0; i < n - half; ++i) w[i] = op(w[i], w[i + half]);
    fold_tree<half>(w, op);
  }
}

// The max over the elements of N 16-byte packs, in the accumulation type (NaN ignored, as
// max_acc). 16-bit elements are compared two at a time (max.{bf16,f16}x2, exact) and only the
// last pair is widened.
template <class T, int N> __device__ __forceinline__ acc_t<T> packs_max(const uint4 (&p)[N]) {
  using A = acc_t<T>;
  if constexpr (sizeof(T) == 2) {
    uint32_t w[4 * N];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      w[4 * i] = p[i].x;
      w[4 * i + 1] = p[i].y;
      w[4 * i + 2] = p[i].z;
      w[4 * i + 3] = p[i].w;
    }
    fold_tree<4 * N>(w, [](uint32_t a, uint32_t b) {
      uint32_t r;
      if constexpr (std::is_same_v<T, __half>) {
        asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
      } else {
        asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
      }
      return r;
    });
    const uint32_t last[4] = {w[0], 0u, 0u, 0u};
    A v[8];
    unpack_words16<T>(last, v);
    return max_acc(v[0], v[1]);
  } else {
    constexpr int V = 16 / sizeof(T);
    A v[N * V];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      A u[V];
      unpack<T, V>(p[i], u);
#pragma unroll
      for (int j = 0; j < V; ++j) v[i * V + j] = u[j];
    }
    fold_tree<N * V>(v, [](A a, A b) { return max_acc(a, b); });
    return v[0];
  }
}

// exp((x - shift) * scale) for the elements x of a row whose max is m (shift = m, or 0 where m is
// -inf: see exp_shifted), as exp_base(fma(x, f, -hi)) * exp_base(-lo) where hi + lo is shift * f
// exactly: one fused multiply-add per element, whose only rounding is that of its result, and one
// correction per sum. That holds while |hi| < split_limit (2^31 for float, 2^60 for double): lo,
// at most half an ulp of hi, stays within 64, so neither exp_base(lo) (the term at the max) nor
// exp_base(-lo) leaves the type's range (for a row of max 1e10, lo is near -440, and the sum would
// come out 0 * inf = NaN). From there on (and where shift * f overflows), every x < shift lies at
// least |shift| * 2^-24 below it (2^-53 for double), so (shift - x) * f >= 2^7 and its term is
// below 2^-127 (float; e^-128 for double): negligible next to the max's 1, and the row's sum is
// the count of x equal to the max. A power of two that brings shift * f near 2^110 (2^1000 for
// double), exactly, gives those terms as exactly 0 and 1 and is used in place of f. lo is NaN where
// shift is +inf or NaN: the row's sum is then NaN.
template <class A> struct ShiftedExp {
  A f, hi, lo;
};
template <class A> __device__ __forceinline__ A split_limit();
template <> __device__ __forceinline__ float split_limit<float>() { return 2147483648.0f; }     // 2^31
template <> __device__ __forceinline__ double split_limit<double>() { return 1152921504606846976.0; }  // 2^60
template <class A> __device__ __forceinline__ ShiftedExp<A> shifted_exp(A m, A scale) {
  const A shift = m == neg_inf<A>() ? A(0) : m;
  A f = exp_factor(scale);
  A hi = shift * f;
  if (!(fabs(hi) < split_limit<A>()) && isfinite(shift)) {
    f = pow2_near_inverse(shift);
    hi = shift * f;
  }
  return {f, hi, fma(shift, f, -hi)};
}
// The sum over the elements of N 16-byte packs of exp_base(fma(x, f, -hi)) (without the factor
// exp_base(-lo)), in four chains of additions rather than one.
template <class T, int N>
__device__ __forceinline__ acc_t<T> packs_exp_sum(const uint4 (&p)[N], const ShiftedExp<acc_t<T>>& e) {
  using A = acc_t<T>;
  constexpr int V = 16 / sizeof(T);
  A s[4] = {A(0), A(0), A(0), A(0)};
#pragma unroll
  for (int u = 0; u < N; ++u) {
    A v[V];
    unpack<T, V>(p[u], v);
#pragma unroll
    for (int j = 0; j < V; ++j) s[(u * V + j) % 4] += exp_base(fma(v[j], e.f, -e.hi));
  }
  return (s[0] + s[1]) + (s[2] + s[3]);
}
// The (max, sum) pair of the elements of N 16-byte packs: their max m, and the sum of
// exp((x - m) * scale) (as merge_max_sum takes it with f = exp_factor(scale)).
template <class T, int N>
__device__ __forceinline__ MaxSum<acc_t<T>> packs_max_sum(const uint4 (&p)[N], acc_t<T> scale) {
  const acc_t<T> m = packs_max<T, N>(p);
  const ShiftedExp<acc_t<T>> e = shifted_exp(m, scale);
  return {m, packs_exp_sum<T, N>(p, e) * exp_base(-e.lo)};
}

// The (max, sum, moment) partial of the elements of N 16-byte packs (MaxSumMoment), the moment from
// the sum's exps: with u = fma(x, f, -hi), (x - m) * scale is (u - lo) * scale / f, so
// t = exp_base(-lo) * scale / f * (sum e u - lo * sum e), e = exp_base(u), a term of e 0 counting 0
// (u is -inf for x -inf; the clamp keeps 0 * u finite). scale / f is 1 / exp_factor(1) but where f
// is shifted_exp's power of two: there every term but the max's (whose u - lo is 0) is negligible,
// and t is 0 (NaN from a NaN sum).
// The sums over the elements of N 16-byte packs of e = exp_base(u) and, where Moment, e u, u = fma(x,
// f, -hi) (shifted_exp's), in two chains each; u is clamped to the type's range, so that a term of e
// 0 (x = -inf: u = -inf) counts 0. Where Sum, *sx gets the elements' own sum, in double.
template <class T, int N, bool Moment = true, bool Sum = false>
__device__ __forceinline__ void packs_exp_moment(const uint4 (&p)[N], const ShiftedExp<acc_t<T>>& e, acc_t<T>& sum,
                                                 acc_t<T>& moment, double* sx = nullptr) {
  using A = acc_t<T>;
  constexpr int V = 16 / sizeof(T);
  A s[2] = {A(0), A(0)}, w[2] = {A(0), A(0)};
  double xs = 0.0;
#pragma unroll
  for (int u = 0; u < N; ++u) {
    A v[V];
    unpack<T, V>(p[u], v);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const A d = fma(v[j], e.f, -e.hi);
      const A x = exp_base(d);
      s[j & 1] += x;
      if constexpr (Moment) w[j & 1] = fma(x, max_acc(d, -std::numeric_limits<A>::max()), w[j & 1]);
      if constexpr (Sum) xs += static_cast<double>(v[j]);
    }
  }
  sum = s[0] + s[1];
  if constexpr (Moment) moment = w[0] + w[1];
  if constexpr (Sum) *sx = xs;
}
// The shift of a max m as the packs' exp sums take it (shifted_exp(m): the shift 0 where m is -inf),
// with the factors that turn those sums (packs_exp_moment's) into the partial's: r = exp_base(-lo)
// for the sum, and k = exp_base(-lo) * scale / f for the moment's, less lo times the sum's.
template <class A> struct Shift {
  ShiftedExp<A> e;
  A r, k;
};
template <class A> __device__ __forceinline__ Shift<A> shift_of(A m, A scale) {
  const ShiftedExp<A> e = shifted_exp(m, scale);
  const A r = exp_base(-e.lo);
  return {e, r, r * (e.f == exp_factor(scale) ? A(1) / exp_factor(A(1)) : A(0))};
}

// The (max, sum, moment) partial of the elements of N 16-byte packs (MaxSumMoment) taken against m,
// which is at least their max (the partial's max is m), the moment from the sum's exps: with
// u = fma(x, f, -hi), (x - m) * scale is (u - lo) * scale / f, so
// t = exp_base(-lo) * scale / f * (sum e u - lo * sum e), e = exp_base(u), a term of e 0 counting 0
// (u is -inf for x -inf; the clamp keeps 0 * u finite). scale / f is 1 / exp_factor(1) but where f
// is shifted_exp's power of two: there every term but the max's (whose u - lo is 0) is negligible,
// and t is 0 (NaN from a NaN sum).
template <class T, int N>
__device__ __forceinline__ MaxSumMoment<acc_t<T>> packs_sum_moment(const uint4 (&p)[N], acc_t<T> m,
                                                                   acc_t<T> scale) {
  using A = acc_t<T>;
  const Shift<A> k = shift_of(m, scale);
  A sum, w;
  packs_exp_moment<T, N>(p, k.e, sum, w);
  return {m, sum * k.r, k.k * (w - k.e.lo * sum)};
}

// Folds N packs into a running (max of x, sum of exp((x - max) * scale)).
template <class T, int N>
__device__ __forceinline__ void fold_packs(const uint4 (&p)[N], MaxSum<acc_t<T>>& cp, acc_t<T> scale) {
  using A = acc_t<T>;
  const A m = max_acc(cp.m, packs_max<T, N>(p));
  const ShiftedExp<A> e = shifted_exp(m, scale);
  const A s = packs_exp_sum<T, N>(p, e);
  const A old = cp.m == neg_inf<A>() ? A(0) : exp_base(scaled_difference(cp.m, m, e.f, exp_factor(A(1))));
  cp = {m, cp.s * old + s * exp_base(-e.lo)};
}

// Copies one pack unchanged from src to dst and hands its values to the caller.
template <class T, int V>
__device__ __forceinline__ void copy_pack(T* dst, const T* src, acc_t<T> (&out)[V]) {
  if constexpr (sizeof(T) * V == 16) {
    const uint4 u = *reinterpret_cast<const uint4*>(src);
    store_v4(dst, u);
    unpack<T, V>(u, out);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) {
      dst[i] = src[i];
      out[i] = to_acc(src[i]);
    }
  }
}

__device__ __forceinline__ void store_global_v4_evict_first(void* p, uint4 v) {
  asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

// Stores into global memory (y); `evict_first` marks the lines as streaming (st.global.cs).
template <class T, int V>
__device__ __forceinline__ void store_pack(T* p, const acc_t<T> (&in)[V], bool evict_first = false) {
  if constexpr (sizeof(T) * V == 16) {
    uint32_t w[4];
    if constexpr (sizeof(T) == 2) {
#pragma unroll
      for (int i = 0; i < 4; ++i) w[i] = pair_bits(T{}, in[2 * i], in[2 * i + 1]);
    } else if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int i = 0; i < 4; ++i) w[i] = __float_as_uint(in[i]);
    } else {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        w[2 * i] = static_cast<uint32_t>(__double2loint(in[i]));
        w[2 * i + 1] = static_cast<uint32_t>(__double2hiint(in[i]));
      }
    }
    const uint4 u = make_uint4(w[0], w[1], w[2], w[3]);
    if (evict_first) {
      store_global_v4_evict_first(p, u);
    } else {
      store_global_v4(p, u);
    }
  } else if constexpr (sizeof(T) * V == 8 && sizeof(T) < 8) {
    uint32_t w[2];
    if constexpr (sizeof(T) == 2) {
#pragma unroll
      for (int i = 0; i < 2; ++i) w[i] = pair_bits(T{}, in[2 * i], in[2 * i + 1]);
    } else {
#pragma unroll
      for (int i = 0; i < 2; ++i) w[i] = __float_as_uint(in[i]);
    }
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(w[0]), "r"(w[1]) : "memory");
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = from_acc<T>(in[i]);
  }
}

// Hides a pack's value from the compiler, so that values derived from it earlier are derived again
// rather than kept alive in registers.
__device__ __forceinline__ void opaque(uint4& p) {
  asm volatile("" : "+r"(p.x), "+r"(p.y), "+r"(p.z), "+r"(p.w));
}

// Writes y for one 16-byte pack of x (see log_softmax_out_scaled).
template <class T>
__device__ __forceinline__ void store_log_softmax_pack(T* dst, uint4 p, acc_t<T> m, acc_t<T> scale, acc_t<T> log_sum,
                                                       bool evict_first = false) {
  constexpr int V = 16 / sizeof(T);
  acc_t<T> v[V];
  unpack<T, V>(p, v);
#pragma unroll
  for (int j = 0; j < V; ++j) v[j] = log_softmax_out_scaled(v[j], m, scale, log_sum);
  store_pack<T, V>(dst, v, evict_first);
}

}  // namespace softlight
