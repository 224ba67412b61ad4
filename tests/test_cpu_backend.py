"""The CPU backend through the Python API and the raw entry, against the float64 reference."""
import numpy as np
import pytest

import softlight
from reference import (POISON, SPECIAL_ROWS, assert_matches, from_bfloat16_bits, log_softmax_ref,
                       logsumexp_ref, special_matrix, to_bfloat16_bits)

SHAPES = [(1, 1), (5, 1), (4, 3), (3, 4), (17, 32), (9, 100), (6, 1000), (5, 4097), (3, 65536),
          (2, 1_000_003)]
NP_DTYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16}


@pytest.fixture
def rng(request):
    # Fresh data every run; the seed is printed so that a failure can be replayed.
    seed = np.random.SeedSequence().entropy % (2**32)
    print(f"seed={seed}")
    return np.random.default_rng(seed)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", list(NP_DTYPES))
def test_api_matches_float64(rng, shape, dtype):
    x = (rng.standard_normal(shape) * 4).astype(NP_DTYPES[dtype])
    out = np.full(shape, POISON, dtype=NP_DTYPES[dtype])
    r = softlight.log_softmax(x, out=out)
    assert r is out
    assert_matches(out, log_softmax_ref(x), dtype, f"{dtype} {shape}")


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_raw_bfloat16_matches_float64(rng, shape):
    xb = to_bfloat16_bits(rng.standard_normal(shape) * 4)
    yb = np.full(shape, to_bfloat16_bits(np.float32(POISON)), dtype=np.uint16)
    softlight.log_softmax_raw(xb.ctypes.data, yb.ctypes.data, shape[0], shape[1], dtype="bfloat16",
                              device="cpu")
    assert_matches(from_bfloat16_bits(yb), log_softmax_ref(from_bfloat16_bits(xb)), "bfloat16")


def test_returns_new_numpy_array(rng):
    x = rng.standard_normal((3, 7, 11)).astype(np.float32)
    y = softlight.log_softmax(x)
    assert isinstance(y, np.ndarray) and y.shape == x.shape and y.dtype == x.dtype
    assert_matches(y, log_softmax_ref(x), "float32")
    y0 = softlight.log_softmax(np.array(3.0, dtype=np.float32))
    assert y0.shape == () and y0 == 0.0


@pytest.mark.parametrize("dtype", list(NP_DTYPES))
def test_special_values_table(dtype):
    for row, expected in SPECIAL_ROWS:
        x = np.array([row], dtype=NP_DTYPES[dtype])
        assert_matches(softlight.log_softmax(x), np.array([expected]), dtype, f"row {row}")
    # x - max overflows in float32 and gives -inf, as in torch; float64 keeps it finite.
    y = softlight.log_softmax(np.array([[3e38, -3e38, 0.0]], dtype=np.float32))
    assert y.tolist() == [[0.0, -np.inf, np.float32(-3e38)]]
    assert softlight.log_softmax(np.array([[5.0]], dtype=np.float32)).tolist() == [[0.0]]


@pytest.mark.parametrize("cols", [1, 3, 4097, 70_000])
@pytest.mark.parametrize("dtype", list(NP_DTYPES))
def test_special_values_random(rng, cols, dtype):
    x = special_matrix(rng, cols, NP_DTYPES[dtype])
    assert_matches(softlight.log_softmax(x), log_softmax_ref(x), dtype)


@pytest.mark.parametrize("dtype", list(NP_DTYPES))
def test_row_strided_views(rng, dtype):
    big = (rng.standard_normal((6, 50)) * 3).astype(NP_DTYPES[dtype])
    x = big[:, 3:40]  # rows 50 apart, 37 columns, offset start
    out_big = np.full((6, 64), POISON, dtype=NP_DTYPES[dtype])
    out = out_big[:, 5:42]
    softlight.log_softmax(x, out=out)
    assert_matches(out, log_softmax_ref(x), dtype)
    assert (out_big[:, :5] == POISON).all() and (out_big[:, 42:] == POISON).all()  # gaps untouched


def test_in_place(rng):
    x = (rng.standard_normal((8, 333)) * 3).astype(np.float32)
    ref = log_softmax_ref(x)
    r = softlight.log_softmax(x, out=x)
    assert r is x
    assert_matches(x, ref, "float32")


def test_collapsible_leading_axes(rng):
    x = rng.standard_normal((4, 5, 6, 7)).astype(np.float32)
    assert_matches(softlight.log_softmax(x, dim=3), log_softmax_ref(x), "float32")
    assert_matches(softlight.log_softmax(x[1:3]), log_softmax_ref(x[1:3]), "float32")
    assert_matches(softlight.log_softmax(x[:, 2:3, :1]), log_softmax_ref(x[:, 2:3, :1]), "float32")


def test_empty_arrays():
    for shape in [(0, 5), (5, 0), (0,), (2, 0, 3)]:
        y = softlight.log_softmax(np.zeros(shape, np.float32))
        assert y.shape == shape


def test_many_threads_agree(rng):
    x = (rng.standard_normal((257, 3001)) * 5).astype(np.float32)
    ys = []
    for threads in (1, 2, 7):
        y = np.full_like(x, POISON)
        softlight.log_softmax_raw(x.ctypes.data, y.ctypes.data, *x.shape, dtype="float32", device="cpu",
                                  threads=threads)
        ys.append(y)
    assert_matches(ys[0], log_softmax_ref(x), "float32")
    assert np.array_equal(ys[0], ys[1]) and np.array_equal(ys[0], ys[2])


def test_float16_conversions_round_to_nearest_even():
    # Every finite float16 value fed through a one-column row gives 0 (or NaN for NaN/inf): the
    # conversion itself is checked by a two-column row whose output is exactly -log(2).
    vals = np.arange(0, 1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = vals[np.isfinite(vals)]
    x = np.stack([finite, finite], axis=1)
    y = softlight.log_softmax(x)
    assert np.all(y == np.float16(-np.log(2.0)))
    single = softlight.log_softmax(vals.reshape(-1, 1))
    assert np.array_equal(np.isnan(single[:, 0]), ~np.isfinite(vals) | (vals == -np.inf))
    assert np.all(single[np.isfinite(vals), 0] == 0)


def test_float16_conversions_exactly_as_numpy():
    """Every float16 value converts to float exactly: the lse of an axis of one element is x (NaN for
    +inf). Floats round to float16 as numpy rounds them (nearest even; subnormals, overflow, NaN):
    grad_scale's x * k in float, then stored, over every float16 value and several k. Both through
    the vector kernels and their scalar tails (rows of 4093: a tail in each)."""
    from softlight import _C
    vals = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    _, lse = softlight.log_softmax(vals[:-5].reshape(-1, 1), 1, return_lse=True)
    want = vals[:-5].astype(np.float32)
    want[want == np.inf] = np.nan
    nan = np.isnan(want)
    assert lse.dtype == np.float32 and np.array_equal(np.isnan(lse), nan)
    assert np.array_equal(lse[~nan].view(np.uint32), want[~nan].view(np.uint32))
    cols, stride = 4093, 4096
    for k in (0.5, 3.0, 1 / 3, 2.0**-10, 2.0**-20, 1e4, -0.7, 65504.0):
        g = np.zeros((16, stride), np.float16)
        g.reshape(-1)[:] = vals
        want = (g[:, :cols].astype(np.float32) * np.float32(k)).astype(np.float16)
        f = np.array([k], np.float32)
        assert _C.cross_entropy_grad_scale(g.ctypes.data, stride, 16, cols, 1, f.ctypes.data, 1, 2) == 0
        got = g[:, :cols]
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan), k
        assert np.array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16)), k


@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("shape", [(4, 1), (9, 100), (5, 4097), (2, 1_000_003)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", list(NP_DTYPES))
def test_temperature_and_lse(rng, shape, dtype, temperature):
    x = (rng.standard_normal(shape) * 4).astype(NP_DTYPES[dtype])
    y, lse = softlight.log_softmax(x, temperature=temperature, return_lse=True)
    x64 = x.astype(np.float64) / temperature
    assert_matches(y, log_softmax_ref(x64), dtype)
    assert lse.shape == shape[:-1] and lse.dtype == (np.float64 if dtype == "float64" else np.float32)
    assert_matches(lse, logsumexp_ref(x64), "float64" if dtype == "float64" else "float32")


@pytest.mark.parametrize("temperature", [1.0, 0.75])
@pytest.mark.parametrize("dtype", list(NP_DTYPES))
def test_rows_of_large_finite_max(rng, dtype, temperature):
    """Rows whose max is large but finite, either sign: y is (x - max) / T - log(sum), as on the GPU,
    so that elements near the max keep their differences (x / T - max / T rounds them away: 3 %
    off at a max of 1e20 in float32 with T = 0.75). The reference shifts before it divides, too."""
    big = [2e4, 3e4, 1e4] if dtype == "float16" else [1e10, 1e20, 1e30]
    x = rng.standard_normal((5, 3000)) * 3
    x[0, 3] = big[0]
    x[1] = big[1] * (1 + 0.01 * rng.random(3000))   # many elements a few ulps below the max
    x[2] = -big[2] * (1 + 0.05 * rng.random(3000))  # a large negative max
    x[3, :] = big[1]                                # all at the max: -log(cols)
    x[4, 1] = x[4, 2] = big[2]                      # two at the max: -log 2 there
    x = x.astype(NP_DTYPES[dtype])
    y, lse = softlight.log_softmax(x, temperature=temperature, return_lse=True)
    x64 = x.astype(np.float64)
    assert_matches(y, log_softmax_ref((x64 - x64.max(-1, keepdims=True)) / temperature), dtype)
    assert_matches(lse, logsumexp_ref(x64 / temperature), "float64" if dtype == "float64" else "float32")


@pytest.mark.parametrize("shape,dim", [((3, 2), 1), ((3, 5000), 1), ((2, 300_000), 1), ((3, 40, 33), 1),
                                       ((4, 7, 2), 1), ((40, 3), 0), ((2, 9), 0)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_difference_from_the_max_past_the_type(rng, dtype, shape, dim):
    """Rows whose x - max overflows the type ([3e38, -1e38] in float32) at a temperature that brings
    (x - max) / T back in range: y, the lse and the consumers' statistics are finite (each kernel
    family: short and long rows, a middle axis, the first axis, a row split among threads)."""
    big = float(np.finfo(NP_DTYPES[dtype]).max)
    t = big / 20
    x = (rng.uniform(-0.9, 0.9, shape) * big).astype(NP_DTYPES[dtype])
    y, lse = softlight.log_softmax(x, dim=dim, temperature=t, return_lse=True)
    z = (x.astype(np.longdouble) / t).astype(np.float64)
    assert_matches(y, np.moveaxis(log_softmax_ref(np.moveaxis(z, dim, -1)), -1, dim), dtype)
    assert_matches(lse, logsumexp_ref(np.moveaxis(z, dim, -1)), dtype)
    if dim != x.ndim - 1 or x.ndim != 2:
        return
    target = rng.integers(0, shape[1], shape[0])
    ref = log_softmax_ref(z)
    lp = np.take_along_axis(ref, target[:, None], 1)[:, 0]
    assert_matches(softlight.token_logprobs(x, target, temperature=t), lp, dtype)
    assert_matches(softlight.entropy(x, temperature=t), -(np.exp(ref) * ref).sum(1), dtype)
    loss = softlight.cross_entropy(x, target, temperature=t, reduction="none", label_smoothing=0.25)
    assert_matches(loss, 0.75 * -lp - 0.25 * ref.mean(1), dtype)


def test_lse_special_values_and_empty_rows(rng):
    x = special_matrix(rng, 333, np.float32)
    y, lse = softlight.log_softmax(x, return_lse=True)
    assert_matches(lse, logsumexp_ref(x), "float32")
    assert np.isnan(lse[1]) and lse[2] == -np.inf  # a row with +inf; a row of all -inf
    y, lse = softlight.log_softmax(np.zeros((3, 0), np.float32), return_lse=True)
    assert y.shape == (3, 0) and lse.tolist() == [-np.inf] * 3
    y0, l0 = softlight.log_softmax(np.array(2.5, np.float64), return_lse=True)
    assert y0 == 0.0 and l0 == 2.5


def test_raw_lse_and_temperature_bfloat16(rng):
    xb = to_bfloat16_bits(rng.standard_normal((7, 3000)) * 4)
    yb = np.zeros_like(xb)
    lse = np.full(7, POISON, np.float32)
    softlight.log_softmax_raw(xb.ctypes.data, yb.ctypes.data, 7, 3000, dtype="bfloat16", device="cpu",
                              temperature=2.0, lse_ptr=lse.ctypes.data)
    x64 = from_bfloat16_bits(xb).astype(np.float64) / 2.0
    assert_matches(from_bfloat16_bits(yb), log_softmax_ref(x64), "bfloat16")
    assert_matches(lse, logsumexp_ref(x64), "float32")


# The vector kernels' layouts (src/cpu/simd.hpp): long rows split among threads (rows fewer than
# twice the threads, 131072 elements or more), middle axes over a few contiguous inner positions (a
# divisor of a vector's lanes or up to 8 vectors: a span a block, split too where the blocks are
# few), wider inner axes in tiles, rows of up to 16, one column. Vectors hold 4 or 8 floats
# (generic, AVX2 kernels), or 16 in a 64-byte build: 32 to 128 inner positions are spans of 2 to 8
# vectors of 16, spans or tiles of vectors of 8.
# Special values in several places of the axis, the log-sum-exp beside, 1, 2 and 5 threads.
LAYOUTS = [(1, 300_001, 1), (3, 140_000, 1), (2, 70_001, 2), (3, 50_000, 4), (9, 33, 8), (7, 5, 3), (4, 20, 300),
           (40, 16, 1), (40, 7, 1), (33, 1, 1), (5, 1, 16), (3, 50_000, 16), (2, 30, 64), (2, 30, 24), (3, 40, 12),
           (2, 30, 48), (3, 20, 128), (2, 9, 80), (3, 40, 32)]


@pytest.mark.parametrize("outer,dim,inner", LAYOUTS, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
def test_vector_layouts_match_float64(rng, outer, dim, inner, dtype):
    import capi
    x = rng.standard_normal((outer, inner, dim)) * 4  # the softmax axis last here, moved below
    if outer * inner >= 4 and dim >= 3:
        lanes = x.reshape(-1, dim)
        lanes[0, rng.integers(dim)] = np.nan
        lanes[1, rng.integers(dim)] = np.inf
        lanes[2, :] = -np.inf
        lanes[3, rng.random(dim) < 0.5] = -np.inf
    x = np.ascontiguousarray(np.moveaxis(x, 2, 1))  # (outer, dim, inner)
    if dtype == "bfloat16":
        src = to_bfloat16_bits(x)
        xs = from_bfloat16_bits(src)
    else:
        src = xs = x.astype(NP_DTYPES[dtype])
    ref = np.moveaxis(log_softmax_ref(np.moveaxis(xs.astype(np.float64), 1, 2)), 2, 1)
    lse_ref = logsumexp_ref(np.moveaxis(xs.astype(np.float64), 1, 2))
    code = softlight._dtypes.BY_NAME[dtype]
    for threads in (1, 2, 5):
        out = np.full(src.shape, to_bfloat16_bits(np.float32(POISON)) if dtype == "bfloat16" else POISON, src.dtype)
        lse = np.full((outer, inner), POISON, np.float64 if dtype == "float64" else np.float32)
        st = capi.forward_3d_cpu(src.ctypes.data, (dim * inner, inner, 1), out.ctypes.data, (dim * inner, inner, 1),
                                 outer, dim, inner, code, threads, 1.0, lse.ctypes.data)
        assert st == 0
        y = from_bfloat16_bits(out) if dtype == "bfloat16" else out
        assert_matches(y, ref, dtype, f"{dtype} {(outer, dim, inner)} threads {threads}")
        assert_matches(lse, lse_ref, "float64" if dtype == "float64" else "float32", "lse")


@pytest.mark.parametrize("shape,dim", [((37, 1), 1), ((5, 1, 19), 1), ((1, 1), 0), ((3, 1, 1), 1)])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_an_axis_of_one_element(rng, shape, dim, dtype):
    """y is 0, or NaN where x is not finite; the log-sum-exp is x (NaN for +inf, -inf for -inf)."""
    x = (rng.standard_normal(shape) * 4).astype(NP_DTYPES[dtype])
    flat = x.reshape(-1)
    flat[:4] = [np.nan, np.inf, -np.inf, 0.5][: min(4, flat.size)]
    out = np.full(shape, POISON, x.dtype)
    y, lse = softlight.log_softmax(x, dim, out=out, return_lse=True, temperature=2.0)
    ref = np.moveaxis(log_softmax_ref(np.moveaxis(x.astype(np.float64) / 2.0, dim, -1)), -1, dim)
    assert_matches(y, ref, dtype)
    xl = np.moveaxis(x.astype(np.float64) / 2.0, dim, -1)
    assert_matches(lse, logsumexp_ref(xl), "float64" if dtype == "float64" else "float32")


def _child_log_softmax(x, queue):
    queue.put(softlight.log_softmax(x))


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork on this platform")
def test_a_forked_child_computes_after_the_parent_started_its_threads(rng):
    """The parent's worker threads do not exist in a child made by fork (as in a DataLoader's
    workers): the child's calls still complete, with the same result."""
    import multiprocessing
    x = (rng.standard_normal((64, 100_000)) * 4).astype(np.float32)
    want = softlight.log_softmax(x)  # the parent's pool is started
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_log_softmax, args=(x, queue))
    child.start()
    got = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    np.testing.assert_array_equal(got, want)
