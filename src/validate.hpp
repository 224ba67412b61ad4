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

// SOFTLIGHT_SUCCESS with *noop set when there is nothing to do; otherwise the first problem found,
// checked in the order: dtype, sizes, pointers, strides, overlap.
softlight_status validate_rows_call(const RowsCall& c, bool* noop);

// Fills in scale and lse from the options (NULL: defaults), then validate_rows_call; a temperature
// that is not finite and positive is INVALID_ARGUMENT.
softlight_status prepare_rows_call(const softlight_forward_options* o, RowsCall* c, bool* noop);

// A call along any axis: extents {outer, dim, inner}; strides {outer, dim, inner} in elements per
// array. Forward: in0 = x, out = y. Backward: in0 = dy, in1 = y, out = dx.
struct AxisCall {
  int64_t n[3];
  softlight_dtype dtype;
  const void* in0;
  int64_t in0_s[3];
  const void* in1;  // backward only
  int64_t in1_s[3];
  void* out;
  int64_t out_s[3];
  bool backward = false;
  double scale = 1.0;   // forward: 1 / temperature
  void* lse = nullptr;  // forward: optional log-sum-exp per (outer, inner) position
};

// The checked AxisCall of a 3-d forward or backward entry, its strides of extent-1 axes set to 0.
// *st is the first problem found — NULL stride arrays, then the options, then as
// validate_rows_call: strides must be non-negative, the output must not alias itself (its axes,
// ordered by stride, each step past all the smaller ones reach), and an output may share an
// input's memory only as the very same array — and *noop says there is nothing to do.
AxisCall forward_axis_call(const void* x, const int64_t* xs, void* y, const int64_t* ys, int64_t outer,
                           int64_t dim, int64_t inner, softlight_dtype dtype,
                           const softlight_forward_options* options, softlight_status* st, bool* noop);
AxisCall backward_axis_call(const void* dy, const int64_t* dys, const void* y, const int64_t* ys, void* dx,
                            const int64_t* dxs, int64_t outer, int64_t dim, int64_t inner,
                            softlight_dtype dtype, softlight_status* st, bool* noop);

// The rows view of an axis call when it is one (inner == 1, every dim stride 1): rows = outer,
// row strides the outer strides.
bool axis_call_is_rows(const AxisCall& c);

}  // namespace softlight
