// The GPU entry points of a build without the CUDA toolkit (CMakeLists.txt: no CUDA compiler found,
// or SOFTLIGHT_GPU=OFF). Every call is checked as the GPU build checks it, so that a bad argument gets
// the same status on every build; a valid call that has work to do returns SOFTLIGHT_ERROR_NO_DEVICE,
// with nothing written. The CPU entry points (the _cpu suffix) are the same in both builds.
#include "softlight/softlight.h"
#include "entry/validate.hpp"

namespace softlight {

namespace {
softlight_status absent(softlight_status st, bool noop) {
  return st != SOFTLIGHT_SUCCESS || noop ? st : SOFTLIGHT_ERROR_NO_DEVICE;
}
}  // namespace

}  // namespace softlight

extern "C" int softlight_device_count(void) { return 0; }

extern "C" softlight_status softlight_log_softmax_forward_ex(
    const void* x, int64_t x_row_stride, void* y, int64_t y_row_stride, int64_t rows, int64_t cols,
    softlight_dtype dtype, const softlight_forward_options* options, void*) {
  using namespace softlight;
  softlight_status st;
  bool noop;
  rows_forward_call(x, x_row_stride, y, y_row_stride, rows, cols, dtype, options, &st, &noop);
  return absent(st, noop);
}

extern "C" softlight_status softlight_log_softmax_forward_3d(
    const void* x, const int64_t x_strides[3], void* y, const int64_t y_strides[3], int64_t outer,
    int64_t dim, int64_t inner, softlight_dtype dtype, const softlight_forward_options* options, void*) {
  using namespace softlight;
  softlight_status st;
  bool noop;
  forward_call(x, x_strides, y, y_strides, outer, dim, inner, dtype, options, &st, &noop);
  return absent(st, noop);
}

extern "C" softlight_status softlight_log_softmax_backward_3d(
    const void* dy, const int64_t dy_strides[3], const void* y, const int64_t y_strides[3], void* dx,
    const int64_t dx_strides[3], int64_t outer, int64_t dim, int64_t inner, softlight_dtype dtype, void*) {
  using namespace softlight;
  softlight_status st;
  bool noop;
  backward_call(dy, dy_strides, y, y_strides, dx, dx_strides, outer, dim, inner, dtype, &st, &noop);
  return absent(st, noop);
}

extern "C" softlight_status softlight_log_softmax_backward(
    const void* dy, int64_t dy_row_stride, const void* y, int64_t y_row_stride, void* dx,
    int64_t dx_row_stride, int64_t rows, int64_t cols, softlight_dtype dtype, void* stream) {
  const int64_t dys[3] = {dy_row_stride, 1, 0}, ys[3] = {y_row_stride, 1, 0}, dxs[3] = {dx_row_stride, 1, 0};
  return softlight_log_softmax_backward_3d(dy, dys, y, ys, dx, dxs, rows, cols, 1, dtype, stream);
}

extern "C" softlight_status softlight_log_softmax_forward(const void* x, int64_t x_row_stride, void* y,
                                                          int64_t y_row_stride, int64_t rows, int64_t cols,
                                                          softlight_dtype dtype, void* stream) {
  return softlight_log_softmax_forward_ex(x, x_row_stride, y, y_row_stride, rows, cols, dtype, nullptr, stream);
}

extern "C" softlight_status softlight_row_stats(const void* x, int64_t x_row_stride, int64_t rows, int64_t cols,
                                                softlight_dtype dtype, const softlight_row_stats_options* options,
                                                void*) {
  using namespace softlight;
  if (options == nullptr) return SOFTLIGHT_ERROR_NULL_POINTER;
  softlight_status st;
  bool noop;
  row_stats_call(x, x_row_stride, rows, cols, dtype, *options, false, &st, &noop);
  return absent(st, noop);
}

extern "C" softlight_status softlight_row_stats_backward(const void* x, int64_t x_row_stride, void* dx,
                                                         int64_t dx_row_stride, int64_t rows, int64_t cols,
                                                         softlight_dtype dtype, const softlight_row_stats_grad* grad,
                                                         void*) {
  using namespace softlight;
  if (grad == nullptr) return SOFTLIGHT_ERROR_NULL_POINTER;
  softlight_status st;
  bool noop;
  row_stats_grad_call(x, x_row_stride, dx, dx_row_stride, rows, cols, dtype, *grad, false, &st, &noop);
  return absent(st, noop || cols == 0);
}

extern "C" softlight_status softlight_cross_entropy(const void* x, int64_t x_row_stride, const int64_t* target,
                                                    int64_t rows, int64_t cols, softlight_dtype dtype,
                                                    const softlight_cross_entropy_options* options, void*) {
  using namespace softlight;
  if (options == nullptr) return SOFTLIGHT_ERROR_NULL_POINTER;
  softlight_status st;
  bool noop;
  cross_entropy_call(x, x_row_stride, target, rows, cols, dtype, *options, false, &st, &noop);
  // (No rows still writes the reduction of nothing on the device, unless there is none: NONE.)
  return absent(st, noop && options->reduction == SOFTLIGHT_REDUCTION_NONE);
}

extern "C" softlight_status softlight_cross_entropy_grad_scale(void* grad, int64_t grad_row_stride, int64_t rows,
                                                               int64_t cols, softlight_dtype dtype, const void* d_loss,
                                                               int64_t d_loss_count, void*) {
  using namespace softlight;
  softlight_status st;
  bool noop;
  grad_scale_call(grad, grad_row_stride, rows, cols, dtype, d_loss, d_loss_count, &st, &noop);
  return absent(st, noop || cols == 0);
}
