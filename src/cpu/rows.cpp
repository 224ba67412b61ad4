// The CPU backend: the same semantics as the GPU kernels (float accumulation for 16- and 32-bit
// types, double for float64, the same special-value rules), parallel over rows with std::thread.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

#include "cpu/parallel.hpp"
#include "cpu/simd.hpp"
#include "cpu/types.hpp"
#include "softlight/softlight.h"
#include "entry/validate.hpp"

namespace softlight {
namespace {

using cpu::BFloat16;
using cpu::Half;
using cpu::Traits;
using cpu::hardware_threads;
using cpu::kernels_for;
using cpu::parallel_for;
using cpu::with_cpu_type;

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
  const cpu::Scaling<A> k(scale);
  const double total = row_sum<A>(n, [&](int64_t j) { return std::exp(k(at(j), shift)); });
  const A log_sum = std::log(static_cast<A>(total));
  for (int64_t j = 0; j < n; ++j) y[j * ys] = Traits<T>::store(k(at(j), m) - log_sum);
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

constexpr int64_t kPieceMin = int64_t{1} << 16;  // elements a piece of a span split among threads

// Each position's max and log-sum from the (max, sum) of a span's pieces (p positions a piece).
template <class A>
void merge_pieces(const A* m, const double* s, int64_t pieces, int p, A scale, A* m_out, A* log_sum) {
  const A ninf = -std::numeric_limits<A>::infinity();
  if (pieces == 1) {  // (flat_stats merged its lanes already)
    for (int q = 0; q < p; ++q) {
      m_out[q] = m[q];
      log_sum[q] = std::log(static_cast<A>(s[q]));
    }
    return;
  }
  for (int q = 0; q < p; ++q) {
    A mq = ninf;
    for (int64_t c = 0; c < pieces; ++c) mq = m[c * p + q] > mq ? m[c * p + q] : mq;
    double sq = 0;  // a piece whose max is -inf counts 0 (times its sum: NaN stays NaN)
    for (int64_t c = 0; c < pieces; ++c)
      sq += s[c * p + q] * (m[c * p + q] == ninf ? 0.0 : std::exp(static_cast<double>(cpu::Scaling<A>(scale)(m[c * p + q], mq))));
    m_out[q] = mq;
    log_sum[q] = std::log(static_cast<A>(sq));
  }
}

// `outer` spans of len contiguous elements (x + o * xs, y + o * ys), p interleaved positions each
// (simd.hpp, flat_stats): where the spans are fewer than the threads, each is cut into pieces
// whose statistics are taken in parallel, merged, and written in parallel (x read twice).
template <class T, class K, class A = typename Traits<T>::A>
void run_flat(const K& k, const T* x, int64_t xs, T* y, int64_t ys, int64_t outer, int64_t len, int p, A scale,
              A* lse, int num_threads) {
  const int64_t workers = num_threads > 0 ? num_threads : static_cast<int64_t>(hardware_threads());
  int64_t pieces = 1;
  if (outer < 2 * workers) pieces = std::max<int64_t>(1, std::min((2 * workers + outer - 1) / outer, len / kPieceMin));
  const int64_t unit = std::max<int64_t>(k.lanes, p);  // pieces start on a whole vector and position
  const int64_t piece = (((len + pieces - 1) / pieces + unit - 1) / unit) * unit;
  pieces = (len + piece - 1) / piece;
  std::unique_ptr<A[]> ms(pieces > 1 ? new (std::nothrow) A[static_cast<size_t>(outer * pieces * p)] : nullptr);
  std::unique_ptr<double[]> ss(pieces > 1 ? new (std::nothrow) double[static_cast<size_t>(outer * pieces * p)]
                                          : nullptr);
  if (pieces == 1 || !ms || !ss) {  // a span a task: statistics, then the output
    parallel_for(outer, len, num_threads, [&](int64_t o0, int64_t o1) {
      A m[64], ls[64];  // (p <= 8 vectors of at most 8 lanes here)
      double sum[64];
      for (int64_t o = o0; o < o1; ++o) {
        k.flat_stats(x + o * xs, len, p, scale, m, sum);
        merge_pieces(m, sum, 1, p, scale, m, ls);
        k.flat_write(x + o * xs, y + o * ys, len, p, m, ls, scale);
        if (lse != nullptr)
          for (int q = 0; q < p; ++q) lse[o * p + q] = m[q] * scale + ls[q];
      }
    });
    return;
  }
  const auto span = [&](int64_t t, int64_t* o, int64_t* off) {
    *o = t / pieces;
    *off = (t % pieces) * piece;
    return std::min(piece, len - *off);
  };
  parallel_for(outer * pieces, piece, num_threads, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      int64_t o, off;
      const int64_t n = span(t, &o, &off);
      k.flat_stats(x + o * xs + off, n, p, scale, ms.get() + t * p, ss.get() + t * p);
    }
  });
  parallel_for(outer * pieces, piece, num_threads, [&](int64_t t0, int64_t t1) {
    A m[64], ls[64];
    for (int64_t t = t0; t < t1; ++t) {
      int64_t o, off;
      const int64_t n = span(t, &o, &off);
      merge_pieces(ms.get() + o * pieces * p, ss.get() + o * pieces * p, pieces, p, scale, m, ls);
      k.flat_write(x + o * xs + off, y + o * ys + off, n, p, m, ls, scale);
      if (lse != nullptr && off == 0)
        for (int q = 0; q < p; ++q) lse[o * p + q] = m[q] * scale + ls[q];
    }
  });
}

// The forward where the axis is contiguous (rows) or the inner positions are (tiles), through the
// vector kernels; false for any other layout.
template <class T> bool run_vector(const Call& c, int num_threads) {
  using A = typename Traits<T>::A;
  const auto& k = kernels_for<T>();
  const int64_t outer = c.n[0], dim = c.n[1], inner = c.n[2];
  const T* x = static_cast<const T*>(c.in0);
  T* y = static_cast<T*>(c.out);
  A* lse = static_cast<A*>(c.lse);
  const A scale = static_cast<A>(c.scale);
  if (dim == 1) {  // an axis of one element, its positions contiguous: element by element
    const bool one_row = inner == 1 && (outer == 1 || (c.in0_s[0] == 1 && c.out_s[0] == 1));
    const bool dense =
        c.in0_s[2] == 1 && c.out_s[2] == 1 && (outer == 1 || (c.in0_s[0] == inner && c.out_s[0] == inner));
    if (one_row || dense) {
      parallel_for(outer * inner, 16, num_threads, [&](int64_t p0, int64_t p1) {
        k.unit(x + p0, y + p0, p1 - p0, scale, lse ? lse + p0 : nullptr);
      });
      return true;
    }
  }
  if (inner == 1 && (dim == 1 || (c.in0_s[1] == 1 && c.out_s[1] == 1))) {
    const int64_t xs = c.in0_s[0], ys = c.out_s[0];
    if (outer < 2 * static_cast<int64_t>(hardware_threads()) && dim >= 2 * kPieceMin) {
      run_flat(k, x, xs, y, ys, outer, dim, 1, scale, lse, num_threads);  // few long rows: split
      return true;
    }
    parallel_for(outer, dim, num_threads, [&](int64_t r0, int64_t r1) {
      const auto kernel = dim <= cpu::kShortRow ? k.short_rows : k.rows;
      kernel(x + r0 * xs, xs, y + r0 * ys, ys, r1 - r0, dim, scale, lse ? lse + r0 : nullptr);
    });
    return true;
  }
  // A dense block of a few inner positions as one span (simd.hpp, flat_stats): positions that
  // share a vector, or whole vectors of them where the blocks are too few to keep every thread busy
  // (many blocks of whole vectors go to the tiles, below, which take a block's logs as vectors).
  const bool few_inner = inner > 1 && (inner < k.lanes ? k.lanes % inner == 0
                                                       : inner % k.lanes == 0 && inner <= 8 * k.lanes &&
                                                             outer < 2 * static_cast<int64_t>(hardware_threads()));
  if (few_inner && c.in0_s[2] == 1 && c.out_s[2] == 1 && c.in0_s[1] == inner && c.out_s[1] == inner) {
    run_flat(k, x, c.in0_s[0], y, c.out_s[0], outer, dim * inner, static_cast<int>(inner), scale, lse, num_threads);
    return true;
  }
  if (inner > 1 && c.in0_s[2] == 1 && c.out_s[2] == 1) {
    const int64_t lanes = int64_t{cpu::kTileVectors} * k.lanes;  // a tile a task
    const int64_t tiles = (inner + lanes - 1) / lanes;
    parallel_for(outer * tiles, dim * lanes, num_threads, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t o = p / tiles, i0 = (p % tiles) * lanes;
        k.tiles(x + o * c.in0_s[0] + i0, c.in0_s[1], y + o * c.out_s[0] + i0, c.out_s[1],
                std::min(lanes, inner - i0), dim, scale, lse ? lse + o * inner + i0 : nullptr);
      }
    });
    return true;
  }
  return false;
}

// Every other call, forward or backward: position p = o * inner + i (a row where inner is 1), its
// axis read at its stride, into the worker's scratch where the axis fits it (contiguous arithmetic
// measured 15-25 % faster).
// The backward of contiguous rows through the vector kernel; false for any other layout.
template <class T> bool run_vector_backward(const Call& c, int num_threads) {
  const bool rows = c.n[2] == 1 && (c.n[1] == 1 || (c.in0_s[1] == 1 && c.in1_s[1] == 1 && c.out_s[1] == 1));
  if (!rows) return false;
  const auto& k = kernels_for<T>();
  const T* dy = static_cast<const T*>(c.in0);
  const T* y = static_cast<const T*>(c.in1);
  T* dx = static_cast<T*>(c.out);
  parallel_for(c.n[0], c.n[1], num_threads, [&](int64_t r0, int64_t r1) {
    k.backward_rows(dy + r0 * c.in0_s[0], c.in0_s[0], y + r0 * c.in1_s[0], c.in1_s[0], dx + r0 * c.out_s[0],
                    c.out_s[0], r1 - r0, c.n[1]);
  });
  return true;
}

template <class T> void run(const Call& c, int num_threads) {
  using A = typename Traits<T>::A;
  if (c.backward ? run_vector_backward<T>(c, num_threads) : run_vector<T>(c, num_threads)) return;
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
