// The consumers of a row's log-sum-exp on the CPU: row statistics, their gradient, and
// cross-entropy with its gradient written in the same pass (docs/consumers.md). Rows run in
// parallel; each row's statistics come from one read (simd.hpp, row_stats), and a gradient is
// written while the row is still in cache.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>

#include "cpu/parallel.hpp"
#include "softlight/softlight.h"
#include "entry/validate.hpp"

namespace softlight {
namespace {

using cpu::Traits;

// One row's statistics, in z = x * scale units where not said.
template <class A> struct RowStats {
  A mx;       // max x (-inf for an empty row)
  A m;        // max z
  A log_sum;  // log sum exp(z - m)
  A lse;      // m + log_sum
  double s, t;
  long double sum_x;  // sum x (not scaled)

  // z[j] - lse from x[j]'s value v, as log_softmax writes it: the shift taken before the scale, so
  // that no temperature makes a row's own values overflow.
  A logprob(A v, A scale) const { return cpu::Scaling<A>(scale)(v, mx) - log_sum; }
};

template <class T, class K, class A = typename Traits<T>::A> RowStats<A> stats_of(const K& k, const T* x, int64_t n, A scale) {
  A m;
  double s, t;
  long double sum;
  k.row_stats(x, n, scale, &m, &s, &t, &sum);
  RowStats<A> r;
  r.mx = m;
  r.m = m * scale;
  r.log_sum = std::log(static_cast<A>(s));
  r.lse = r.m + r.log_sum;
  r.s = s;
  r.t = t;
  r.sum_x = sum;
  return r;
}

template <class A> A entropy_of(const RowStats<A>& r) {
  return static_cast<A>(static_cast<double>(r.log_sum) - r.t / r.s);
}

// The column of a token, or -1 where it is not in this row's columns (checked: only shards have such).
inline int64_t column_of(int64_t token, int64_t offset, int64_t cols) {
  return token >= offset && token - offset < cols ? token - offset : -1;
}

template <class A> A* acc(void* p) { return static_cast<A*>(p); }
template <class A> const A* acc(const void* p) { return static_cast<const A*>(p); }

template <class T> void row_stats(const ConsumerCall& c, const softlight_row_stats_options& o, int num_threads) {
  using A = typename Traits<T>::A;
  const auto& k = cpu::kernels_for<T>();
  const A scale = static_cast<A>(c.scale);
  const T* x = static_cast<const T*>(c.x);
  cpu::parallel_for(c.rows, c.cols + 1, num_threads, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * c.x_stride;
      const RowStats<A> st = stats_of(k, xr, c.cols, scale);
      if (o.lse) acc<A>(o.lse)[r] = st.lse;
      if (o.entropy) acc<A>(o.entropy)[r] = entropy_of(st);
      if (o.sum) acc<A>(o.sum)[r] = static_cast<A>(st.sum_x * c.scale);
      if (o.max) acc<A>(o.max)[r] = st.m;
      if (o.sumexp) acc<A>(o.sumexp)[r] = static_cast<A>(st.s);
      if (o.moment) acc<A>(o.moment)[r] = static_cast<A>(st.t);
      for (int64_t q = 0; q < c.index_count; ++q) {
        const int64_t j = column_of(c.index[r * c.index_stride + q], c.index_offset, c.cols);
        const A z = j < 0 ? A(0) : Traits<T>::load(xr[j]) * scale;
        if (o.picked) acc<A>(o.picked)[r * c.index_count + q] = z;
        if (o.logprobs) acc<A>(o.logprobs)[r * c.index_count + q] = j < 0 ? A(0) : st.logprob(Traits<T>::load(xr[j]), scale);
      }
    }
  });
}

// One row of a gradient dx = scale * (p (a - e (log p + h)) + cst) + scale * sum_q b_q [j == token_q],
// log p = (x - m) * scale - log_sum: the row's vector pass, then each token's element again from x's
// value kept in xv (`count` values of scratch) before the pass (dx may be x).
template <class T, class K, class A = typename Traits<T>::A>
void grad_row(const K& k, const T* x, T* dx, int64_t n, A scale, A m, A log_sum, A a, A e, A h, A cst,
              const int64_t* cols_of, const A* b, int64_t count, A* xv) {
  for (int64_t q = 0; q < count; ++q) xv[q] = cols_of[q] < 0 ? A(0) : Traits<T>::load(x[cols_of[q]]);
  k.stats_grad(x, dx, n, scale, m, log_sum, a, e, h, cst);
  for (int64_t q = 0; q < count; ++q) {
    const int64_t j = cols_of[q];
    if (j < 0) continue;
    // Every index naming column j adds its b: the first to reach j writes the element whole.
    bool first = true;
    for (int64_t p = 0; p < q; ++p) first = first && cols_of[p] != j;
    if (!first) continue;
    A bsum = 0;
    for (int64_t p = q; p < count; ++p)
      if (cols_of[p] == j) bsum += b[p];
    const A lp = cpu::Scaling<A>(scale)(xv[q], m) - log_sum;
    const A pj = lp == -std::numeric_limits<A>::infinity() ? A(0) : std::exp(lp);
    const A term = pj == A(0) ? A(0) : (e == A(0) ? pj * a : pj * (a - e * (lp + h)));
    dx[j] = Traits<T>::store(term * scale + cst * scale + bsum * scale);
  }
}

// The backward's scratch: each (row, index) pair's column, coefficient and x value, allocated before
// any work (a failed allocation is OUT_OF_MEMORY with nothing written).
struct Scratch {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> owner[3];
  int64_t* cols = nullptr;
  void* b = nullptr;   // values of the accumulation type (storage for doubles)
  void* xv = nullptr;
  bool make(int64_t count) {
    if (count == 0) return true;
    for (auto& o : owner) o.reset(std::malloc(static_cast<size_t>(count) * 8));
    cols = static_cast<int64_t*>(owner[0].get());
    b = owner[1].get();
    xv = owner[2].get();
    return cols && b && xv;
  }
};

template <class T>
void row_stats_backward(const ConsumerCall& c, const softlight_row_stats_grad& g, const Scratch& scratch,
                        int num_threads) {
  using A = typename Traits<T>::A;
  const auto& k = cpu::kernels_for<T>();
  const A scale = static_cast<A>(c.scale);
  const T* x = static_cast<const T*>(c.x);
  T* dx = static_cast<T*>(c.dx);
  const auto at = [](const void* p, int64_t i) { return p == nullptr ? A(0) : acc<A>(p)[i]; };
  const int64_t kc = c.index_count;
  cpu::parallel_for(c.rows, c.cols + 1, num_threads, [&](int64_t r0, int64_t r1) {
    int64_t* cols = scratch.cols + r0 * kc;  // this range's part of the scratch
    A* b = static_cast<A*>(scratch.b) + r0 * kc;
    A* xv = static_cast<A*>(scratch.xv) + r0 * kc;
    for (int64_t r = r0; r < r1; ++r, cols += kc, b += kc, xv += kc) {
      A a = at(g.d_lse, r);
      for (int64_t q = 0; q < kc; ++q) {
        const int64_t i = r * kc + q;
        cols[q] = column_of(c.index[r * c.index_stride + q], c.index_offset, c.cols);
        b[q] = at(g.d_picked, i) + at(g.d_logprobs, i);
        a -= at(g.d_logprobs, i);
      }
      // p = exp(z - lse) = exp((x - m) * scale - (lse - m * scale)) with the row's max m found again
      // (a pass over the row, which then stays in cache): no temperature overflows x * scale.
      const T* xr = x + r * c.x_stride;
      // (A shard's row of all -inf shifts by 0: its p are 0 where the whole row's lse is finite.)
      const A m_row = k.row_max(xr, c.cols);
      const A m = m_row == -std::numeric_limits<A>::infinity() ? A(0) : m_row;
      // lse - m * scale with m * scale rounded as the forward rounded it (RowStats::lse): for the
      // forward's own lse the difference is its log_sum, however large m * scale is.
      // An lse of +inf (overflowed: a row with +inf has NaN) says nothing of p: the row is NaN.
      const A lse = acc<A>(g.lse)[r];
      const A log_sum = lse == std::numeric_limits<A>::infinity()
                            ? std::numeric_limits<A>::quiet_NaN()
                            : static_cast<A>(static_cast<double>(lse) - static_cast<double>(m * scale));
      grad_row(k, xr, dx + r * c.dx_stride, c.cols, scale, m, log_sum, a, at(g.d_entropy, r),
               g.d_entropy ? acc<A>(g.entropy)[r] : A(0), at(g.d_sum, r), cols, b, kc, xv);
    }
  });
}

template <class T>
softlight_status cross_entropy(const ConsumerCall& c, const softlight_cross_entropy_options& o, int num_threads) {
  using A = typename Traits<T>::A;
  const auto& k = cpu::kernels_for<T>();
  const A scale = static_cast<A>(c.scale);
  const T* x = static_cast<const T*>(c.x);
  T* grad = static_cast<T*>(c.dx);
  const double eps = o.label_smoothing, zl = o.z_loss;
  int64_t valid = 0;
  for (int64_t r = 0; r < c.rows; ++r) valid += !(c.ignore && c.index[r] == c.ignore_index);
  // The upstream gradient of each row's loss: 1 / count for the mean (no row counts where none does).
  const double g = o.reduction == SOFTLIGHT_REDUCTION_MEAN ? (valid > 0 ? 1.0 / static_cast<double>(valid) : 0.0) : 1.0;
  const bool reduce = o.reduction != SOFTLIGHT_REDUCTION_NONE;
  std::unique_ptr<double[]> losses(reduce ? new (std::nothrow) double[static_cast<size_t>(c.rows)] : nullptr);
  if (reduce && !losses) return SOFTLIGHT_ERROR_OUT_OF_MEMORY;
  cpu::parallel_for(c.rows, c.cols + 1, num_threads, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * c.x_stride;
      const int64_t t = c.index[r];
      double loss = 0;
      if (c.ignore && t == c.ignore_index) {
        if (o.lse) acc<A>(o.lse)[r] = stats_of(k, xr, c.cols, scale).lse;
        if (grad != nullptr) {
          T* gr = grad + r * c.dx_stride;
          for (int64_t j = 0; j < c.cols; ++j) gr[j] = Traits<T>::store(A(0));
        }
      } else {
        const RowStats<A> st = stats_of(k, xr, c.cols, scale);
        // Each term against the row's max (in double), so that no temperature overflows a term whose
        // value is finite: lse - z[t] = log_sum - (x[t] - max) * scale, and the same for the mean z.
        const double sc = c.scale, mx = st.mx, log_sum = st.log_sum;
        const double lse = mx * sc + log_sum;
        const cpu::Scaling<double> shift(sc);
        const double nll = log_sum - shift(static_cast<double>(Traits<T>::load(xr[t])), mx);
        // The smoothing term from the mean of the differences from the row's max, in double (a
        // second pass over the row, in cache): a common offset of the logits costs no precision,
        // and halves over the count keep float64 values near the largest from overflowing.
        double smooth = 0.0;
        if (eps != 0.0) {
          if (std::isfinite(mx)) {
            const double inv = 1.0 / static_cast<double>(c.cols);
            double d = 0.0;  // the mean difference, halved
            for (int64_t j = 0; j < c.cols; ++j)
              d += (0.5 * static_cast<double>(Traits<T>::load(xr[j])) - 0.5 * mx) * inv;
            smooth = eps * (log_sum - sc * (d + d));
          } else {
            smooth = eps * (log_sum - shift(static_cast<double>(st.sum_x / c.cols), mx));
          }
        }
        loss = (1.0 - eps) * nll + smooth + (zl == 0.0 ? 0.0 : zl * lse * lse);
        if (o.lse) acc<A>(o.lse)[r] = st.lse;
        if (grad != nullptr) {
          const A a = static_cast<A>(zl == 0.0 ? g : g * (1.0 + 2.0 * zl * lse));  // (no 0 * inf)
          const A cst = static_cast<A>(-g * eps / static_cast<double>(c.cols));
          const A b = static_cast<A>(-g * (1.0 - eps));
          A xv;
          grad_row(k, xr, grad + r * c.dx_stride, c.cols, scale, st.mx, st.log_sum, a, A(0), A(0), cst, &t, &b, 1, &xv);
        }
      }
      if (reduce) losses[r] = loss;
      else acc<A>(o.loss)[r] = static_cast<A>(loss);
    }
  });
  if (reduce) {
    double total = 0;
    for (int64_t r = 0; r < c.rows; ++r) total += losses[r];
    if (o.reduction == SOFTLIGHT_REDUCTION_MEAN) total = valid > 0 ? total / static_cast<double>(valid) : std::nan("");
    acc<A>(o.loss)[0] = static_cast<A>(total);
  }
  return SOFTLIGHT_SUCCESS;
}

}  // namespace
}  // namespace softlight

extern "C" softlight_status softlight_row_stats_cpu(const void* x, int64_t x_row_stride, int64_t rows, int64_t cols,
                                                    softlight_dtype dtype, const softlight_row_stats_options* options,
                                                    int num_threads) {
  using namespace softlight;
  if (options == nullptr) return SOFTLIGHT_ERROR_NULL_POINTER;
  const softlight_row_stats_options& o = *options;
  softlight_status st;
  bool noop;
  const ConsumerCall c = row_stats_call(x, x_row_stride, rows, cols, dtype, o, true, &st, &noop);
  if (st != SOFTLIGHT_SUCCESS || noop) return st;
  return cpu::with_cpu_type(c.dtype, [&](auto tag) { row_stats<decltype(tag)>(c, o, num_threads); });
}

extern "C" softlight_status softlight_row_stats_backward_cpu(const void* x, int64_t x_row_stride, void* dx,
                                                             int64_t dx_row_stride, int64_t rows, int64_t cols,
                                                             softlight_dtype dtype, const softlight_row_stats_grad* grad,
                                                             int num_threads) {
  using namespace softlight;
  if (grad == nullptr) return SOFTLIGHT_ERROR_NULL_POINTER;
  const softlight_row_stats_grad& g = *grad;
  softlight_status st;
  bool noop;
  const ConsumerCall c = row_stats_grad_call(x, x_row_stride, dx, dx_row_stride, rows, cols, dtype, g, true, &st,
                                             &noop);
  if (st != SOFTLIGHT_SUCCESS || noop || cols == 0) return st;
  Scratch scratch;
  if (!scratch.make(rows * g.index.count)) return SOFTLIGHT_ERROR_OUT_OF_MEMORY;
  return cpu::with_cpu_type(c.dtype, [&](auto tag) { row_stats_backward<decltype(tag)>(c, g, scratch, num_threads); });
}

extern "C" softlight_status softlight_cross_entropy_grad_scale_cpu(void* grad, int64_t grad_row_stride, int64_t rows,
                                                                   int64_t cols, softlight_dtype dtype, const void* d_loss,
                                                                   int64_t d_loss_count, int num_threads) {
  using namespace softlight;
  softlight_status st;
  bool noop;
  const ConsumerCall c = grad_scale_call(grad, grad_row_stride, rows, cols, dtype, d_loss, d_loss_count, &st, &noop);
  if (st != SOFTLIGHT_SUCCESS || noop || cols == 0) return st;
  return cpu::with_cpu_type(c.dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = typename Traits<T>::A;
    const auto& k = cpu::kernels_for<T>();
    const A* f = static_cast<const A*>(d_loss);
    T* g = static_cast<T*>(grad);
    cpu::parallel_for(rows, cols, num_threads, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const A factor = f[d_loss_count == 1 ? 0 : r];
        if (factor != A(1)) k.scale(g + r * c.dx_stride, cols, factor);  // (1: the row as written)
      }
    });
  });
}

extern "C" softlight_status softlight_cross_entropy_cpu(const void* x, int64_t x_row_stride, const int64_t* target,
                                                        int64_t rows, int64_t cols, softlight_dtype dtype,
                                                        const softlight_cross_entropy_options* options,
                                                        int num_threads) {
  using namespace softlight;
  if (options == nullptr) return SOFTLIGHT_ERROR_NULL_POINTER;
  const softlight_cross_entropy_options& o = *options;
  softlight_status st;
  bool noop;
  const ConsumerCall c = cross_entropy_call(x, x_row_stride, target, rows, cols, dtype, o, true, &st, &noop);
  if (st != SOFTLIGHT_SUCCESS) return st;
  int red;
  std::memcpy(&red, &o.reduction, sizeof red);
  if (noop) {  // no rows: the sum is 0, the mean NaN (torch's)
    if (red != SOFTLIGHT_REDUCTION_NONE) {
      const double v = red == SOFTLIGHT_REDUCTION_SUM ? 0.0 : std::nan("");
      if (softlight_dtype_size(c.dtype) == 8) *static_cast<double*>(o.loss) = v;
      else *static_cast<float*>(o.loss) = static_cast<float>(v);
    }
    return st;
  }
  softlight_status result = SOFTLIGHT_SUCCESS;
  cpu::with_cpu_type(c.dtype, [&](auto tag) { result = cross_entropy<decltype(tag)>(c, o, num_threads); });
  return result;
}
