// The GPU entry point: validate, find the pointers' device, plan, launch.
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "device/launch.hpp"
#include "entry/validate.hpp"
#include "planner/plan.hpp"
#include "planner/tuning.hpp"
#include "softlight/softlight.h"

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

// A device's attributes do not change while the process runs: each device is queried once (five
// runtime calls less on every later call; query_device_info, device/launch.hpp).
cudaError_t device_info(int device, DeviceInfo* d) {
  static std::mutex mu;
  static std::map<int, DeviceInfo> known;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (const auto it = known.find(device); it != known.end()) {
      *d = it->second;
      return cudaSuccess;
    }
  }
  const cudaError_t e = query_device_info(device, d);
  if (e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(mu);
  known.emplace(device, *d);
  return cudaSuccess;
}

softlight_status cuda_status(cudaError_t e) {
  cudaGetLastError();
  if (e == cudaErrorMemoryAllocation) return SOFTLIGHT_ERROR_OUT_OF_MEMORY;
  return no_driver(e) ? SOFTLIGHT_ERROR_NO_DEVICE : SOFTLIGHT_ERROR_CUDA;
}

// Every row of each (pointer, row stride in elements of `elem` bytes) pair starts on `bytes`: the
// pointers and row strides are multiples of it. Pass a stride of 0 where there is one row.
bool rows_start_on(std::initializer_list<std::pair<const void*, int64_t>> arrays, int elem, int bytes) {
  for (const auto& [p, stride] : arrays)
    if (reinterpret_cast<uintptr_t>(p) % bytes != 0 || (stride * elem) % bytes != 0) return false;
  return true;
}

// 16-byte vector access is valid for rows of `cols` elements of `elem` bytes at each (pointer, row
// stride in elements) pair: pointers, row strides and the row length are multiples of 16 bytes.
bool vectorizable(std::initializer_list<std::pair<const void*, int64_t>> arrays, int64_t cols, int elem,
                  int bytes = 16) {
  return (cols * elem) % bytes == 0 && rows_start_on(arrays, elem, bytes);
}

// The device of every array of a call (null entries skipped), made current for the scope, and
// what the planner needs of it.
class CallDevice {
 public:
  softlight_status open(std::initializer_list<const void*> arrays) {
    int first = -1;
    for (const void* p : arrays) {
      if (p == nullptr) continue;
      int d = -1;
      if (const softlight_status st = pointer_device(p, &d); st != SOFTLIGHT_SUCCESS) return st;
      if (first >= 0 && d != first) return SOFTLIGHT_ERROR_DEVICE_MISMATCH;
      first = d;
    }
    scope_.emplace(first);
    if (const cudaError_t e = device_info(first, &info); e != cudaSuccess) return cuda_status(e);
    if (info.cc_major < 8) return SOFTLIGHT_ERROR_UNSUPPORTED_DEVICE;
    return SOFTLIGHT_SUCCESS;
  }
  DeviceInfo info;

 private:
  std::optional<DeviceScope> scope_;
};

// The problem of a forward rows call as the planner takes it: which vector accesses its layout allows.
Problem rows_problem(const Call& c) {
  Problem prob;
  prob.rows = c.rows();
  prob.cols = c.cols();
  prob.elem_bytes = softlight_dtype_size(c.dtype);
  const bool one = c.rows() == 1;
  const auto x = reinterpret_cast<uintptr_t>(c.x()), y = reinterpret_cast<uintptr_t>(c.y());
  const std::initializer_list<std::pair<const void*, int64_t>> arrays = {{c.x(), c.x_stride()}, {c.y(), c.y_stride()}};
  prob.aligned16 = vectorizable(arrays, c.cols(), prob.elem_bytes);
  prob.aligned8 = vectorizable(arrays, c.cols(), prob.elem_bytes, 8);
  prob.rows128 = rows_start_on(arrays, prob.elem_bytes, 128);
  // Peeling needs element-aligned pointers (as any access does) that agree modulo 16 bytes.
  prob.peelable = x % prob.elem_bytes == 0 && (x - y) % 16 == 0 &&
                  (one || ((c.x_stride() - c.y_stride()) * prob.elem_bytes) % 16 == 0);
  prob.flat16 = x % 16 == 0 && y % 16 == 0 && (one || (c.x_stride() == c.cols() && c.y_stride() == c.cols()));
  return prob;
}

// The problem of any other call (the backward, and the forward along a non-last axis).
AxisProblem axis_problem(const Call& c) {
  AxisProblem prob;
  prob.outer = c.n[0];
  prob.dim = c.n[1];
  prob.inner = c.n[2];
  prob.elem_bytes = softlight_dtype_size(c.dtype);
  prob.rows = c.is_rows();
  prob.backward = c.backward;
  // (The forward has no in1: in0 stands in for it.)
  const void* in1 = c.backward ? c.in1 : c.in0;
  const int64_t in1_stride = c.backward ? c.in1_s[0] : c.in0_s[0];
  prob.aligned16 = prob.rows && vectorizable({{c.in0, c.in0_s[0]}, {in1, in1_stride}, {c.out, c.out_s[0]}}, c.n[1],
                                             prob.elem_bytes);
  // cluster_tiles reads x through a tensor map: axes nested in order (each stride spans the
  // axes inside it) and extents that fit its 32-bit coordinates.
  const bool nested = (c.n[1] == 1 || c.in0_s[1] >= c.n[2]) && (c.n[0] == 1 || c.in0_s[0] >= c.n[1] * c.in0_s[1]);
  const bool small = c.n[0] < (int64_t{1} << 31) && c.n[1] < (int64_t{1} << 31) && c.n[2] < (int64_t{1} << 31);
  prob.tiles_aligned = !prob.rows && !c.backward && c.in0_s[2] == 1 && c.out_s[2] == 1 && nested && small &&
                       vectorizable({{c.in0, c.in0_s[0]}, {c.in0, c.in0_s[1]}, {c.out, c.out_s[0]}, {c.out, c.out_s[1]}},
                                    c.n[2], prob.elem_bytes);
  return prob;
}

// The family's launcher for a plan (forward or backward, as the call is).
cudaError_t launch_family(const Plan& p, const Call& c, cudaStream_t s) {
  switch (p.family) {
    case Family::none: return cudaSuccess;
    case Family::single_column: return launch_single_column(p, c, s);
    case Family::flat_rows: return launch_flat_rows(p, c, s);
    case Family::short_rows: return launch_short_rows(p, c, s);
    case Family::register_rows: return launch_register_rows(p, c, s);
    case Family::register_clusters: return launch_register_clusters(p, c, s);
    case Family::block_rows: return launch_block_rows(p, c, s);
    case Family::cluster_rows: return launch_cluster_rows(p, c, s);
    case Family::grid_rows: return launch_grid_rows(p, c, s);
    case Family::split_rows: return launch_split_rows(p, c, s);
    case Family::cluster_tiles: return launch_cluster_tiles(p, c, s);
    case Family::consumer_rows: break;  // (the consumers' launchers take their own calls)
  }
  return cudaErrorInvalidValue;
}

// Plans and launches every call of the library, log-softmax and consumers alike, and owns every
// fallback: where a cluster cannot be placed (a partitioned or busy GPU), halves the largest cluster
// allowed and plans again, down to none; the planner then chooses the cluster itself (a forced value
// may be what failed), in clusters (a cooperative grid too large to be resident comes back as the
// same error, and gives way to the clusters). With no clusters the consumers plan consumer_rows.
// Nothing that touches the caller's arrays has been queued when the error comes back (cluster_rows
// may have queued its workspace's allocation, fill and release; cross-entropy, its workspace's).
// plan_for(dev, tuning) -> Plan; launch(plan) -> cudaError_t.
template <class PlanFn, class LaunchFn>
softlight_status launch_with_fallbacks(DeviceInfo dev, const Tuning& tuning, PlanFn plan_for, LaunchFn launch) {
  Plan plan = plan_for(dev, tuning);
  cudaError_t e = launch(plan);
  Tuning again = tuning;
  again.cluster = 0;
  again.exchange = 0;
  again.grid_rows = 0;
  while (e == cudaErrorInvalidClusterSize && dev.max_cluster > 0) {
    (void)cudaGetLastError();  // (the failed launch's error is no error of the next)
    if (plan.family != Family::grid_rows) dev.max_cluster = plan.cluster > 1 ? plan.cluster / 2 : 0;
    plan = plan_for(dev, again);
    e = launch(plan);
  }
  return e == cudaSuccess ? SOFTLIGHT_SUCCESS : cuda_status(e);
}

// A checked call on its device: the plan, and the family's launcher; where the driver cannot
// describe x as a tensor map (cluster_tiles), the same problem planned without tiles (split_rows).
softlight_status run(const Call& c, const DeviceInfo& dev, cudaStream_t s) {
  const Tuning tuning = forced_tuning();
  const auto launch = [&](const Plan& p) {
    const cudaError_t e = launch_family(p, c, s);
    if (e != cudaErrorNotSupported || p.family != Family::cluster_tiles) return e;
    AxisProblem q = axis_problem(c);  // no tensor map for x: split_rows, with the forced split values alone
    q.tiles_aligned = false;
    Tuning split;
    split.split_lanes = tuning.split_lanes;
    split.split_segment_bytes = tuning.split_segment_bytes;
    return launch_family(plan_axis(q, dev, split), c, s);
  };
  if (!c.backward && c.is_rows()) {
    const Problem prob = rows_problem(c);
    return launch_with_fallbacks(
        dev, tuning, [&](const DeviceInfo& d, const Tuning& o) { return plan_rows(prob, d, o); }, launch);
  }
  const AxisProblem prob = axis_problem(c);
  return launch_with_fallbacks(
      dev, tuning, [&](const DeviceInfo& d, const Tuning& o) { return plan_axis(prob, d, o); }, launch);
}

// A checked call (validate.hpp) on the device of its arrays. It starts with no error pending in the
// library's runtime (or queues nothing), so the check after a launch reports that launch's alone.
softlight_status run_gpu(const Call& call, void* stream) {
  if (const cudaError_t pending = cudaPeekAtLastError(); pending != cudaSuccess)
    return no_driver(pending) ? SOFTLIGHT_ERROR_NO_DEVICE : SOFTLIGHT_ERROR_CUDA;
  CallDevice dev;
  const softlight_status st = dev.open({call.in0, call.backward ? call.in1 : nullptr, call.out, call.lse});
  return st != SOFTLIGHT_SUCCESS ? st : run(call, dev.info, static_cast<cudaStream_t>(stream));
}

// The pending-error check and the device of a consumer call's arrays (null ones skipped).
softlight_status open_consumer(CallDevice* dev, std::initializer_list<const void*> arrays) {
  if (const cudaError_t pending = cudaPeekAtLastError(); pending != cudaSuccess)
    return no_driver(pending) ? SOFTLIGHT_ERROR_NO_DEVICE : SOFTLIGHT_ERROR_CUDA;
  return dev->open(arrays);
}

template <class A> ConsumerArgs<A> consumer_args(const softlight_row_stats_options& o) {
  const auto p = [](void* v) { return static_cast<A*>(v); };
  return {o.index.ids, o.index.count, o.index.row_stride, o.index.offset, o.index.shard != 0, p(o.lse),
          p(o.entropy), p(o.logprobs), p(o.picked), p(o.sum), p(o.max), p(o.sumexp), p(o.moment)};
}
// A consumer's call planned and launched (plan_consumer): the log-softmax's call over the rows of x
// written to y (the gradient; x itself for the statistics) is what a family that holds the rows on
// chip launches with; launch(plan, call) launches the family plan_consumer names (consumer_rows'
// kernel for consumer_rows' plan and none: no rows).
template <class LaunchFn>
softlight_status run_consumer(const void* x, int64_t x_stride, void* y, int64_t y_stride, int64_t rows, int64_t cols,
                              softlight_dtype dtype, double temperature, ConsumerProblem what,
                              const DeviceInfo& dev, LaunchFn launch) {
  const softlight_forward_options fo{temperature, nullptr};
  softlight_status st;
  bool noop;
  const Call call = rows_forward_call(x, x_stride, y, y_stride, rows, cols, dtype, &fo, &st, &noop);
  if (st == SOFTLIGHT_SUCCESS && !noop) what.rows = rows_problem(call);  // (else consumer_rows' kernel)
  return launch_with_fallbacks(
      dev, forced_tuning(),
      [&](const DeviceInfo& d, const Tuning& o) { return plan_consumer(what, d, o); },
      [&](const Plan& p) { return launch(p, call); });
}

template <class A> GradArgs<A> grad_args(const softlight_row_stats_grad& g) {
  const auto p = [](const void* v) { return static_cast<const A*>(v); };
  return {g.index.ids, g.index.count, g.index.row_stride, g.index.offset, g.index.shard != 0, p(g.lse),
          p(g.entropy), p(g.d_lse), p(g.d_entropy), p(g.d_logprobs), p(g.d_picked), p(g.d_sum)};
}

}  // namespace

}  // namespace softlight

extern "C" int softlight_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

extern "C" softlight_status softlight_log_softmax_forward_ex(
    const void* x, int64_t x_row_stride, void* y, int64_t y_row_stride, int64_t rows, int64_t cols,
    softlight_dtype dtype, const softlight_forward_options* options, void* stream) {
  using namespace softlight;
  softlight_status st;
  bool noop;
  const Call call = rows_forward_call(x, x_row_stride, y, y_row_stride, rows, cols, dtype, options, &st, &noop);
  return st != SOFTLIGHT_SUCCESS || noop ? st : run_gpu(call, stream);
}

extern "C" softlight_status softlight_log_softmax_forward_3d(
    const void* x, const int64_t x_strides[3], void* y, const int64_t y_strides[3], int64_t outer,
    int64_t dim, int64_t inner, softlight_dtype dtype, const softlight_forward_options* options,
    void* stream) {
  using namespace softlight;
  softlight_status st;
  bool noop;
  const Call call = forward_call(x, x_strides, y, y_strides, outer, dim, inner, dtype, options, &st, &noop);
  return st != SOFTLIGHT_SUCCESS || noop ? st : run_gpu(call, stream);
}

extern "C" softlight_status softlight_log_softmax_backward_3d(
    const void* dy, const int64_t dy_strides[3], const void* y, const int64_t y_strides[3], void* dx,
    const int64_t dx_strides[3], int64_t outer, int64_t dim, int64_t inner, softlight_dtype dtype,
    void* stream) {
  using namespace softlight;
  softlight_status st;
  bool noop;
  const Call call = backward_call(dy, dy_strides, y, y_strides, dx, dx_strides, outer, dim, inner, dtype, &st, &noop);
  return st != SOFTLIGHT_SUCCESS || noop ? st : run_gpu(call, stream);
}
extern "C" softlight_status softlight_log_softmax_backward(
    const void* dy, int64_t dy_row_stride, const void* y, int64_t y_row_stride, void* dx,
    int64_t dx_row_stride, int64_t rows, int64_t cols, softlight_dtype dtype, void* stream) {
  const int64_t dys[3] = {dy_row_stride, 1, 0}, ys[3] = {y_row_stride, 1, 0}, dxs[3] = {dx_row_stride, 1, 0};
  return softlight_log_softmax_backward_3d(dy, dys, y, ys, dx, dxs, rows, cols, 1, dtype, stream);
}

extern "C" softlight_status softlight_log_softmax_forward(const void* x, int64_t x_row_stride,
                                                          void* y, int64_t y_row_stride,
                                                          int64_t rows, int64_t cols,
                                                          softlight_dtype dtype, void* stream) {
  return softlight_log_softmax_forward_ex(x, x_row_stride, y, y_row_stride, rows, cols, dtype,
                                          nullptr, stream);
}

extern "C" softlight_status softlight_row_stats(const void* x, int64_t x_row_stride, int64_t rows, int64_t cols,
                                                softlight_dtype dtype, const softlight_row_stats_options* options,
                                                void* stream) {
  using namespace softlight;
  if (options == nullptr) return SOFTLIGHT_ERROR_NULL_POINTER;
  const softlight_row_stats_options& o = *options;
  softlight_status st;
  bool noop;
  const ConsumerCall c = row_stats_call(x, x_row_stride, rows, cols, dtype, o, false, &st, &noop);
  if (st != SOFTLIGHT_SUCCESS || noop) return st;
  CallDevice dev;
  st = open_consumer(&dev, {x, o.index.ids, o.lse, o.entropy, o.logprobs, o.picked, o.sum, o.max, o.sumexp, o.moment});
  if (st != SOFTLIGHT_SUCCESS) return st;
  // Rows that the log-softmax holds on chip (short rows, flat tiles, a group of lanes, or a cluster)
  // give the statistics of their max, sum and moment from there (all of a row's loads in flight at
  // once); any other, consumer_rows' kernel.
  ConsumerProblem what;
  what.asks_sum = o.sum != nullptr;
  const auto s = static_cast<cudaStream_t>(stream);
  return run_consumer(x, x_row_stride, const_cast<void*>(x), x_row_stride, rows, cols, dtype, o.temperature, what,
                      dev.info, [&](const Plan& p, const Call& call) {
                        switch (p.family) {
                          case Family::short_rows: return launch_short_rows_stats(p, call, consumer_args<float>(o), s);
                          case Family::flat_rows: return launch_flat_rows_stats(p, call, consumer_args<float>(o), s);
                          case Family::register_rows:
                            return launch_register_rows_stats(p, call, consumer_args<float>(o), s);
                          case Family::register_clusters:
                            return launch_register_clusters_stats(p, call, consumer_args<float>(o), s);
                          default: return launch_row_stats(c, consumer_args<float>(o), consumer_args<double>(o), s);
                        }
                      });
}

extern "C" softlight_status softlight_row_stats_backward(const void* x, int64_t x_row_stride, void* dx,
                                                         int64_t dx_row_stride, int64_t rows, int64_t cols,
                                                         softlight_dtype dtype, const softlight_row_stats_grad* grad,
                                                         void* stream) {
  using namespace softlight;
  if (grad == nullptr) return SOFTLIGHT_ERROR_NULL_POINTER;
  const softlight_row_stats_grad& g = *grad;
  softlight_status st;
  bool noop;
  const ConsumerCall c = row_stats_grad_call(x, x_row_stride, dx, dx_row_stride, rows, cols, dtype, g, false, &st,
                                             &noop);
  if (st == SOFTLIGHT_SUCCESS && g.index.count > kMaxGpuTokens) st = SOFTLIGHT_ERROR_INVALID_ARGUMENT;
  if (st != SOFTLIGHT_SUCCESS || noop || cols == 0) return st;
  CallDevice dev;
  st = open_consumer(&dev, {x, dx, g.index.ids, g.lse, g.entropy, g.d_lse, g.d_entropy, g.d_logprobs, g.d_picked,
                            g.d_sum});
  if (st != SOFTLIGHT_SUCCESS) return st;
  const cudaError_t e = launch_row_stats_grad(c, grad_args<float>(g), grad_args<double>(g),
                                              static_cast<cudaStream_t>(stream));
  return e == cudaSuccess ? SOFTLIGHT_SUCCESS : cuda_status(e);
}

extern "C" softlight_status softlight_cross_entropy(const void* x, int64_t x_row_stride, const int64_t* target,
                                                    int64_t rows, int64_t cols, softlight_dtype dtype,
                                                    const softlight_cross_entropy_options* options, void* stream) {
  using namespace softlight;
  if (options == nullptr) return SOFTLIGHT_ERROR_NULL_POINTER;
  const softlight_cross_entropy_options& o = *options;
  softlight_status st;
  bool noop;
  const ConsumerCall c = cross_entropy_call(x, x_row_stride, target, rows, cols, dtype, o, false, &st, &noop);
  if (st != SOFTLIGHT_SUCCESS || (noop && o.reduction == SOFTLIGHT_REDUCTION_NONE)) return st;
  CallDevice dev;
  st = open_consumer(&dev, {x, target, o.loss, o.lse, o.grad});
  if (st != SOFTLIGHT_SUCCESS) return st;
  // Rows that the log-softmax holds on chip, in registers or shared memory (short rows, flat tiles, a
  // group of lanes, or a cluster) or cluster_rows' ring, write the gradient from there (one read, one
  // write; x itself too), or the loss alone (the first four); any other, consumer_rows' kernel (a
  // second read for the gradient). (No rows: the reduction of nothing, 0 or NaN, is still written, on
  // the device.)
  ConsumerProblem what;
  what.cross_entropy = true;
  what.writes_grad = o.grad != nullptr;
  what.label_smoothing = o.label_smoothing != 0.0;
  return run_consumer(x, x_row_stride, o.grad != nullptr ? o.grad : const_cast<void*>(x),
                      o.grad != nullptr ? o.grad_row_stride : x_row_stride, rows, cols, dtype, o.temperature, what,
                      dev.info, [&](const Plan& p, const Call& call) {
                        const bool on_chip = p.family != Family::consumer_rows && p.family != Family::none;
                        return launch_cross_entropy(c, o, static_cast<cudaStream_t>(stream), on_chip ? &p : nullptr,
                                                    on_chip ? &call : nullptr);
                      });
}

extern "C" softlight_status softlight_cross_entropy_grad_scale(void* grad, int64_t grad_row_stride, int64_t rows,
                                                               int64_t cols, softlight_dtype dtype, const void* d_loss,
                                                               int64_t d_loss_count, void* stream) {
  using namespace softlight;
  softlight_status st;
  bool noop;
  const ConsumerCall c = grad_scale_call(grad, grad_row_stride, rows, cols, dtype, d_loss, d_loss_count, &st, &noop);
  if (st != SOFTLIGHT_SUCCESS || noop || cols == 0) return st;
  CallDevice dev;
  st = open_consumer(&dev, {grad, d_loss});
  if (st != SOFTLIGHT_SUCCESS) return st;
  const cudaError_t e = launch_grad_scale(c, d_loss, d_loss_count, static_cast<cudaStream_t>(stream));
  return e == cudaSuccess ? SOFTLIGHT_SUCCESS : cuda_status(e);
}
