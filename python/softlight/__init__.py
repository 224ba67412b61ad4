"""softlight: log-softmax at the speed of light, for any DLPack array.

    import softlight
    y = softlight.log_softmax(x)          # x: torch, CuPy, JAX or numpy; any dim (default -1)
    dx = softlight.log_softmax_backward(dy, y)
    loss = softlight.cross_entropy(logits, target)   # and token_logprobs, entropy, logsumexp (CPU)
"""
from pathlib import Path

from . import _C
from ._api import log_softmax, log_softmax_backward, log_softmax_raw
from ._consumers import cross_entropy, entropy, logsumexp, row_stats, row_stats_backward, token_logprobs
from ._errors import (ArgumentTypeError, AxisError, DeviceError, InvalidArgumentError, OutOfMemoryError,
                      SoftlightError, UnsupportedDTypeError)

__version__ = "0.1.0"

_HERE = Path(__file__).resolve().parent


def version():
    """The C library's version as (major, minor, patch)."""
    v = _C.version()
    return v // 10000, v // 100 % 100, v % 100


def include_dir():
    """Folder holding softlight/softlight.h (the C ABI)."""
    return str(_HERE / "include")


def library_path():
    """Path of the shared library libsoftlight."""
    libs = sorted((_HERE / "lib").glob("libsoftlight.so*")) or sorted((_HERE / "lib").glob("*softlight*"))
    return str(libs[0]) if libs else ""


def cmake_dir():
    """Pass as -Dsoftlight_DIR=... so that CMake's find_package(softlight) finds this install."""
    return str(_HERE / "lib" / "cmake" / "softlight")


__all__ = ["log_softmax", "log_softmax_backward", "log_softmax_raw", "cross_entropy", "token_logprobs", "entropy",
           "logsumexp", "row_stats", "row_stats_backward", "SoftlightError", "InvalidArgumentError",
           "UnsupportedDTypeError", "DeviceError", "ArgumentTypeError", "AxisError", "OutOfMemoryError", "version",
           "include_dir", "library_path",
           "cmake_dir", "__version__"]
