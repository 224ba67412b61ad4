"""The 3-d entries' layout checks against brute force, on random small layouts (CPU entry; the GPU
entry shares the same checks): an output is accepted only when its axes, ordered by stride, each step
past everything the smaller ones reach (the documented rule, which every view of an array meets), so
that no two of its elements alias; an accepted call never has an output element that is also an input
element unless the two arrays are the same (in place); and an accepted call computes what float64
computes."""
import numpy as np
import pytest

import capi
from reference import POISON, log_softmax_ref

F64 = 3  # softlight_dtype code


def offsets(n, s):
    o, d, i = np.meshgrid(np.arange(n[0]), np.arange(n[1]), np.arange(n[2]), indexing="ij")
    return o * s[0] + d * s[1] + i * s[2]  # [outer, dim, inner]


def steps_past(n, s):
    """The documented rule for outputs: with extent-1 axes left out and the others ordered by
    stride, each stride is at least the span of the smaller ones."""
    reach = 1
    for size, stride in sorted(((n[a], s[a]) for a in range(3) if n[a] > 1), key=lambda t: t[1]):
        if stride < reach:
            return False
        reach += stride * (size - 1)
    return True


def normalized(n, s):
    return tuple(0 if n[a] == 1 else s[a] for a in range(3))


@pytest.fixture
def rng():
    seed = np.random.SeedSequence().entropy % (2**32)
    print(f"seed={seed}")
    return np.random.default_rng(seed)


def test_random_layouts_against_brute_force(rng):
    buf_len = 4096
    accepted = refused_alias = refused_overlap = 0
    for _ in range(400):
        n = tuple(int(v) for v in rng.integers(1, 5, 3))
        xs = tuple(int(v) for v in rng.integers(0, 13, 3))
        ys = tuple(int(v) for v in rng.integers(0, 13, 3))
        x0, y0 = (int(v) for v in rng.integers(0, 600, 2))
        if rng.random() < 0.2:  # in place, sometimes
            y0, ys = x0, xs
        xo, yo = offsets(n, xs) + x0, offsets(n, ys) + y0
        buf = np.arange(buf_len, dtype=np.float64) * 1e-3
        before = buf.copy()
        st = capi.forward_3d_cpu(buf.ctypes.data + 8 * x0, xs, buf.ctypes.data + 8 * y0, ys, *n, F64, 1)
        y_aliases = len(set(yo.ravel().tolist())) < yo.size
        same = x0 == y0 and normalized(n, xs) == normalized(n, ys)
        if y_aliases:
            assert not steps_past(n, ys)  # the rule is sound: aliasing outputs break it
        if not steps_past(n, ys):
            assert st == 3, (n, ys, st)  # INVALID_STRIDE
            refused_alias += 1
        elif st == 5:  # OVERLAP: refused only when the spans meet and the arrays are not the same
            assert not same and xo.min() <= yo.max() and yo.min() <= xo.max()
            refused_overlap += 1
        else:
            assert st == 0, (n, xs, ys, x0, y0, st)
            assert same or not (set(xo.ravel().tolist()) & set(yo.ravel().tolist()))
            x = before[xo]  # [outer, dim, inner]
            assert np.allclose(buf[yo], log_softmax_ref(np.moveaxis(x, 1, -1)).transpose(0, 2, 1), atol=1e-12)
            accepted += 1
        if st != 0:
            assert np.array_equal(buf, before)  # a refused call wrote nothing
    assert accepted and refused_alias and refused_overlap  # every kind of case came up


def test_backward_layout_checks_cover_both_inputs():
    n = (2, 3, 4)
    s = (12, 4, 1)
    buf = np.full(200, POISON)
    p = buf.ctypes.data
    ok = capi.backward_3d_cpu(p, s, p + 8 * 50, s, p + 8 * 100, s, *n, F64)
    assert ok == 0
    assert capi.backward_3d_cpu(p, s, p + 8 * 50, s, p + 8 * 60, s, *n, F64) == 5  # dx overlaps y
    assert capi.backward_3d_cpu(p, s, p + 8 * 50, s, p + 8 * 10, s, *n, F64) == 5  # dx overlaps dy
    assert capi.backward_3d_cpu(p, s, p + 8 * 50, s, p + 8 * 50, s, *n, F64) == 0  # dx is y: in place
    assert capi.backward_3d_cpu(p, s, p + 8 * 50, s, p + 8 * 100, (12, 0, 1), *n, F64) == 3  # dx aliases
