"""Bad input is refused by name, and nothing is written."""
import numpy as np
import pytest

import capi
import softlight
from softlight import InvalidArgumentError, SoftlightError, UnsupportedDTypeError
from reference import POISON


def poisoned(shape, dtype=np.float32):
    return np.full(shape, POISON, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_, np.complex64])
def test_integer_and_other_dtypes_are_refused(dtype):
    x = np.ones((2, 3), dtype=dtype)
    with pytest.raises(UnsupportedDTypeError, match="unsupported dtype .*supported: float32"):
        softlight.log_softmax(x)
    assert issubclass(UnsupportedDTypeError, TypeError)


def test_not_an_array():
    with pytest.raises(TypeError, match="DLPack"):
        softlight.log_softmax([[1.0, 2.0]])


def test_stream_with_cpu_array():
    with pytest.raises(TypeError, match="stream= applies to GPU arrays"):
        softlight.log_softmax(np.ones((2, 3), np.float32), stream=0)


def test_read_only_out_is_refused_and_untouched():
    x = np.ones((2, 3), np.float32)
    out = poisoned((2, 3))
    out.flags.writeable = False
    with pytest.raises(InvalidArgumentError, match="read-only"):
        softlight.log_softmax(x, out=out)
    assert (out == POISON).all()


@pytest.mark.parametrize("bad,match", [
    (poisoned((2, 4)), "shape"),
    (poisoned((3, 2)), "shape"),
    (poisoned((2, 3), np.float64), "dtype"),
])
def test_mismatched_out(bad, match):
    with pytest.raises(InvalidArgumentError, match=match):
        softlight.log_softmax(np.ones((2, 3), np.float32), out=bad)
    assert (bad == POISON).all()


def test_dim_must_be_in_range():
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(IndexError, match="out of range"):
        softlight.log_softmax(x, dim=3)
    with pytest.raises(IndexError, match="out of range"):
        softlight.log_softmax(x, dim=-4)
    with pytest.raises(TypeError, match="dim must be an int"):
        softlight.log_softmax(x, dim=1.0)
    with pytest.raises(TypeError, match="dim must be an int"):
        softlight.log_softmax(x, dim=True)
    for d in (-3, -1, 0, 1, 2):
        assert softlight.log_softmax(x, dim=d).shape == x.shape


@pytest.mark.parametrize("make,dim", [
    (lambda a: a.reshape(4, 3, 8)[:, ::2, :], -1),  # the axes before dim are not evenly spaced
    (lambda a: a.reshape(2, 6, 8)[:, 2:4, :], 2),   # a slice of the middle axis
    (lambda a: a.reshape(2, 6, 8)[:, :, 1:7], 0),   # the axes after dim are not evenly spaced
    (lambda a: a[:, ::-1], -1),                     # a negative stride
    (lambda a: a.T, 0),                             # a transpose
], ids=["gapped-3d", "middle-slice", "inner-gap", "negative", "transpose"])
def test_layouts_that_do_not_merge_are_computed(make, dim):
    """Views the C ABI does not read in place go through a contiguous copy (docs/semantics.md), into
    `out` of any layout as well."""
    a = np.random.default_rng(0).standard_normal((12, 8)).astype(np.float32)
    v = make(a)
    x64 = np.ascontiguousarray(v).astype(np.float64)
    ref = x64 - x64.max(dim, keepdims=True)
    ref -= np.log(np.exp(ref).sum(dim, keepdims=True))
    assert np.allclose(softlight.log_softmax(v, dim=dim), ref, atol=1e-6)
    out = make(np.full((12, 8), POISON, np.float32))
    assert softlight.log_softmax(v, dim=dim, out=out) is out and np.allclose(out, ref, atol=1e-6)
    g = make(np.random.default_rng(1).standard_normal((12, 8)).astype(np.float32))
    y = np.ascontiguousarray(softlight.log_softmax(v, dim=dim))
    want = np.ascontiguousarray(g) - np.exp(y) * np.ascontiguousarray(g).sum(dim, keepdims=True)
    assert np.allclose(softlight.log_softmax_backward(g, make(y.copy()) if False else y, dim), want, atol=1e-5)


def test_overlapping_out_is_refused():
    buf = poisoned((5, 4))
    x, out = buf[0:4], buf[1:5]  # same layout, shifted by a row
    with pytest.raises(InvalidArgumentError, match="overlap"):
        softlight.log_softmax(x, out=out)
    assert (buf == POISON).all()


class TestRawEntry:
    def test_null_pointers(self):
        y = poisoned((2, 3))
        with pytest.raises(InvalidArgumentError, match="pointer is null"):
            softlight.log_softmax_raw(0, y.ctypes.data, 2, 3, dtype="float32", device="cpu")
        assert (y == POISON).all()

    def test_negative_sizes(self):
        x, y = np.ones((2, 3), np.float32), poisoned((2, 3))
        for rows, cols in [(-1, 3), (2, -3)]:
            with pytest.raises(InvalidArgumentError, match="negative"):
                softlight.log_softmax_raw(x.ctypes.data, y.ctypes.data, rows, cols, dtype="float32", device="cpu")
        assert (y == POISON).all()

    def test_stride_smaller_than_cols(self):
        x, y = np.ones((2, 3), np.float32), poisoned((2, 3))
        with pytest.raises(InvalidArgumentError, match="stride"):
            softlight.log_softmax_raw(x.ctypes.data, y.ctypes.data, 2, 3, dtype="float32", x_stride=2,
                                      device="cpu")
        assert (y == POISON).all()

    def test_partial_overlap(self):
        buf = poisoned((4, 4))
        with pytest.raises(InvalidArgumentError, match="overlap"):
            softlight.log_softmax_raw(buf.ctypes.data, buf.ctypes.data + 4, 3, 3, dtype="float32", x_stride=4,
                                      y_stride=4, device="cpu")
        # same start but a different layout is an overlap too
        with pytest.raises(InvalidArgumentError, match="overlap"):
            softlight.log_softmax_raw(buf.ctypes.data, buf.ctypes.data, 2, 3, dtype="float32", x_stride=4,
                                      y_stride=3, device="cpu")
        assert (buf == POISON).all()

    @pytest.mark.parametrize("dtype", ["int32", "float8", "complex64", np.int16])
    def test_unsupported_dtype_names(self, dtype):
        x, y = np.ones(4, np.float32), poisoned(4)
        with pytest.raises(UnsupportedDTypeError):
            softlight.log_softmax_raw(x.ctypes.data, y.ctypes.data, 1, 4, dtype=dtype, device="cpu")
        assert (y == POISON).all()

    def test_zero_sizes_are_a_no_op_even_with_null_pointers(self):
        for device in ("cpu", "cuda"):
            softlight.log_softmax_raw(0, 0, 0, 5, dtype="float32", device=device)
            softlight.log_softmax_raw(0, 0, 5, 0, dtype="float16", device=device)

    def test_gpu_entry_refuses_host_memory(self):
        # Where a GPU is present: host memory is not device memory. Where none is: no device.
        x, y = np.ones((2, 3), np.float32), poisoned((2, 3))
        with pytest.raises(SoftlightError, match="not CUDA device|no usable CUDA|built without the CUDA toolkit") as e:
            softlight.log_softmax_raw(x.ctypes.data, y.ctypes.data, 2, 3, dtype="float32")
        assert e.value.status in (6, 8)
        assert (y == POISON).all()

    def test_bad_device_and_stream_arguments(self):
        x, y = np.ones(4, np.float32), poisoned(4)
        with pytest.raises(ValueError, match="device must be"):
            softlight.log_softmax_raw(x.ctypes.data, y.ctypes.data, 1, 4, dtype="float32", device="tpu")
        with pytest.raises(TypeError, match="stream"):
            softlight.log_softmax_raw(x.ctypes.data, y.ctypes.data, 1, 4, dtype="float32", stream="s")
        with pytest.raises(ValueError, match="non-negative"):
            softlight.log_softmax_raw(x.ctypes.data, y.ctypes.data, 1, 4, dtype="float32", stream=-1)
        assert (y == POISON).all()


def test_status_strings_and_version():
    from softlight import _C
    for s in range(0, 12):
        assert _C.status_string(s) and "unknown" not in _C.status_string(s)
    assert "unknown" in _C.status_string(99)
    assert ".".join(map(str, softlight.version())) == softlight.__version__


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
def test_bad_temperature(bad):
    x, out = np.ones((2, 3), np.float32), poisoned((2, 3))
    with pytest.raises(InvalidArgumentError, match="temperature"):
        softlight.log_softmax(x, out=out, temperature=bad)
    with pytest.raises(InvalidArgumentError, match="temperature"):
        softlight.log_softmax_raw(x.ctypes.data, out.ctypes.data, 2, 3, dtype="float32", device="cpu",
                                  temperature=bad)
    with pytest.raises(TypeError, match="temperature"):
        softlight.log_softmax(x, temperature="hot")
    assert (out == POISON).all()


def test_lse_overlapping_x_or_y_is_refused():
    x, y = np.ones((4, 8), np.float32), poisoned((4, 8))
    for target in (x, y):
        with pytest.raises(InvalidArgumentError, match="overlap"):
            softlight.log_softmax_raw(x.ctypes.data, y.ctypes.data, 4, 8, dtype="float32", device="cpu",
                                      lse_ptr=target.ctypes.data + 8)
    assert (y == POISON).all()


def test_c_abi_rejects_bad_temperature_directly():
    x, y = np.ones((2, 3), np.float32), poisoned((2, 3))
    assert capi.forward_cpu(x.ctypes.data, 3, y.ctypes.data, 3, 2, 3, 0, 0, -2.0, 0) == 11
    assert capi.forward_cpu(x.ctypes.data, 3, y.ctypes.data, 3, 2, 3, 0, 0, 0.0, 0) == 0  # 0 means 1
    assert (y <= 0).all()


def test_missing_cuda_python_is_named(monkeypatch):
    """Without cuda-python (an optional extra), what needs it says how to get it."""
    import sys

    from softlight import _streams
    for name in ("cuda.core", "cuda.core.experimental"):
        monkeypatch.setitem(sys.modules, name, None)  # imports of these now fail
    with pytest.raises(ImportError, match=r"softlight\[cuda\]"):
        _streams._cuda_core()
