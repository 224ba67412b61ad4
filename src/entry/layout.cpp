// The N-d entries of the C ABI: an array's axis as the 3-d form (outer, dim, inner) the other
// entries compute, worked out once here for every binding (Python, torch, JAX). Pure host code.
#include <cstdint>

#include "softlight/softlight.h"

namespace {

// (extent, stride) of the axes [a, b) as one evenly strided axis (axes of extent 1 take no part;
// none at all: (1, 0)); false where they do not form one.
bool merge(const int64_t* shape, const int64_t* strides, int a, int b, int64_t* s) {
  *s = 0;
  bool first = true;
  int64_t next = 0;  // the stride the next axis must have
  for (int i = b - 1; i >= a; --i) {
    if (shape[i] == 1) continue;
    if (!first && strides[i] != next) return false;
    if (first) *s = strides[i];
    first = false;
    if (__builtin_mul_overflow(strides[i], shape[i], &next)) return false;
  }
  return true;
}

// The product of extents [a, b) into *p; false where it overflows.
bool product(const int64_t* shape, int a, int b, int64_t* p) {
  *p = 1;
  for (int i = a; i < b; ++i)
    if (__builtin_mul_overflow(*p, shape[i], p)) return false;
  return true;
}

// The extents of the 3-d form and the axis, checked: the statuses softlight_layout_nd documents.
softlight_status extents(const int64_t* shape, int ndim, int64_t dim, int* d, int64_t n[3]) {
  if (ndim < 0) return SOFTLIGHT_ERROR_INVALID_SIZE;
  if (ndim > 0 && shape == nullptr) return SOFTLIGHT_ERROR_NULL_POINTER;
  for (int i = 0; i < ndim; ++i)
    if (shape[i] < 0) return SOFTLIGHT_ERROR_INVALID_SIZE;
  const int64_t axes = ndim > 0 ? ndim : 1;  // a 0-d array counts as one axis
  if (dim < -axes || dim >= axes) return SOFTLIGHT_ERROR_INVALID_AXIS;
  *d = static_cast<int>(dim < 0 ? dim + axes : dim);
  if (ndim == 0) {
    n[0] = n[1] = n[2] = 1;
    return SOFTLIGHT_SUCCESS;
  }
  n[1] = shape[*d];
  if (!product(shape, 0, *d, &n[0]) || !product(shape, *d + 1, ndim, &n[2])) return SOFTLIGHT_ERROR_INVALID_SIZE;
  return SOFTLIGHT_SUCCESS;
}

// The strides of one array in the 3-d form of extents already checked (extents()).
softlight_status strides3(const int64_t* shape, const int64_t* strides, int ndim, int d, int64_t s[3]) {
  s[0] = s[1] = s[2] = 0;
  if (ndim == 0) return SOFTLIGHT_SUCCESS;
  if (strides == nullptr) return SOFTLIGHT_ERROR_NULL_POINTER;
  for (int i = 0; i < ndim; ++i)
    if (shape[i] == 0) return SOFTLIGHT_SUCCESS;  // nothing is read or written: any layout will do
  if (!merge(shape, strides, 0, d, &s[0]) || !merge(shape, strides, d + 1, ndim, &s[2]))
    return SOFTLIGHT_ERROR_UNMERGED_LAYOUT;
  for (int i = 0; i < ndim; ++i)
    if (strides[i] < 0 && shape[i] != 1) return SOFTLIGHT_ERROR_UNMERGED_LAYOUT;  // an axis of one never steps
  s[1] = shape[d] != 1 ? strides[d] : 0;
  return SOFTLIGHT_SUCCESS;
}

// The 3-d form of `count` arrays of one shape: extents n, strides s[k] for strides[k].
template <int count>
softlight_status form(const int64_t* shape, const int64_t* const (&strides)[count], int ndim, int64_t dim,
                      int64_t n[3], int64_t (&s)[count][3]) {
  int d = 0;
  if (const softlight_status st = extents(shape, ndim, dim, &d, n); st != SOFTLIGHT_SUCCESS) return st;
  for (int k = 0; k < count; ++k)
    if (const softlight_status st = strides3(shape, strides[k], ndim, d, s[k]); st != SOFTLIGHT_SUCCESS) return st;
  return SOFTLIGHT_SUCCESS;
}

}  // namespace

extern "C" {

softlight_status softlight_layout_nd(const int64_t* shape, const int64_t* strides, int ndim, int64_t dim,
                                     int64_t n[3], int64_t s[3]) {
  if (n == nullptr || s == nullptr) return SOFTLIGHT_ERROR_NULL_POINTER;
  int64_t t[1][3];
  const softlight_status st = form<1>(shape, {strides}, ndim, dim, n, t);
  for (int i = 0; i < 3; ++i) s[i] = t[0][i];
  return st;
}

softlight_status softlight_log_softmax_forward_nd(const void* x, const int64_t* x_strides, void* y,
                                                  const int64_t* y_strides, const int64_t* shape, int ndim,
                                                  int64_t dim, softlight_dtype dtype,
                                                  const softlight_forward_options* options, void* stream) {
  int64_t n[3], s[2][3];
  if (const softlight_status st = form<2>(shape, {x_strides, y_strides}, ndim, dim, n, s); st != SOFTLIGHT_SUCCESS)
    return st;
  return softlight_log_softmax_forward_3d(x, s[0], y, s[1], n[0], n[1], n[2], dtype, options, stream);
}

softlight_status softlight_log_softmax_forward_nd_cpu(const void* x, const int64_t* x_strides, void* y,
                                                      const int64_t* y_strides, const int64_t* shape, int ndim,
                                                      int64_t dim, softlight_dtype dtype,
                                                      const softlight_forward_options* options, int num_threads) {
  int64_t n[3], s[2][3];
  if (const softlight_status st = form<2>(shape, {x_strides, y_strides}, ndim, dim, n, s); st != SOFTLIGHT_SUCCESS)
    return st;
  return softlight_log_softmax_forward_3d_cpu(x, s[0], y, s[1], n[0], n[1], n[2], dtype, options, num_threads);
}

softlight_status softlight_log_softmax_backward_nd(const void* dy, const int64_t* dy_strides, const void* y,
                                                   const int64_t* y_strides, void* dx, const int64_t* dx_strides,
                                                   const int64_t* shape, int ndim, int64_t dim, softlight_dtype dtype,
                                                   void* stream) {
  int64_t n[3], s[3][3];
  if (const softlight_status st = form<3>(shape, {dy_strides, y_strides, dx_strides}, ndim, dim, n, s);
      st != SOFTLIGHT_SUCCESS)
    return st;
  return softlight_log_softmax_backward_3d(dy, s[0], y, s[1], dx, s[2], n[0], n[1], n[2], dtype, stream);
}

softlight_status softlight_log_softmax_backward_nd_cpu(const void* dy, const int64_t* dy_strides, const void* y,
                                                       const int64_t* y_strides, void* dx, const int64_t* dx_strides,
                                                       const int64_t* shape, int ndim, int64_t dim,
                                                       softlight_dtype dtype, int num_threads) {
  int64_t n[3], s[3][3];
  if (const softlight_status st = form<3>(shape, {dy_strides, y_strides, dx_strides}, ndim, dim, n, s);
      st != SOFTLIGHT_SUCCESS)
    return st;
  return softlight_log_softmax_backward_3d_cpu(dy, s[0], y, s[1], dx, s[2], n[0], n[1], n[2], dtype, num_threads);
}

}  // extern "C"
