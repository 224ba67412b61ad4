"""softlight's Python API: log-softmax of any DLPack array, and a raw-pointer entry.

One path a call: read the arrays (_arrays.read), make the output, one call into the bindings, which
work out the 3-d layout and call the C ABI, then turn the status into an exception.
"""
import math

from . import _C
from ._arrays import TORCH, device_name, empty_like, filled, read
from ._dtypes import BY_NAME, NAMES
from ._errors import ArgumentTypeError, AxisError, InvalidArgumentError, check
from ._streams import stream_handle, synchronize

# The bindings' layout codes (python/bindings.cpp), beside the C ABI's statuses.
_LAYOUT = {
    -2: "the axes before dim {d} of {name} (shape {shape}, strides {strides} in elements) do not merge into one "
        "evenly strided axis; pass a contiguous array (for example x.contiguous() or numpy.ascontiguousarray(x))",
    -3: "the axes after dim {d} of {name} (shape {shape}, strides {strides} in elements) do not merge into one "
        "evenly strided axis; pass a contiguous array (for example x.contiguous() or numpy.ascontiguousarray(x))",
    -4: "{name} has a negative stride (strides {strides}); pass a contiguous array",
}


def _fail(status, dim, arrays):
    """Raise the error of a status from the bindings (a C ABI status or a layout code)."""
    shape = tuple(arrays[0][1][1])
    if status == -1:
        raise AxisError(f"softlight: dim {dim} is out of range for a {len(shape)}-d array")
    if status in _LAYOUT:
        # Which array: the first whose own layout the bindings refuse (they check in this order; a
        # new output, strides None, is C-contiguous and never refused).
        for name, a in arrays:
            if a[2] is None:
                continue
            s = tuple(a[2])
            if _C.layout_code(a[1], s, dim) == status:
                break
        raise InvalidArgumentError("softlight: " + _LAYOUT[status].format(d=dim % max(len(shape), 1), name=name,
                                                                          shape=shape, strides=s), status)
    check(status)


def _check_dim(dim):
    if type(dim) is not int:
        if isinstance(dim, bool) or not hasattr(dim, "__index__"):
            raise ArgumentTypeError(f"softlight: dim must be an int, got {type(dim).__qualname__}")
        dim = dim.__index__()
    return dim


def _check_temperature(temperature):
    if type(temperature) is float and 0.0 < temperature < math.inf:
        return temperature
    if isinstance(temperature, (bool, str, bytes)) or not hasattr(temperature, "__float__"):
        raise ArgumentTypeError(f"softlight: temperature must be a real number, got {type(temperature).__qualname__}")
    t = float(temperature)
    if not (t > 0.0 and math.isfinite(t)):
        raise InvalidArgumentError(f"softlight: temperature must be finite and positive, got {temperature!r}")
    return t


def _matching(arr, like, name):
    """Checks an array that goes with the first one: same device, dtype and shape."""
    if arr[4] != like[4] or (arr[4] and arr[5] != like[5]):
        raise InvalidArgumentError(f"softlight: {name} is on {device_name(arr)}, the input on {device_name(like)}")
    if arr[3] != like[3]:
        raise InvalidArgumentError(f"softlight: {name} has dtype {NAMES[arr[3]]}, the input {NAMES[like[3]]}")
    if tuple(arr[1]) != tuple(like[1]):
        raise InvalidArgumentError(f"softlight: {name} has shape {tuple(arr[1])}, the input {tuple(like[1])}")


def _first(a, stream):
    """(array as read, stream handle) of a call's first array: `stream`, else the framework's current
    stream, else the legacy default stream (0); stream= only for GPU arrays."""
    arr, handle = read(a, None if stream is None else stream_handle(stream))
    if handle is None:
        return arr, 0
    if not arr[4]:
        raise ArgumentTypeError("softlight: stream= applies to GPU arrays, and the arrays are on the CPU")
    return arr, handle


def _output(out, first, xa, stream, name):
    """(array, Array) of the result: `out`, or a new array like the first input."""
    if out is None:
        out = empty_like(first, xa)
        # A new torch or CuPy array: C-contiguous (strides None), its pointer all that is to read.
        if xa[7] == "torch":
            return out, (out.data_ptr(), xa[1], None, xa[3], xa[4], xa[5], False, "torch", None)
        if xa[7] == "cupy":
            return out, (out.data.ptr, xa[1], None, xa[3], True, xa[5], False, "cupy", None)
        return out, read(out, stream)[0]
    oa = read(out, stream)[0]
    _matching(oa, xa, name)
    if oa[6]:
        raise InvalidArgumentError(f"softlight: {name} is read-only")
    return out, oa


def _finish(arr, handle):
    """JAX tracks no foreign streams: its arrays are handed back only once the work is done."""
    if arr[7] == "jax" and arr[4]:
        synchronize(handle, arr[5])


def log_softmax(x, dim=-1, *, out=None, stream=None, temperature=1.0, return_lse=False):
    """Log-softmax of `x` along `dim`, computed in float32 (float64 for float64 inputs).

    x:      any DLPack array (numpy, torch, CuPy, JAX, ...) of float32, float16, bfloat16 or
            float64, on a CUDA GPU or the CPU, of any number of axes; `dim` any axis (negative
            counts from the end). Strided views work as they are, without a copy, when the axes
            before `dim` merge into one evenly strided axis and so do those after it (always true
            of contiguous arrays and of slices along one axis); other views are refused with
            InvalidArgumentError (make them contiguous first).
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
    if temperature != 1.0 or type(temperature) is not float:
        temperature = _check_temperature(temperature)
    if type(dim) is not int:
        dim = _check_dim(dim)
    t = TORCH
    if type(x) is t[0] and stream is None and not return_lse:
        # A CUDA tensor with the defaults of the common call: read inline (each step saved is a
        # tenth of a microsecond or more of a call that costs about ten, docs/perf/host.json).
        code = t[1].get(x.dtype)
        dev = x.get_device()
        if code is not None and dev >= 0 and x.layout is t[2] and not x.is_neg():
            if out is None:
                y, ys = (t[4](x), None) if x.is_contiguous() else (None, None)
            elif type(out) is t[0] and out.dtype is x.dtype and out.get_device() == dev and out.layout is t[2] \
                    and not out.is_neg() and out.shape == x.shape:
                y, ys = out, out.stride()
            else:
                y = None
            if y is not None:
                status = _C.forward(x.data_ptr(), x.shape, x.stride(), y.data_ptr(), ys, dim, code, True, t[3](dev),
                                    temperature, 0)
                if status:
                    _fail(status, dim, (("x", read(x)[0]), ("out", read(y)[0])))
                return y
    xa, handle = _first(x, stream)
    gpu = xa[4]
    out, oa = _output(out, x, xa, handle, "out")
    lse, lse_ptr = None, 0
    if return_lse:
        nd = len(xa[1])
        if not -max(nd, 1) <= dim < max(nd, 1):
            raise AxisError(f"softlight: dim {dim} is out of range for a {nd}-d array")
        d = dim % max(nd, 1)
        shape = tuple(xa[1])
        lse = empty_like(x, xa, shape=shape[:d] + shape[d + 1:], dtype="float64" if xa[3] == 3 else "float32")
        lse_ptr = read(lse, handle)[0][0]
    status = _C.forward(xa[0], xa[1], xa[2], oa[0], oa[2], dim, xa[3], gpu, handle, temperature, lse_ptr)
    if status:
        _fail(status, dim, (("x", xa), ("out", oa)))
    _finish(xa, handle)
    if return_lse and 0 in tuple(xa[1]):
        shape = tuple(xa[1])
        d = dim % max(len(shape), 1)
        if shape[d] == 0 and math.prod(shape[:d] + shape[d + 1:]) > 0:
            lse = filled(lse, xa[7], -math.inf)  # the log-sum-exp of an empty axis; the library wrote nothing
    return (out, lse) if return_lse else out


def log_softmax_backward(grad_out, out, dim=-1, *, grad_in=None, stream=None):
    """The gradient of log_softmax: grad_out - exp(out) * grad_out.sum(dim, keepdim=True).

    grad_out: the gradient of the loss with respect to the forward's output (any DLPack array,
              float32, float16, bfloat16 or float64, GPU or CPU; layouts as for log_softmax).
    out:      the forward's output, of the same shape, dtype and device.
    grad_in:  optional array to write into (may be grad_out or out itself).
    For y = log_softmax(x / T), multiply the result by 1 / T. Returns grad_in, or a new array of
    the same kind as grad_out.
    """
    if type(dim) is not int:
        dim = _check_dim(dim)
    t = TORCH
    if type(grad_out) is t[0] and type(out) is t[0] and grad_in is None and stream is None:
        # CUDA tensors with the defaults, as autograd's backward calls it: read inline (log_softmax).
        code = t[1].get(grad_out.dtype)
        dev = grad_out.get_device()
        if code is not None and dev >= 0 and out.dtype is grad_out.dtype and out.get_device() == dev and \
                grad_out.layout is t[2] and out.layout is t[2] and not grad_out.is_neg() and not out.is_neg() and \
                out.shape == grad_out.shape and grad_out.is_contiguous():
            dx = t[4](grad_out)
            status = _C.backward(grad_out.data_ptr(), grad_out.shape, grad_out.stride(), out.data_ptr(), out.stride(),
                                 dx.data_ptr(), None, dim, code, True, t[3](dev))
            if status:
                _fail(status, dim, (("grad_out", read(grad_out)[0]), ("out", read(out)[0])))
            return dx
    ga, handle = _first(grad_out, stream)
    gpu = ga[4]
    ya = read(out, handle)[0]
    _matching(ya, ga, "out")
    grad_in, da = _output(grad_in, grad_out, ga, handle, "grad_in")
    status = _C.backward(ga[0], ga[1], ga[2], ya[0], ya[2], da[0], da[2], dim, ga[3], gpu, handle)
    if status:
        _fail(status, dim, (("grad_out", ga), ("out", ya), ("grad_in", da)))
    _finish(ga, handle)
    return grad_in


def log_softmax_raw(x_ptr, y_ptr, rows, cols, *, dtype, x_stride=None, y_stride=None, stream=0,
                    device="cuda", threads=0, temperature=1.0, lse_ptr=0):
    """Log-softmax over rows given as raw pointers (ints): `rows` rows of `cols` elements, each row
    `x_stride` / `y_stride` elements after the last (default: cols). device="cuda" queues the work
    on `stream` (asynchronous); device="cpu" runs it on host memory before returning, on `threads`
    threads (0: all cores). `lse_ptr`, if not 0, receives each row's log-sum-exp (float32, or
    float64 for float64 data)."""
    code = BY_NAME.get(dtype) if type(dtype) is str else None
    if code is None:
        from ._dtypes import code as code_of, normalize
        code = code_of(normalize(dtype))
    if temperature != 1.0 or type(temperature) is not float:
        temperature = _check_temperature(temperature)
    if device == "cuda":
        gpu = True
        if type(stream) is not int or stream < 0:
            stream = stream_handle(stream)
    elif device == "cpu":
        gpu = False
    else:
        raise InvalidArgumentError(f"softlight: device must be 'cuda' or 'cpu', got {device!r}")
    status = _C.forward_rows(x_ptr, cols if x_stride is None else x_stride, y_ptr, cols if y_stride is None else y_stride,
                             rows, cols, code, gpu, stream if gpu else 0, temperature, lse_ptr, threads)
    if status:
        check(status)
