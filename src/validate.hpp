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

softlight_status apply_options(const softlight_forward_options* o, AxisCall* c);

// As validate_rows_call, for the 3-d forms: strides must be non-negative (those of extent-1 axes
// are ignored), the output must not alias itself, and an output may share an input's memory only
// as the very same array.
softlight_status validate_axis_call(const AxisCall& c, bool* noop);

// apply_options then validate_rows_call: what both forward entries of the rows form do first.
softlight_status prepare_rows_call(const softlight_forward_options* o, RowsCall* c, bool* noop);

// The AxisCall of a 3-d forward or backward entry (NULL stride arrays: NULL_POINTER in *st).
AxisCall forward_axis_call(const void* x, const int64_t* xs, void* y, const int64_t* ys, int64_t outer,
                           int64_t dim, int64_t inner, softlight_dtype dtype, softlight_status* st);
AxisCall backward_axis_call(const void* dy, const int64_t* dys, const void* y, const int64_t* ys, void* dx,
                            const int64_t* dxs, int64_t outer, int64_t dim, int64_t inner,
                            softlight_dtype dtype, softlight_status* st);

// The strides of an axis call with those of extent-1 axes set to 0.
void normalize_strides(AxisCall* c);

// The rows view of an axis call when it is one (inner == 1, every dim stride 1): rows = outer,
// row strides the outer strides.
bool axis_call_is_rows(const AxisCall& c);

}  // namespace softlight
