"""softlight's Python API: log-softmax of any DLPack array, and a raw-pointer entry.

One path a call: read the arrays (_arrays.read), make the output, one call into the bindings, which
work out the 3-d layout and call the C ABI, then turn the status into an exception.
"""
import math

from . import _C
from ._arrays import (DEVICE_ID, DTYPE, FRAMEWORK, ON_GPU, PTR, READONLY, SHAPE, STRIDES, TORCH, contiguous, copy_into,
                      device_name, empty_like, filled, no_autograd, read, writing)
from ._dtypes import BY_NAME, NAMES
from ._errors import ArgumentTypeError, AxisError, InvalidArgumentError, check
from ._streams import stream_handle, synchronize

_torch_forward, _torch_backward = _C.torch_forward, _C.torch_backward

# The C ABI's N-d statuses (softlight.h): dim out of range, and a layout the library does not compute
# in place (the axes before dim or after it do not merge into one evenly strided axis, or a stride is
# negative). Such arrays are read, or written, through a contiguous copy (_direct).
_INVALID_AXIS = 13
_LAYOUT = (14,)


def _fail(status, dim, arrays):
    """Raise the error of a status from the bindings (a C ABI status)."""
    if status == _INVALID_AXIS:
        nd = len(tuple(arrays[0][1][SHAPE]))
        raise AxisError(f"softlight: dim {dim} is out of range for a {nd}-d array")
    check(status)


def _direct(a, arr, dim, handle, like=None):
    """(array, as read) that the bindings take in place along dim: `a` itself where its layout is one,
    else a contiguous copy of it (the caller holds it until the call is done), or, for an output
    (`like`: the first input and its reading), a new contiguous array like it, whose values the
    caller copies into `a` (copy_into)."""
    if arr[STRIDES] is None or _C.layout(arr[SHAPE], tuple(arr[STRIDES]), dim)[0] == 0:
        return a, arr
    c = contiguous(a, arr[FRAMEWORK]) if like is None else empty_like(*like)
    return c, read(c, handle)[0]


def _check_dim(dim, axis=None):
    """The axis of a call from dim= or axis= (numpy's and scipy's name; one of the two: dim is -1
    unless given), as an int."""
    name = "dim"
    if axis is not None:
        if not (type(dim) is int and dim == -1):
            raise ArgumentTypeError("softlight: pass dim or axis, not both")
        dim, name = axis, "axis"
    if type(dim) is not int:
        if isinstance(dim, bool) or not hasattr(dim, "__index__"):
            raise ArgumentTypeError(f"softlight: {name} must be an int, got {type(dim).__qualname__}")
        try:
            dim = dim.__index__()
        except (TypeError, ValueError) as e:
            raise ArgumentTypeError(f"softlight: {name} must be an int: {e}") from None
    if not -2**62 <= dim < 2**62:
        raise AxisError(f"softlight: {name} {dim} is out of range")
    return dim


def _check_temperature(temperature):
    if type(temperature) is float and 0.0 < temperature < math.inf:
        return temperature
    t = _real(temperature, "temperature")
    if not (t > 0.0 and math.isfinite(t)):
        raise InvalidArgumentError(f"softlight: temperature must be finite and positive, got {temperature!r}")
    return t


def _real(v, name):
    """v as a Python float, or ArgumentTypeError naming the argument (a number or a 0-d array only)."""
    if type(v) is float or type(v) is int:
        return float(v)
    if isinstance(v, (bool, str, bytes)) or not hasattr(v, "__float__") or getattr(v, "ndim", 0) != 0:
        raise ArgumentTypeError(f"softlight: {name} must be a real number, got {type(v).__qualname__}"
                                + (f" of shape {tuple(v.shape)}" if getattr(v, "ndim", 0) else ""))
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError) as e:
        raise ArgumentTypeError(f"softlight: {name} must be a real number: {e}") from None


def _matching(arr, like, name, first="the input"):
    """Checks an array that goes with the first one: same device, dtype and shape."""
    if arr[ON_GPU] != like[ON_GPU] or (arr[ON_GPU] and arr[DEVICE_ID] != like[DEVICE_ID]):
        raise InvalidArgumentError(f"softlight: {name} is on {device_name(arr)}, {first} on {device_name(like)}")
    if arr[DTYPE] != like[DTYPE]:
        raise InvalidArgumentError(f"softlight: {name} has dtype {NAMES[arr[DTYPE]]}, {first} {NAMES[like[DTYPE]]}")
    if tuple(arr[SHAPE]) != tuple(like[SHAPE]):
        raise InvalidArgumentError(f"softlight: {name} has shape {tuple(arr[SHAPE])}, {first} {tuple(like[SHAPE])}")


def _read_named(a, stream, name):
    """read(a, stream), its ArgumentTypeError naming the argument."""
    try:
        return read(a, stream)
    except ArgumentTypeError as e:
        raise ArgumentTypeError(f"softlight: {name}: {str(e).removeprefix('softlight: ')}") from None


def _first(a, stream, name="x"):
    """(array as read, stream handle) of a call's first array: `stream`, else the framework's current
    stream, else the legacy default stream (0); stream= only for GPU arrays. A torch tensor that
    requires grad under grad mode is refused (the plain API records no autograd graph)."""
    arr, handle = _read_named(a, None if stream is None else stream_handle(stream), name)
    if arr[FRAMEWORK] == "torch":
        no_autograd(a, name)
    if handle is None:
        return arr, 0
    if not arr[ON_GPU]:
        raise ArgumentTypeError("softlight: stream= applies to GPU arrays, and the arrays are on the CPU")
    return arr, handle


def _output(out, first, xa, stream, name):
    """(array, Array) of the result: `out`, or a new array like the first input."""
    if out is None:
        out = empty_like(first, xa)
        # A new torch or CuPy array: C-contiguous (strides None), its pointer all that is to read.
        if xa[FRAMEWORK] == "torch":
            return out, (out.data_ptr(), xa[SHAPE], None, xa[DTYPE], xa[ON_GPU], xa[DEVICE_ID], False, "torch", None)
        if xa[FRAMEWORK] == "cupy":
            return out, (out.data.ptr, xa[SHAPE], None, xa[DTYPE], True, xa[DEVICE_ID], False, "cupy", None)
        return out, read(out, stream)[0]
    oa = _read_named(out, stream, name)[0]
    _matching(oa, xa, name)
    if oa[READONLY]:
        raise InvalidArgumentError(f"softlight: {name} is read-only")
    if oa[FRAMEWORK] == "torch":
        writing(out, name)
    return out, oa


def _finish(arr, handle):
    """JAX tracks no foreign streams: its arrays are handed back only once the work is done."""
    if arr[FRAMEWORK] == "jax" and arr[ON_GPU]:
        synchronize(handle, arr[DEVICE_ID])


def log_softmax(x, dim=-1, *, axis=None, out=None, stream=None, temperature=1.0, return_lse=False):
    """Log-softmax of `x` along `dim` (or `axis`; default the last), computed in float32 (float64 for
    float64 inputs).

    x:      any DLPack array (numpy, torch, CuPy, JAX, ...) of float32, float16, bfloat16 or
            float64, on a CUDA GPU or the CPU, of any number of axes; `dim` any axis (negative
            counts from the end). Every layout is computed: strided views are read in place when the
            axes before `dim` merge into one evenly strided axis and so do those after it (always
            true of contiguous arrays and of slices along one axis), otherwise through a contiguous
            copy (docs/semantics.md). A torch tensor that requires grad under grad mode is refused:
            use softlight.torch for autograd.
    out:    optional array of the same shape, dtype and device to write into; may be `x` itself.
    stream: GPU arrays only. An int handle, a cuda.core Stream, or anything with
            __cuda_stream__. Default: the framework's current stream (torch, CuPy), else the
            legacy default stream.
    temperature: computes log_softmax(x / temperature), fused (finite and positive).
    return_lse: also return the log-sum-exp along `dim` of x / temperature (float32; float64 for
            float64 inputs), of x's shape without `dim`, from the same pass.
    Returns `out`, or a new array of the same kind as `x` on the same device; with return_lse, the
    pair (y, lse).
    """
    if type(temperature) is not float or temperature != 1.0:
        temperature = _check_temperature(temperature)
    if type(dim) is not int or axis is not None or not -64 <= dim < 64:
        dim = _check_dim(dim, axis)
    if type(x) is TORCH.tensor and stream is None and not return_lse and not x.requires_grad:
        # A torch tensor with the defaults of the common call: read, made and called in C, None where
        # the general path below is to take it (each step saved is a tenth of a microsecond or more of
        # a call that costs about ten, docs/perf/host.json).
        y = _torch_forward(x, dim, temperature, False, out)
        if y is not None:
            return y
    xa, handle = _first(x, stream)
    gpu = xa[ON_GPU]
    out, oa = _output(out, x, xa, handle, "out")
    lse, lse_ptr = None, 0
    if return_lse:
        nd = len(xa[SHAPE])
        if not -max(nd, 1) <= dim < max(nd, 1):
            raise AxisError(f"softlight: dim {dim} is out of range for a {nd}-d array")
        d = dim % max(nd, 1)
        shape = tuple(xa[SHAPE])
        lse = empty_like(x, xa, shape=shape[:d] + shape[d + 1:], dtype="float64" if xa[DTYPE] == 3 else "float32")
        lse_ptr = read(lse, handle)[0][PTR]
    status = _C.forward(xa[PTR], xa[SHAPE], xa[STRIDES], oa[PTR], oa[STRIDES], dim, xa[DTYPE], gpu, handle, temperature,
                        lse_ptr)
    if status in _LAYOUT:  # a layout not read in place: through contiguous copies
        xc, ca = _direct(x, xa, dim, handle)
        yc, ya = _direct(out, oa, dim, handle, (x, xa))
        status = _C.forward(ca[PTR], ca[SHAPE], ca[STRIDES], ya[PTR], ya[STRIDES], dim, xa[DTYPE], gpu, handle,
                            temperature, lse_ptr)
        del xc  # (held until the call is done)
        if status == 0 and yc is not out:
            copy_into(out, yc, xa[FRAMEWORK])
    if status:
        _fail(status, dim, (("x", xa), ("out", oa)))
    _finish(xa, handle)
    if return_lse and 0 in tuple(xa[SHAPE]):
        shape = tuple(xa[SHAPE])
        d = dim % max(len(shape), 1)
        if shape[d] == 0 and math.prod(shape[:d] + shape[d + 1:]) > 0:
            lse = filled(lse, xa[FRAMEWORK], -math.inf)  # the log-sum-exp of an empty axis; the library wrote nothing
    return (out, lse) if return_lse else out


def log_softmax_backward(grad, y, dim=-1, *, axis=None, grad_in=None, stream=None):
    """The gradient of log_softmax: grad - exp(y) * grad.sum(dim, keepdim=True).

    grad:     the gradient of the loss with respect to the forward's output (any DLPack array,
              float32, float16, bfloat16 or float64, GPU or CPU; layouts as for log_softmax).
    y:        the forward's output, of the same shape, dtype and device.
    dim:      the forward's axis (or `axis`; default the last).
    grad_in:  optional array to write into (may be grad or y itself).
    For y = log_softmax(x / T), multiply the result by 1 / T. Returns grad_in, or a new array of
    the same kind as grad.
    """
    if type(dim) is not int or axis is not None or not -64 <= dim < 64:
        dim = _check_dim(dim, axis)
    if type(grad) is TORCH.tensor and type(y) is TORCH.tensor and grad_in is None and stream is None and \
            not grad.requires_grad and not y.requires_grad:
        # torch tensors with the defaults, as autograd's backward calls it: in C (log_softmax).
        dx = _torch_backward(grad, y, dim)
        if dx is not None:
            return dx
    ga, handle = _first(grad, stream, "grad")
    gpu = ga[ON_GPU]
    ya = _read_named(y, handle, "y")[0]
    if ya[FRAMEWORK] == "torch":
        no_autograd(y, "y")
    _matching(ya, ga, "y", "grad")
    grad_in, da = _output(grad_in, grad, ga, handle, "grad_in")
    status = _C.backward(ga[PTR], ga[SHAPE], ga[STRIDES], ya[PTR], ya[STRIDES], da[PTR], da[STRIDES], dim, ga[DTYPE],
                         gpu, handle)
    if status in _LAYOUT:  # layouts not read in place: through contiguous copies (log_softmax)
        (gc, gca), (yc, yca) = _direct(grad, ga, dim, handle), _direct(y, ya, dim, handle)
        dc, dca = _direct(grad_in, da, dim, handle, (grad, ga))
        status = _C.backward(gca[PTR], gca[SHAPE], gca[STRIDES], yca[PTR], yca[STRIDES], dca[PTR], dca[STRIDES], dim,
                             ga[DTYPE], gpu, handle)
        del gc, yc  # (held until the call is done)
        if status == 0 and dc is not grad_in:
            copy_into(grad_in, dc, ga[FRAMEWORK])
    if status:
        _fail(status, dim, (("grad", ga), ("y", ya), ("grad_in", da)))
    _finish(ga, handle)
    return grad_in


def _int_arg(v, name, low=0, high=2**63 - 1):
    """v as a Python int in [low, high], or a SoftlightError naming the argument."""
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise ArgumentTypeError(f"softlight: {name} must be an int, got {type(v).__qualname__}")
    v = v.__index__()
    if v < 0 <= low:
        raise InvalidArgumentError(f"softlight: {name} must not be negative, got {v}")
    if not low <= v <= high:
        raise InvalidArgumentError(f"softlight: {name} must be in [{low}, {high}], got {v}")
    return v


def log_softmax_raw(x_ptr, y_ptr, rows, cols, *, dtype, x_stride=None, y_stride=None, stream=0,
                    device="cuda", threads=0, temperature=1.0, lse_ptr=0):
    """Log-softmax over rows given as raw pointers (ints): `rows` rows of `cols` elements, each row
    `x_stride` / `y_stride` elements after the last (default: cols). dtype: a name ("float32"), a
    numpy or torch dtype. device="cuda" queues the work on `stream` (asynchronous); device="cpu" runs
    it on host memory before returning, on `threads` threads (0: all cores). `lse_ptr`, if not 0,
    receives each row's log-sum-exp (float32, or float64 for float64 data)."""
    code = BY_NAME.get(dtype) if type(dtype) is str else None
    if code is None:
        from ._dtypes import code as code_of, normalize
        code = code_of(normalize(dtype))
    if type(temperature) is not float or temperature != 1.0:
        temperature = _check_temperature(temperature)
    x_ptr, y_ptr, lse_ptr = (_int_arg(p, n, 0, 2**64 - 1) for p, n in ((x_ptr, "x_ptr"), (y_ptr, "y_ptr"),
                                                                        (lse_ptr, "lse_ptr")))
    rows, cols = _int_arg(rows, "rows"), _int_arg(cols, "cols")
    x_stride = cols if x_stride is None else _int_arg(x_stride, "x_stride", -2**63)
    y_stride = cols if y_stride is None else _int_arg(y_stride, "y_stride", -2**63)
    threads = _int_arg(threads, "threads", 0, 2**31 - 1)
    if device == "cuda":
        gpu = True
        if type(stream) is not int or stream < 0:
            stream = stream_handle(stream)
    elif device == "cpu":
        gpu = False
    else:
        raise InvalidArgumentError(f"softlight: device must be 'cuda' or 'cpu', got {device!r}")
    status = _C.forward_rows(x_ptr, x_stride, y_ptr, y_stride, rows, cols, code, gpu, stream if gpu else 0,
                             temperature, lse_ptr, threads)
    if status:
        check(status)
