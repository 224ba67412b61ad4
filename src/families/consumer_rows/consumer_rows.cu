// The consumers of a row's log-sum-exp on the GPU (docs/consumers.md): a CTA a row (rows strided
// over a grid that fills the GPU), its statistics from one read (each thread's running max, sum of
// exponentials, their moment and the sum of the row, merged over the CTA), and their gradient from
// one read of the row and one write: over the rows as one flat array where they lie back to back
// with at most one token a row, else a CTA a row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "device/consumer_out.cuh"
#include "device/launch.hpp"
#include "device/workspace.hpp"
#include "device/packs.cuh"
#include "device/reductions.cuh"

namespace softlight {
namespace {

constexpr int kThreads = 512;  // a CTA's threads: 16 warps, a pack of 16 bytes each a step

// A thread's (or a merged) partial: m the max of x seen, s = sum exp((x - m) * sc), t = sum of
// exp((x - m) * sc) (x - m) * sc (0 where the exp is 0), sx = sum (x - ref) with ref the row's first
// element (sum_ref), in double: a common offset of the row costs no precision, and a float64 row of
// values near the largest has a finite sum. A partial whose max is -inf is shifted by 0
// (numerics.cuh).
template <class A> struct Stats {
  A m, s, t;
  double sx;
};

template <class A> __device__ __forceinline__ Stats<A> empty_stats() { return {neg_inf<A>(), A(0), A(0), 0.0}; }

// The reference of a row's sum (Stats::sx): its first element where that is finite, else 0.
template <class T> __device__ __forceinline__ double sum_ref(const T* x, int64_t n) {
  const double v = n > 0 ? static_cast<double>(to_acc(x[0])) : 0.0;
  return isfinite(v) ? v : 0.0;
}

// The weight of each term of the sum: 1, but for float64 rows half of 1 / n, so that neither a term
// (two values near the largest, of opposite signs) nor the sum overflows where the mean does not.
// The row's sum is ref * n + sx / w (sum_of).
template <class T> __device__ __forceinline__ double sum_weight(int64_t n) {
  return sizeof(T) == 8 ? 0.5 / static_cast<double>(n > 0 ? n : 1) : 1.0;
}
template <class T> __device__ __forceinline__ double mean_of(double sx, double ref, int64_t n) {
  return sizeof(T) == 8 ? ref + 2.0 * sx : ref + sx / static_cast<double>(n);
}

// One element into a partial (sc: the scale; ref and w: the sum's reference and weight).
template <class A>
__device__ __forceinline__ void add(Stats<A>& p, A v, A sc, double ref = 0.0, double w = 1.0) {
  if (v > p.m) {  // the max rises (NaN never wins): the sums move onto it
    if (p.m != neg_inf<A>()) {
      const A d = scaled_difference(p.m, v, sc, A(1));
      const A r = exp_of(d);
      p.t = r == A(0) ? A(0) : r * (p.t + p.s * d);  // (r = 0: every earlier term is 0 too)
      p.s *= r;
    }
    p.m = v;
  }
  const A d = scaled_difference(v, p.m == neg_inf<A>() ? A(0) : p.m, sc, A(1));
  const A e = exp_of(d);
  p.s += e;
  p.t += e == A(0) ? A(0) : e * d;
  p.sx += w == 1.0 ? static_cast<double>(v) - ref : (0.5 * static_cast<double>(v) - 0.5 * ref) * (w + w);
}

// N 16-byte packs into a partial whose max's shift is k (packs.cuh, shift_of): the packs' max first
// (the sums move onto it, and k with them, at most once a group), then each element's exp as the
// register clusters take it (packs.cuh, packs_exp_moment), a fused multiply-add and an exp, the
// group's sums added to the partial's once. The moment t and the sum sx are kept where asked
// (Moment, Sum), and stay 0 elsewhere.
template <class T, int N, bool Moment, bool Sum>
__device__ __forceinline__ void add_packs(Stats<acc_t<T>>& p, Shift<acc_t<T>>& k, const uint4 (&q)[N],
                                          acc_t<T> sc, double ref) {
  using A = acc_t<T>;
  const A mq = packs_max<T, N>(q);
  if (mq > p.m) {
    if (p.m != neg_inf<A>()) {
      const A d = scaled_difference(p.m, mq, sc, A(1));
      const A r = exp_of(d);
      if constexpr (Moment) p.t = r == A(0) ? A(0) : r * (p.t + p.s * d);
      p.s *= r;
    }
    p.m = mq;
    k = shift_of(mq, sc);
  }
  A sq, w;
  double sx;
  packs_exp_moment<T, N, Moment, Sum>(q, k.e, sq, w, &sx);
  p.s = fma(sq, k.r, p.s);
  if constexpr (Moment) p.t = fma(k.k, fma(-k.e.lo, sq, w), p.t);
  if constexpr (Sum) p.sx += sx - static_cast<double>(N * (16 / sizeof(T))) * ref;  // (sums of 16 floats: exact)
}

// The elements of a row of n at x before its first 16-byte boundary (all n where x is not on its
// type's alignment, which a raw pointer through the C ABI may be).
template <class T> __host__ __device__ __forceinline__ int64_t head_of(const T* x, int64_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(x);
  const int64_t h = a % sizeof(T) ? n : static_cast<int64_t>((16 - a % 16) % 16 / sizeof(T));
  return h < n ? h : n;
}

// A thread's partial of a row of n at x: the elements before x's first 16-byte boundary one by one,
// then 16-byte packs, four a step (64 bytes in flight a thread), coalesced over the CTA, then the
// rest. float64 takes every element by itself (packs of two gain nothing there, and its exp would
// spill).
template <class T, bool Moment, bool Sum>
__device__ __forceinline__ Stats<acc_t<T>> thread_stats(const T* __restrict__ x, int64_t n, acc_t<T> sc) {
  using A = acc_t<T>;
  constexpr int V = 16 / sizeof(T), N = 4;
  Stats<A> p = empty_stats<A>();
  const double ref = Sum ? sum_ref(x, n) : 0.0, w = sum_weight<T>(n);
  int64_t tail = 0;
  if constexpr (sizeof(T) < 8) {
    const int64_t head = head_of(x, n);
    for (int64_t j = threadIdx.x; j < head; j += blockDim.x) add(p, to_acc(x[j]), sc, ref, w);
    Shift<A> shift = shift_of(p.m, sc);
    const int64_t packs = (n - head) / V, step = blockDim.x;
    const uint4* xp = reinterpret_cast<const uint4*>(x + head);
    int64_t k = threadIdx.x;
    for (; k + (N - 1) * step < packs; k += N * step) {
      uint4 q[N];
#pragma unroll
      for (int u = 0; u < N; ++u) q[u] = xp[k + u * step];
      add_packs<T, N, Moment, Sum>(p, shift, q, sc, ref);
    }
    for (; k < packs; k += step) {
      const uint4 q[1] = {xp[k]};
      add_packs<T, 1, Moment, Sum>(p, shift, q, sc, ref);
    }
    tail = head + packs * V;
  }
  for (int64_t j = tail + threadIdx.x; j < n; j += blockDim.x) add(p, to_acc(x[j]), sc, ref, w);
  return p;
}

// a and b merged (merge_moment; the sums of x added).
template <class A> __device__ __forceinline__ Stats<A> merge(Stats<A> a, Stats<A> b, A sc) {
  const double sx = a.sx + b.sx;
  const MaxSumMoment<A> r = merge_moment(MaxSumMoment<A>{a.m, a.s, a.t}, MaxSumMoment<A>{b.m, b.s, b.t}, sc);
  return {r.m, r.s, r.t, sx};
}

// (The sum of x crosses only where it is kept: Sum.)
template <bool Sum, class A> __device__ __forceinline__ Stats<A> shfl_xor(Stats<A> p, int o) {
  return {__shfl_xor_sync(0xffffffffu, p.m, o), __shfl_xor_sync(0xffffffffu, p.s, o),
          __shfl_xor_sync(0xffffffffu, p.t, o), Sum ? __shfl_xor_sync(0xffffffffu, p.sx, o) : 0.0};
}

// The CTA's merged partial, in every thread. scratch: 32 partials of shared memory.
template <bool Sum, class A> __device__ Stats<A> block_merge(Stats<A> p, Stats<A>* scratch, A sc) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int o = 16; o > 0; o /= 2) p = merge(p, shfl_xor<Sum>(p, o), sc);
  if (lane == 0) scratch[warp] = p;
  __syncthreads();
  Stats<A> r = lane < warps ? scratch[lane] : empty_stats<A>();
  for (int o = 16; o > 0; o /= 2) r = merge(r, shfl_xor<Sum>(r, o), sc);
  __syncthreads();  // (the scratch is free again)
  return r;
}

// dst[j] = f(x[j]) over a row of n, each element by the thread that reads it (dst may be x): where x
// and dst lie as far from a 16-byte boundary, 16-byte packs from x's first boundary (the elements
// before it and after the last whole pack one by one), coalesced over the CTA; else element by
// element. N: the packs a thread loads before it writes any (N x 16 bytes in flight a thread), the
// CTA's N x blockDim.x packs a step, then the packs left one at a time.
template <class T, int N = 1, class F> __device__ __forceinline__ void map_row(const T* x, T* dst, int64_t n, F f) {
  using A = acc_t<T>;
  constexpr int V = 16 / sizeof(T);
  const int64_t head = head_of(x, n);
  const int64_t end = head_of(static_cast<const T*>(dst), n) == head ? head + (n - head) / V * V : head;
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) dst[j] = from_acc<T>(f(to_acc(x[j])));
  int64_t j0 = head + int64_t{threadIdx.x} * V;
  if constexpr (N > 1) {
    const int64_t step = int64_t{blockDim.x} * V;
    for (; j0 + (N - 1) * step < end; j0 += N * step) {
      A v[N][V];
#pragma unroll
      for (int u = 0; u < N; ++u) load_pack<T, V>(x + j0 + u * step, v[u]);
#pragma unroll
      for (int u = 0; u < N; ++u) {
#pragma unroll
        for (int i = 0; i < V; ++i) v[u][i] = f(v[u][i]);
        store_pack<T, V>(dst + j0 + u * step, v[u]);
      }
    }
  }
  for (int64_t j = j0; j < end; j += int64_t{blockDim.x} * V) {
    A v[V];
    load_pack<T, V>(x + j, v);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = f(v[i]);
    store_pack<T, V>(dst + j, v);
  }
  for (int64_t j = end + threadIdx.x; j < n; j += blockDim.x) dst[j] = from_acc<T>(f(to_acc(x[j])));
}

// Held to three CTAs an SM (40 registers): at the compiler's 55, two, and 16-bit rows of 50257 took
// 0.388 ms against 0.357 (docs/consumers.md, "Kernel choices").
template <class T, bool Moment, bool Sum>
__global__ void __launch_bounds__(kThreads, 3)
    row_stats_kernel(const T* __restrict__ x, int64_t xs, int64_t rows, int64_t cols, acc_t<T> sc,
                     ConsumerArgs<acc_t<T>> a) {
  using A = acc_t<T>;
  __shared__ Stats<A> scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * xs;
    const Stats<A> p = block_merge<Sum>(thread_stats<T, Moment, Sum>(xr, cols, sc), scratch, sc);
    const A log_sum = log_acc(p.s);
    const A shift = p.m == neg_inf<A>() ? A(0) : p.m;
    if (threadIdx.x == 0) {
      const A mz = p.m * sc;
      if (a.lse) a.lse[r] = mz + log_sum;
      if (a.entropy) a.entropy[r] = log_sum - p.t / p.s;
      if (a.sum) a.sum[r] = static_cast<A>(mean_of<T>(p.sx, sum_ref(xr, cols), cols) * static_cast<double>(cols) * sc);
      if (a.max) a.max[r] = mz;
      if (a.sumexp) a.sumexp[r] = p.s;
      if (a.moment) a.moment[r] = p.t;
    }
    pick_tokens(a, xr, r, cols, shift, sc, log_sum, threadIdx.x, blockDim.x);
  }
}

template <class A> __device__ __forceinline__ A value_at(const A* p, int64_t i) { return p == nullptr ? A(0) : p[i]; }

// The gradient of the statistics at an element of a row that no token names: dx = sc (p (ca - ce (log p
// + h)) + cs), log p = x sc - lse in one rounding (a fused multiply-add: no temperature overflows x sc,
// and no max of the row is needed). A token's element adds sc b, b the sum of its coefficients.
template <class A> struct RowGrad {
  A lse, ca, ce, h, cs;
  __device__ __forceinline__ A operator()(A v, A sc) const {
    const A lp = fma(v, sc, -lse);
    const A p = exp_of(lp);
    const A term = p == A(0) ? A(0) : (ce == A(0) ? p * ca : p * (ca - ce * (lp + h)));
    return term * sc + cs * sc;
  }
};

// Row r's coefficients, lp_sum the sum of its tokens' d_logprobs. An lse of +inf (overflowed) says
// nothing of p: the row is NaN (docs/consumers.md).
template <class A> __device__ __forceinline__ RowGrad<A> row_grad(const GradArgs<A>& g, int64_t r, A lp_sum) {
  const A ce = value_at(g.d_entropy, r);
  return {g.lse[r] == -neg_inf<A>() ? A(NAN) : g.lse[r], value_at(g.d_lse, r) - lp_sum, ce,
          ce == A(0) ? A(0) : g.entropy[r], value_at(g.d_sum, r)};
}

// Token q of row r's coefficient b, where it is the first of the row's tokens to name its column j
// (tcol: the row's columns, -1 outside the shard): every index naming j adds its coefficient. Else
// (a later one, or outside): false.
template <class A>
__device__ __forceinline__ bool token_sum(const GradArgs<A>& g, const int64_t* tcol, int64_t r, int64_t q, A* b) {
  const int64_t j = tcol[q];
  if (j < 0) return false;
  for (int64_t k = 0; k < q; ++k)
    if (tcol[k] == j) return false;
  A s = A(0);
  for (int64_t k = q; k < g.count; ++k)
    if (tcol[k] == j) s += value_at(g.d_picked, r * g.count + k) + value_at(g.d_logprobs, r * g.count + k);
  *b = s;
  return true;
}

// The gradient of the statistics, a CTA a row (where the flat pass below does not apply): from one
// read of the row, four packs a thread in flight, and one write, then the tokens' elements.
template <class T>
__global__ void __launch_bounds__(kThreads) row_stats_grad_kernel(const T* x, int64_t xs, T* dx, int64_t dxs,
                                                                  int64_t rows, int64_t cols, acc_t<T> sc,
                                                                  GradArgs<acc_t<T>> g) {
  using A = acc_t<T>;
  __shared__ A red[32];
  extern __shared__ unsigned char tokens_smem[];  // per token: its column, then x's value there
  int64_t* tcol = reinterpret_cast<int64_t*>(tokens_smem);
  A* tval = reinterpret_cast<A*>(tcol + g.count);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * xs;
    T* dr = dx + r * dxs;
    A lp_sum = A(0);
    for (int64_t q = threadIdx.x; q < g.count; q += blockDim.x) {
      const int64_t token = g.index[r * g.index_stride + q];
      const int64_t j = token - g.offset;
      const bool inside = token >= g.offset && j < cols;
      tcol[q] = inside ? j : -1;
      tval[q] = inside ? to_acc(xr[j]) : A(0);  // (read before dx, which may be x, is written)
      lp_sum += value_at(g.d_logprobs, r * g.count + q);
    }
    lp_sum = block_sum(lp_sum, red, blockDim.x, 1);  // (its barriers also publish the tokens)
    const RowGrad<A> grad = row_grad(g, r, lp_sum);
    map_row<T, 4>(xr, dr, cols, [&](A v) { return grad(v, sc); });
    __syncthreads();  // the row's dx written before the tokens' elements are
    for (int64_t q = threadIdx.x; q < g.count; q += blockDim.x) {
      A b;
      if (token_sum(g, tcol, r, q, &b)) dr[tcol[q]] = from_acc<T>(grad(tval[q], sc) + b * sc);
    }
    __syncthreads();  // (the tokens' shared memory is reused by the next row)
  }
}

// The flat pass, for rows that lie back to back in x and dx alike with at most one token a row
// (docs/consumers.md): the rows as one array cut into 16-byte packs with no regard for where a row
// ends, kFlatPacks a thread (loaded before any is written) and kFlatThreads x kFlatPacks a CTA, a CTA
// for each such piece, as a copy is cut: a grid that fills the GPU and strides over the array (or a
// CTA a row, as row_stats_grad_kernel) is 5 % slower, for a plain copy too. Each thread reads its
// rows' coefficients and token from the arguments itself: no workspace, no barrier, one launch.
constexpr int kFlatThreads = 128, kFlatPacks = 4;

// Row r's coefficients as RowGrad, and its token's column j (-1: none, or outside the shard) and b.
template <class A> struct RowToken {
  RowGrad<A> k;
  int64_t j;
  A b;
};
template <class A> __device__ __forceinline__ RowToken<A> row_token(const GradArgs<A>& g, int64_t r, int64_t cols) {
  if (g.count == 0) return {row_grad(g, r, A(0)), -1, A(0)};
  const int64_t token = g.index[r * g.index_stride], j = token - g.offset;
  const A lp = value_at(g.d_logprobs, r);
  return {row_grad(g, r, lp), token >= g.offset && j < cols ? j : -1, value_at(g.d_picked, r) + lp};
}

// dx at column c of t's row, where x is v.
template <class A> __device__ __forceinline__ A flat_value(const RowToken<A>& t, A v, int64_t c, A sc) {
  const A d = t.k(v, sc);
  return c == t.j ? d + t.b * sc : d;
}

// (e / cols in 32 bits where both fit)
__device__ __forceinline__ int64_t row_of(int64_t e, int64_t cols) {
  return (e | cols) >> 32 ? e / cols : static_cast<uint32_t>(e) / static_cast<uint32_t>(cols);
}

// n elements from x to dx: the first `head` (before x's first 16-byte boundary, dx's too) and those
// from `end` on one by one (CTA 0), the packs between by the CTAs in turn. A pack that crosses the
// end of a row (rows of at least a pack) takes each element's coefficients from its own row.
// (dr, dc): kFlatThreads packs as rows and columns.
template <class T>
__global__ void __launch_bounds__(kFlatThreads)
    grad_flat_kernel(const T* x, T* dx, int64_t n, int64_t cols, int64_t head, int64_t end, int64_t dr,
                     int64_t dc, acc_t<T> sc, GradArgs<acc_t<T>> g) {
  using A = acc_t<T>;
  constexpr int V = 16 / sizeof(T), N = kFlatPacks;
  if (blockIdx.x == 0) {
    const auto one = [&](int64_t e) {
      const int64_t r = row_of(e, cols), c = e - r * cols;
      dx[e] = from_acc<T>(flat_value(row_token(g, r, cols), to_acc(x[e]), c, sc));
    };
    for (int64_t e = threadIdx.x; e < head; e += blockDim.x) one(e);
    for (int64_t e = end + threadIdx.x; e < n; e += blockDim.x) one(e);
  }
  const int64_t e0 = head + (int64_t{blockIdx.x} * kFlatThreads * N + threadIdx.x) * V;
  uint4 q[N];  // (as loaded: the elements are widened one pack at a time)
#pragma unroll
  for (int u = 0; u < N; ++u)
    if (e0 + u * kFlatThreads * V < end) q[u] = *reinterpret_cast<const uint4*>(x + e0 + u * kFlatThreads * V);
  if (e0 >= end) return;  // (a thread past the last pack: its row would lie past the last)
  int64_t r = row_of(e0, cols), c = e0 - r * cols;  // the pack's first element's row and column
  RowToken<A> t = row_token(g, r, cols);
  int64_t tr = r;  // t's row
#pragma unroll
  for (int u = 0; u < N; ++u) {
    const int64_t e = e0 + int64_t{u} * kFlatThreads * V;
    if (e >= end) break;
    if (r != tr) t = row_token(g, r, cols), tr = r;
    A v[V];
    unpack<T, V>(q[u], v);
    if (c + V <= cols) {
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] = flat_value(t, v[i], c + i, sc);
    } else {
      const RowToken<A> t1 = row_token(g, r + 1, cols);
#pragma unroll
      for (int i = 0; i < V; ++i)
        v[i] = c + i < cols ? flat_value(t, v[i], c + i, sc) : flat_value(t1, v[i], c + i - cols, sc);
    }
    store_pack<T, V>(dx + e, v);
    r += dr;  // on to the thread's next pack
    c += dc;
    if (c >= cols) c -= cols, ++r;
  }
}

// A CTA a row, up to as many CTAs as the GPU holds at once (the rows strided over them past that):
// more would run as a second wave, most of the GPU idle at its end.
template <class K> int grid_for(K kernel, int64_t rows, size_t smem = 0) {
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device))
    sms = 132;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem) != cudaSuccess || per_sm < 1)
    per_sm = 1;
  (void)cudaGetLastError();  // (a failed query above is no error of the launch)
  const int64_t ctas = int64_t{sms} * per_sm;
  return static_cast<int>(rows < ctas ? rows : ctas);
}

}  // namespace

cudaError_t launch_row_stats(const ConsumerCall& c, const ConsumerArgs<float>& af, const ConsumerArgs<double>& ad,
                             cudaStream_t stream) {
  return with_element_type(c.dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const ConsumerArgs<A>& a = *[&] {
      if constexpr (sizeof(A) == 8) return &ad;
      else return &af;
    }();
    const auto run = [&](auto kernel) {
      kernel<<<grid_for(kernel, c.rows), kThreads, 0, stream>>>(static_cast<const T*>(c.x), c.x_stride, c.rows,
                                                                c.cols, static_cast<A>(c.scale), a);
      return cudaGetLastError();
    };
    const bool moment = a.entropy || a.moment, sum = a.sum != nullptr;
    return moment ? (sum ? run(row_stats_kernel<T, true, true>) : run(row_stats_kernel<T, true, false>))
                  : (sum ? run(row_stats_kernel<T, false, true>) : run(row_stats_kernel<T, false, false>));
  });
}

cudaError_t launch_row_stats_grad(const ConsumerCall& c, const GradArgs<float>& gf, const GradArgs<double>& gd,
                                  cudaStream_t stream) {
  return with_element_type(c.dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const GradArgs<A>& g = *[&] {
      if constexpr (sizeof(A) == 8) return &gd;
      else return &gf;
    }();
    const T* x = static_cast<const T*>(c.x);
    T* dx = static_cast<T*>(c.dx);
    const A sc = static_cast<A>(c.scale);
    // The flat pass where the rows lie back to back in x and dx alike (or there is one), each at least
    // a pack long, x and dx as far from a 16-byte boundary, with at most one token a row; else a CTA
    // a row.
    constexpr int64_t V = 16 / sizeof(T), piece = int64_t{kFlatThreads} * kFlatPacks * V;
    const uintptr_t ax = reinterpret_cast<uintptr_t>(x), ad = reinterpret_cast<uintptr_t>(dx);
    const int64_t n = c.rows * c.cols, head = head_of(x, n);
    const int64_t end = head + (n - head) / V * V, ctas = std::max<int64_t>(1, (end - head + piece - 1) / piece);
    if (g.count <= 1 && c.cols >= V && ax % sizeof(T) == 0 && ax % 16 == ad % 16 && ctas <= INT32_MAX &&
        (c.rows == 1 || (c.x_stride == c.cols && c.dx_stride == c.cols))) {
      const int64_t step = int64_t{kFlatThreads} * V;
      grad_flat_kernel<T><<<static_cast<unsigned>(ctas), kFlatThreads, 0, stream>>>(
          x, dx, n, c.cols, head, end, step / c.cols, step % c.cols, sc, g);
      return cudaGetLastError();
    }
    const size_t smem = static_cast<size_t>(g.count) * (8 + sizeof(A));
    auto kernel = row_stats_grad_kernel<T>;
    if (smem > 48 * 1024) {
      if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     static_cast<int>(smem)))
        return e;
    }
    kernel<<<grid_for(kernel, c.rows, smem), kThreads, smem, stream>>>(x, c.x_stride, dx, c.dx_stride, c.rows,
                                                                        c.cols, sc, g);
    return cudaGetLastError();
  });
}

}  // namespace softlight

// --- cross-entropy, its gradient in the same pass -----------------------------------------------
namespace softlight {
namespace {

// The reductions' kernels: CTAs of kReduceThreads; the mean's count in at most kReduceCtas CTAs of
// at least kCountRowsPerThread rows a thread; the losses summed in pieces of at least kPieceRows
// rows a CTA, at most kReduceCtas pieces (one CTA sums the pieces' sums after).
constexpr int kReduceThreads = 1024, kReduceCtas = 1024, kCountRowsPerThread = 16;
constexpr int64_t kPieceRows = 65536;

// The rows whose target is not ignored, added into *count (zeroed before): a grid over the rows,
// each CTA's count added by an integer atomic (the same count in any order).
__global__ void __launch_bounds__(kReduceThreads) count_kept(const int64_t* target, int64_t rows, bool ignore,
                                                             int64_t ignore_index, unsigned long long* count) {
  __shared__ double red[32];
  double n = 0;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t r = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; r < rows; r += step)
    n += !(ignore && target[r] == ignore_index);
  n = block_sum(n, red, blockDim.x, 1);
  if (threadIdx.x == 0 && n != 0) atomicAdd(count, static_cast<unsigned long long>(n));
}

// Each row's loss (into `losses`, double, or the loss array itself for no reduction), lse, and where
// asked its gradient for an upstream gradient of 1 (of the mean: 1 / *count), written from a second
// read of the row while it is in L2. A target outside the row gives a NaN loss and a NaN gradient row.
template <class T, bool Sum>
__global__ void __launch_bounds__(kThreads) cross_entropy_kernel(const T* x, int64_t xs, const int64_t* target,
                                                                 int64_t rows, int64_t cols, acc_t<T> sc,
                                                                 CrossEntropyArgs<acc_t<T>> a, T* grad, int64_t gs) {
  using A = acc_t<T>;
  __shared__ Stats<A> scratch[32];
  const double g = a.mean ? (*a.count > 0 ? 1.0 / static_cast<double>(*a.count) : 0.0) : 1.0;
  const double inv_cols = 1.0 / static_cast<double>(cols);  // (a division once, not a row)
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * xs;
    const int64_t t = target[r];
    const bool ignored = a.ignore && t == a.ignore_index;
    const bool bad = !ignored && (t < 0 || t >= cols);
    const Stats<A> p = block_merge<Sum>(thread_stats<T, false, Sum>(xr, cols, sc), scratch, sc);
    const A log_sum = log_acc(p.s);
    const A shift = p.m == neg_inf<A>() ? A(0) : p.m;
    const double mx = shift, ls = log_sum, dsc = sc;
    const double lse = mx * dsc + ls;
    double loss = 0;
    if (bad) {
      loss = NAN;
    } else if (!ignored) {
      const double nll = ls - scaled_difference(static_cast<double>(to_acc(xr[t])), mx, dsc, 1.0);
      const double mean = mean_of<T>(p.sx, sum_ref(xr, cols), cols);  // (sx: differences from the reference)
      const double smooth = a.eps == 0.0 ? 0.0 : a.eps * (ls - scaled_difference(mean, mx, dsc, 1.0));
      loss = (1.0 - a.eps) * nll + smooth + (a.z_loss == 0.0 ? 0.0 : a.z_loss * lse * lse);
    }
    if (threadIdx.x == 0) {
      if (a.reduce) a.losses[r] = loss;
      else a.loss[r] = static_cast<A>(loss);
      if (a.lse) a.lse[r] = p.m * sc + log_sum;
    }
    if (grad == nullptr) continue;
    T* gr = grad + r * gs;
    const A xt = bad || ignored ? A(0) : to_acc(xr[t]);  // (read before grad, which may be x, is written)
    __syncthreads();
    // (z_loss 0 leaves the factor g: an overflowed lse of +inf times 0 would make it NaN.)
    const A ca = static_cast<A>(a.z_loss == 0.0 ? g : g * (1.0 + 2.0 * a.z_loss * lse)),
            cc = static_cast<A>(-g * a.eps * inv_cols);
    const A none = bad ? A(NAN) : A(0);
    const Difference<A> diff(shift, sc);
    const auto value = [&](A v) {
      if (ignored || bad) return none;
      const A lp = diff(v) - log_sum;
      const A q = exp_of(lp);
      return (q * ca + cc) * sc;
    };
    map_row(xr, gr, cols, value);
    __syncthreads();  // the row written before its target's element is
    if (threadIdx.x == 0 && !ignored && !bad)
      gr[t] = from_acc<T>(value(xt) - static_cast<A>(g * (1.0 - a.eps)) * sc);
  }
}

// The sum of each piece of `piece` rows' losses (a CTA a piece), into sums.
__global__ void __launch_bounds__(kReduceThreads) sum_pieces(const double* losses, int64_t rows, int64_t piece,
                                                             double* sums) {
  __shared__ double red[32];
  const int64_t first = int64_t{blockIdx.x} * piece, end = first + piece < rows ? first + piece : rows;
  double s = 0;
  for (int64_t r = first + threadIdx.x; r < end; r += blockDim.x) s += losses[r];
  s = block_sum(s, red, blockDim.x, 1);
  if (threadIdx.x == 0) sums[blockIdx.x] = s;
}

// The reduced loss: the values (each row's loss, or the pieces' sums) summed by one CTA, over the
// kept rows' count for the mean (NaN where none is kept).
template <class A>
__global__ void __launch_bounds__(kReduceThreads) reduce_losses(const double* losses, int64_t rows, bool mean,
                                                                const int64_t* count, A* loss) {
  __shared__ double red[32];
  double s = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) s += losses[r];
  s = block_sum(s, red, blockDim.x, 1);
  if (threadIdx.x == 0) *loss = static_cast<A>(mean ? (*count > 0 ? s / static_cast<double>(*count) : NAN) : s);
}

}  // namespace

cudaError_t launch_cross_entropy(const ConsumerCall& c, const softlight_cross_entropy_options& o,
                                 cudaStream_t stream, const Plan* plan, const Call* call) {
  int red;
  memcpy(&red, &o.reduction, sizeof red);
  const bool reduce = red != SOFTLIGHT_REDUCTION_NONE, mean = red == SOFTLIGHT_REDUCTION_MEAN;
  // The losses' sum: one CTA over the rows' losses, or over more than kPieceRows rows the sums of
  // pieces of rows (a CTA a piece) summed after by one CTA. The pieces depend on the rows alone:
  // the same sum at every call.
  const int64_t piece = std::max(kPieceRows, (c.rows + kReduceCtas - 1) / kReduceCtas);
  const int64_t pieces = c.rows > kPieceRows ? (c.rows + piece - 1) / piece : 0;
  cudaMemPool_t pool;
  void* ws = nullptr;  // the kept rows' count, then each row's loss and the pieces' sums (reductions)
  const size_t bytes = 8 + (reduce ? static_cast<size_t>(c.rows + pieces) * 8 : 0);
  cudaError_t e;
  if ((e = workspace_pool(&pool)) || (e = cudaMallocFromPoolAsync(&ws, bytes, pool, stream))) return e;
  int64_t* count = static_cast<int64_t*>(ws);
  double* losses = reinterpret_cast<double*>(count + 1);
  double* sums = losses + c.rows;
  if (mean) {  // (the count is read for the mean alone)
    const int64_t per_cta = int64_t{kReduceThreads} * kCountRowsPerThread;
    const int grid = static_cast<int>(std::clamp<int64_t>((c.rows + per_cta - 1) / per_cta, 1, kReduceCtas));
    if ((e = cudaMemsetAsync(count, 0, sizeof *count, stream)) != cudaSuccess) {
      (void)cudaFreeAsync(ws, stream);
      return e;
    }
    count_kept<<<grid, kReduceThreads, 0, stream>>>(c.index, c.rows, c.ignore, c.ignore_index,
                                                    reinterpret_cast<unsigned long long*>(count));
  }
  const bool loss_only = o.grad == nullptr;
  e = with_element_type(c.dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    CrossEntropyArgs<A> a{o.label_smoothing, o.z_loss, c.ignore, c.ignore_index, mean, reduce, count, losses,
                          static_cast<A*>(o.loss), static_cast<A*>(o.lse)};
    const auto kernel = o.label_smoothing != 0.0 ? cross_entropy_kernel<T, true> : cross_entropy_kernel<T, false>;
    if (plan != nullptr && c.rows > 0) {
      // The row held on chip (registers, or cluster_rows' ring) between its read and the gradient's
      // write. Where the clusters cannot be placed (a partitioned or busy GPU), the error, and
      // nothing else queued: the GPU entry plans again (its launch_with_fallbacks).
      cudaError_t on_chip = cudaErrorInvalidValue;
      if constexpr (sizeof(A) == 4) {
        switch (plan->family) {
          case Family::short_rows: on_chip = launch_short_rows_ce(*plan, *call, c.index, a, loss_only, stream); break;
          case Family::flat_rows: on_chip = launch_flat_rows_ce(*plan, *call, c.index, a, loss_only, stream); break;
          case Family::register_rows:
            on_chip = launch_register_rows_ce(*plan, *call, c.index, a, loss_only, stream);
            break;
          case Family::register_clusters:
            on_chip = launch_register_clusters_ce(*plan, *call, c.index, a, loss_only, stream);
            break;
          case Family::block_rows:  // (these two for the gradient alone: the loss alone never plans them)
            if (!loss_only) on_chip = launch_block_rows_ce(*plan, *call, c.index, a, stream);
            break;
          case Family::cluster_rows:
            if (!loss_only) on_chip = launch_cluster_rows_ce(*plan, *call, c.index, a, stream);
            break;
          default: break;
        }
      }
      if (on_chip != cudaSuccess) return on_chip;
    } else if (c.rows > 0) {  // (no rows: the reduction of none, 0 or NaN, below)
      kernel<<<grid_for(kernel, c.rows), kThreads, 0, stream>>>(
          static_cast<const T*>(c.x), c.x_stride, c.index, c.rows, c.cols, static_cast<A>(c.scale), a,
          static_cast<T*>(o.grad), o.grad_row_stride);
    }
    if (reduce && pieces > 0) {
      sum_pieces<<<static_cast<unsigned>(pieces), kReduceThreads, 0, stream>>>(losses, c.rows, piece, sums);
      reduce_losses<A><<<1, kReduceThreads, 0, stream>>>(sums, pieces, mean, count, static_cast<A*>(o.loss));
    } else if (reduce) {
      reduce_losses<A><<<1, kReduceThreads, 0, stream>>>(losses, c.rows, mean, count, static_cast<A*>(o.loss));
    }
    return cudaGetLastError();
  });
  const cudaError_t f = cudaFreeAsync(ws, stream);
  return e != cudaSuccess ? e : f;
}

// Each CTA a row at a time: the row's factor read once; a factor of 1 leaves the row unread (one
// factor of 1 for every row: the CTA returns at once).
template <class T>
__global__ void __launch_bounds__(kThreads) grad_scale_kernel(T* g, int64_t gs, int64_t rows, int64_t cols,
                                                              const acc_t<T>* f, bool per_row) {
  using A = acc_t<T>;
  if (!per_row && f[0] == A(1)) return;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const A k = f[per_row ? r : 0];
    if (k == A(1)) continue;
    T* gr = g + r * gs;
    map_row(gr, gr, cols, [k](A v) { return v * k; });
  }
}

cudaError_t launch_grad_scale(const ConsumerCall& c, const void* d_loss, int64_t count, cudaStream_t stream) {
  return with_element_type(c.dtype, [&](auto tag) {
    using T = decltype(tag);
    const auto kernel = grad_scale_kernel<T>;
    kernel<<<grid_for(kernel, c.rows), kThreads, 0, stream>>>(static_cast<T*>(c.dx), c.dx_stride, c.rows, c.cols,
                                                              static_cast<const acc_t<T>*>(d_loss), count != 1);
    return cudaGetLastError();
  });
}

}  // namespace softlight
