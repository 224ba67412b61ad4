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
  double scale = 1.0;    // 1 / temperature
  void* lse = nullptr;   // optional per-row log-sum-exp (accumulation type)
};

// Fills in scale and lse from the options (NULL: defaults); INVALID_ARGUMENT for a temperature
// that is not finite and positive.
softlight_status apply_options(const softlight_forward_options* o, RowsCall* c);

// SOFTLIGHT_SUCCESS with *noop set when there is nothing to do; otherwise the first problem found,
// checked in the order: dtype, sizes, pointers, strides, overlap.
softlight_status validate_rows_call(const RowsCall& c, bool* noop);

}  // namespace softlight
