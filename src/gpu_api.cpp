// The GPU entry point: validate, find the pointers' device, plan, launch.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>

#include "kernels.hpp"
#include "plan.hpp"
#include "softlight/softlight.h"
#include "validate.hpp"

namespace softlight {
namespace {

bool no_driver(cudaError_t e) {
  return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
         e == cudaErrorInitializationError || e == cudaErrorStubLibrary ||
         e == cudaErrorSystemDriverMismatch || e == cudaErrorCompatNotSupportedOnDevice;
}

// The device a pointer lives on, or a status saying why it is not usable device memory.
softlight_status pointer_device(const void* p, int* device) {
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, p);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky, but leave no trace for the caller's next check
    return no_driver(e) ? SOFTLIGHT_ERROR_NO_DEVICE : SOFTLIGHT_ERROR_NOT_DEVICE_MEMORY;
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
    return SOFTLIGHT_ERROR_NOT_DEVICE_MEMORY;
  *device = attr.device;
  return SOFTLIGHT_SUCCESS;
}

// Makes `device` current for the scope of the call and restores the caller's device after.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device)
      changed_ = cudaSetDevice(device) == cudaSuccess;
  }
  ~DeviceScope() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
  bool changed_ = false;
};

cudaError_t device_info(int device, DeviceInfo* d) {
  int v = 0;
  cudaError_t e;
  if ((e = cudaDeviceGetAttribute(&d->cc_major, cudaDevAttrComputeCapabilityMajor, device))) return e;
  if ((e = cudaDeviceGetAttribute(&d->cc_minor, cudaDevAttrComputeCapabilityMinor, device))) return e;
  if ((e = cudaDeviceGetAttribute(&d->sm_count, cudaDevAttrMultiProcessorCount, device))) return e;
  if ((e = cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device))) return e;
  d->smem_per_block_optin = v;
  if ((e = cudaDeviceGetAttribute(&v, cudaDevAttrClusterLaunch, device))) return e;
  // Hopper schedules clusters of up to 16 CTAs (8 portably); the launcher steps down if the
  // chosen size cannot be placed.
  d->max_cluster = v ? kMaxCluster : 0;
  return cudaSuccess;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Tuning knobs for experiments: SOFTLIGHT_CLUSTER, SOFTLIGHT_CHUNK_BYTES, SOFTLIGHT_THREADS,
// SOFTLIGHT_HINTS (unset: the planner's choice); SOFTLIGHT_VERBOSE prints cluster launches.
Overrides overrides_from_env() {
  Overrides o;
  if (const char* s = std::getenv("SOFTLIGHT_CLUSTER")) o.cluster = std::atoi(s);
  if (const char* s = std::getenv("SOFTLIGHT_CHUNK_BYTES")) o.chunk_bytes = std::atoi(s);
  if (const char* s = std::getenv("SOFTLIGHT_THREADS")) o.threads = std::atoi(s);
  if (const char* s = std::getenv("SOFTLIGHT_HINTS")) o.hints = std::atoi(s);
  if (o.chunk_bytes % 16 != 0 || o.chunk_bytes < 0) o.chunk_bytes = 0;
  return o;
}

cudaError_t run_plan(const Plan& plan, const RowsArgs& args, cudaStream_t stream) {
  switch (plan.family) {
    case Family::none: return cudaSuccess;
    case Family::warp_rows: return launch_warp_rows(plan, args, stream);
    case Family::block_rows: return launch_block_rows(plan, args, stream);
    case Family::cluster_rows: return launch_cluster_rows(plan, args, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace
}  // namespace softlight

extern "C" softlight_status softlight_log_softmax_forward_ex(
    const void* x, int64_t x_row_stride, void* y, int64_t y_row_stride, int64_t rows, int64_t cols,
    softlight_dtype dtype, const softlight_forward_options* options, void* stream) {
  using namespace softlight;
  RowsCall call{x, x_row_stride, y, y_row_stride, rows, cols, dtype};
  bool noop = false;
  softlight_status st = apply_options(options, &call);
  if (st == SOFTLIGHT_SUCCESS) st = validate_rows_call(call, &noop);
  if (st != SOFTLIGHT_SUCCESS || noop) return st;

  int xdev = -1, ydev = -1, ldev = -1;
  if ((st = pointer_device(x, &xdev)) != SOFTLIGHT_SUCCESS) return st;
  if ((st = pointer_device(y, &ydev)) != SOFTLIGHT_SUCCESS) return st;
  if (xdev != ydev) return SOFTLIGHT_ERROR_DEVICE_MISMATCH;
  if (call.lse != nullptr) {
    if ((st = pointer_device(call.lse, &ldev)) != SOFTLIGHT_SUCCESS) return st;
    if (ldev != xdev) return SOFTLIGHT_ERROR_DEVICE_MISMATCH;
  }

  DeviceScope scope(xdev);
  DeviceInfo dev;
  if (cudaError_t e = device_info(xdev, &dev); e != cudaSuccess) {
    cudaGetLastError();
    return no_driver(e) ? SOFTLIGHT_ERROR_NO_DEVICE : SOFTLIGHT_ERROR_CUDA;
  }
  if (dev.cc_major < 8) return SOFTLIGHT_ERROR_UNSUPPORTED_DEVICE;

  const int elem = softlight_dtype_size(dtype);
  Problem prob;
  prob.rows = rows;
  prob.cols = cols;
  prob.elem_bytes = elem;
  prob.aligned16 = aligned16(x) && aligned16(y) && (cols * elem) % 16 == 0 &&
                   (rows == 1 || ((x_row_stride * elem) % 16 == 0 && (y_row_stride * elem) % 16 == 0));
  const Overrides over = overrides_from_env();
  const RowsArgs args{x, x_row_stride, y, y_row_stride, rows, cols, dtype, call.scale, call.lse};
  const auto s = static_cast<cudaStream_t>(stream);

  Plan plan = plan_rows(prob, dev, over);
  cudaError_t e = run_plan(plan, args, s);
  // A cluster that cannot be placed (a partitioned or busy GPU): halve it until one can, then
  // fall back to one CTA per row. Nothing has been queued when this error comes back.
  while (e == cudaErrorInvalidClusterSize && dev.max_cluster > 0) {
    dev.max_cluster = plan.cluster > 1 ? plan.cluster / 2 : 0;
    plan = plan_rows(prob, dev, Overrides{0, over.chunk_bytes, over.threads, over.hints});
    e = run_plan(plan, args, s);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    return no_driver(e) ? SOFTLIGHT_ERROR_NO_DEVICE : SOFTLIGHT_ERROR_CUDA;
  }
  return SOFTLIGHT_SUCCESS;
}

extern "C" softlight_status softlight_log_softmax_forward(const void* x, int64_t x_row_stride,
                                                          void* y, int64_t y_row_stride,
                                                          int64_t rows, int64_t cols,
                                                          softlight_dtype dtype, void* stream) {
  return softlight_log_softmax_forward_ex(x, x_row_stride, y, y_row_stride, rows, cols, dtype,
                                          nullptr, stream);
}
