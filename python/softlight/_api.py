"""softlight's Python API: log-softmax of any DLPack array, and a raw-pointer entry."""
import math

from . import _C
from . import _dtypes
from ._arrays import (CPU, CUDA, CUDA_MANAGED, NO_SYNC, dlpack_device, empty_like, filled, finish, framework_of,
                      framework_stream, prepare_input, read_view, ready_for_foreign_stream, torch_view)
from ._errors import InvalidArgumentError, check
from ._streams import stream_handle


def _normalize_dim(dim, ndim):
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"softlight: dim must be an int, got {type(dim).__qualname__}")
    n = max(ndim, 1)  # a 0-d array behaves as one element along dim 0 / -1
    if not -n <= dim < n:
        raise IndexError(f"softlight: dim {dim} is out of range for a {ndim}-d array")
    return dim % n


def _merge(shape, strides):
    """(extent, stride) of axes that form one evenly strided axis, else None. Axes of extent 1
    take no part; no axes at all give (1, 0)."""
    axes = [(n, s) for n, s in zip(shape, strides) if n != 1]
    if not axes:
        return 1, 0
    for (n, s), (n2, s2) in zip(axes, axes[1:]):
        if s != s2 * n2:
            return None
    return math.prod(n for n, _ in axes), axes[-1][1]


def _c_strides(shape):
    out, step = [0] * len(shape), 1
    for i in range(len(shape) - 1, -1, -1):
        out[i] = step
        step *= shape[i]
    return tuple(out)


def _axis_layout(view, d, name):
    """(outer, dim, inner) and the (outer, dim, inner) strides of an array taken along axis d."""
    shape, strides = view.shape, view.strides
    if shape and 0 not in shape and strides == _c_strides(shape):
        # C-contiguous (most calls): what _strided_layout gives such arrays, in fewer steps.
        outer, inner = math.prod(shape[:d]), math.prod(shape[d + 1:])
        return (outer, shape[d], inner), (shape[d] * inner if outer != 1 else 0, inner if shape[d] != 1 else 0,
                                          1 if inner != 1 else 0)
    return _strided_layout(shape, strides, d, name)


def _strided_layout(shape, strides, d, name):
    """_axis_layout of any layout."""
    if not shape:
        return (1, 1, 1), (0, 0, 0)
    if 0 in shape:  # nothing is read or written: any layout will do
        return (math.prod(shape[:d]), shape[d], math.prod(shape[d + 1:])), (0, 0, 0)
    before, after = _merge(shape[:d], strides[:d]), _merge(shape[d + 1:], strides[d + 1:])
    for part, where in ((before, "before"), (after, "after")):
        if part is None:
            raise InvalidArgumentError(
                f"softlight: the axes {where} dim {d} of {name} (shape {shape}, strides {strides} in elements) "
                f"do not merge into one evenly strided axis; pass a contiguous array (for example "
                f"x.contiguous() or numpy.ascontiguousarray(x))")
    if any(s < 0 for s in strides):
        raise InvalidArgumentError(f"softlight: {name} has a negative stride (strides {strides}); "
                                   f"pass a contiguous array")
    return (before[0], shape[d], after[0]), (before[1], strides[d] if shape[d] != 1 else 0, after[1])


def _layout_like(view, first, first_strides, d, name):
    """The (outer, dim, inner) strides of `view`, an array of `first`'s shape: first_strides where
    the two are laid out alike."""
    return first_strides if view.strides == first.strides else _axis_layout(view, d, name)[1]


class _Arrays:
    """The arrays of one call, read through DLPack on one device and stream."""

    def __init__(self, first, stream):
        self.framework = framework_of(first)
        first = prepare_input(first, self.framework)
        self.first = first
        attrs = torch_view(first) if self.framework == "torch" else None
        if attrs is not None:
            self.dev_type, self.dev_id = (CUDA if attrs.on_gpu else CPU), attrs.device_id
        else:
            self.dev_type, self.dev_id = dlpack_device(first)
        self.on_gpu = self.dev_type in (CUDA, CUDA_MANAGED)
        if stream is not None and not self.on_gpu:
            raise TypeError("softlight: stream= applies to GPU arrays, and the arrays are on the CPU")
        # Our stream: `stream`, else the framework's current stream (torch, CuPy), else the legacy
        # default stream. Where it is the framework's current stream, the arrays are ready on it
        # and their exports ask for no synchronization (the producer's work for that is not free).
        current = framework_stream(first, self.dev_id, self.framework) if self.on_gpu else None
        self.handle = stream_handle(stream) if stream is not None else (current if current is not None else 0)
        self.dlpack_stream = NO_SYNC if current is not None and self.handle == current else self.handle
        self.first_view = self.read(first, "x", framework=self.framework, attrs=attrs)

    def read(self, a, name, like=None, writable=False, framework=None, attrs=None):
        """The View of `a`; with `like`, checked to match it in device, dtype and shape."""
        fw = framework_of(a) if framework is None else framework
        # What a's export asks of its producer: NO_SYNC only for the first array's framework.
        sync = self.dlpack_stream if fw == self.framework else self.handle
        if like is not None and not writable:
            a = prepare_input(a, fw)
        v = read_view(a, fw, sync, attrs)
        if like is not None:
            if v.on_gpu != like.on_gpu or v.device_id != like.device_id:
                raise InvalidArgumentError(f"softlight: {name} is on {v.device}, the input on {like.device}")
            if v.dtype != like.dtype:
                raise InvalidArgumentError(f"softlight: {name} has dtype {v.dtype}, the input {like.dtype}")
            if v.shape != like.shape:
                raise InvalidArgumentError(f"softlight: {name} has shape {v.shape}, the input {like.shape}")
        if writable and v.readonly:
            raise InvalidArgumentError(f"softlight: {name} is read-only")
        if self.on_gpu:
            ready_for_foreign_stream(a, fw)
        return v

    def output(self, out, name):
        """(array, View) of the result: `out`, or a new array like the first input."""
        if out is None:
            out = empty_like(self.first, self.first_view)
        return out, self.read(out, name, like=self.first_view, writable=True)


def _check_temperature(temperature):
    try:
        t = float(temperature)
    except (TypeError, ValueError):
        raise TypeError(f"softlight: temperature must be a number, got {type(temperature).__qualname__}") from None
    if not (t > 0.0 and math.isfinite(t)):
        raise InvalidArgumentError(f"softlight: temperature must be finite and positive, got {temperature!r}")
    return t


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
    temperature = _check_temperature(temperature)
    arrays = _Arrays(x, stream)
    xv = arrays.first_view
    d = _normalize_dim(dim, len(xv.shape))
    n, x_strides = _axis_layout(xv, d, "x")
    out, ov = arrays.output(out, "out")
    y_strides = _layout_like(ov, xv, x_strides, d, "out")

    lse, lse_ptr = None, 0
    if return_lse:
        lse_shape = xv.shape[:d] + xv.shape[d + 1:]
        lse = empty_like(arrays.first, xv, shape=lse_shape, dtype="float64" if xv.dtype == "float64" else "float32")
        lse_ptr = arrays.read(lse, "lse").ptr

    code = _dtypes.code(xv.dtype)
    if arrays.on_gpu:
        status = _C.forward_3d(xv.ptr, x_strides, ov.ptr, y_strides, *n, code, arrays.handle, temperature, lse_ptr)
    else:
        status = _C.forward_3d_cpu(xv.ptr, x_strides, ov.ptr, y_strides, *n, code, 0, temperature, lse_ptr)
    check(status)
    finish(arrays.first, xv, arrays.handle, arrays.framework)
    if return_lse and n[1] == 0 and n[0] * n[2] > 0:
        lse = filled(lse, -math.inf)  # the log-sum-exp of an empty axis; the library wrote nothing
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
    arrays = _Arrays(grad_out, stream)
    gv = arrays.first_view
    yv = arrays.read(out, "out", like=gv)
    d = _normalize_dim(dim, len(gv.shape))
    n, g_strides = _axis_layout(gv, d, "grad_out")
    y_strides = _layout_like(yv, gv, g_strides, d, "out")
    grad_in, dv = arrays.output(grad_in, "grad_in")
    d_strides = _layout_like(dv, gv, g_strides, d, "grad_in")
    code = _dtypes.code(gv.dtype)
    if arrays.on_gpu:
        status = _C.backward_3d(gv.ptr, g_strides, yv.ptr, y_strides, dv.ptr, d_strides, *n, code, arrays.handle)
    else:
        status = _C.backward_3d_cpu(gv.ptr, g_strides, yv.ptr, y_strides, dv.ptr, d_strides, *n, code, 0)
    check(status)
    finish(arrays.first, gv, arrays.handle, arrays.framework)
    return grad_in


def log_softmax_raw(x_ptr, y_ptr, rows, cols, *, dtype, x_stride=None, y_stride=None, stream=0,
                    device="cuda", threads=0, temperature=1.0, lse_ptr=0):
    """Log-softmax over rows given as raw pointers (ints): `rows` rows of `cols` elements, each row
    `x_stride` / `y_stride` elements after the last (default: cols). device="cuda" queues the work
    on `stream` (asynchronous); device="cpu" runs it on host memory before returning, on `threads`
    threads (0: all cores). `lse_ptr`, if not 0, receives each row's log-sum-exp (float32, or
    float64 for float64 data)."""
    name = _dtypes.normalize(dtype)
    temperature = _check_temperature(temperature)
    x_stride = cols if x_stride is None else x_stride
    y_stride = cols if y_stride is None else y_stride
    if device == "cuda":
        status = _C.forward(int(x_ptr), x_stride, int(y_ptr), y_stride, rows, cols, _dtypes.code(name),
                            stream_handle(stream), temperature, int(lse_ptr))
    elif device == "cpu":
        status = _C.forward_cpu(int(x_ptr), x_stride, int(y_ptr), y_stride, rows, cols, _dtypes.code(name),
                                threads, temperature, int(lse_ptr))
    else:
        raise ValueError(f"softlight: device must be 'cuda' or 'cpu', got {device!r}")
    check(status)
