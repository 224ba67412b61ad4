#include "validate.hpp"

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
  } else if (x0 < y0 + static_cast<uintptr_t>(yb) && y0 < x0 + static_cast<uintptr_t>(xb)) {
    return SOFTLIGHT_ERROR_OVERLAP;
  }
  return SOFTLIGHT_SUCCESS;
}

}  // namespace softlight
