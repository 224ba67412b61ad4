"""Any axis, strided views and the backward on the CPU backend, against float64 references
(the same code paths' validation as the GPU's: every check runs before any work)."""
import numpy as np
import pytest

import capi
import softlight
from softlight import InvalidArgumentError, _C
from reference import (POISON, assert_matches, from_bfloat16_bits, log_softmax_grad_ref, log_softmax_ref,
                       log_softmax_ref_axis, logsumexp_ref, special_matrix, to_bfloat16_bits)

NP_DTYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16}
F32, BF16 = 0, 2  # softlight_dtype codes


@pytest.fixture
def rng():
    seed = np.random.SeedSequence().entropy % (2**32)
    print(f"seed={seed}")
    return np.random.default_rng(seed)


@pytest.mark.parametrize("shape", [(3, 5, 7), (2, 3, 4, 5), (1, 9, 1), (4, 1, 6), (6,), (2, 3000, 3)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", list(NP_DTYPES))
def test_every_axis_matches_float64(rng, shape, dtype):
    x = (rng.standard_normal(shape) * 4).astype(NP_DTYPES[dtype])
    for d in range(-len(shape), len(shape)):
        out = np.full(shape, POISON, dtype=x.dtype)
        assert softlight.log_softmax(x, dim=d, out=out) is out
        assert_matches(out, log_softmax_ref_axis(x, d), dtype, f"{shape} dim={d}")


@pytest.mark.parametrize("inner", [3, 8, 12, 16, 20, 24, 28, 40, 48, 56, 64])
@pytest.mark.parametrize("dtype", list(NP_DTYPES))
def test_middle_axis_over_a_few_inner_positions(rng, inner, dtype):
    """A middle axis over `inner` contiguous positions, in few outer blocks: each block is one span
    of interleaved positions (src/cpu/simd.hpp, flat_stats), read in blocks of whole rounds of its
    vectors, and split among threads where it is long (6000 x 24 is three blocks of 2048 and more)."""
    for outer, dim in ((1, 6000), (3, 300)):
        x = (rng.standard_normal((outer, dim, inner)) * 4).astype(NP_DTYPES[dtype])
        y, lse = softlight.log_softmax(x, dim=1, return_lse=True, temperature=1.5)
        z = np.moveaxis(x.astype(np.float64) / 1.5, 1, -1)
        what = f"{(outer, dim, inner)} {dtype}"
        assert_matches(np.moveaxis(y, 1, -1), log_softmax_ref(z), dtype, what)
        assert_matches(lse, logsumexp_ref(z), "float64" if dtype == "float64" else "float32", what)


VIEWS = {
    "step2-last": (lambda a: a[:, :, ::2], -1),
    "step2-middle": (lambda a: a[:, ::2, :], 1),
    "transposed": (lambda a: a.reshape(24, 8).T, 0),
    "transposed-last": (lambda a: a.reshape(24, 8).T, -1),
    "sliced-inner": (lambda a: a[1:, :, 2:5], 1),
    "broadcast": (lambda a: np.broadcast_to(a[:, :1, :], a.shape), 1),  # stride 0 along dim
}


@pytest.mark.parametrize("view", list(VIEWS))
def test_strided_views_are_read_in_place(rng, view):
    make, d = VIEWS[view]
    x = make((rng.standard_normal((4, 6, 8)) * 3).astype(np.float32))
    out = np.full(x.shape, POISON, np.float32)
    softlight.log_softmax(x, dim=d, out=out)
    assert_matches(out, log_softmax_ref_axis(x, d), "float32", view)


def test_strided_out(rng):
    x = (rng.standard_normal((5, 7, 3)) * 3).astype(np.float32)
    buf = np.full((5, 14, 3), POISON, np.float32)
    out = buf[:, ::2, :]
    softlight.log_softmax(x, dim=1, out=out)
    assert_matches(out, log_softmax_ref_axis(x, 1), "float32")
    assert (buf[:, 1::2, :] == POISON).all()  # the gaps are never written


def test_special_values_along_a_non_last_axis(rng):
    m = special_matrix(rng, 33)  # 7 rows of special cases
    x = np.ascontiguousarray(m.T)  # the cases now run down the columns
    y = softlight.log_softmax(x, dim=0)
    assert_matches(y, log_softmax_ref_axis(x, 0), "float32")


def test_in_place_non_last_axis(rng):
    x = (rng.standard_normal((3, 40, 5)) * 3).astype(np.float32)
    ref = log_softmax_ref_axis(x, 1)
    assert softlight.log_softmax(x, dim=1, out=x) is x
    assert_matches(x, ref, "float32")


def test_temperature_and_lse_along_an_axis(rng):
    x = (rng.standard_normal((4, 50, 6)) * 3).astype(np.float64)
    y, lse = softlight.log_softmax(x, dim=1, temperature=0.5, return_lse=True)
    assert lse.shape == (4, 6) and lse.dtype == np.float64
    assert_matches(y, log_softmax_ref_axis(x / 0.5, 1), "float64")
    assert_matches(lse, logsumexp_ref(np.moveaxis(x / 0.5, 1, -1)), "float64")


def test_bfloat16_axis_through_the_raw_entry(rng):
    xb = to_bfloat16_bits(rng.standard_normal((3, 70, 9)) * 3)
    yb = np.full(xb.shape, to_bfloat16_bits(np.float32(POISON)), np.uint16)
    st = capi.forward_3d_cpu(xb.ctypes.data, (630, 9, 1), yb.ctypes.data, (630, 9, 1), 3, 70, 9, BF16)
    assert st == 0
    assert_matches(from_bfloat16_bits(yb), log_softmax_ref_axis(from_bfloat16_bits(xb), 1), "bfloat16")


# --- the backward --------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,d", [((5, 7), -1), ((3, 1000), 1), ((2, 70000), -1), ((4, 9, 6), 1),
                                     ((4, 9, 6), 0), ((1, 1), 0), ((3, 3, 3, 3), 2)],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", list(NP_DTYPES))
def test_backward_matches_float64(rng, shape, d, dtype):
    x = (rng.standard_normal(shape) * 3).astype(NP_DTYPES[dtype])
    y = softlight.log_softmax(x, dim=d)
    dy = rng.standard_normal(shape).astype(NP_DTYPES[dtype])
    dx = np.full(shape, POISON, dtype=x.dtype)
    assert softlight.log_softmax_backward(dy, y, dim=d, grad_in=dx) is dx
    ref = log_softmax_grad_ref(dy, y, d)
    atol = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3}[dtype]
    # |dx| is bounded by |dy| + max|dy| * n * exp(y): an absolute bound scaled by the row's sum.
    scale = 1 + np.abs(dy.astype(np.float64)).sum(axis=d, keepdims=True)
    err = np.abs(dx.astype(np.float64) - ref) / scale
    assert err.max() <= atol, f"{dtype} {shape} dim={d}: {err.max():.3e}"


def test_backward_against_finite_differences(rng):
    """d/dx of sum(w * log_softmax(x)) equals the backward of w, to central-difference accuracy."""
    x = rng.standard_normal((3, 6)) * 2
    w = rng.standard_normal((3, 6))
    g = softlight.log_softmax_backward(w, softlight.log_softmax(x))
    h = 1e-6
    num = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        num[idx] = ((w * log_softmax_ref(x + e)).sum() - (w * log_softmax_ref(x - e)).sum()) / (2 * h)
    np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-8)


def test_backward_in_place_and_special_values():
    y = np.array([[0.0, -np.inf, np.log(0.5), np.log(0.5)], [np.nan, 0.0, -1.0, -2.0]], np.float32)
    dy = np.array([[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0]], np.float32)
    ref = log_softmax_grad_ref(dy, y)
    softlight.log_softmax_backward(dy, y, grad_in=dy)  # in place over grad_out
    assert dy[0, 1] == 2.0  # exp(-inf) = 0: dx = dy exactly
    assert np.isnan(dy[1]).tolist() == [True, False, False, False]
    assert_matches(dy[0], ref[0], "float32")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_backward_of_any_y(dtype):
    """The backward takes any y, not only log-softmax outputs: where exp(y) * sum(dy) passes the
    largest finite value of the dtype the result is infinite, as the float64 reference rounded to
    the dtype is (rows of 5 and of 70: the scalar tail and the vectors)."""
    for n in (5, 70):
        y = np.linspace(-800.0, 800.0, n).astype(dtype).reshape(1, n)
        dy = np.linspace(-1.0, 1.0, n).astype(dtype).reshape(1, n)
        dy[0, 0] = 2.0  # a sum away from 0
        with np.errstate(over="ignore", invalid="ignore"):
            ref = log_softmax_grad_ref(dy, y).astype(dtype).astype(np.float64)
        got = softlight.log_softmax_backward(dy, y)
        assert_matches(got, ref, dtype, f"n={n}")


def test_backward_bfloat16_raw(rng):
    yb = to_bfloat16_bits(log_softmax_ref(rng.standard_normal((4, 300))))
    gb = to_bfloat16_bits(rng.standard_normal((4, 300)))
    db = np.zeros_like(gb)
    assert capi.backward_cpu(gb.ctypes.data, 300, yb.ctypes.data, 300, db.ctypes.data, 300, 4, 300, BF16) == 0
    ref = log_softmax_grad_ref(from_bfloat16_bits(gb), from_bfloat16_bits(yb))
    err = np.abs(from_bfloat16_bits(db) - ref) / (1 + np.abs(from_bfloat16_bits(gb)).sum(-1, keepdims=True))
    assert err.max() < 8e-3


@pytest.mark.parametrize("bad,match", [
    (lambda g, y: (g, y[:, :3]), "shape"),
    (lambda g, y: (g, y.astype(np.float64)), "dtype"),
])
def test_backward_mismatched_inputs(bad, match):
    g, y = np.ones((2, 4), np.float32), np.zeros((2, 4), np.float32)
    with pytest.raises(InvalidArgumentError, match=match):
        softlight.log_softmax_backward(*bad(g, y))


def test_backward_partially_overlapping_grad_in_is_refused():
    buf = np.full((5, 4), POISON, np.float32)
    y = np.zeros((4, 4), np.float32)
    with pytest.raises(InvalidArgumentError, match="overlap"):
        softlight.log_softmax_backward(buf[0:4], y, grad_in=buf[1:5])
    assert (buf == POISON).all()


# --- the 3-d C entry's own checks ----------------------------------------------------------------

def test_3d_entry_checks():
    x = np.ones((2, 3, 4), np.float32)
    y = np.full((2, 3, 4), POISON, np.float32)
    s = (12, 4, 1)
    call = lambda xs=s, ys=s, n=(2, 3, 4), xp=x.ctypes.data, yp=y.ctypes.data: capi.forward_3d_cpu(  # noqa: E731
        xp, xs, yp, ys, *n, F32)
    assert call(ys=(12, -4, 1)) == 3          # negative stride
    assert call(ys=(12, 0, 1)) == 3           # the output aliases itself
    assert call(ys=(4, 4, 1)) == 3            # ... across axes too
    assert call(xs=(0, 0, 0)) == 0            # a broadcast input is fine
    assert call(n=(2, -1, 4)) == 2
    assert call(xp=0) == 1
    assert call(yp=x.ctypes.data + 4) == 5    # partial overlap
    assert call(yp=x.ctypes.data, ys=(12, 1, 3)) == 5  # same memory, another layout
    assert call(n=(2, 0, 4)) == 0             # nothing to do
    y[...] = POISON
    assert call(xp=x.ctypes.data, ys=(12, 0, 1)) == 3
    assert (y == POISON).all()
    assert call() == 0 and np.allclose(y, -np.log(3))


def test_layout_of_an_axis(rng):
    """The C ABI's 3-d form (outer, dim, inner) of random views along every axis: accepted
    exactly where the axes before and after dim each merge into one evenly strided axis, and then
    computing what float64 computes along that axis."""
    for _ in range(300):
        shape = tuple(int(v) for v in rng.choice([1, 1, 2, 3, 7], size=int(rng.integers(1, 5))))
        big = tuple(s * 2 for s in shape[:-1]) + (shape[-1] * 4,)
        base = rng.standard_normal(big).astype(np.float32)
        view = base[tuple(slice(None, None, int(rng.choice([1, 2]))) for _ in shape)]
        view = view[tuple(slice(0, s) for s in shape)]
        strides = tuple(s // 4 for s in view.strides)
        for d in range(len(shape)):
            code = _C.layout(shape, strides, d)[0]
            def merges(axes):
                axes = [(n, s) for n, s in axes if n != 1]
                return all(s == s2 * n2 for (n, s), (n2, s2) in zip(axes, axes[1:]))
            merged = merges(list(zip(shape[:d], strides[:d]))) and merges(list(zip(shape[d + 1:], strides[d + 1:])))
            want = 0 if 0 in shape or merged else 14  # SOFTLIGHT_ERROR_UNMERGED_LAYOUT
            assert code == want, (shape, strides, d)
            if code == 0:
                y = softlight.log_softmax(view, dim=d)
                ref = np.asarray(view, np.float64)
                ref = ref - ref.max(d, keepdims=True)
                ref -= np.log(np.exp(ref).sum(d, keepdims=True))
                assert np.abs(y - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max())
