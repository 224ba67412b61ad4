// Argument checks shared by the GPU and CPU entry points. Pure host code.
#pragma once

#include <cstdint>

#include "softlight/softlight.h"

namespace softlight {

struct RowsCall {
  const void* x;
  int64_t x_stride;
  void* y;
  int64_t y_stride;
  int64_t rows;
  int64_t cols;
  softlight_dtype dtype;
};

// SOFTLIGHT_SUCCESS with *noop set when there is nothing to do; otherwise the first problem found,
// checked in the order: dtype, sizes, pointers, strides, overlap.
softlight_status validate_rows_call(const RowsCall& c, bool* noop);

}  // namespace softlight
