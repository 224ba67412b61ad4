// Argument checks shared by the GPU and CPU entry points. Pure host code.
#pragma once

#include <cstdint>

#include "softlight/softlight.h"

namespace softlight {

// The one description of a call, from the C ABI to the launchers: extents {outer, dim, inner};
// strides {outer, dim, inner} in elements per array, those of extent-1 axes 0. Forward: in0 = x,
// out = y. Backward: in0 = dy, in1 = y, out = dx. Rows are the case inner = 1 with the axis
// contiguous (is_rows); the rows kernels read them through the accessors below.
struct Call {
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
  bool known_dtype = true;  // false: the caller's dtype was none of softlight_dtype's (dtype is then float32)

  // Rows: inner == 1 and every array's axis contiguous (or of one element).
  bool is_rows() const {
    return n[2] == 1 && (n[1] == 1 || (in0_s[1] == 1 && out_s[1] == 1 && (!backward || in1_s[1] == 1)));
  }
  // The rows view of a forward rows call: x, y and their row strides (0 where there is one row).
  int64_t rows() const { return n[0]; }
  int64_t cols() const { return n[1]; }
  const void* x() const { return in0; }
  int64_t x_stride() const { return in0_s[0]; }
  void* y() const { return out; }
  int64_t y_stride() const { return out_s[0]; }
};

// The checked Call of a 3-d forward or backward entry, its strides of extent-1 axes set to 0.
// *st is the first problem found — NULL stride arrays, then the options, then dtype, sizes,
// pointers, strides and overlap: strides must be non-negative, the output must not alias itself (its axes,
// ordered by stride, each step past all the smaller ones reach), and an output may share an
// input's memory only as the very same array — and *noop says there is nothing to do.
Call forward_call(const void* x, const int64_t* xs, void* y, const int64_t* ys, int64_t outer,
                           int64_t dim, int64_t inner, softlight_dtype dtype,
                           const softlight_forward_options* options, softlight_status* st, bool* noop);
Call backward_call(const void* dy, const int64_t* dys, const void* y, const int64_t* ys, void* dx,
                            const int64_t* dxs, int64_t outer, int64_t dim, int64_t inner,
                            softlight_dtype dtype, softlight_status* st, bool* noop);

// The checked Call of the rows forward entries (rows x cols, a row stride per array): as
// forward_call with inner = 1, where a row stride under cols (more than one row) is also
// INVALID_STRIDE, found before any overlap.
Call rows_forward_call(const void* x, int64_t x_stride, void* y, int64_t y_stride, int64_t rows, int64_t cols,
                       softlight_dtype dtype, const softlight_forward_options* options, softlight_status* st,
                       bool* noop);

// A consumer call (softlight_row_stats_cpu, softlight_row_stats_backward_cpu,
// softlight_cross_entropy_cpu): rows of x, an optional row-sized output (dx or grad), token indices,
// and small arrays of the accumulation type, those written (outs) and those read (ins).
struct ConsumerCall {
  softlight_dtype dtype;
  bool known_dtype = true;
  int64_t rows = 0, cols = 0;
  const void* x = nullptr;
  int64_t x_stride = 0;
  void* dx = nullptr;  // optional: a rows x cols output, dx_stride apart; may be x with x's stride
  int64_t dx_stride = 0;
  double scale = 1.0;
  const int64_t* index = nullptr;
  int64_t index_count = 0, index_stride = 0, index_offset = 0;
  bool shard = false;  // tokens outside the columns pick nothing (else they are refused)
  bool host_index = true;  // the indices are host memory, read by the checks (GPU entries: false)
  bool ignore = false;  // cross-entropy's ignore_index applies
  int64_t ignore_index = 0;
  struct Small {
    const void* p;
    int64_t count;  // values of the accumulation type
  };
  Small outs[8] = {};
  int n_outs = 0;
  Small ins[8] = {};
  int n_ins = 0;
  void out(void* p, int64_t count) { outs[n_outs++] = {p, count}; }
  void in(const void* p, int64_t count) { ins[n_ins++] = {p, count}; }
};

// The first problem of a consumer call, in the order of the forward entries' checks (dtype, the
// temperature, sizes, pointers, alignment, strides, overlap), then the index values where they are
// host memory: each in [0, cols) after index_offset, or ignore_index where it applies, unless shard.
// *noop: rows is 0. Nothing is written either way.
softlight_status check_consumer(const ConsumerCall& c, double temperature, bool* noop);

// The checked calls of softlight_row_stats[_cpu] and softlight_row_stats_backward[_cpu] (options
// not NULL): *st their first problem (check_consumer's, then a missing input), *noop nothing to do.
ConsumerCall row_stats_call(const void* x, int64_t x_row_stride, int64_t rows, int64_t cols, softlight_dtype dtype,
                            const softlight_row_stats_options& o, bool host_index, softlight_status* st, bool* noop);
ConsumerCall row_stats_grad_call(const void* x, int64_t x_row_stride, void* dx, int64_t dx_row_stride, int64_t rows,
                                 int64_t cols, softlight_dtype dtype, const softlight_row_stats_grad& g,
                                 bool host_index, softlight_status* st, bool* noop);
// The checked call of softlight_cross_entropy[_cpu] (options and options->loss not NULL): as
// row_stats_call, with the reduction, label_smoothing and z_loss checked too.
ConsumerCall cross_entropy_call(const void* x, int64_t x_row_stride, const int64_t* target, int64_t rows,
                                int64_t cols, softlight_dtype dtype, const softlight_cross_entropy_options& o,
                                bool host_index, softlight_status* st, bool* noop);
// The checked call of softlight_cross_entropy_grad_scale[_cpu]: grad as x and as dx (in place), d_loss a
// small input of d_loss_count values (1 or rows, else INVALID_ARGUMENT; NULL: NULL_POINTER).
ConsumerCall grad_scale_call(void* grad, int64_t grad_row_stride, int64_t rows, int64_t cols, softlight_dtype dtype,
                             const void* d_loss, int64_t d_loss_count, softlight_status* st, bool* noop);
// The shared part of a consumer call (its dtype read as an int, the scale of its temperature).
ConsumerCall consumer_call(const void* x, int64_t x_row_stride, int64_t rows, int64_t cols, softlight_dtype dtype,
                           double temperature);

}  // namespace softlight
