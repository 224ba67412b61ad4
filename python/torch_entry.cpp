// softlight's one reader of torch tensors, in C: a tensor's attributes through the Python C API. The
// plain API's reader (_arrays.read_torch) and the torch operators' kernels take a tensor's pointer,
// shape, strides, dtype code, device and current stream from torch_read; the eager calls of
// log_softmax and its backward (softlight.torch, and the plain API's calls on torch tensors) read
// their tensors, make the output with torch.empty_like and call the C ABI here, in one step. Nothing
// of torch is compiled in: torch's own objects (types, dtypes, functions) are handed over once,
// through torch_setup (_arrays._torch_setup). A tensor or call this path does not take as it is
// (another dtype or layout, the negative bit, another device; for the eager calls also a copy to make
// first, autograd, autocast, a transform, mode or tracer that must see the operator) gives None, and
// the caller takes its general path, which names what it refuses; both give the same results.
//
// The same reads from Python cost several microseconds more a call (about a dozen attribute reads
// and calls at 0.1-0.2 us each; docs/perf/host.json).
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
  PyObject* bump = nullptr;            // autograd's version bump of a tuple of tensors written in place
} torch_;

struct Names {
  PyObject *dtype, *layout, *requires_grad, *get_device, *is_neg, *is_contiguous, *data_ptr, *shape, *is_cuda, *is_cpu,
      *stride;
} names_;

PyObject* framework_ = nullptr;  // "torch": the framework's name in torch_read's tuple

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

// Whether t is a torch.Tensor: of exactly that type (`exact`: the eager calls, where a subclass must
// go through the operator), or of a subclass (torch_read: nn.Parameter, for one).
bool is_tensor(PyObject* t, bool exact) {
  if (torch_.tensor == nullptr) return false;
  PyTypeObject* type = reinterpret_cast<PyTypeObject*>(torch_.tensor);
  return exact ? Py_TYPE(t) == type : PyObject_TypeCheck(t, type) != 0;
}

// A tensor's dtype code (the C ABI's) and device (-1: the CPU); false where this reader does not take
// it: another dtype or layout, the negative bit, a device neither CUDA nor the CPU.
bool describe(PyObject* t, int* code, int64_t* device) {
  PyObject* dt = PyObject_GetAttr(t, names_.dtype);
  if (dt == nullptr) {
    PyErr_Clear();
    return false;
  }
  Py_DECREF(dt);
  *code = -1;
  for (int i = 0; i < 4; ++i)
    if (dt == torch_.dtypes[i]) *code = i;
  if (*code < 0 || !attr_is(t, names_.layout, torch_.strided) || method_true(t, names_.is_neg) != 0) return false;
  if (attr_is(t, names_.is_cuda, Py_True)) {
    *device = int_of(PyObject_CallMethodNoArgs(t, names_.get_device), -1);
    return *device >= 0 && torch_.raw_stream != Py_None;
  }
  *device = -1;
  return attr_is(t, names_.is_cpu, Py_True);  // (meta tensors and other devices: the caller says what it takes)
}

// What the eager calls need of an exact torch.Tensor: dtype code, device and shape, and the strides
// read where not `contiguous` (else t must be C-contiguous); false if they do not take it.
struct Read {
  int code;
  int64_t device;
  Dims shape, strides;
};

bool read(PyObject* t, Read* r, bool contiguous_only = true) {
  if (!is_tensor(t, true) || !describe(t, &r->code, &r->device)) return false;
  if (contiguous_only && method_true(t, names_.is_contiguous) != 1) return false;
  PyObject* shape = PyObject_GetAttr(t, names_.shape);
  if (shape == nullptr) {
    PyErr_Clear();
    return false;
  }
  bool ok = dims_of(shape, &r->shape);
  Py_DECREF(shape);
  if (ok && !contiguous_only) {
    PyObject* strides = PyObject_CallMethodNoArgs(t, names_.stride);
    ok = strides != nullptr && dims_of(strides, &r->strides);
    Py_XDECREF(strides);
  } else if (ok) {
    ok = contiguous(r->shape, &r->strides);  // (sizes past 64 bits: the general path says so)
  }
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

// Bumps t's autograd version (written in place); false with an exception set.
bool bump(PyObject* t) {
  PyObject* ts = PyTuple_Pack(1, t);
  PyObject* r = ts != nullptr ? PyObject_CallOneArg(torch_.bump, ts) : nullptr;
  Py_XDECREF(ts);
  Py_XDECREF(r);
  return r != nullptr;
}

// The result of a call: `out`, or on a nonzero status nullptr with softlight's exception for it.
PyObject* finish(int status, PyObject* out) {
  if (status == 0) return out;
  Py_DECREF(out);
  // The general path names the axis, and computes a layout not written in place through a copy.
  if (status == SOFTLIGHT_ERROR_INVALID_AXIS || status == SOFTLIGHT_ERROR_UNMERGED_LAYOUT) Py_RETURN_NONE;
  PyObject* s = PyLong_FromLong(status);
  PyObject* r = s != nullptr ? PyObject_CallOneArg(torch_.raise_status, s) : nullptr;
  Py_XDECREF(s);
  Py_XDECREF(r);
  if (!PyErr_Occurred()) PyErr_Format(PyExc_RuntimeError, "softlight: status %d", status);
  return nullptr;
}

// torch_forward(x, dim, temperature, check_plain, out=None) -> y (out where given); None where the
// general path is to take the call; True (check_plain only) where the call is plain eager but autograd
// is to record it. check_plain: refuse calls that autograd, autocast, a transform, mode or tracer must
// see (the operators' own kernels, below all of those, and the plain API, which refuses a tensor that
// requires grad itself, pass False). out: an exact torch.Tensor of x's dtype, device and shape, any
// strides the C ABI writes in place, that does not require grad; its autograd version is bumped.
PyObject* torch_forward(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 4 && n != 5) {
    PyErr_SetString(PyExc_TypeError, "torch_forward takes 4 or 5 positional arguments");
    return nullptr;
  }
  PyObject *x = a[0], *dim_o = a[1], *t_o = a[2], *out = n == 5 ? a[4] : Py_None;
  if (!is_tensor(x, true)) Py_RETURN_NONE;
  if (a[3] == Py_True) {
    bool grad = false;
    if (!plain(x, &grad)) Py_RETURN_NONE;
    if (grad) Py_RETURN_TRUE;
  }
  if (!PyLong_CheckExact(dim_o) || !PyFloat_CheckExact(t_o)) Py_RETURN_NONE;
  const double t = PyFloat_AS_DOUBLE(t_o);
  if (!(t > 0.0 && t < HUGE_VAL)) Py_RETURN_NONE;
  Read r, o;
  if (!read(x, &r)) Py_RETURN_NONE;
  if (out != Py_None && (!read(out, &o, false) || o.code != r.code || o.device != r.device || o.shape != r.shape ||
                         !attr_is(out, names_.requires_grad, Py_False)))
    Py_RETURN_NONE;
  const int64_t dim = PyLong_AsLongLong(dim_o);
  if (dim == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  uintptr_t xp, yp, stream;
  if (!pointer_of(x, &xp) || !stream_of(r.device, &stream)) return nullptr;
  PyObject* y = out;
  if (out == Py_None) {
    if ((y = empty_like(x, &yp)) == nullptr) return nullptr;
  } else {
    Py_INCREF(y);
    if (!pointer_of(out, &yp)) {
      Py_DECREF(y);
      return nullptr;
    }
  }
  const int status = forward(xp, r.shape, r.strides, yp, out == Py_None ? r.strides : o.strides, dim, r.code,
                             r.device >= 0, stream, t, 0);
  if (status == 0 && out != Py_None && !bump(out)) {
    Py_DECREF(y);
    return nullptr;
  }
  return finish(status, y);
}

// torch_backward(grad, y, dim) -> dx = grad - exp(y) * sum(grad) along dim, or None (as above). The
// callers are below autograd, or the plain API, which refuses tensors that require grad itself:
// nothing is refused for autograd's sake.
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
  uintptr_t gp, yp, dxp, stream;
  if (!pointer_of(a[0], &gp) || !pointer_of(a[1], &yp) || !stream_of(g.device, &stream)) return nullptr;
  PyObject* dx = empty_like(a[0], &dxp);
  if (dx == nullptr) return nullptr;
  return finish(backward(gp, g.shape, g.strides, yp, g.strides, dxp, g.strides, dim, g.code, g.device >= 0, stream),
                dx);
}

// torch_read(t) -> ((ptr, shape, strides, dtype code, on_gpu, device, False, "torch", None), stream):
// a torch.Tensor (or a subclass) as _arrays reads arrays (its tuple at PTR), shape and strides as
// torch gives them (t.shape, t.stride(), in elements) and the current stream's handle of its device
// (None for the CPU); None where this reader does not take t (_arrays.read_torch says why).
PyObject* torch_read(PyObject*, PyObject* t) {
  int code;
  int64_t device;
  if (!is_tensor(t, false) || !describe(t, &code, &device)) Py_RETURN_NONE;
  uintptr_t ptr, stream;
  if (!pointer_of(t, &ptr) || !stream_of(device, &stream)) return nullptr;
  PyObject* shape = PyObject_GetAttr(t, names_.shape);
  PyObject* strides = shape != nullptr ? PyObject_CallMethodNoArgs(t, names_.stride) : nullptr;
  PyObject* arr = strides != nullptr ? PyTuple_New(9) : nullptr;
  PyObject* res = arr != nullptr ? PyTuple_New(2) : nullptr;
  if (res == nullptr) {
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    Py_XDECREF(arr);
    return nullptr;
  }
  PyObject* gpu = device >= 0 ? Py_True : Py_False;
  Py_INCREF(gpu);
  Py_INCREF(Py_False);
  Py_INCREF(framework_);
  Py_INCREF(Py_None);
  PyObject* items[9] = {PyLong_FromUnsignedLongLong(ptr), shape, strides, PyLong_FromLong(code), gpu,
                        PyLong_FromLongLong(device >= 0 ? device : 0), Py_False, framework_, Py_None};
  for (int i = 0; i < 9; ++i) PyTuple_SET_ITEM(arr, i, items[i]);
  PyTuple_SET_ITEM(res, 0, arr);
  PyObject* s = device >= 0 ? PyLong_FromUnsignedLongLong(stream) : (Py_INCREF(Py_None), Py_None);
  PyTuple_SET_ITEM(res, 1, s);
  if (items[0] == nullptr || items[3] == nullptr || items[5] == nullptr || s == nullptr) {
    Py_DECREF(res);
    return nullptr;
  }
  return res;
}

// torch_setup(Tensor, strided, (float32, float16, bfloat16, float64), empty_like, raw_stream or None,
// is_grad_enabled, any_autocast, transforms_active, dispatch_stack_len, tracing_state, raise_status,
// increment_version)
PyObject* torch_setup(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (n != 12 || !PyType_Check(a[0]) || !PyTuple_Check(a[2]) || PyTuple_GET_SIZE(a[2]) != 4) {
    PyErr_SetString(PyExc_TypeError, "torch_setup: wrong arguments");
    return nullptr;
  }
  PyObject** slots[] = {&torch_.tensor, &torch_.strided, nullptr, &torch_.empty_like, &torch_.raw_stream,
                        &torch_.grad_enabled, &torch_.any_autocast, &torch_.transforms, &torch_.dispatch_modes,
                        &torch_.tracing, &torch_.raise_status, &torch_.bump};
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
     "torch_forward(x, dim, temperature, check_plain, out=None) -> y; None: the general path takes the call; "
     "True: the call is plain eager but autograd is to record it"},
    {"torch_backward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(torch_backward)), METH_FASTCALL,
     "torch_backward(grad, y, dim) -> dx, or None: the general path takes the call"},
    {"torch_read", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(torch_read)), METH_O,
     "torch_read(t) -> ((ptr, shape, strides, dtype code, on_gpu, device, False, 'torch', None), stream), or None: "
     "the reader does not take t"},
    {"torch_setup", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(torch_setup)), METH_FASTCALL,
     "torch_setup(...): torch's objects, once (softlight._arrays)"},
};

}  // namespace

bool add_torch_entries(PyObject* module) {
  const char* strs[] = {"dtype", "layout", "requires_grad", "get_device", "is_neg", "is_contiguous", "data_ptr",
                        "shape", "is_cuda", "is_cpu", "stride"};
  PyObject** fields[] = {&names_.dtype, &names_.layout, &names_.requires_grad, &names_.get_device, &names_.is_neg,
                         &names_.is_contiguous, &names_.data_ptr, &names_.shape, &names_.is_cuda, &names_.is_cpu,
                         &names_.stride};
  for (int i = 0; i < 11; ++i)
    if ((*fields[i] = PyUnicode_InternFromString(strs[i])) == nullptr) return false;
  if ((framework_ = PyUnicode_InternFromString("torch")) == nullptr) return false;
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
