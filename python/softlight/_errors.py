"""Exceptions raised by softlight, one per kind of status the C ABI returns."""
from . import _C


class SoftlightError(Exception):
    """Base class of softlight's errors; ``status`` is the C ABI status code (0 if none)."""

    def __init__(self, message, status=0):
        super().__init__(message)
        self.status = status


class InvalidArgumentError(SoftlightError, ValueError):
    """Bad sizes, strides, layout, overlap or pointer; nothing was written."""


class UnsupportedDTypeError(SoftlightError, TypeError):
    """A dtype softlight does not compute in; nothing was written."""


class DeviceError(SoftlightError, RuntimeError):
    """No usable CUDA device, an unsupported one, or a CUDA runtime failure."""


class ArgumentTypeError(SoftlightError, TypeError):
    """An argument of the wrong kind: not an array, a dim that is not an integer, a stream that is not
    a stream; nothing was written."""


class AxisError(SoftlightError, IndexError):
    """dim out of range for the array; nothing was written."""


class OutOfMemoryError(DeviceError, MemoryError):
    """Memory for a workspace or scratch could not be had; nothing was written."""


# Status codes of include/softlight/softlight.h.
SUCCESS = 0
_KIND = {
    1: InvalidArgumentError,  # null pointer
    2: InvalidArgumentError,  # size
    3: InvalidArgumentError,  # stride
    4: UnsupportedDTypeError,
    5: InvalidArgumentError,  # overlap
    6: InvalidArgumentError,  # not device memory
    7: InvalidArgumentError,  # device mismatch
    8: DeviceError,  # no device
    9: DeviceError,  # unsupported device
    10: DeviceError,  # CUDA error
    11: InvalidArgumentError,
    12: OutOfMemoryError,
    13: AxisError,
    14: InvalidArgumentError,  # a layout the N-d entries do not compute in place
}


def check(status, what="softlight"):
    """Raise the exception that matches a C ABI status (no-op on success)."""
    if status != SUCCESS:
        kind = _KIND.get(status, SoftlightError)
        if status == 8 and not _C.gpu_built():
            raise kind(f"{what}: this softlight was built without the CUDA toolkit (no nvcc at build time), so it "
                       f"computes on the CPU alone; reinstall it where nvcc is found for GPU arrays (status 8)", status)
        raise kind(f"{what}: {_C.status_string(status)} (status {status})", status)
