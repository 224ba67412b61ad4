// pybind11 glue over the C ABI, and nothing past it: one call per operation from Python (the array's
// pointer, shape and strides in, then the C entry point) and DLPack capsule reading. The planner
// queries of the tests are a module of the tuning build's own (planner_queries.cpp).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "softlight/softlight.h"

namespace py = pybind11;

namespace {

// DLPack ABI (https://dmlc.github.io/dlpack/latest/), the parts a consumer reads.
struct DLDevice { int32_t device_type; int32_t device_id; };
struct DLDataType { uint8_t code; uint8_t bits; uint16_t lanes; };
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
struct DLPackVersion { uint32_t major; uint32_t minor; };
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned*);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr uint64_t kDLPackReadOnly = 1;
constexpr int kMaxDims = 64;

// Reads a DLPack capsule without consuming it: the capsule's own destructor releases the tensor, so
// the caller keeps the capsule (not only the array) alive for as long as the pointer is used.
// Returns (ptr, shape, strides in elements, (code, bits, lanes), (device type, id), readonly).
py::tuple dlpack_view(py::capsule cap) {
  const char* name = cap.name();
  const DLTensor* t = nullptr;
  bool readonly = false;
  if (name && std::string(name) == "dltensor_versioned") {
    auto* m = static_cast<DLManagedTensorVersioned*>(cap.get_pointer());
    if (m == nullptr) throw py::value_error("empty DLPack capsule");
    if (m->version.major != 1)
      throw py::value_error("unsupported DLPack major version " + std::to_string(m->version.major));
    t = &m->dl_tensor;
    readonly = (m->flags & kDLPackReadOnly) != 0;
  } else if (name && std::string(name) == "dltensor") {
    auto* m = static_cast<DLManagedTensor*>(cap.get_pointer());
    if (m == nullptr) throw py::value_error("empty DLPack capsule");
    t = &m->dl_tensor;
  } else {
    throw py::type_error("not an unconsumed DLPack capsule (name: " + std::string(name ? name : "none") + ")");
  }
  if (t->ndim < 0 || t->ndim > kMaxDims)
    throw py::value_error("DLPack tensor with " + std::to_string(t->ndim) + " dimensions (0 to 64 are read)");
  if (t->ndim > 0 && t->shape == nullptr) throw py::value_error("DLPack tensor without a shape");
  py::tuple shape(t->ndim), strides(t->ndim);
  int64_t expected = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] < 0) throw py::value_error("DLPack tensor with a negative extent");
    shape[i] = t->shape[i];
    strides[i] = t->strides ? t->strides[i] : expected;  // no strides: C-contiguous
    expected *= t->shape[i];
  }
  return py::make_tuple(reinterpret_cast<uintptr_t>(t->data) + t->byte_offset, shape, strides,
                        py::make_tuple(int(t->dtype.code), int(t->dtype.bits), int(t->dtype.lanes)),
                        py::make_tuple(int(t->device.device_type), int(t->device.device_id)), readonly);
}

}  // namespace

// The layout of an array along an axis and the two calls of the C ABI, shared with torch_entry.cpp
// (bindings.hpp).
namespace softlight_py {

// Arrays whose shape and strides differ in length: a code beside the C ABI's statuses (Python turns it
// into a message). Every other check of an array's axis is the C ABI's (softlight_layout_nd).
constexpr int kShapeMismatch = -5;

void* mptr(uintptr_t p) { return reinterpret_cast<void*>(p); }

// The forward of one array along dim: y (ys strides; the shape is x's) = log_softmax(x / t), lse
// optional. gpu: queued on `stream`; else on the CPU's threads. Returns a C ABI status or the code above.
int forward(uintptr_t x, const Dims& shape, const Dims& xs, uintptr_t y, const Dims& ys, int64_t dim, int dtype,
            bool gpu, uintptr_t stream, double temperature, uintptr_t lse) {
  if (xs.size() != shape.size() || ys.size() != shape.size()) return kShapeMismatch;
  if (dtype < 0 || dtype > 3) return SOFTLIGHT_ERROR_UNSUPPORTED_DTYPE;  // never an enum out of its values
  const softlight_forward_options o{temperature, mptr(lse)};
  const auto type = static_cast<softlight_dtype>(dtype);
  const int nd = static_cast<int>(shape.size());
  py::gil_scoped_release nogil;
  return gpu ? softlight_log_softmax_forward_nd(mptr(x), xs.data(), mptr(y), ys.data(), shape.data(), nd, dim, type, &o,
                                                mptr(stream))
             : softlight_log_softmax_forward_nd_cpu(mptr(x), xs.data(), mptr(y), ys.data(), shape.data(), nd, dim, type,
                                                    &o, 0);
}

// The backward along dim: dx = dy - exp(y) * sum(dy), arrays of one shape.
int backward(uintptr_t dy, const Dims& shape, const Dims& dys, uintptr_t y, const Dims& ys, uintptr_t dx,
             const Dims& dxs, int64_t dim, int dtype, bool gpu, uintptr_t stream) {
  if (dys.size() != shape.size() || ys.size() != shape.size() || dxs.size() != shape.size()) return kShapeMismatch;
  if (dtype < 0 || dtype > 3) return SOFTLIGHT_ERROR_UNSUPPORTED_DTYPE;
  const auto type = static_cast<softlight_dtype>(dtype);
  const int nd = static_cast<int>(shape.size());
  py::gil_scoped_release nogil;
  return gpu ? softlight_log_softmax_backward_nd(mptr(dy), dys.data(), mptr(y), ys.data(), mptr(dx), dxs.data(),
                                                 shape.data(), nd, dim, type, mptr(stream))
             : softlight_log_softmax_backward_nd_cpu(mptr(dy), dys.data(), mptr(y), ys.data(), mptr(dx), dxs.data(),
                                                     shape.data(), nd, dim, type, 0);
}

// --- the hot entry points, without pybind11's argument conversion -----------------------------
// Each call of softlight.log_softmax crosses here once; pybind11's conversion of a dozen arguments
// costs over a microsecond a call, so these three parse their positional arguments with the C API
// (METH_FASTCALL) and are added to the module beside the pybind11 functions.

bool dims_of(PyObject* o, Dims* out) {
  PyObject* seq = PySequence_Fast(o, "shape and strides must be sequences of ints");
  if (seq == nullptr) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n > kMaxDims) {
    Py_DECREF(seq);
    PyErr_SetString(PyExc_ValueError, "more than 64 dimensions");
    return false;
  }
  out->resize(static_cast<size_t>(n));
  PyObject** items = PySequence_Fast_ITEMS(seq);
  for (Py_ssize_t i = 0; i < n; ++i) {
    (*out)[static_cast<size_t>(i)] = PyLong_AsLongLong(items[i]);
    if ((*out)[static_cast<size_t>(i)] == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      return false;
    }
  }
  Py_DECREF(seq);
  return true;
}

// The strides (in elements) of a C-contiguous array of `shape`: a new output made for the call.
bool contiguous(const Dims& shape, Dims* out) {
  out->resize(shape.size());
  int64_t step = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    (*out)[i] = step;
    // (A zero extent: nothing is written, any stride does.)
    if (shape[i] > 1 && __builtin_mul_overflow(step, shape[i], &step)) {
      PyErr_SetString(PyExc_OverflowError, "the array's size overflows 64 bits");
      return false;
    }
  }
  return true;
}

}  // namespace softlight_py

namespace {

using namespace softlight_py;

bool as_u(PyObject* o, uintptr_t* v) {
  *v = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(o));
  return !(*v == static_cast<uintptr_t>(-1) && PyErr_Occurred());
}

bool as_i(PyObject* o, int64_t* v) {
  *v = PyLong_AsLongLong(o);
  return !(*v == -1 && PyErr_Occurred());
}

bool wrong_count(Py_ssize_t n, Py_ssize_t want, const char* name) {
  if (n == want) return false;
  PyErr_Format(PyExc_TypeError, "%s takes %zd positional arguments (%zd given)", name, want, n);
  return true;
}

// forward(x, shape, x_strides, y, y_strides, dim, dtype, gpu, stream, temperature, lse) -> status;
// y_strides None: y is C-contiguous.
PyObject* fast_forward(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (wrong_count(n, 11, "forward")) return nullptr;
  uintptr_t x, y, stream, lse;
  int64_t dim, dtype;
  Dims shape, xs, ys;
  if (!as_u(a[0], &x) || !dims_of(a[1], &shape) || !dims_of(a[2], &xs) || !as_u(a[3], &y) ||
      !(a[4] == Py_None ? contiguous(shape, &ys) : dims_of(a[4], &ys)) || !as_i(a[5], &dim) || !as_i(a[6], &dtype) ||
      !as_u(a[8], &stream) || !as_u(a[10], &lse))
    return nullptr;
  const int gpu = PyObject_IsTrue(a[7]);
  const double t = PyFloat_AsDouble(a[9]);
  if (gpu < 0 || (t == -1.0 && PyErr_Occurred())) return nullptr;
  return PyLong_FromLong(forward(x, shape, xs, y, ys, dim, static_cast<int>(dtype), gpu, stream, t, lse));
}

// backward(dy, shape, dy_strides, y, y_strides, dx, dx_strides, dim, dtype, gpu, stream) -> status;
// dx_strides None: dx is C-contiguous.
PyObject* fast_backward(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (wrong_count(n, 11, "backward")) return nullptr;
  uintptr_t dy, y, dx, stream;
  int64_t dim, dtype;
  Dims shape, dys, ys, dxs;
  if (!as_u(a[0], &dy) || !dims_of(a[1], &shape) || !dims_of(a[2], &dys) || !as_u(a[3], &y) ||
      !dims_of(a[4], &ys) || !as_u(a[5], &dx) || !(a[6] == Py_None ? contiguous(shape, &dxs) : dims_of(a[6], &dxs)) || !as_i(a[7], &dim) || !as_i(a[8], &dtype) ||
      !as_u(a[10], &stream))
    return nullptr;
  const int gpu = PyObject_IsTrue(a[9]);
  if (gpu < 0) return nullptr;
  return PyLong_FromLong(backward(dy, shape, dys, y, ys, dx, dxs, dim, static_cast<int>(dtype), gpu, stream));
}

// forward_rows(x, x_stride, y, y_stride, rows, cols, dtype, gpu, stream, temperature, lse, threads) -> status
PyObject* fast_forward_rows(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (wrong_count(n, 12, "forward_rows")) return nullptr;
  uintptr_t x, y, stream, lse;
  int64_t xs, ys, rows, cols, dtype, threads;
  if (!as_u(a[0], &x) || !as_i(a[1], &xs) || !as_u(a[2], &y) || !as_i(a[3], &ys) || !as_i(a[4], &rows) ||
      !as_i(a[5], &cols) || !as_i(a[6], &dtype) || !as_u(a[8], &stream) || !as_u(a[10], &lse) || !as_i(a[11], &threads))
    return nullptr;
  const int gpu = PyObject_IsTrue(a[7]);
  const double t = PyFloat_AsDouble(a[9]);
  if (gpu < 0 || (t == -1.0 && PyErr_Occurred())) return nullptr;
  if (dtype < 0 || dtype > 3) return PyLong_FromLong(SOFTLIGHT_ERROR_UNSUPPORTED_DTYPE);
  const softlight_forward_options o{t, mptr(lse)};
  const auto type = static_cast<softlight_dtype>(dtype);
  softlight_status st;
  Py_BEGIN_ALLOW_THREADS
  st = gpu ? softlight_log_softmax_forward_ex(mptr(x), xs, mptr(y), ys, rows, cols, type, &o, mptr(stream))
           : softlight_log_softmax_forward_cpu_ex(mptr(x), xs, mptr(y), ys, rows, cols, type, &o,
                                                  static_cast<int>(threads));
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(st);
}

PyMethodDef kFastMethods[] = {
    {"forward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_forward)), METH_FASTCALL,
     "forward(x, shape, x_strides, y, y_strides, dim, dtype, gpu, stream, temperature, lse) -> status"},
    {"backward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_backward)), METH_FASTCALL,
     "backward(dy, shape, dy_strides, y, y_strides, dx, dx_strides, dim, dtype, gpu, stream) -> status"},
    {"forward_rows", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast_forward_rows)), METH_FASTCALL,
     "forward_rows(x, x_stride, y, y_stride, rows, cols, dtype, gpu, stream, temperature, lse, threads) -> status"},
};

// --- consumers of a row's log-sum-exp (CPU) ---------------------------------------------------
// Pointers as ints; outputs and inputs in the C ABI's field order (0: none).

using Ptrs = std::array<uintptr_t, 8>;

softlight_tokens tokens(uintptr_t ids, int64_t count, int64_t row_stride, int64_t offset, bool shard) {
  return {reinterpret_cast<const int64_t*>(ids), count, row_stride, offset, shard};
}

int row_stats(uintptr_t x, int64_t xs, int64_t rows, int64_t cols, int dtype, double temperature, uintptr_t index,
              int64_t k, int64_t index_stride, int64_t offset, bool shard, const Ptrs& out, int threads, bool gpu,
              uintptr_t stream) {
  if (dtype < 0 || dtype > 3) return SOFTLIGHT_ERROR_UNSUPPORTED_DTYPE;
  softlight_row_stats_options o{};
  o.temperature = temperature;
  o.index = tokens(index, k, index_stride, offset, shard);
  void** fields[8] = {&o.lse, &o.entropy, &o.logprobs, &o.picked, &o.sum, &o.max, &o.sumexp, &o.moment};
  for (int i = 0; i < 8; ++i) *fields[i] = mptr(out[i]);
  py::gil_scoped_release nogil;
  const auto type = static_cast<softlight_dtype>(dtype);
  return gpu ? softlight_row_stats(mptr(x), xs, rows, cols, type, &o, mptr(stream))
             : softlight_row_stats_cpu(mptr(x), xs, rows, cols, type, &o, threads);
}

int row_stats_backward(uintptr_t x, int64_t xs, uintptr_t dx, int64_t dxs, int64_t rows, int64_t cols, int dtype,
                       double temperature, uintptr_t index, int64_t k, int64_t index_stride, int64_t offset, bool shard,
                       const std::array<uintptr_t, 7>& in, int threads, bool gpu, uintptr_t stream) {
  if (dtype < 0 || dtype > 3) return SOFTLIGHT_ERROR_UNSUPPORTED_DTYPE;
  softlight_row_stats_grad g{};
  g.temperature = temperature;
  g.index = tokens(index, k, index_stride, offset, shard);
  const void** fields[7] = {&g.lse, &g.entropy, &g.d_lse, &g.d_entropy, &g.d_logprobs, &g.d_picked, &g.d_sum};
  for (int i = 0; i < 7; ++i) *fields[i] = mptr(in[i]);
  py::gil_scoped_release nogil;
  const auto type = static_cast<softlight_dtype>(dtype);
  return gpu ? softlight_row_stats_backward(mptr(x), xs, mptr(dx), dxs, rows, cols, type, &g, mptr(stream))
             : softlight_row_stats_backward_cpu(mptr(x), xs, mptr(dx), dxs, rows, cols, type, &g, threads);
}

int cross_entropy(uintptr_t x, int64_t xs, uintptr_t target, int64_t rows, int64_t cols, int dtype,
                  double temperature, double label_smoothing, double z_loss, bool ignore, int64_t ignore_index,
                  int reduction, uintptr_t loss, uintptr_t lse, uintptr_t grad, int64_t grad_stride, int threads,
                  bool gpu, uintptr_t stream) {
  if (dtype < 0 || dtype > 3) return SOFTLIGHT_ERROR_UNSUPPORTED_DTYPE;
  if (reduction < 0 || reduction > 2) return SOFTLIGHT_ERROR_INVALID_ARGUMENT;
  softlight_cross_entropy_options o{};
  o.temperature = temperature;
  o.label_smoothing = label_smoothing;
  o.z_loss = z_loss;
  o.ignore = ignore;
  o.ignore_index = ignore_index;
  o.reduction = static_cast<softlight_reduction>(reduction);
  o.loss = mptr(loss);
  o.lse = mptr(lse);
  o.grad = mptr(grad);
  o.grad_row_stride = grad_stride;
  py::gil_scoped_release nogil;
  const auto* t = reinterpret_cast<const int64_t*>(target);
  const auto type = static_cast<softlight_dtype>(dtype);
  return gpu ? softlight_cross_entropy(mptr(x), xs, t, rows, cols, type, &o, mptr(stream))
             : softlight_cross_entropy_cpu(mptr(x), xs, t, rows, cols, type, &o, threads);
}

int cross_entropy_grad_scale(uintptr_t grad, int64_t stride, int64_t rows, int64_t cols, int dtype, uintptr_t d_loss,
                             int64_t d_loss_count, int threads, bool gpu, uintptr_t stream) {
  if (dtype < 0 || dtype > 3) return SOFTLIGHT_ERROR_UNSUPPORTED_DTYPE;
  const auto type = static_cast<softlight_dtype>(dtype);
  py::gil_scoped_release nogil;
  return gpu ? softlight_cross_entropy_grad_scale(mptr(grad), stride, rows, cols, type, mptr(d_loss), d_loss_count,
                                                  mptr(stream))
             : softlight_cross_entropy_grad_scale_cpu(mptr(grad), stride, rows, cols, type, mptr(d_loss), d_loss_count,
                                                      threads);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "softlight's C ABI, bound for Python (internal: use softlight.log_softmax)";
  m.def("version", &softlight_version);
  m.def("gpu_built", [] { return softlight_gpu_built() != 0; });
  m.def("device_count", &softlight_device_count);
  m.def("status_string", [](int s) { return std::string(softlight_status_string(static_cast<softlight_status>(s))); });
  m.def("dtype_size", [](int code) { return code < 0 || code > 3 ? 0 : softlight_dtype_size(static_cast<softlight_dtype>(code)); });
  for (PyMethodDef& def : kFastMethods) {
    PyObject* f = PyCFunction_NewEx(&def, nullptr, m.ptr());
    if (f == nullptr) throw py::error_already_set();
    m.add_object(def.ml_name, py::reinterpret_steal<py::object>(f));
  }
  if (!softlight_py::add_torch_entries(m.ptr())) throw py::error_already_set();
  // layout(shape, strides, dim) -> (status, (outer, n, inner), their strides): softlight_layout_nd.
  m.def("layout", [](const Dims& shape, const Dims& strides, int64_t dim) {
    int64_t n[3] = {}, s[3] = {};
    const int status =
        strides.size() != shape.size()
            ? kShapeMismatch
            : static_cast<int>(softlight_layout_nd(shape.data(), strides.data(), static_cast<int>(shape.size()), dim,
                                                   n, s));
    return py::make_tuple(status, py::make_tuple(n[0], n[1], n[2]), py::make_tuple(s[0], s[1], s[2]));
  });
  m.def("dlpack_view", &dlpack_view, py::arg("capsule"));
  // The consumers' entries, named here argument by argument; python/softlight/_consumers.py calls them
  // positionally: each is on a training step's path (a call per loss), and pybind11's keyword matching
  // would add to every call's host cost, which is kept at torch's own (docs/perf/host.json).
  m.def("row_stats", &row_stats, py::arg("x"), py::arg("xs"), py::arg("rows"), py::arg("cols"), py::arg("dtype"),
        py::arg("temperature"), py::arg("index"), py::arg("k"), py::arg("index_stride"), py::arg("offset"),
        py::arg("shard"), py::arg("out"), py::arg("threads"), py::arg("gpu") = false, py::arg("stream") = 0);
  m.def("row_stats_backward", &row_stats_backward, py::arg("x"), py::arg("xs"), py::arg("dx"), py::arg("dxs"),
        py::arg("rows"), py::arg("cols"), py::arg("dtype"), py::arg("temperature"), py::arg("index"), py::arg("k"),
        py::arg("index_stride"), py::arg("offset"), py::arg("shard"), py::arg("ins"), py::arg("threads"),
        py::arg("gpu") = false, py::arg("stream") = 0);
  m.def("cross_entropy", &cross_entropy, py::arg("x"), py::arg("xs"), py::arg("target"), py::arg("rows"),
        py::arg("cols"), py::arg("dtype"), py::arg("temperature"), py::arg("label_smoothing"), py::arg("z_loss"),
        py::arg("ignore"), py::arg("ignore_index"), py::arg("reduction"), py::arg("loss"), py::arg("lse"),
        py::arg("grad"), py::arg("grad_stride"), py::arg("threads"), py::arg("gpu") = false, py::arg("stream") = 0);
  m.def("cross_entropy_grad_scale", &cross_entropy_grad_scale, py::arg("grad"), py::arg("stride"), py::arg("rows"),
        py::arg("cols"), py::arg("dtype"), py::arg("d_loss"), py::arg("d_loss_count"), py::arg("threads"),
        py::arg("gpu") = false, py::arg("stream") = 0);
}
