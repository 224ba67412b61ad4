"""softlight inside JAX programs: jax.jit, jax.grad, jax.vmap, on the GPU and the CPU.

    import softlight.jax as slj
    y = slj.log_softmax(x, axis=-1)             # called as jax.nn.log_softmax is

It runs through XLA's FFI (python/jax_ffi.cpp): the forward and the backward are custom calls into
softlight's C ABI on XLA's own stream, and the gradient comes from softlight's backward through
jax.custom_vjp. The handlers are built where JAX is importable at build time:

    pip install --no-build-isolation .          # in an environment that has jax

(the default `pip install .` needs no JAX and builds none). Without them, importing this module
raises ImportError saying so. linear_cross_entropy, the LM head with its loss without the logits, is
written in JAX itself (python/softlight/_jax_linear.py).
"""
import ctypes
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ._api import _check_temperature
from ._jax_linear import linear_cross_entropy

_LIBS = sorted((Path(__file__).resolve().parent / "lib").glob("libsoftlight_jax.so*"))
if not _LIBS:
    raise ImportError("softlight was built without its JAX handlers: reinstall with "
                      "`pip install --no-build-isolation .` in an environment that has jax")
_lib = ctypes.cdll.LoadLibrary(str(_LIBS[0]))
for _op in ("forward", "backward"):
    jax.ffi.register_ffi_target(f"softlight_{_op}", jax.ffi.pycapsule(getattr(_lib, f"softlight_jax_{_op}_cpu")),
                                platform="cpu")
    jax.ffi.register_ffi_target(f"softlight_{_op}", jax.ffi.pycapsule(getattr(_lib, f"softlight_jax_{_op}_gpu")),
                                platform="CUDA")

_DTYPES = (jnp.float32, jnp.float16, jnp.bfloat16, jnp.float64)


def _forward(x, axis, temperature):
    """(y, log-sum-exp) of x along axis (counted from the end)."""
    lse_dtype = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    lse_shape = x.shape[:x.ndim + axis] + x.shape[x.ndim + axis + 1:] if x.ndim else ()
    call = jax.ffi.ffi_call("softlight_forward", (jax.ShapeDtypeStruct(x.shape, x.dtype),
                                                  jax.ShapeDtypeStruct(lse_shape, lse_dtype)),
                            vmap_method="broadcast_all")
    return call(x, axis=np.int64(axis), temperature=np.float64(temperature))


def _backward(g, y, axis):
    call = jax.ffi.ffi_call("softlight_backward", jax.ShapeDtypeStruct(y.shape, y.dtype), vmap_method="broadcast_all")
    return call(g, y, axis=np.int64(axis))


@partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _log_softmax(x, axis, temperature):
    return _forward(x, axis, temperature)[0]


def _log_softmax_fwd(x, axis, temperature):
    y = _forward(x, axis, temperature)[0]
    return y, y


def _log_softmax_bwd(axis, temperature, y, g):
    dx = _backward(g.astype(y.dtype), y, axis)
    return (dx if temperature == 1.0 else dx / jnp.asarray(temperature, dx.dtype),)


_log_softmax.defvjp(_log_softmax_fwd, _log_softmax_bwd)


def _end_axis(x, axis):
    n = max(x.ndim, 1)
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"softlight: axis must be an int, got {type(axis).__qualname__}")
    if not -n <= axis < n:
        raise IndexError(f"softlight: axis {axis} is out of range for a {x.ndim}-d array")
    return int(axis) % n - n  # counted from the end, so that vmap's leading axes leave it be


def log_softmax(x, axis=-1, *, temperature=1.0):
    """log_softmax(x / temperature) along axis, as jax.nn.log_softmax; differentiable (its gradient
    is softlight's backward), and usable under jax.jit and jax.vmap."""
    x = jnp.asarray(x)
    if x.dtype not in _DTYPES:
        raise TypeError(f"softlight: unsupported dtype {x.dtype}; supported: float32, float16, bfloat16, float64")
    return _log_softmax(x, _end_axis(x, axis), _check_temperature(temperature))


def logsumexp(x, axis=-1, *, temperature=1.0):
    """The log-sum-exp of x / temperature along axis (float32, float64 for float64), from the forward's
    pass (not differentiable through this function)."""
    x = jnp.asarray(x)
    return _forward(x, _end_axis(x, axis), _check_temperature(temperature))[1]


__all__ = ["log_softmax", "logsumexp", "linear_cross_entropy"]
