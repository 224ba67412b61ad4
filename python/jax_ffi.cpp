// XLA FFI handlers that run softlight inside jitted JAX programs (python/softlight/jax.py registers
// them). Built where JAX's headers are at hand at build time (CMakeLists.txt: SOFTLIGHT_JAX).
// XLA hands dense row-major buffers: the C ABI's N-d entries take them with their C-order strides.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "softlight/softlight.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

bool dtype_of(ffi::DataType t, softlight_dtype* out) {
  switch (t) {
    case ffi::DataType::F32: *out = SOFTLIGHT_FLOAT32; return true;
    case ffi::DataType::F16: *out = SOFTLIGHT_FLOAT16; return true;
    case ffi::DataType::BF16: *out = SOFTLIGHT_BFLOAT16; return true;
    case ffi::DataType::F64: *out = SOFTLIGHT_FLOAT64; return true;
    default: return false;
  }
}

// A buffer's shape and C-order strides (XLA hands dense row-major buffers), as the N-d entries take them.
struct Dense {
  std::vector<int64_t> shape, strides;
  explicit Dense(const ffi::AnyBuffer& b) {
    const auto dims = b.dimensions();
    shape.assign(dims.begin(), dims.end());
    strides.assign(shape.size(), 1);
    for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  }
  int ndim() const { return static_cast<int>(shape.size()); }
};

ffi::Error status_error(softlight_status st) {
  if (st == SOFTLIGHT_SUCCESS) return ffi::Error::Success();
  return ffi::Error(st == SOFTLIGHT_ERROR_CUDA || st == SOFTLIGHT_ERROR_OUT_OF_MEMORY ? ffi::ErrorCode::kInternal
                                                                                   : ffi::ErrorCode::kInvalidArgument,
                    std::string("softlight: ") + softlight_status_string(st));
}

// Forward: y = log_softmax(x / temperature) along axis; lse receives the log-sum-exp of each position.
template <bool Gpu>
ffi::Error forward(void* stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> lse,
                   int64_t axis, double temperature) {
  softlight_dtype dtype;
  if (!dtype_of(x.element_type(), &dtype)) return ffi::Error::InvalidArgument("softlight: unsupported dtype");
  const Dense a(x);  // the axis counted from the end: batch axes vmap adds in front leave it be
  const softlight_forward_options o{temperature, lse->untyped_data()};
  const softlight_status st =
      Gpu ? softlight_log_softmax_forward_nd(x.untyped_data(), a.strides.data(), y->untyped_data(), a.strides.data(),
                                             a.shape.data(), a.ndim(), axis, dtype, &o, stream)
          : softlight_log_softmax_forward_nd_cpu(x.untyped_data(), a.strides.data(), y->untyped_data(),
                                                 a.strides.data(), a.shape.data(), a.ndim(), axis, dtype, &o, 0);
  return status_error(st);
}

// Backward: dx = dy - exp(y) * sum(dy) along axis.
template <bool Gpu>
ffi::Error backward(void* stream, ffi::AnyBuffer dy, ffi::AnyBuffer y, ffi::Result<ffi::AnyBuffer> dx, int64_t axis) {
  softlight_dtype dtype;
  if (!dtype_of(dy.element_type(), &dtype)) return ffi::Error::InvalidArgument("softlight: unsupported dtype");
  const Dense a(dy);
  const softlight_status st =
      Gpu ? softlight_log_softmax_backward_nd(dy.untyped_data(), a.strides.data(), y.untyped_data(), a.strides.data(),
                                              dx->untyped_data(), a.strides.data(), a.shape.data(), a.ndim(), axis,
                                              dtype, stream)
          : softlight_log_softmax_backward_nd_cpu(dy.untyped_data(), a.strides.data(), y.untyped_data(),
                                                  a.strides.data(), dx->untyped_data(), a.strides.data(),
                                                  a.shape.data(), a.ndim(), axis, dtype, 0);
  return status_error(st);
}

ffi::Error forward_cpu(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> lse, int64_t axis,
                       double temperature) {
  return forward<false>(nullptr, x, y, lse, axis, temperature);
}
ffi::Error forward_gpu(cudaStream_t s, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                       ffi::Result<ffi::AnyBuffer> lse, int64_t axis, double temperature) {
  return forward<true>(s, x, y, lse, axis, temperature);
}
ffi::Error backward_cpu(ffi::AnyBuffer dy, ffi::AnyBuffer y, ffi::Result<ffi::AnyBuffer> dx, int64_t axis) {
  return backward<false>(nullptr, dy, y, dx, axis);
}
ffi::Error backward_gpu(cudaStream_t s, ffi::AnyBuffer dy, ffi::AnyBuffer y, ffi::Result<ffi::AnyBuffer> dx,
                        int64_t axis) {
  return backward<true>(s, dy, y, dx, axis);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(softlight_jax_forward_cpu, forward_cpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("axis")
                                  .Attr<double>("temperature"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(softlight_jax_forward_gpu, forward_gpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("axis")
                                  .Attr<double>("temperature"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(softlight_jax_backward_cpu, backward_cpu,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Attr<int64_t>(
                                  "axis"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(softlight_jax_backward_gpu, backward_gpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("axis"));
