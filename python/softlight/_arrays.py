"""Arrays in and out: reading any DLPack array, making a result of the same kind, and streams.

Only the DLPack protocol is needed to read an array. Making a result array "like x" needs the
array's framework; torch, CuPy, JAX and numpy are known. Any other DLPack producer works with
``out=`` given.
"""
import sys
from typing import NamedTuple

from . import _C
from . import _dtypes
from ._errors import InvalidArgumentError

# DLPack device types (dlpack.h: DLDeviceType)
CPU, CUDA, CUDA_HOST, CUDA_MANAGED = 1, 2, 3, 13
_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal",
                 10: "rocm", 13: "cuda_managed", 14: "oneapi"}


class View(NamedTuple):
    """What softlight needs of an array, read from its DLPack export (a named tuple: made at every
    call, and a frozen dataclass costs a microsecond more to make)."""

    ptr: int
    shape: tuple
    strides: tuple  # in elements
    dtype: str
    on_gpu: bool
    device_id: int
    readonly: bool

    @property
    def device(self):
        return f"cuda:{self.device_id}" if self.on_gpu else "cpu"


def dlpack_device(a):
    """(DLPack device type, id) of an array, with a clear error for non-arrays."""
    if not hasattr(a, "__dlpack__") or not hasattr(a, "__dlpack_device__"):
        raise TypeError(f"softlight: expected an array supporting DLPack (numpy, torch, CuPy, JAX, ...), "
                        f"got {type(a).__module__}.{type(a).__qualname__}")
    dev_type, dev_id = a.__dlpack_device__()
    dev_type = int(dev_type)
    if dev_type not in (CPU, CUDA, CUDA_HOST, CUDA_MANAGED):
        name = _DEVICE_NAMES.get(dev_type, f"device type {dev_type}")
        raise InvalidArgumentError(f"softlight: arrays on {name} are not supported (CUDA and CPU arrays are)")
    return dev_type, int(dev_id)


NO_SYNC = -1  # DLPack's stream value for "no synchronization wanted"


def export(a, dev_type, stream):
    """A View of `a`. For CUDA arrays `stream` goes to the producer: the handle of our stream, on
    which it makes `a` ready, or NO_SYNC where our work follows the producer's own current stream."""
    kwargs = {}
    if dev_type in (CUDA, CUDA_MANAGED):
        # DLPack reserves 0; 1 names the legacy default stream.
        kwargs["stream"] = 1 if stream == 0 else stream
    try:
        cap = a.__dlpack__(max_version=(1, 0), **kwargs)
    except TypeError:  # a producer from before DLPack 1.0
        cap = a.__dlpack__(**kwargs)
    except BufferError as e:
        # numpy refuses to export read-only arrays to old consumers; say what is wrong plainly.
        raise InvalidArgumentError(f"softlight: cannot read the array through DLPack: {e}") from e
    d = _C.dlpack_view(cap)
    dtype = _dtypes.from_dlpack(d["dtype_code"], d["dtype_bits"], d["dtype_lanes"])
    readonly = d["readonly"]
    flags = getattr(a, "flags", None)  # numpy's legacy export cannot signal read-only
    if flags is not None and hasattr(flags, "writeable"):
        readonly = readonly or not flags.writeable
    return View(ptr=d["ptr"], shape=tuple(d["shape"]), strides=tuple(d["strides"]), dtype=dtype,
                on_gpu=dev_type in (CUDA, CUDA_MANAGED), device_id=int(d["device_id"]), readonly=readonly)


def torch_view(a):
    """The View of a torch tensor read from its attributes, as its DLPack export gives it; None
    where the attributes cannot stand for the export (tensor subclasses, other layouts, devices or
    dtypes, views with the negative bit, tensors that require grad, which torch refuses to export).
    torch's __dlpack__ costs several microseconds a call (docs/design.md, "The Python call"); the
    attributes, a fraction of that."""
    torch = _torch()
    if type(a) is not torch.Tensor or a.requires_grad or a.layout is not torch.strided or a.is_neg():
        return None
    dtype = _torch_dtypes().get(a.dtype)
    if dtype is None:
        return None
    if a.is_cuda:
        on_gpu, device_id = True, a.get_device()
    elif a.is_cpu:
        on_gpu, device_id = False, 0
    else:
        return None
    return View(ptr=a.data_ptr(), shape=tuple(a.shape), strides=a.stride(), dtype=dtype, on_gpu=on_gpu,
                device_id=device_id, readonly=False)


def read_view(a, framework, stream, attrs=None):
    """The View of `a` for work on `stream` (as in export). A torch tensor's attributes
    (torch_view; `attrs` where already at hand) stand for its export where the export would ask
    nothing of torch: on the CPU, or on the GPU with stream NO_SYNC (our work follows torch's current
    stream). Otherwise, and for other arrays, the View comes through DLPack."""
    if attrs is None and framework == "torch":
        attrs = torch_view(a)
    if attrs is None:
        return export(a, dlpack_device(a)[0], stream)
    if attrs.on_gpu and stream != NO_SYNC:
        return export(a, CUDA, stream)
    return attrs


# --- frameworks ----------------------------------------------------------------------------------

def _torch():
    return sys.modules["torch"]


_TORCH_DTYPES = {}


def _torch_dtypes():
    """torch dtype -> softlight's name for it, for the dtypes softlight computes in."""
    if not _TORCH_DTYPES:
        t = _torch()
        _TORCH_DTYPES.update({t.float32: "float32", t.float16: "float16", t.bfloat16: "bfloat16",
                              t.float64: "float64"})
    return _TORCH_DTYPES


_FRAMEWORKS = {}  # array type -> framework name


def framework_of(a):
    fw = _FRAMEWORKS.get(type(a))
    if fw is None:
        root = type(a).__module__.split(".", 1)[0]
        fw = _FRAMEWORKS[type(a)] = "jax" if root in ("jax", "jaxlib") else root
    return fw


def _torch_stream(a, device_id):
    torch = _torch()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # the handle alone, without a Stream object
    return raw(device_id) if raw is not None else torch.cuda.current_stream(device_id).cuda_stream


def _cupy_stream(a, device_id):
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(device_id):
        return cupy.cuda.get_current_stream().ptr


def framework_stream(a, device_id, framework=None):
    """The framework's current stream on the device, for frameworks that have one (torch, CuPy),
    else None."""
    fw = framework or framework_of(a)
    if fw == "torch":
        return _torch_stream(a, device_id)
    if fw == "cupy":
        return _cupy_stream(a, device_id)
    return None


def prepare_input(a, framework=None):
    """The array as softlight reads it (torch tensors that require grad are read detached)."""
    if (framework or framework_of(a)) == "torch" and getattr(a, "requires_grad", False):
        return a.detach()
    return a


def empty_like(a, view, shape=None, dtype=None):
    """An uninitialised, C-contiguous array of the same kind and device as `a`: by default of the
    same shape and dtype, else of `shape` and the dtype named `dtype` ("float32", ...)."""
    fw = framework_of(a)
    shape = view.shape if shape is None else tuple(shape)
    if fw == "numpy":
        import numpy as np
        return np.empty(shape, dtype=a.dtype if dtype is None else np.dtype(dtype))
    if fw == "torch":
        torch = _torch()
        if shape == tuple(a.shape) and dtype is None:
            if a.is_contiguous():  # torch's default keeps that layout, and parses no keyword
                return torch.empty_like(a)
            return torch.empty_like(a, memory_format=torch.contiguous_format)
        return torch.empty(shape, dtype=a.dtype if dtype is None else getattr(torch, dtype), device=a.device)
    if fw == "cupy":
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(view.device_id):
            return cupy.empty(shape, dtype=a.dtype if dtype is None else cupy.dtype(dtype))
    if fw == "jax":
        import jax.numpy as jnp
        (device,) = a.devices()
        out = jnp.empty(shape, dtype=a.dtype if dtype is None else jnp.dtype(dtype), device=device)
        return out.block_until_ready()
    raise TypeError(f"softlight: cannot make a result array like a {type(a).__module__}."
                    f"{type(a).__qualname__}; pass out= (any writable DLPack array of the same shape)")


def filled(a, value):
    """`a` with every element set to `value` (a new array for JAX, whose arrays are immutable)."""
    if framework_of(a) == "jax":
        return a.at[...].set(value)
    a[...] = value
    return a


def finish(a, view, stream_handle, framework=None):
    """Framework-specific completion. JAX tracks no foreign streams, so its arrays are handed back
    only after the work is done; the other frameworks follow their stream."""
    if (framework or framework_of(a)) == "jax" and view.on_gpu:
        from ._streams import synchronize
        synchronize(stream_handle, view.device_id)


def ready_for_foreign_stream(a, framework=None):
    """JAX arrays are produced on JAX's own streams: wait for them before reading."""
    if (framework or framework_of(a)) == "jax":
        a.block_until_ready()
