#include "entry/validate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace softlight {

namespace {

// Bytes from the first element of a strided 3-d array to one past its last (strides
// non-negative), or -1 if that does not fit in int64.
int64_t span_bytes(const int64_t n[3], const int64_t s[3], int elem) {
  const int64_t limit = std::numeric_limits<int64_t>::max() / elem;  // elements that fit
  int64_t last = 0;  // offset of the last element, in elements
  for (int a = 0; a < 3; ++a) {
    if (n[a] > 1 && s[a] > (limit - 1 - last) / (n[a] - 1)) return -1;
    last += (n[a] - 1) * s[a];
  }
  return (last + 1) * elem;
}

bool ranges_overlap(uintptr_t a, int64_t a_bytes, uintptr_t b, int64_t b_bytes) {
  return a < b + static_cast<uintptr_t>(b_bytes) && b < a + static_cast<uintptr_t>(a_bytes);
}

// The log-sum-exp output (`count` values of the accumulation type) overlaps an array's span.
bool lse_clashes(const void* lse, int64_t count, int elem, uintptr_t x0, int64_t xb, uintptr_t y0, int64_t yb) {
  if (lse == nullptr) return false;
  const auto l0 = reinterpret_cast<uintptr_t>(lse);
  const int64_t lb = count * (elem == 8 ? 8 : 4);  // count checked against overflow by validate_call
  return ranges_overlap(l0, lb, x0, xb) || ranges_overlap(l0, lb, y0, yb);
}

// A temperature is taken where its scale 1 / T is a normal number of the accumulation type (float
// for float32, float16 and bfloat16, double for float64) that the kernels' exp can take: for float,
// whose exp is 2^(d * scale * log2(e)), scale * log2(e) must stay finite too. So T in about
// [4.3e-39, 8.5e37] or [5.6e-309, 4.5e307]; past those ends rows come out NaN.
constexpr double kLog2E = 1.4426950408889634;
bool temperature_in_range(double t, softlight_dtype dtype) {
  const bool wide = softlight_dtype_size(dtype) == 8;
  const double lo = wide ? std::numeric_limits<double>::min() : std::numeric_limits<float>::min();
  const double hi = wide ? std::numeric_limits<double>::max() : std::numeric_limits<float>::max() / kLog2E;
  if (!(t > 0.0) || !std::isfinite(t)) return false;
  const double scale = 1.0 / t;
  return scale >= lo && scale <= hi;
}

softlight_status apply_options(const softlight_forward_options* o, Call* c) {
  if (o == nullptr) return SOFTLIGHT_SUCCESS;
  const double t = o->temperature == 0.0 ? 1.0 : o->temperature;
  if (!temperature_in_range(t, c->dtype)) return SOFTLIGHT_ERROR_INVALID_ARGUMENT;
  c->scale = 1.0 / t;
  c->lse = o->lse;
  return SOFTLIGHT_SUCCESS;
}

// The caller's dtype read as an int (a value outside the enum's may not be loaded as the enum):
// whether softlight knows it, with *out that dtype (else float32, never used).
bool read_dtype(const softlight_dtype& dtype, softlight_dtype* out) {
  int v;
  std::memcpy(&v, &dtype, sizeof v);
  const bool ok = v >= 0 && v <= 3;
  *out = ok ? static_cast<softlight_dtype>(v) : SOFTLIGHT_FLOAT32;
  return ok;
}

// No two positions of the array share an element: with the axes ordered by stride, each stride
// steps past everything the smaller ones reach.
bool injective(const int64_t n[3], const int64_t s[3]) {
  int order[3] = {0, 1, 2};
  std::sort(order, order + 3, [&](int a, int b) { return s[a] < s[b]; });
  int64_t reach = 1;  // elements covered by the axes so far, as a span
  for (int a : order) {
    if (n[a] == 1) continue;
    if (s[a] < reach) return false;
    // A span past int64 is refused as INVALID_SIZE by the span check that follows.
    if (s[a] > (std::numeric_limits<int64_t>::max() - reach) / (n[a] - 1)) return true;
    reach = s[a] * (n[a] - 1) + reach;
  }
  return true;
}

bool same_layout(const int64_t a[3], const int64_t b[3]) {
  return a[0] == b[0] && a[1] == b[1] && a[2] == b[2];
}

// Strides from the caller's array (none: NULL_POINTER), those of extent-1 axes set to 0.
softlight_status take_strides(int64_t (&dst)[3], const int64_t* src, const int64_t n[3]) {
  for (int a = 0; a < 3; ++a) dst[a] = src == nullptr || n[a] == 1 ? 0 : src[a];
  return src == nullptr ? SOFTLIGHT_ERROR_NULL_POINTER : SOFTLIGHT_SUCCESS;
}

softlight_status validate_call(const Call& c, bool* noop) {
  if (!c.known_dtype) return SOFTLIGHT_ERROR_UNSUPPORTED_DTYPE;
  const int elem = softlight_dtype_size(c.dtype);
  if (c.n[0] < 0 || c.n[1] < 0 || c.n[2] < 0) return SOFTLIGHT_ERROR_INVALID_SIZE;
  if (c.n[0] == 0 || c.n[1] == 0 || c.n[2] == 0) {
    *noop = true;
    return SOFTLIGHT_SUCCESS;
  }
  if (c.in0 == nullptr || c.out == nullptr || (c.backward && c.in1 == nullptr)) return SOFTLIGHT_ERROR_NULL_POINTER;
  // Every pointer on its element's size (the log-sum-exp on its accumulation type's): the kernels'
  // loads and stores need it, and a misaligned access on the GPU would end the CUDA context.
  const auto misaligned = [](const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes != 0; };
  if (misaligned(c.in0, elem) || misaligned(c.out, elem) || (c.backward && misaligned(c.in1, elem)) ||
      (c.lse != nullptr && misaligned(c.lse, elem == 8 ? 8 : 4)))
    return SOFTLIGHT_ERROR_INVALID_ARGUMENT;
  for (int a = 0; a < 3; ++a) {
    if (c.in0_s[a] < 0 || c.out_s[a] < 0 || (c.backward && c.in1_s[a] < 0)) return SOFTLIGHT_ERROR_INVALID_STRIDE;
  }
  if (!injective(c.n, c.out_s)) return SOFTLIGHT_ERROR_INVALID_STRIDE;
  const int64_t ob = span_bytes(c.n, c.out_s, elem);
  const int64_t ib0 = span_bytes(c.n, c.in0_s, elem);
  const int64_t ib1 = c.backward ? span_bytes(c.n, c.in1_s, elem) : 0;
  if (ob < 0 || ib0 < 0 || ib1 < 0 || c.n[0] > std::numeric_limits<int64_t>::max() / c.n[2] ||
      (c.lse != nullptr && c.n[0] * c.n[2] > std::numeric_limits<int64_t>::max() / 8))
    return SOFTLIGHT_ERROR_INVALID_SIZE;
  const auto o0 = reinterpret_cast<uintptr_t>(c.out);
  auto clash = [&](const void* in, const int64_t* s, int64_t bytes) {
    const auto i0 = reinterpret_cast<uintptr_t>(in);
    if (i0 == o0) return !same_layout(s, c.out_s);
    return ranges_overlap(i0, bytes, o0, ob);
  };
  if (clash(c.in0, c.in0_s, ib0) || (c.backward && clash(c.in1, c.in1_s, ib1))) return SOFTLIGHT_ERROR_OVERLAP;
  if (lse_clashes(c.lse, c.n[0] * c.n[2], elem, reinterpret_cast<uintptr_t>(c.in0), ib0, o0, ob))
    return SOFTLIGHT_ERROR_OVERLAP;
  return SOFTLIGHT_SUCCESS;
}

}  // namespace

softlight_status check_consumer(const ConsumerCall& c, double temperature, bool* noop) {
  *noop = false;
  if (!c.known_dtype) return SOFTLIGHT_ERROR_UNSUPPORTED_DTYPE;
  if (!temperature_in_range(temperature == 0.0 ? 1.0 : temperature, c.dtype)) return SOFTLIGHT_ERROR_INVALID_ARGUMENT;
  if (c.rows < 0 || c.cols < 0 || c.index_count < 0) return SOFTLIGHT_ERROR_INVALID_SIZE;
  if (c.index_offset < 0) return SOFTLIGHT_ERROR_INVALID_ARGUMENT;
  if (c.rows == 0) {
    *noop = true;
    return SOFTLIGHT_SUCCESS;
  }
  const int elem = softlight_dtype_size(c.dtype), acc = elem == 8 ? 8 : 4;
  const bool has_index = c.index_count > 0;
  if ((c.cols > 0 && c.x == nullptr) || (has_index && c.index == nullptr)) return SOFTLIGHT_ERROR_NULL_POINTER;
  for (int i = 0; i < c.n_outs + c.n_ins; ++i) {
    const ConsumerCall::Small& a = i < c.n_outs ? c.outs[i] : c.ins[i - c.n_outs];
    if (a.p != nullptr && a.count > std::numeric_limits<int64_t>::max() / 8) return SOFTLIGHT_ERROR_INVALID_SIZE;
  }
  const auto misaligned = [](const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes != 0; };
  if (misaligned(c.x, elem) || misaligned(c.dx, elem) || misaligned(c.index, 8)) return SOFTLIGHT_ERROR_INVALID_ARGUMENT;
  for (int i = 0; i < c.n_outs + c.n_ins; ++i) {
    const ConsumerCall::Small& a = i < c.n_outs ? c.outs[i] : c.ins[i - c.n_outs];
    if (misaligned(a.p, acc)) return SOFTLIGHT_ERROR_INVALID_ARGUMENT;
  }
  const bool steps = c.rows > 1;
  // x is only read: its rows may overlap (a stride of 0 repeats one row, as a broadcast view does).
  // The written rows must not; nor may the index rows, which the GPU's pass reads per row.
  if (c.x_stride < 0 || (steps && ((c.dx != nullptr && c.dx_stride < c.cols) ||
                                   (has_index && c.index_stride < c.index_count))))
    return SOFTLIGHT_ERROR_INVALID_STRIDE;
  const int64_t n[3] = {c.rows, c.cols, 1};
  const int64_t xs[3] = {steps ? c.x_stride : 0, 1, 0}, ds[3] = {steps ? c.dx_stride : 0, 1, 0};
  const int64_t in[3] = {c.rows, std::max<int64_t>(c.index_count, 1), 1};
  const int64_t is[3] = {steps ? c.index_stride : 0, 1, 0};
  const int64_t xb = c.cols == 0 ? 0 : span_bytes(n, xs, elem);
  const int64_t db = c.dx == nullptr || c.cols == 0 ? 0 : span_bytes(n, ds, elem);
  const int64_t ib = has_index ? span_bytes(in, is, 8) : 0;
  if (xb < 0 || db < 0 || ib < 0) return SOFTLIGHT_ERROR_INVALID_SIZE;
  const auto x0 = reinterpret_cast<uintptr_t>(c.x), d0 = reinterpret_cast<uintptr_t>(c.dx),
             i0 = reinterpret_cast<uintptr_t>(c.index);
  if (c.dx != nullptr && (d0 == x0 ? c.dx_stride != c.x_stride && steps : ranges_overlap(d0, db, x0, xb)))
    return SOFTLIGHT_ERROR_OVERLAP;
  if (ranges_overlap(d0, db, i0, ib)) return SOFTLIGHT_ERROR_OVERLAP;
  // Each small output clear of every other array; the small inputs clear of the outputs.
  for (int i = 0; i < c.n_outs; ++i) {
    const auto o = reinterpret_cast<uintptr_t>(c.outs[i].p);
    const int64_t ob = c.outs[i].p == nullptr ? 0 : c.outs[i].count * acc;
    if (ranges_overlap(o, ob, x0, xb) || ranges_overlap(o, ob, d0, db) || ranges_overlap(o, ob, i0, ib))
      return SOFTLIGHT_ERROR_OVERLAP;
    for (int j = 0; j < c.n_outs + c.n_ins; ++j) {
      if (j == i) continue;
      const ConsumerCall::Small& a = j < c.n_outs ? c.outs[j] : c.ins[j - c.n_outs];
      if (a.p != nullptr && ranges_overlap(o, ob, reinterpret_cast<uintptr_t>(a.p), a.count * acc))
        return SOFTLIGHT_ERROR_OVERLAP;
    }
  }
  for (int i = 0; i < c.n_ins; ++i) {
    const ConsumerCall::Small& a = c.ins[i];
    if (a.p != nullptr && ranges_overlap(reinterpret_cast<uintptr_t>(a.p), a.count * acc, d0, db))
      return SOFTLIGHT_ERROR_OVERLAP;
  }
  if (has_index && !c.shard && c.host_index) {
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t k = 0; k < c.index_count; ++k) {
        const int64_t t = c.index[r * c.index_stride + k];
        if (c.ignore && t == c.ignore_index) continue;
        // (t - offset without overflow)
        if (t < c.index_offset || t - c.index_offset >= c.cols) return SOFTLIGHT_ERROR_INVALID_ARGUMENT;
      }
  }
  return SOFTLIGHT_SUCCESS;
}

ConsumerCall consumer_call(const void* x, int64_t x_row_stride, int64_t rows, int64_t cols, softlight_dtype dtype,
                           double temperature) {
  ConsumerCall c;
  c.known_dtype = read_dtype(dtype, &c.dtype);
  c.rows = rows;
  c.cols = cols;
  c.x = x;
  c.x_stride = x_row_stride;
  c.scale = 1.0 / (temperature == 0.0 ? 1.0 : temperature);
  return c;
}

namespace {
// The tokens into the call; returns rows * count (INT64_MAX where that overflows the checks' bound).
int64_t take_tokens(const softlight_tokens& t, bool host_index, ConsumerCall* c) {
  c->index = t.ids;
  c->index_count = t.count;
  c->index_stride = t.row_stride;
  c->index_offset = t.offset;
  c->shard = t.shard != 0;
  c->host_index = host_index;
  const int64_t rows = c->rows;
  return rows >= 0 && t.count >= 0 && (t.count == 0 || rows <= INT64_MAX / 8 / t.count) ? rows * t.count : INT64_MAX;
}
}  // namespace

ConsumerCall row_stats_call(const void* x, int64_t x_row_stride, int64_t rows, int64_t cols, softlight_dtype dtype,
                            const softlight_row_stats_options& o, bool host_index, softlight_status* st, bool* noop) {
  ConsumerCall c = consumer_call(x, x_row_stride, rows, cols, dtype, o.temperature);
  const int64_t picks = take_tokens(o.index, host_index, &c);
  for (void* p : {o.lse, o.entropy, o.sum, o.max, o.sumexp, o.moment}) c.out(p, rows);
  c.out(o.picked, picks);
  c.out(o.logprobs, picks);
  *st = check_consumer(c, o.temperature, noop);
  return c;
}

ConsumerCall row_stats_grad_call(const void* x, int64_t x_row_stride, void* dx, int64_t dx_row_stride, int64_t rows,
                                 int64_t cols, softlight_dtype dtype, const softlight_row_stats_grad& g,
                                 bool host_index, softlight_status* st, bool* noop) {
  ConsumerCall c = consumer_call(x, x_row_stride, rows, cols, dtype, g.temperature);
  c.dx = dx;
  c.dx_stride = dx_row_stride;
  const int64_t picks = take_tokens(g.index, host_index, &c);
  for (const void* p : {g.lse, g.entropy, g.d_lse, g.d_entropy, g.d_sum}) c.in(p, rows);
  c.in(g.d_picked, picks);
  c.in(g.d_logprobs, picks);
  *st = check_consumer(c, g.temperature, noop);
  if (*st == SOFTLIGHT_SUCCESS && !*noop &&
      ((dx == nullptr && cols > 0) || g.lse == nullptr || (g.d_entropy != nullptr && g.entropy == nullptr)))
    *st = SOFTLIGHT_ERROR_NULL_POINTER;
  return c;
}

ConsumerCall cross_entropy_call(const void* x, int64_t x_row_stride, const int64_t* target, int64_t rows,
                                int64_t cols, softlight_dtype dtype, const softlight_cross_entropy_options& o,
                                bool host_index, softlight_status* st, bool* noop) {
  ConsumerCall c = consumer_call(x, x_row_stride, rows, cols, dtype, o.temperature);
  c.dx = o.grad;
  c.dx_stride = o.grad_row_stride;
  c.index = target;
  c.index_count = 1;
  c.index_stride = 1;
  c.ignore = o.ignore != 0;
  c.ignore_index = o.ignore_index;
  c.host_index = host_index;
  int red;
  std::memcpy(&red, &o.reduction, sizeof red);
  c.out(o.loss, red == SOFTLIGHT_REDUCTION_NONE ? rows : 1);
  c.out(o.lse, rows);
  *st = check_consumer(c, o.temperature, noop);
  if (*st == SOFTLIGHT_SUCCESS && (red < 0 || red > 2 || !(o.label_smoothing >= 0.0 && o.label_smoothing <= 1.0) ||
                                   !(o.z_loss >= 0.0 && std::isfinite(o.z_loss))))
    *st = SOFTLIGHT_ERROR_INVALID_ARGUMENT;
  // The loss is a zero-size array (may be NULL) only for NONE over no rows; a reduction writes one value.
  if (*st == SOFTLIGHT_SUCCESS && o.loss == nullptr && (red != SOFTLIGHT_REDUCTION_NONE || rows > 0))
    *st = SOFTLIGHT_ERROR_NULL_POINTER;
  return c;
}

ConsumerCall grad_scale_call(void* grad, int64_t grad_row_stride, int64_t rows, int64_t cols, softlight_dtype dtype,
                             const void* d_loss, int64_t d_loss_count, softlight_status* st, bool* noop) {
  ConsumerCall c = consumer_call(grad, grad_row_stride, rows, cols, dtype, 1.0);
  c.dx = grad;  // read and written in place
  c.dx_stride = grad_row_stride;
  const bool count_ok = d_loss_count == 1 || d_loss_count == rows;
  c.in(d_loss, count_ok ? d_loss_count : 0);
  *st = check_consumer(c, 1.0, noop);
  if (*st == SOFTLIGHT_SUCCESS && !count_ok) *st = SOFTLIGHT_ERROR_INVALID_ARGUMENT;
  if (*st == SOFTLIGHT_SUCCESS && !*noop && d_loss == nullptr) *st = SOFTLIGHT_ERROR_NULL_POINTER;
  return c;
}

Call forward_call(const void* x, const int64_t* xs, void* y, const int64_t* ys, int64_t outer, int64_t dim,
                  int64_t inner, softlight_dtype dtype, const softlight_forward_options* options,
                  softlight_status* st, bool* noop) {
  Call c{{outer, dim, inner}, SOFTLIGHT_FLOAT32, x, {}, nullptr, {}, y, {}};
  c.known_dtype = read_dtype(dtype, &c.dtype);
  *noop = false;
  *st = take_strides(c.in0_s, xs, c.n);
  if (const softlight_status s = take_strides(c.out_s, ys, c.n); *st == SOFTLIGHT_SUCCESS) *st = s;
  if (*st == SOFTLIGHT_SUCCESS) *st = apply_options(options, &c);
  if (*st == SOFTLIGHT_SUCCESS) *st = validate_call(c, noop);
  return c;
}

Call backward_call(const void* dy, const int64_t* dys, const void* y, const int64_t* ys, void* dx,
                   const int64_t* dxs, int64_t outer, int64_t dim, int64_t inner, softlight_dtype dtype,
                   softlight_status* st, bool* noop) {
  Call c{{outer, dim, inner}, SOFTLIGHT_FLOAT32, dy, {}, y, {}, dx, {}};
  c.known_dtype = read_dtype(dtype, &c.dtype);
  c.backward = true;
  *noop = false;
  *st = take_strides(c.in0_s, dys, c.n);
  if (const softlight_status s = take_strides(c.in1_s, ys, c.n); *st == SOFTLIGHT_SUCCESS) *st = s;
  if (const softlight_status s = take_strides(c.out_s, dxs, c.n); *st == SOFTLIGHT_SUCCESS) *st = s;
  if (*st == SOFTLIGHT_SUCCESS) *st = validate_call(c, noop);
  return c;
}

Call rows_forward_call(const void* x, int64_t x_stride, void* y, int64_t y_stride, int64_t rows, int64_t cols,
                       softlight_dtype dtype, const softlight_forward_options* options, softlight_status* st,
                       bool* noop) {
  // A single row never steps by its stride, so any stride is accepted there.
  const bool steps = rows > 1 && cols > 0;
  const int64_t xs[3] = {x_stride, 1, 0}, ys[3] = {y_stride, 1, 0};
  Call c = forward_call(x, xs, y, ys, rows, cols, 1, dtype, options, st, noop);
  // A row stride under cols: before the overlap (and y's own aliasing) that it would also cause.
  if (steps && (x_stride < cols || y_stride < cols) &&
      (*st == SOFTLIGHT_SUCCESS || *st == SOFTLIGHT_ERROR_OVERLAP || *st == SOFTLIGHT_ERROR_INVALID_STRIDE))
    *st = SOFTLIGHT_ERROR_INVALID_STRIDE;
  return c;
}

}  // namespace softlight
