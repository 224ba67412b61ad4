"""Hostile input on the CPU: exporters that lie or free early, malformed DLPack capsules, misaligned
and read-only memory, temperatures at their ends, the error taxonomy, long rows, many threads. Each
refusal leaves the output as it was, and the process (and the next call) carries on."""
import ctypes
import numpy as np
import pytest

import capi
import softlight
from softlight import ArgumentTypeError, AxisError, InvalidArgumentError, SoftlightError, UnsupportedDTypeError
from reference import POISON, assert_matches, in_threads, log_softmax_ref, log_softmax_ref_axis

F32 = 0


def poisoned(shape, dtype=np.float32):
    return np.full(shape, POISON, dtype)


# --- exporters -------------------------------------------------------------------------------------

class FreshExport:
    """__dlpack__ returns a capsule that owns a new buffer: the buffer lives as long as the capsule."""

    def __init__(self, shape, value):
        self.shape, self.value = shape, value

    def __dlpack__(self, **kw):
        return np.full(self.shape, self.value, np.float32).__dlpack__(**kw)

    def __dlpack_device__(self):
        return (1, 0)


def test_an_exporters_capsule_is_held_until_the_call_returns():
    """The capsule, not only the array, keeps the memory alive: a buffer owned by the capsule alone
    is read while the call runs (before, it was freed first: a crash, or reads of freed memory)."""
    out = poisoned((16, 1 << 16))
    softlight.log_softmax(FreshExport((16, 1 << 16), 3.0), out=out)
    assert np.allclose(out, -np.log(1 << 16), atol=1e-5)
    y = softlight.log_softmax(np.linspace(-1, 1, 96, dtype=np.float32).reshape(3, 32))
    out2 = FreshExport((3, 32), 0.0)  # an output owned by its capsule: written, then gone, no crash
    softlight.log_softmax(y, out=out2)


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl", _DLTensor), ("ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _Versioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl", _DLTensor)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class Crafted:
    """An exporter whose capsule says what the test wants (over `array`'s memory)."""

    def __init__(self, array, ndim=None, shape=True, device=(1, 0), capsule_device=1, versioned=False, flags=0):
        self.array = array
        self.shape_buf = (ctypes.c_int64 * max(1, array.ndim))(*array.shape)
        self.device = device
        dl = _DLTensor(array.ctypes.data, capsule_device, 0, array.ndim if ndim is None else ndim, 2, 32, 1,
                       self.shape_buf if shape else None, None, 0)
        if versioned:
            self.managed, self.name = _Versioned(1, 0, None, None, flags, dl), b"dltensor_versioned"
        else:
            self.managed, self.name = _Managed(dl, None, None), b"dltensor"

    def __dlpack__(self, **kw):
        return _capsule_new(ctypes.addressof(self.managed), self.name, None)

    def __dlpack_device__(self):
        return self.device


@pytest.mark.parametrize("kw", [dict(ndim=-1), dict(ndim=1_000_000), dict(shape=False), dict(capsule_device=2),
                                dict(capsule_device=2, versioned=True)],
                         ids=["ndim-1", "ndim-1e6", "null-shape", "says-cuda", "says-cuda-versioned"])
def test_malformed_capsules_are_refused(kw):
    x = np.ones((4, 8), np.float32)
    out = poisoned((4, 8))
    with pytest.raises(InvalidArgumentError):
        softlight.log_softmax(Crafted(x, **kw), out=out)
    assert (out == POISON).all()
    assert np.allclose(softlight.log_softmax(x), -np.log(8))  # and the next call works


def test_read_only_exports_are_not_written():
    x = np.ones((4, 8), np.float32)
    target = poisoned((4, 8))
    with pytest.raises(InvalidArgumentError, match="read-only"):
        softlight.log_softmax(x, out=Crafted(target, versioned=True, flags=1))
    assert (target == POISON).all()
    softlight.log_softmax(x, out=Crafted(target, versioned=True, flags=0))  # writable: written
    assert np.allclose(target, -np.log(8))


# --- memory ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,offset", [(np.float32, 2), (np.float64, 4), (np.float16, 1)])
def test_misaligned_pointers_are_refused(dtype, offset):
    """A pointer off its element's size is refused before anything is read (on the GPU such an
    access would end the process's CUDA context)."""
    item = np.dtype(dtype).itemsize
    raw = np.zeros(64 * item + offset, np.uint8)
    x = np.frombuffer(raw.data, dtype, count=64, offset=offset).reshape(8, 8)
    assert x.ctypes.data % item != 0
    out = poisoned((8, 8), dtype)
    with pytest.raises(InvalidArgumentError):
        softlight.log_softmax(x, out=out)
    assert (out == POISON).all()
    assert capi.forward_cpu(x.ctypes.data, 8, out.ctypes.data, 8, 8, 8, {4: 0, 2: 1, 8: 3}[item]) == 11


def test_long_rows_stream_with_bounded_scratch(rng):
    """Rows past the workers' scratch (16 K elements) are streamed: the same results, whatever the
    length; at the boundary and past it, in every dtype and along a non-last axis."""
    for cols in (16384, 16385, 1 << 20):
        x = (rng.standard_normal((2, cols)) * 4).astype(np.float32)
        x[1, 7] = -np.inf
        assert_matches(softlight.log_softmax(x), log_softmax_ref(x), "float32", f"cols {cols}")
    x = (rng.standard_normal((3, 20000, 2)) * 4).astype(np.float16)
    assert_matches(softlight.log_softmax(x, dim=1), log_softmax_ref_axis(x, 1), "float16", "axis 1")
    dy = rng.standard_normal((2, 20000)).astype(np.float32)
    y = softlight.log_softmax(rng.standard_normal((2, 20000)).astype(np.float32))
    dx = softlight.log_softmax_backward(dy, y)
    ref = dy.astype(np.float64) - np.exp(y.astype(np.float64)) * dy.astype(np.float64).sum(-1, keepdims=True)
    assert np.abs(dx - ref).max() <= 1e-4


# --- temperature -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,t", [(np.float32, 1e-39), (np.float32, 3e-39), (np.float16, 1e-40),
                                     (np.float32, 1e38), (np.float32, 1e46), (np.float64, 1e-320),
                                     (np.float64, 1e308)])
def test_temperatures_whose_scale_leaves_the_type_are_refused(dtype, t):
    """1 / T must be a normal number of the accumulation type (float for float32, float16 and
    bfloat16, double for float64) that the exp can take (for float, times log2(e)); past the ends
    rows came out NaN with success."""
    x = np.array([[1.0, 2.0, -np.inf]], dtype)
    out = poisoned((1, 3), dtype)
    with pytest.raises(InvalidArgumentError, match="temperature"):
        softlight.log_softmax(x, out=out, temperature=t)
    assert (out == POISON).all()


@pytest.mark.parametrize("dtype,t", [(np.float32, 4.3e-39), (np.float32, 8e37), (np.float64, 1e-300),
                                     (np.float64, 1e300), (np.float32, 0.5), (np.float32, 7.0)])
def test_temperatures_in_range_are_exact(dtype, t):
    x = np.array([[1.0, 2.0, -np.inf, 0.5], [1e-30, -1e-30, 0.0, 1e-31]], dtype)
    y = softlight.log_softmax(x, temperature=t)
    with np.errstate(over="ignore"):
        ref = log_softmax_ref(x.astype(np.float64) / t).astype(dtype)  # past the type's range: -inf
    assert not np.isnan(y).any()
    assert np.array_equal(np.isinf(y), np.isinf(ref))
    fin = np.isfinite(ref)
    assert np.allclose(y[fin], ref[fin], rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-30), (y, ref)


# --- errors ----------------------------------------------------------------------------------------

def test_every_python_error_is_a_softlight_error():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(AxisError) as e:
        softlight.log_softmax(x, dim=2)
    assert isinstance(e.value, SoftlightError) and isinstance(e.value, IndexError)
    for bad_dim in (1.0, "1", True, None):
        with pytest.raises(ArgumentTypeError) as e:
            softlight.log_softmax(x, dim=bad_dim)
        assert isinstance(e.value, SoftlightError) and isinstance(e.value, TypeError)
    with pytest.raises(ArgumentTypeError):
        softlight.log_softmax([[1.0, 2.0]])
    for bad_t in ("2", True, b"2", None):
        with pytest.raises(ArgumentTypeError):
            softlight.log_softmax(x, temperature=bad_t)
    with pytest.raises(UnsupportedDTypeError) as e:
        softlight.log_softmax(np.ones((2, 3), np.int32))
    assert isinstance(e.value, SoftlightError)
    assert softlight.log_softmax(x, dim=np.int64(1)).shape == (2, 3)
    assert softlight.log_softmax(x, temperature=np.float32(2.0)).shape == (2, 3)


def test_out_of_range_enum_values_and_huge_layouts_get_statuses():
    x, y = np.ones((2, 3), np.float32), poisoned((2, 3))
    for code in (4, 99, -1, 1 << 30):
        assert capi.forward_cpu(x.ctypes.data, 3, y.ctypes.data, 3, 2, 3, code) == 4  # unsupported dtype
    big = 1 << 40
    st = capi.forward_3d_cpu(x.ctypes.data, (big, 0, 1), y.ctypes.data, (big, 0, 1), big, 1, big, F32)
    assert st in (2, 3)  # too large to address, or an output aliasing itself
    assert (y == POISON).all()


def test_bfloat16_numpy_arrays_from_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes (numpy's bfloat16) is not installed")
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(4, 16).astype(ml_dtypes.bfloat16)
    y = softlight.log_softmax(x)
    assert y.dtype == x.dtype
    assert_matches(y.astype(np.float32), log_softmax_ref(x.astype(np.float32)), "bfloat16")


# --- threads ---------------------------------------------------------------------------------------

def test_sixteen_threads_get_exact_results(rng):
    xs = [(rng.standard_normal((64, 3000)) * 3).astype(np.float32) for _ in range(16)]
    want = [softlight.log_softmax(x) for x in xs]

    def work(i):
        for _ in range(5):
            y = softlight.log_softmax(xs[i])
        return y
    got = in_threads(16, work)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
