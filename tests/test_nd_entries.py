"""The C ABI's N-d entries (softlight_log_softmax_forward_nd and the rest), called as a C program
calls them: the axis merge they own, their statuses with nothing written, and their results against
float64 over views of every kind."""
import numpy as np
import pytest

import capi

F32, F64 = 0, 3
SUCCESS, NULL_POINTER, INVALID_SIZE, INVALID_AXIS, UNMERGED = 0, 1, 2, 13, 14


def reference(x, d):
    r = np.asarray(x, np.float64)
    r = r - r.max(d, keepdims=True)
    return r - np.log(np.exp(r).sum(d, keepdims=True))


def elems(a):
    return tuple(s // a.itemsize for s in a.strides)


def test_the_merge_of_the_axes():
    assert capi.layout_nd((4, 5, 6), (30, 6, 1), 1) == (SUCCESS, (4, 5, 6), (30, 6, 1))
    assert capi.layout_nd((4, 5, 6), (30, 6, 1), -1) == (SUCCESS, (20, 6, 1), (6, 1, 0))
    assert capi.layout_nd((2, 3, 4, 5), (60, 20, 5, 1), 1) == (SUCCESS, (2, 3, 20), (60, 20, 1))
    assert capi.layout_nd((4, 1, 6), (6, 99, 1), 2) == (SUCCESS, (4, 6, 1), (6, 1, 0))  # an axis of one: no part
    assert capi.layout_nd((), (), 0, ndim=0) == (SUCCESS, (1, 1, 1), (0, 0, 0))  # 0-d: one axis of one
    assert capi.layout_nd((), (), -1, ndim=0)[0] == SUCCESS
    assert capi.layout_nd((4, 0, 6), (1, 2, 3), 0)[0] == SUCCESS  # nothing read: any layout
    assert capi.layout_nd((4, 5, 6), (1, 24, 4), 1)[0] == SUCCESS  # a transpose along its middle axis
    assert capi.layout_nd((4, 5, 6), (30, 1, 5), 0)[0] == UNMERGED  # the axes after dim do not merge
    assert capi.layout_nd((4, 5, 6), (1, 4, 20), 2)[0] == UNMERGED  # nor those before it
    assert capi.layout_nd((4, 5), (-5, 1), 1)[0] == UNMERGED  # a negative stride
    assert capi.layout_nd((4, 5), (5, 1), 2)[0] == INVALID_AXIS
    assert capi.layout_nd((4, 5), (5, 1), -3)[0] == INVALID_AXIS
    assert capi.layout_nd((), (), 1, ndim=0)[0] == INVALID_AXIS
    assert capi.layout_nd((4, -5), (5, 1), 1)[0] == INVALID_SIZE
    assert capi.layout_nd((4, 5), (5, 1), 0, ndim=-1)[0] == INVALID_SIZE
    assert capi.layout_nd(None, None, 0, ndim=2)[0] == NULL_POINTER
    assert capi.layout_nd((1 << 40, 1 << 40), (1, 1), 0)[0] == SUCCESS
    assert capi.layout_nd((1 << 40, 1 << 40, 2), (2, 1, 1), 2)[0] == INVALID_SIZE  # outer overflows


@pytest.mark.parametrize("dtype,np_dtype,tol", [(F32, np.float32, 2e-6), (F64, np.float64, 1e-13)])
def test_views_against_float64(dtype, np_dtype, tol):
    rng = np.random.default_rng(7)
    base = rng.standard_normal((6, 5, 8)).astype(np_dtype)
    views = [base, base.transpose(1, 0, 2), base[:, ::2, :], base[::-1].copy()[:, :, 1:7], base.transpose(2, 1, 0),
             base[2:4]]
    for x in views:
        for d in range(-x.ndim, x.ndim):
            st, _, _ = capi.layout_nd(x.shape, elems(x), d)
            y = np.full(x.shape, np.nan, np_dtype)
            got = capi.forward_nd_cpu(x.ctypes.data, elems(x), y.ctypes.data, elems(y), x.shape, d, dtype)
            assert got == st, (x.shape, elems(x), d)
            if st == SUCCESS:
                assert np.abs(y - reference(x, d)).max() <= tol * 10
                g = rng.standard_normal(x.shape).astype(np_dtype)
                dx = np.full(x.shape, np.nan, np_dtype)
                assert capi.backward_nd_cpu(g.ctypes.data, elems(g), y.ctypes.data, elems(y), dx.ctypes.data,
                                            elems(dx), x.shape, d, dtype) == SUCCESS
                want = g - np.exp(np.asarray(y, np.float64)) * g.sum(d, keepdims=True, dtype=np.float64)
                assert np.abs(dx - want).max() <= tol * 100
            else:
                assert np.isnan(y).all()  # nothing written


def test_statuses_write_nothing():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.full_like(x, np.nan)
    call = lambda **k: capi.forward_nd_cpu(**dict(dict(x=x.ctypes.data, xs=(4, 1), y=y.ctypes.data, ys=(4, 1),  # noqa: E731
                                                        shape=(3, 4), dim=1, dtype=F32), **k))
    assert call(dim=2) == INVALID_AXIS
    assert call(xs=None) == NULL_POINTER
    assert call(ys=(1, 3)) == SUCCESS  # y transposed: each side of dim still one evenly strided axis
    y[:] = np.nan
    assert call(ys=(-4, 1)) == UNMERGED
    assert call(ndim=-1) == INVALID_SIZE
    assert call(dtype=9) == 4  # unsupported dtype, from the 3-d entry's checks
    assert np.isnan(y).all()
    assert call() == SUCCESS and np.abs(y - reference(x, 1)).max() < 1e-6
