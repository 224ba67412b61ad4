"""softlight's Python API: log-softmax of any DLPack array, and a raw-pointer entry."""
import math

from . import _C
from . import _dtypes
from ._arrays import (CUDA, CUDA_MANAGED, dlpack_device, empty_like, export, filled, finish, prepare_input,
                      ready_for_foreign_stream, default_stream)
from ._errors import InvalidArgumentError, check
from ._streams import stream_handle


def _normalize_dim(dim, ndim):
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"softlight: dim must be an int, got {type(dim).__qualname__}")
    n = max(ndim, 1)  # a 0-d array behaves as one element along dim 0 / -1
    if not -n <= dim < n:
        raise IndexError(f"softlight: dim {dim} is out of range for a {ndim}-d array")
    return dim % n


def _rows_layout(view, name):
    """(rows, cols, row_stride) of an array taken as rows of its last axis."""
    shape, strides = view.shape, view.strides
    if not shape:
        return 1, 1, 1
    cols = shape[-1]
    rows = math.prod(shape[:-1])
    if rows == 0 or cols == 0:
        return rows, cols, cols  # nothing is read or written: any layout will do
    if cols > 1 and strides[-1] != 1:
        raise InvalidArgumentError(
            f"softlight: the last axis of {name} must be contiguous (stride 1), got stride {strides[-1]}; "
            f"supported layouts are C-contiguous arrays and 2-d arrays with padded rows")
    lead = [(n, s) for n, s in zip(shape[:-1], strides[:-1]) if n != 1]
    if rows <= 1 or not lead:
        return rows, cols, cols
    row_stride = lead[-1][1]
    expected = row_stride
    for n, s in reversed(lead):
        if s != expected:
            raise InvalidArgumentError(
                f"softlight: the leading axes of {name} (shape {shape}, strides {strides} in elements) do not "
                f"form evenly spaced rows; pass a C-contiguous array or a row-strided 2-d view")
        expected *= n
    if row_stride < cols:
        raise InvalidArgumentError(
            f"softlight: rows of {name} overlap or run backwards (row stride {row_stride} < {cols} columns)")
    return rows, cols, row_stride


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
            float64, on a CUDA GPU or the CPU. `dim` must be its last axis; the array must be
            C-contiguous, or 2-d with rows a fixed stride apart.
    out:    optional array of the same shape, dtype and device to write into; may be `x` itself.
    stream: GPU arrays only. An int handle, a cuda.core Stream, or anything with
            __cuda_stream__. Default: the framework's current stream (torch, CuPy), else the
            legacy default stream.
    temperature: computes log_softmax(x / temperature), fused (finite and positive).
    return_lse: also return the log-sum-exp of each row of x / temperature (float32; float64 for
            float64 inputs), shape x.shape[:-1], from the same pass.
    Returns `out`, or a new array of the same kind as `x` on the same device; with return_lse, the
    pair (y, lse).
    """
    temperature = _check_temperature(temperature)
    dev_type, dev_id = dlpack_device(x)
    on_gpu = dev_type in (CUDA, CUDA_MANAGED)
    if stream is not None and not on_gpu:
        raise TypeError("softlight: stream= applies to GPU arrays, and x is a CPU array")
    x = prepare_input(x)
    handle = stream_handle(stream) if stream is not None else (default_stream(x, dev_id) if on_gpu else 0)
    if on_gpu:
        ready_for_foreign_stream(x)
    xv = export(x, dev_type, handle)
    ndim = len(xv.shape)
    d = _normalize_dim(dim, ndim)
    if ndim and d != ndim - 1:
        raise InvalidArgumentError(
            f"softlight: dim={dim} is not the last axis of a {ndim}-d array; this version computes "
            f"log-softmax over the last axis only (dim=-1)")
    rows, cols, x_stride = _rows_layout(xv, "x")

    if out is None:
        out = empty_like(x, xv)
        out_dev = dev_type, xv.device_id
    else:
        out_dev = dlpack_device(out)
    ov = export(out, out_dev[0], handle)
    if ov.on_gpu != xv.on_gpu or ov.device_id != xv.device_id:
        raise InvalidArgumentError(f"softlight: out is on {ov.device}, x on {xv.device}")
    if ov.dtype != xv.dtype:
        raise InvalidArgumentError(f"softlight: out has dtype {ov.dtype}, x has {xv.dtype}")
    if ov.shape != xv.shape:
        raise InvalidArgumentError(f"softlight: out has shape {ov.shape}, x has {xv.shape}")
    if ov.readonly:
        raise InvalidArgumentError("softlight: out is read-only")
    _, _, y_stride = _rows_layout(ov, "out")
    if on_gpu:
        ready_for_foreign_stream(out)

    lse, lse_ptr = None, 0
    if return_lse:
        lse = empty_like(x, xv, shape=xv.shape[:-1], dtype="float64" if xv.dtype == "float64" else "float32")
        lse_ptr = export(lse, dev_type, handle).ptr

    code = _dtypes.code(xv.dtype)
    if on_gpu:
        status = _C.forward(xv.ptr, x_stride, ov.ptr, y_stride, rows, cols, code, handle, temperature, lse_ptr)
    else:
        status = _C.forward_cpu(xv.ptr, x_stride, ov.ptr, y_stride, rows, cols, code, 0, temperature, lse_ptr)
    check(status)
    finish(x, xv, handle)
    if return_lse and cols == 0 and rows > 0:
        lse = filled(lse, -math.inf)  # the log-sum-exp of an empty row; the library wrote nothing
    return (out, lse) if return_lse else out


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
