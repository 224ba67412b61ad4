#include "validate.hpp"

#include <cmath>
#include <cstdint>
#include <limits>

namespace softlight {

namespace {

// Byte extent of a strided matrix, or -1 if it does not fit in int64.
int64_t extent_bytes(int64_t rows, int64_t cols, int64_t stride, int elem) {
  const int64_t limit = std::numeric_limits<int64_t>::max() / elem;
  if (rows > 1 && stride > (limit - cols) / (rows - 1)) return -1;
  return ((rows - 1) * stride + cols) * elem;
}

}  // namespace

softlight_status apply_options(const softlight_forward_options* o, RowsCall* c) {
  if (o == nullptr) return SOFTLIGHT_SUCCESS;
  const double t = o->temperature == 0.0 ? 1.0 : o->temperature;
  if (!(t > 0.0) || !std::isfinite(t)) return SOFTLIGHT_ERROR_INVALID_ARGUMENT;
  c->scale = 1.0 / t;
  c->lse = o->lse;
  return SOFTLIGHT_SUCCESS;
}

namespace {
bool ranges_overlap(uintptr_t a, int64_t a_bytes, uintptr_t b, int64_t b_bytes) {
  return a < b + static_cast<uintptr_t>(b_bytes) && b < a + static_cast<uintptr_t>(a_bytes);
}
}  // namespace

softlight_status validate_rows_call(const RowsCall& c, bool* noop) {
  *noop = false;
  const int elem = softlight_dtype_size(c.dtype);
  if (elem == 0) return SOFTLIGHT_ERROR_UNSUPPORTED_DTYPE;
  if (c.rows < 0 || c.cols < 0) return SOFTLIGHT_ERROR_INVALID_SIZE;
  if (c.rows == 0 || c.cols == 0) {
    *noop = true;
    return SOFTLIGHT_SUCCESS;
  }
  if (c.x == nullptr || c.y == nullptr) return SOFTLIGHT_ERROR_NULL_POINTER;
  // A single row never steps by its stride, so any stride is accepted there.
  const int64_t xs = c.rows > 1 ? c.x_stride : c.cols;
  const int64_t ys = c.rows > 1 ? c.y_stride : c.cols;
  if (xs < c.cols || ys < c.cols) return SOFTLIGHT_ERROR_INVALID_STRIDE;
  const int64_t xb = extent_bytes(c.rows, c.cols, xs, elem);
  const int64_t yb = extent_bytes(c.rows, c.cols, ys, elem);
  if (xb < 0 || yb < 0) return SOFTLIGHT_ERROR_INVALID_SIZE;
  const auto x0 = reinterpret_cast<uintptr_t>(c.x), y0 = reinterpret_cast<uintptr_t>(c.y);
  if (x0 == y0) {
    if (xs != ys) return SOFTLIGHT_ERROR_OVERLAP;  // same start, different layout
  } else if (ranges_overlap(x0, xb, y0, yb)) {
    return SOFTLIGHT_ERROR_OVERLAP;
  }
  if (c.lse != nullptr) {
    const auto l0 = reinterpret_cast<uintptr_t>(c.lse);
    const int64_t lb = c.rows * (elem == 8 ? 8 : 4);
    if (ranges_overlap(l0, lb, x0, xb) || ranges_overlap(l0, lb, y0, yb)) return SOFTLIGHT_ERROR_OVERLAP;
  }
  return SOFTLIGHT_SUCCESS;
}

}  // namespace softlight
