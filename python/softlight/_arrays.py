"""Reading arrays: pointer, shape, strides, dtype and device, by the cheapest correct means each
framework offers, and making a result array of the same kind.

A reader returns the tuple described at PTR below. torch tensors are read from their attributes in C
(python/torch_entry.cpp), CuPy arrays from theirs (a DLPack export costs several microseconds a
call); every other array through DLPack, whose capsule the tuple holds (`keep`) so that the
producer's export stays alive until the call is done.
"""
import sys

from . import _C
from ._dtypes import BY_DLPACK, BY_NAME, describe_dlpack
from ._errors import ArgumentTypeError, InvalidArgumentError, UnsupportedDTypeError

# DLPack device types (dlpack.h: DLDeviceType)
CPU, CUDA, CUDA_HOST, CUDA_MANAGED = 1, 2, 3, 13
_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal",
                 10: "rocm", 13: "cuda_managed", 14: "oneapi"}
NO_SYNC = -1  # DLPack's stream value for "no synchronization wanted"


# An array as read: the tuple (ptr, shape, strides in elements, dtype code, on_gpu, device_id,
# readonly, framework, keep). A plain tuple: made at every call, and any class costs more to make.
PTR, SHAPE, STRIDES, DTYPE, ON_GPU, DEVICE_ID, READONLY, FRAMEWORK, KEEP = range(9)


def device_name(arr):
    return f"cuda:{arr[DEVICE_ID]}" if arr[ON_GPU] else "cpu"


def _unsupported(what):
    return UnsupportedDTypeError(f"softlight: unsupported dtype {what}; supported: {', '.join(BY_NAME)}")


# --- torch ---------------------------------------------------------------------------------------

_torch_codes = {}


class _Torch:
    """torch's objects the Python side of the torch paths needs, set by _torch_setup when torch is
    first met: the type torch.Tensor (None until then), torch.strided, torch.is_grad_enabled, and
    autograd's version bump of a tuple of tensors."""
    __slots__ = ("tensor", "strided", "grad_enabled", "bump")

    def __init__(self):
        self.tensor = self.strided = self.grad_enabled = self.bump = None


TORCH = _Torch()


def _torch_setup():
    """Hands torch's objects to the C reader (python/torch_entry.cpp), once torch is loaded."""
    torch = sys.modules["torch"]
    if TORCH.tensor is torch.Tensor:
        return torch
    from . import _torch_private as private  # torch is loaded: its private entry points, named there
    from ._errors import check
    _torch_codes.update({torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3})
    _C.torch_setup(torch.Tensor, torch.strided, (torch.float32, torch.float16, torch.bfloat16, torch.float64),
                   torch.empty_like, private.raw_stream, torch.is_grad_enabled, private.any_autocast,
                   private.transforms_active, private.dispatch_stack_len, private.tracing_state, check,
                   private.increment_version)
    TORCH.strided, TORCH.grad_enabled, TORCH.bump = torch.strided, torch.is_grad_enabled, private.increment_version
    TORCH.tensor = torch.Tensor
    return torch


def no_autograd(a, name):
    """Refuse a torch tensor that autograd would have to follow through a plain call (which records no
    graph): under grad mode an input that requires grad would get a result without a grad_fn."""
    if a.requires_grad and TORCH.grad_enabled():
        raise InvalidArgumentError(
            f"softlight: {name} requires grad, and the plain API records no autograd graph; use softlight.torch "
            f"(for example softlight.torch.log_softmax), or call under torch.no_grad() or with {name}.detach()")


def writing(a, name):
    """A torch tensor softlight is about to write in place: refused where it requires grad under grad
    mode (as torch refuses out= with autograd), else its version counter bumped, so that autograd sees
    the change to a tensor saved for a backward."""
    if a.requires_grad and TORCH.grad_enabled():
        raise InvalidArgumentError(f"softlight: {name} requires grad; arrays written in place (out=, grad=) do not "
                                   f"support automatic differentiation")
    TORCH.bump((a,))


def read_torch(a, stream):
    """A torch tensor (any subclass), read in C (_C.torch_read); its current stream is the call's
    unless one is given."""
    got = _torch_read(a)
    if got is None:
        if TORCH.tensor is None:  # first use
            _torch_setup()
            return read_torch(a, stream)
        raise _torch_refusal(a)
    if stream is None or stream == got[1]:
        return got
    if not got[0][ON_GPU]:
        return got[0], stream
    # Another stream: the export has torch make that stream wait for the current one's work.
    return read_dlpack(a.detach(), stream, "torch")


_torch_read = _C.torch_read


def _torch_refusal(a):
    """Why the C reader does not take a tensor (the error to raise)."""
    if _torch_codes.get(a.dtype) is None:
        return _unsupported(str(a.dtype).replace("torch.", ""))
    if a.layout is not TORCH.strided:
        return InvalidArgumentError(f"softlight: {a.layout} tensors are not supported (strided ones are)")
    if a.is_neg():
        return InvalidArgumentError("softlight: a tensor with the negative bit set; call .resolve_neg() first")
    return InvalidArgumentError(f"softlight: tensors on {a.device} are not supported (CUDA and CPU ones are)")


# --- numpy dtypes (numpy and CuPy) ---------------------------------------------------------------

_numpy_codes = {}  # numpy dtype -> code: dtype.name builds a new string at every read (~3 us)


def numpy_code(dt):
    """The code of a numpy dtype (ml_dtypes' bfloat16 too), or raise UnsupportedDTypeError."""
    code = _numpy_codes.get(dt)
    if code is not None and dt.isnative:
        return code
    code = BY_NAME.get(dt.name)
    if code is None or not dt.isnative:
        raise _unsupported(dt.name if dt.isnative else f"{dt.name} (non-native byte order)")
    _numpy_codes[dt] = code
    return code


# --- CuPy ----------------------------------------------------------------------------------------

def _cupy_stream(dev):
    cupy = sys.modules["cupy"]
    if cupy.cuda.runtime.getDevice() == dev:
        return cupy.cuda.get_current_stream().ptr
    with cupy.cuda.Device(dev):
        return cupy.cuda.get_current_stream().ptr


def read_cupy(a, stream):
    code = numpy_code(a.dtype)
    item = a.itemsize
    strides = a.strides
    if any(s % item for s in strides):
        raise InvalidArgumentError(f"softlight: strides {strides} (bytes) are not whole elements")
    mem = a.data
    dev = mem.device_id
    current = _cupy_stream(dev)
    if stream is not None and stream != current:
        return read_dlpack(a, stream, "cupy")  # the export orders that stream after CuPy's
    stream = current
    return (mem.ptr, a.shape, tuple([s // item for s in strides]), code, True, dev, False, "cupy", None), stream


# --- numpy --------------------------------------------------------------------------------------

def read_numpy(a, stream):
    """A numpy array from its attributes (also ml_dtypes' bfloat16, which numpy cannot export)."""
    dt = a.dtype
    code = numpy_code(dt)
    item = dt.itemsize
    strides = a.strides
    if any(s % item for s in strides):
        raise InvalidArgumentError(f"softlight: strides {strides} (bytes) are not whole elements")
    return (a.__array_interface__["data"][0], a.shape, tuple([s // item for s in strides]), code, False, 0,
            not a.flags.writeable, "numpy", None), stream


# --- any DLPack array ----------------------------------------------------------------------------

def read_dlpack(a, stream, framework):
    """Any array with __dlpack__ and __dlpack_device__. On the GPU the producer is asked to make the
    array ready on `stream` (its handle; the legacy default stream where None)."""
    if not hasattr(a, "__dlpack__") or not hasattr(a, "__dlpack_device__"):
        raise ArgumentTypeError(f"softlight: expected an array supporting DLPack (numpy, torch, CuPy, JAX, ...), "
                        f"got {type(a).__module__}.{type(a).__qualname__}")
    try:
        dev_type, dev_id = (int(v) for v in a.__dlpack_device__())
    except (TypeError, ValueError, OverflowError, AttributeError) as e:
        raise InvalidArgumentError(f"softlight: a malformed __dlpack_device__ (expected (device type, device "
                                   f"id)): {e}") from None
    if dev_type not in (CPU, CUDA, CUDA_HOST, CUDA_MANAGED):
        name = _DEVICE_NAMES.get(dev_type, f"device type {dev_type}")
        raise InvalidArgumentError(f"softlight: arrays on {name} are not supported (CUDA and CPU arrays are)")
    on_gpu = dev_type in (CUDA, CUDA_MANAGED)
    if framework == "jax" and on_gpu:
        a.block_until_ready()  # JAX's own streams are not ours to order against
    kwargs = {}
    if on_gpu:
        # DLPack reserves 0; 1 names the legacy default stream.
        kwargs["stream"] = 1 if not stream else stream
    try:
        cap = a.__dlpack__(max_version=(1, 0), **kwargs)
    except TypeError:  # a producer from before DLPack 1.0
        cap = a.__dlpack__(**kwargs)
    except BufferError as e:
        raise InvalidArgumentError(f"softlight: cannot read the array through DLPack: {e}") from e
    try:
        ptr, shape, strides, dl_dtype, (cap_type, cap_id), readonly = _C.dlpack_view(cap)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"softlight: a malformed DLPack export: {e}") from e
    if cap_type != dev_type or (on_gpu and cap_id != dev_id):
        raise InvalidArgumentError(f"softlight: the array says it is on {_DEVICE_NAMES.get(dev_type)}:{dev_id} "
                                   f"but its export on {_DEVICE_NAMES.get(cap_type)}:{cap_id}")
    code = BY_DLPACK.get(dl_dtype)
    if code is None:
        raise _unsupported(describe_dlpack(dl_dtype))
    flags = getattr(a, "flags", None)  # numpy's legacy export cannot signal read-only
    if flags is not None and not getattr(flags, "writeable", True):
        readonly = True
    return (ptr, shape, strides, code, on_gpu, dev_id, readonly, framework, cap), stream


_READERS = {}  # array type -> (reader, framework)


def _reader_for(t):
    root = t.__module__.split(".", 1)[0]
    torch = sys.modules.get("torch")
    if torch is not None and issubclass(t, torch.Tensor):
        _torch_setup()
        r = read_torch, "torch"
    elif root == "cupy" and t.__name__ == "ndarray":
        r = read_cupy, "cupy"
    elif root == "numpy" and t.__name__ == "ndarray":
        r = read_numpy, "numpy"
    else:
        r = None, "jax" if root in ("jax", "jaxlib") else root
    _READERS[t] = r
    return r


def read(a, stream=None):
    """(Array, stream handle) of `a`; `stream` None: the framework's current stream, if it has one."""
    reader, framework = _READERS.get(type(a)) or _reader_for(type(a))
    if reader is not None:
        return reader(a, stream)
    return read_dlpack(a, stream, framework)


# --- results -------------------------------------------------------------------------------------

def empty_like(a, arr, shape=None, dtype=None):
    """An uninitialised, C-contiguous array of the same kind and device as `a` (read as `arr`): by
    default of the same shape and dtype, else of `shape` and the dtype named `dtype`."""
    fw = arr[FRAMEWORK]
    if fw == "torch":
        torch = sys.modules["torch"]
        if shape is None and dtype is None:
            if a.is_contiguous():  # torch's default keeps that layout, and parses no keyword
                return torch.empty_like(a)
            return torch.empty_like(a, memory_format=torch.contiguous_format)
        return torch.empty(tuple(a.shape) if shape is None else shape,
                           dtype=a.dtype if dtype is None else getattr(torch, dtype), device=a.device)
    shape = tuple(arr[SHAPE]) if shape is None else tuple(shape)
    if fw == "numpy":
        import numpy as np
        return np.empty(shape, dtype=a.dtype if dtype is None else np.dtype(dtype))
    if fw == "cupy":
        cupy = sys.modules["cupy"]
        if dtype is None and cupy.cuda.runtime.getDevice() == arr[DEVICE_ID]:
            return cupy.empty(shape, a.dtype)
        with cupy.cuda.Device(arr[DEVICE_ID]):
            return cupy.empty(shape, dtype=a.dtype if dtype is None else cupy.dtype(dtype))
    if fw == "jax":
        import jax.numpy as jnp
        (device,) = a.devices()
        out = jnp.empty(shape, dtype=a.dtype if dtype is None else jnp.dtype(dtype), device=device)
        return out.block_until_ready()
    raise ArgumentTypeError(f"softlight: cannot make a result array like a {type(a).__module__}."
                    f"{type(a).__qualname__}; pass out= (any writable DLPack array of the same shape)")


def contiguous(a, framework):
    """A C-contiguous copy of `a` (read where its layout cannot be read in place)."""
    if framework == "torch":
        return a.contiguous()
    if framework == "numpy":
        import numpy as np
        return np.ascontiguousarray(a)
    if framework == "cupy":
        return sys.modules["cupy"].ascontiguousarray(a)
    raise InvalidArgumentError(f"softlight: cannot make a contiguous copy of a {type(a).__module__}."
                               f"{type(a).__qualname__}; pass a contiguous array")


def copy_into(out, src, framework):
    """out[...] = src, for a result computed in a contiguous array."""
    if framework == "torch":
        out.copy_(src)
    elif framework in ("numpy", "cupy"):
        out[...] = src
    else:
        raise InvalidArgumentError(f"softlight: cannot write into a {type(out).__module__}.{type(out).__qualname__} "
                                   f"of this layout; pass a contiguous out")


def filled(a, framework, value):
    """`a` with every element set to `value` (a new array for JAX, whose arrays are immutable)."""
    if framework == "jax":
        return a.at[...].set(value)
    a[...] = value
    return a
