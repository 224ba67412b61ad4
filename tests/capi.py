"""The C ABI (include/softlight/softlight.h) called through ctypes, as a C program calls it: the
tests of its statuses and layouts go through the library itself, not the Python bindings."""
import ctypes

import softlight

_lib = ctypes.CDLL(softlight.library_path())
_i64, _ptr, _int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
_Strides = _i64 * 3


class ForwardOptions(ctypes.Structure):
    _fields_ = [("temperature", ctypes.c_double), ("lse", _ptr)]


def _fn(name, *args):
    f = getattr(_lib, name)
    f.argtypes, f.restype = list(args), _int
    return f


_forward_cpu_ex = _fn("softlight_log_softmax_forward_cpu_ex", _ptr, _i64, _ptr, _i64, _i64, _i64, _int,
                      ctypes.POINTER(ForwardOptions), _int)
_forward_3d_cpu = _fn("softlight_log_softmax_forward_3d_cpu", _ptr, _Strides, _ptr, _Strides, _i64, _i64, _i64, _int,
                      ctypes.POINTER(ForwardOptions), _int)
_backward_cpu = _fn("softlight_log_softmax_backward_cpu", _ptr, _i64, _ptr, _i64, _ptr, _i64, _i64, _i64, _int, _int)
_backward_3d_cpu = _fn("softlight_log_softmax_backward_3d_cpu", _ptr, _Strides, _ptr, _Strides, _ptr, _Strides,
                       _i64, _i64, _i64, _int, _int)


def forward_cpu(x, xs, y, ys, rows, cols, dtype, threads=0, temperature=1.0, lse=0):
    o = ForwardOptions(temperature, lse or None)
    return _forward_cpu_ex(x or None, xs, y or None, ys, rows, cols, dtype, ctypes.byref(o), threads)


def forward_3d_cpu(x, xs, y, ys, outer, dim, inner, dtype, threads=0, temperature=1.0, lse=0):
    o = ForwardOptions(temperature, lse or None)
    return _forward_3d_cpu(x or None, _Strides(*xs), y or None, _Strides(*ys), outer, dim, inner, dtype,
                           ctypes.byref(o), threads)


def backward_cpu(dy, dys, y, ys, dx, dxs, rows, cols, dtype, threads=0):
    return _backward_cpu(dy or None, dys, y or None, ys, dx or None, dxs, rows, cols, dtype, threads)


def backward_3d_cpu(dy, dys, y, ys, dx, dxs, outer, dim, inner, dtype, threads=0):
    return _backward_3d_cpu(dy or None, _Strides(*dys), y or None, _Strides(*ys), dx or None, _Strides(*dxs),
                            outer, dim, inner, dtype, threads)


_I64p = ctypes.POINTER(_i64)
_forward_nd_cpu = _fn("softlight_log_softmax_forward_nd_cpu", _ptr, _I64p, _ptr, _I64p, _I64p, _int, _i64, _int,
                      ctypes.POINTER(ForwardOptions), _int)
_backward_nd_cpu = _fn("softlight_log_softmax_backward_nd_cpu", _ptr, _I64p, _ptr, _I64p, _ptr, _I64p, _I64p, _int,
                       _i64, _int, _int)
_layout_nd = _fn("softlight_layout_nd", _I64p, _I64p, _int, _i64, _I64p, _I64p)


def _dims(v):
    return None if v is None else (_i64 * max(1, len(v)))(*v)


def forward_nd_cpu(x, xs, y, ys, shape, dim, dtype, threads=0, temperature=1.0, lse=0, ndim=None):
    o = ForwardOptions(temperature, lse or None)
    nd = len(shape) if ndim is None else ndim
    return _forward_nd_cpu(x or None, _dims(xs), y or None, _dims(ys), _dims(shape), nd, dim, dtype, ctypes.byref(o),
                           threads)


def backward_nd_cpu(dy, dys, y, ys, dx, dxs, shape, dim, dtype, threads=0):
    return _backward_nd_cpu(dy or None, _dims(dys), y or None, _dims(ys), dx or None, _dims(dxs), _dims(shape),
                            len(shape), dim, dtype, threads)


def layout_nd(shape, strides, dim, ndim=None):
    """(status, n, s) of softlight_layout_nd."""
    n, s = (_i64 * 3)(), (_i64 * 3)()
    nd = len(shape) if ndim is None else ndim
    st = _layout_nd(_dims(shape), _dims(strides), nd, dim, n, s)
    return st, tuple(n), tuple(s)
