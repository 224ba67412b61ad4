// softlight.torch's eager calls on torch tensors, read in C: the tensor's attributes through the
// Python C API, its output from torch.empty_like, and one call of the C ABI. Nothing of torch is
// compiled in: softlight.torch hands over torch's own objects (types, dtypes, functions) once, at
// import, through torch_setup. A call this path does not take as it is (another type, a layout to
// copy first, autograd, autocast, a transform, mode or tracer that must see the operator) returns
// None, and softlight.torch takes its general path; both give the same results.
//
// The same call from Python costs several microseconds more (about a dozen attribute reads and
// calls at 0.1-0.2 us each; docs/perf/host.json).
#include "bindings.hpp"
#include "softlight/softlight.h"

#include <cmath>

namespace softlight_py {
namespace {

// torch's objects, from torch_setup (strong references, kept for the module's life).
struct Torch {
  PyObject* tensor = nullptr;          // torch.Tensor: only that exact type is read here
  PyObject* strided = nullptr;         // torch.strided
  PyObject* dtypes[4] = {};            // float32, float16, bfloat16, float64: the C ABI's dtype codes 0-3
  PyObject* empty_like = nullptr;      // torch.empty_like
  PyObject* raw_stream = nullptr;      // device -> the current stream's handle (None: no CUDA)
  PyObject* grad_enabled = nullptr;    // torch.is_grad_enabled
  PyObject* any_autocast = nullptr;    // autocast on for any device
  PyObject* transforms = nullptr;      // torch.func transforms active
  PyObject* dispatch_modes = nullptr;  // the number of TorchDispatchModes on the stack
  PyObject* tracing = nullptr;         // the jit tracer's state (None: not tracing)
  PyObject* raise_status = nullptr;    // softlight._errors.check: raises the status's exception
} torch_;

struct Names {
  PyObject *dtype, *layout, *requires_grad, *get_device, *is_neg, *is_contiguous, *data_ptr, *shape, *is_cuda, *is_cpu;
} names_;

// o's attribute `name` is `want` (false on error, with the error cleared: the general path decides).
bool attr_is(PyObject* o, PyObject* name, PyObject* want) {
  PyObject* v = PyObject_GetAttr(o, name);
  if (v == nullptr) {
    PyErr_Clear();
    return false;
  }
  Py_DECREF(v);
  return v == want;
}

// The truth of v, a new reference that this releases (-1 where v is nullptr or has none; cleared).
int truth(PyObject* v) {
  if (v == nullptr) {
    PyErr_Clear();
    return -1;
  }
  const int t = PyObject_IsTrue(v);
  Py_DECREF(v);
  if (t < 0) PyErr_Clear();
  return t;
}

// The truth of o.name() and of f() (-1 on error, cleared).
int method_true(PyObject* o, PyObject* name) { return truth(PyObject_CallMethodNoArgs(o, name)); }
int call_true(PyObject* f) { return truth(PyObject_CallNoArgs(f)); }

// The int in v, a new reference that this releases (`fallback` where v is nullptr or no int; cleared).
int64_t int_of(PyObject* v, int64_t fallback) {
  if (v == nullptr) {
    PyErr_Clear();
    return fallback;
  }
  const int64_t r = PyLong_AsLongLong(v);
  Py_DECREF(v);
  if (r == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return fallback;
  }
  return r;
}

// What the C ABI needs of a tensor this path takes: dtype code, device (-1: CPU) and shape; false if
// it does not take it (not an exact torch.Tensor, another dtype or layout, the negative bit, not
// C-contiguous).
struct Read {
  int code;
  int64_t device;
  Dims shape;
};

bool read(PyObject* t, Read* r) {
  if (torch_.tensor == nullptr || Py_TYPE(t) != reinterpret_cast<PyTypeObject*>(torch_.tensor)) return false;
  PyObject* dt = PyObject_GetAttr(t, names_.dtype);
  if (dt == nullptr) {
    PyErr_Clear();
    return false;
  }
  Py_DECREF(dt);
  r->code = -1;
  for (int i = 0; i < 4; ++i)
    if (dt == torch_.dtypes[i]) r->code = i;
  if (r->code < 0 || !attr_is(t, names_.layout, torch_.strided)) return false;
  if (method_true(t, names_.is_neg) != 0 || method_true(t, names_.is_contiguous) != 1) return false;
  if (attr_is(t, names_.is_cuda, Py_True)) {
    r->device = int_of(PyObject_CallMethodNoArgs(t, names_.get_device), -1);
    if (r->device < 0 || torch_.raw_stream == Py_None) return false;
  } else if (attr_is(t, names_.is_cpu, Py_True)) {
    r->device = -1;
  } else {
    return false;  // (meta tensors and other devices: the general path says what it takes)
  }
  PyObject* shape = PyObject_GetAttr(t, names_.shape);
  if (shape == nullptr) {
    PyErr_Clear();
    return false;
  }
  const bool ok = dims_of(shape, &r->shape);
  Py_DECREF(shape);
  if (!ok) PyErr_Clear();
  return ok;
}

// Whether nothing but eager torch (and autograd, where `grad` is set) sees a call on x, an exact
// torch.Tensor: no autocast, torch.func transform, dispatch mode or jit tracer (each of those must see
// the operator itself). `grad`: whether autograd is to record the call.
bool plain(PyObject* x, bool* grad) {
  if (call_true(torch_.any_autocast) != 0 || call_true(torch_.transforms) != 0) return false;
  if (int_of(PyObject_CallNoArgs(torch_.dispatch_modes), 1) != 0) return false;
  PyObject* tracing = PyObject_CallNoArgs(torch_.tracing);
  if (tracing == nullptr) {
    PyErr_Clear();
    return false;
  }
  Py_DECREF(tracing);
  if (tracing != Py_None) return false;
  const int needs = attr_is(x, names_.requires_grad, Py_True) ? call_true(torch_.grad_enabled) : 0;
  *grad = needs != 0;
  return needs >= 0;
}

// A new tensor like t (torch.empty_like; contiguous, as t is) and its pointer; nullptr with an
// exception set.
PyObject* empty_like(PyObject* t, uintptr_t* ptr) {
  PyObject* out = PyObject_CallOneArg(torch_.empty_like, t);
  if (out == nullptr) return nullptr;
  PyObject* p = PyObject_CallMethodNoArgs(out, names_.data_ptr);
  if (p == nullptr || (*ptr = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(p)), PyErr_Occurred())) {
    Py_XDECREF(p);
    Py_DECREF(out);
    return nullptr;
  }
  Py_DECREF(p);
  return out;
}

bool pointer_of(PyObject* t, uintptr_t* ptr) {
  PyObject* p = PyObject_CallMethodNoArgs(t, names_.data_ptr);
  if (p == nullptr) return false;
  *ptr = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(p));
  Py_DECREF(p);
  return !PyErr_Occurred();
}

// The current stream's handle on a device (0 for the CPU); false with an exception set.
bool stream_of(int64_t device, uintptr_t* stream) {
  *stream = 0;
  if (device < 0) return true;
  PyObject* d = PyLong_FromLongLong(device);
  if (d == nullptr) return false;
  PyObject* s = PyObject_CallOneArg(torch_.raw_stream, d);
  Py_DECREF(d);
  if (s == nullptr) return false;
  *stream = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(s));
  Py_DECREF(s);
  return !PyErr_Occurred();
}

// The result of a call: `out`, or on a nonzero status nullptr with softlight's exception for it.
PyObject* finish(int status, PyObject* out) {
  if (status == 0) return out;
  Py_DECREF(out);
  if (status == SOFTLIGHT_ERROR_INVALID_AXIS) Py_RETURN_NONE;  // the general path names the axis
  PyObject* s = PyLong_FromLong(status);
  PyObject* r = s != nullptr ? PyObject_CallOneArg(torch_.raise_status, s) : nullptr;
  Py_XDECREF(s);
  Py_XDECREF(r);
  if (!PyErr_Occurred()) PyErr_Format(PyExc_RuntimeError, "softlight: status %d", status);
  return nullptr;
}

// torch_forward(x, dim, temperature, check_plain) -> y; None where the general path is to take the
// call; True (check_plain only) where the call is plain eager but autograd is to record it. check_plain:
// refuse calls that autograd, autocast, a transform, mode or tracer must see (the operators' own
// kernels, below all of those, pass False).
PyObject* torch_forward(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 4) {
    PyErr_SetString(PyExc_TypeError, "torch_forward takes 4 positional arguments");
    return nullptr;
  }
  PyObject *x = a[0], *dim_o = a[1], *t_o = a[2];
  if (torch_.tensor == nullptr || Py_TYPE(x) != reinterpret_cast<PyTypeObject*>(torch_.tensor)) Py_RETURN_NONE;
  if (a[3] == Py_True) {
    bool grad = false;
    if (!plain(x, &grad)) Py_RETURN_NONE;
    if (grad) Py_RETURN_TRUE;
  }
  if (!PyLong_CheckExact(dim_o) || !PyFloat_CheckExact(t_o)) Py_RETURN_NONE;
  const double t = PyFloat_AS_DOUBLE(t_o);
  if (!(t > 0.0 && t < HUGE_VAL)) Py_RETURN_NONE;
  Read r;
  if (!read(x, &r)) Py_RETURN_NONE;
  const int64_t dim = PyLong_AsLongLong(dim_o);
  if (dim == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  Dims strides;
  if (!contiguous(r.shape, &strides)) {  // (sizes past 64 bits: the general path says so)
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  uintptr_t xp, yp, stream;
  if (!pointer_of(x, &xp) || !stream_of(r.device, &stream)) return nullptr;
  PyObject* y = empty_like(x, &yp);
  if (y == nullptr) return nullptr;
  return finish(forward(xp, r.shape, strides, yp, strides, dim, r.code, r.device >= 0, stream, t, 0), y);
}

// torch_backward(grad, y, dim) -> dx = grad - exp(y) * sum(grad) along dim, or None (as above). The
// callers are below autograd: nothing is refused for autograd's sake.
PyObject* torch_backward(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 3) {
    PyErr_SetString(PyExc_TypeError, "torch_backward takes 3 positional arguments");
    return nullptr;
  }
  if (!PyLong_CheckExact(a[2])) Py_RETURN_NONE;
  Read g, y;
  if (!read(a[0], &g) || !read(a[1], &y) || g.code != y.code || g.device != y.device || g.shape != y.shape)
    Py_RETURN_NONE;
  const int64_t dim = PyLong_AsLongLong(a[2]);
  if (dim == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  Dims strides;
  if (!contiguous(g.shape, &strides)) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  uintptr_t gp, yp, dxp, stream;
  if (!pointer_of(a[0], &gp) || !pointer_of(a[1], &yp) || !stream_of(g.device, &stream)) return nullptr;
  PyObject* dx = empty_like(a[0], &dxp);
  if (dx == nullptr) return nullptr;
  return finish(backward(gp, g.shape, strides, yp, strides, dxp, strides, dim, g.code, g.device >= 0, stream), dx);
}

// torch_setup(Tensor, strided, (float32, float16, bfloat16, float64), empty_like, raw_stream or None,
// is_grad_enabled, any_autocast, transforms_active, dispatch_stack_len, tracing_state, raise_status)
PyObject* torch_setup(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 11 || !PyType_Check(a[0]) || !PyTuple_Check(a[2]) || PyTuple_GET_SIZE(a[2]) != 4) {
    PyErr_SetString(PyExc_TypeError, "torch_setup: wrong arguments");
    return nullptr;
  }
  PyObject** slots[] = {&torch_.tensor, &torch_.strided, nullptr, &torch_.empty_like, &torch_.raw_stream,
                        &torch_.grad_enabled, &torch_.any_autocast, &torch_.transforms, &torch_.dispatch_modes,
                        &torch_.tracing, &torch_.raise_status};
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (slots[i] == nullptr) continue;
    Py_INCREF(a[i]);
    Py_XSETREF(*slots[i], a[i]);
  }
  for (int i = 0; i < 4; ++i) {
    Py_INCREF(PyTuple_GET_ITEM(a[2], i));
    Py_XSETREF(torch_.dtypes[i], PyTuple_GET_ITEM(a[2], i));
  }
  Py_RETURN_NONE;
}

PyMethodDef kTorchMethods[] = {
    {"torch_forward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(torch_forward)), METH_FASTCALL,
     "torch_forward(x, dim, temperature, check_plain) -> y; None: the general path takes the call; True: the "
     "call is plain eager but autograd is to record it"},
    {"torch_backward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(torch_backward)), METH_FASTCALL,
     "torch_backward(grad, y, dim) -> dx, or None: the general path takes the call"},
    {"torch_setup", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(torch_setup)), METH_FASTCALL,
     "torch_setup(...): torch's objects, once (softlight.torch)"},
};

}  // namespace

bool add_torch_entries(PyObject* module) {
  const char* strs[] = {"dtype", "layout", "requires_grad", "get_device", "is_neg", "is_contiguous", "data_ptr",
                        "shape", "is_cuda", "is_cpu"};
  PyObject** fields[] = {&names_.dtype, &names_.layout, &names_.requires_grad, &names_.get_device, &names_.is_neg,
                         &names_.is_contiguous, &names_.data_ptr, &names_.shape, &names_.is_cuda, &names_.is_cpu};
  for (int i = 0; i < 10; ++i)
    if ((*fields[i] = PyUnicode_InternFromString(strs[i])) == nullptr) return false;
  for (PyMethodDef& def : kTorchMethods) {
    PyObject* f = PyCFunction_NewEx(&def, nullptr, module);
    if (f == nullptr || PyModule_AddObject(module, def.ml_name, f) < 0) {
      Py_XDECREF(f);
      return false;
    }
  }
  return true;
}

}  // namespace softlight_py
