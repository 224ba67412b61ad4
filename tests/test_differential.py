"""Differential tests on the CPU, driven by hypothesis: random arrays of 0 to 6 axes, strided views,
every dtype, values of ordinary size or near the dtype's largest, any dim, temperatures over their
whole accepted range (and past its ends), the log-sum-exp output, the backward, and special values,
against a float64 reference with torch's special-value rules; and the consumers of the log-sum-exp
(row statistics, cross-entropy and their gradient) over the same ranges. Seeded (derandomized):
every run draws the same cases. The GPU suite runs the same generator against the GPU
(tests/test_gpu_differential.py)."""
import math

import numpy as np
import pytest

import softlight
from reference import POISON, assert_matches, log_softmax_ref, logsumexp_ref

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install '.[test]')")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

DTYPES = {"float32": np.float32, "float16": np.float16, "float64": np.float64}
try:
    import ml_dtypes
    DTYPES["bfloat16"] = ml_dtypes.bfloat16
except ImportError:  # bfloat16 numpy arrays need ml_dtypes; the other dtypes still run
    pass
# The temperatures accepted: 1 / T a normal number of the accumulation type that the exp can take
# (for float, 1 / T * log2(e) finite too: docs/semantics.md).
T_RANGE = {"float64": (1 / float(np.finfo(np.float64).max), 1 / float(np.finfo(np.float64).tiny)),
           "other": (1.4426950408889634 / float(np.finfo(np.float32).max), 1 / float(np.finfo(np.float32).tiny))}
CASES = int(__import__("os").environ.get("SOFTLIGHT_TEST_CASES", "5000"))
# Each dtype's largest finite value (numpy's finfo takes ml_dtypes' bfloat16 only in some versions).
LARGEST = {"float32": float(np.finfo(np.float32).max), "float64": float(np.finfo(np.float64).max),
           "float16": 65504.0, "bfloat16": 3.3895313892515355e38}


def draw_temperature(draw, dtype, kinds):
    """A temperature of one of `kinds`: 1, 10^u for u in [-30, 30], just inside and just past the ends
    of the accepted range (edge), or far past them (huge)."""
    kind = draw(st.sampled_from(kinds))
    if kind == "one":
        return 1.0
    if kind == "log":
        return 10.0 ** draw(st.floats(-30, 30))
    if kind == "edge":
        lo, hi = T_RANGE["float64" if dtype == "float64" else "other"]
        return draw(st.sampled_from([lo * 0.5, lo * 1.0000001, hi * 0.9999999, hi * 2]))
    return draw(st.sampled_from([1e-300, 1e300, 1e-39, 1e38]))


@st.composite
def problems(draw):
    ndim = draw(st.integers(0, 6))
    shape = tuple(draw(st.lists(st.sampled_from([1, 1, 2, 3, 5, 8, 17, 24, 64, 96]), min_size=ndim, max_size=ndim)))
    while math.prod(shape) > 4096:  # halve the largest axis
        i = shape.index(max(shape))
        shape = shape[:i] + (shape[i] // 2,) + shape[i + 1:]
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    dim = draw(st.integers(-max(ndim, 1), max(ndim, 1) - 1))
    steps = tuple(draw(st.sampled_from([1, 1, 1, 2, -1])) for _ in shape)
    t = draw_temperature(draw, dtype, ["one", "one", "edge", "huge", "log"])
    specials = draw(st.integers(0, 3))
    seed = draw(st.integers(0, 2**32 - 1))
    huge = draw(st.sampled_from([False, False, False, True]))
    return shape, dtype, dim, steps, t, specials, seed, draw(st.booleans()), draw(st.booleans()), huge


def values(rng, shape, dtype, huge):
    """Normal values times 3, or (huge) times a quarter of the dtype's largest finite value, clipped to
    it: rows whose x - max overflows the dtype, which a temperature above 1 brings back in range."""
    if not huge:
        return rng.standard_normal(shape) * 3
    big = LARGEST[dtype]
    return np.clip(rng.standard_normal(shape) * (big / 4), -big, big)


def view_of(rng, shape, steps, dtype, huge=False):
    """An array of `shape`, as a view with the given steps (negative: reversed) into a larger one."""
    base_shape = tuple(n * abs(s) for n, s in zip(shape, steps))
    base = np.asarray(values(rng, base_shape, dtype, huge), dtype=np.float64)
    idx = tuple(slice(None, None, s) if s > 0 else slice(None, None, -1) for s in steps)
    full = np.asarray(base.astype(DTYPES[dtype]))
    return full[idx] if full.ndim else full


def shifted(x64, shift, t):
    """(x - shift) / T in float64, the difference taken in long double (past float64's range on the
    machines the suite runs on, which the first line checks)."""
    assert np.finfo(np.longdouble).maxexp > np.finfo(np.float64).maxexp, "long double is not wider than double here"
    return ((x64.astype(np.longdouble) - shift) * np.longdouble(1.0 / t)).astype(np.float64)


def reference(x64, d, t):
    """y and the log-sum-exp along axis d in float64, in softlight's order: the temperature scales
    x - max (docs/semantics.md), so a row's own values never overflow before the shift. x - max is
    taken in long double: float64's x - max overflows where (x - max) / T may not."""
    moved = np.moveaxis(x64.reshape(x64.shape or (1,)), d, -1)
    m = np.where(np.isnan(moved), -np.inf, moved).max(axis=-1, keepdims=True, initial=-np.inf)
    shift = np.where(np.isfinite(m), m, 0.0)
    z = shifted(moved, shift, t)
    y = np.moveaxis(log_softmax_ref(z), -1, d).reshape(x64.shape)
    lse = (shift[..., 0] * (1.0 / t) + logsumexp_ref(z)) if moved.shape[-1] else np.full(moved.shape[:-1], -np.inf)
    return y, lse.reshape(tuple(np.delete(np.array(x64.shape or (1,)), d))) if x64.ndim else lse.reshape(())


def merges(shape, strides):
    axes = [(n, s) for n, s in zip(shape, strides) if n != 1]
    return all(s == s2 * n2 for (n, s), (n2, s2) in zip(axes, axes[1:]))


def expect_accepted(x, d, t, dtype):
    lo, hi = T_RANGE["float64" if dtype == "float64" else "other"]
    if not (lo <= t <= hi):
        return "temperature"
    # Every layout is computed: views whose axes do not merge, or with negative strides, through a
    # contiguous copy (docs/semantics.md).
    return None


@settings(max_examples=CASES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(problems())
def test_forward_backward_and_lse_against_float64(case):
    check_forward(case, long_axes=False)


# Axis and inner sizes on each side of the CPU kernels' boundaries: 16-element short rows, 2048-element
# blocks, 65536-element pieces split among threads, 32-step tiles of 8 vectors, spans of up to 8
# vectors of 4, 8 or 16 lanes.
LONG_SIZES = [1, 3, 8, 16, 17, 24, 31, 32, 33, 40, 48, 56, 64, 65, 80, 96, 128, 129, 2047, 2048, 2049, 4097, 65537,
              140000]


@st.composite
def long_problems(draw):
    ndim = draw(st.integers(1, 3))
    shape = list(draw(st.lists(st.sampled_from(LONG_SIZES), min_size=ndim, max_size=ndim)))
    while math.prod(shape) > 1_500_000:
        i = shape.index(max(shape))
        shape[i] = max(1, shape[i] // 3)
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    dim = draw(st.integers(0, ndim - 1))
    steps = tuple(draw(st.sampled_from([1, 1, 1, 2])) for _ in shape)
    t = draw_temperature(draw, dtype, ["one", "one", "log"])
    return (tuple(shape), dtype, dim, steps, t, draw(st.integers(0, 3)), draw(st.integers(0, 2**32 - 1)),
            draw(st.booleans()), draw(st.booleans()), draw(st.sampled_from([False, False, False, True])))


@settings(max_examples=max(1, CASES // 25), deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(long_problems())
def test_long_axes_against_float64(case):
    """The same checks on arrays of up to 1.5M elements, whose axes cross the kernels' blocks."""
    check_forward(case, long_axes=True)


def check_forward(case, long_axes):
    shape, dtype, dim, steps, t, specials, seed, want_lse, backward, huge = case
    rng = np.random.default_rng(seed)
    x = view_of(rng, shape, steps, dtype, huge)
    if x.size and specials:
        for _ in range(specials):
            where = tuple(int(rng.integers(0, n)) for n in x.shape)
            x[where] = rng.choice([np.inf, -np.inf, np.nan, -np.inf])
    d = dim % max(x.ndim, 1)
    why = expect_accepted(x, d, t, dtype)
    out = np.full(x.shape, POISON, x.dtype)
    if why is not None:
        with pytest.raises(softlight.InvalidArgumentError):
            softlight.log_softmax(x, dim=dim, out=out, temperature=t)
        assert (out == POISON).all()
        return
    y, lse = softlight.log_softmax(x, dim=dim, out=out, temperature=t, return_lse=True)
    with np.errstate(all="ignore"):
        ref, ref_lse = reference(x.astype(np.float64), d, t)
        # Past the output type's range the reference is its infinity; elsewhere unrounded.
        held = ref.astype(x.dtype).astype(np.float64)
        ref_out = np.where(np.isinf(held), held, ref)
        held_l = ref_lse.astype(np.float64 if dtype == "float64" else np.float32).astype(np.float64)
        ref_l = np.where(np.isinf(held_l), held_l, ref_lse)
    what = f"shape {x.shape} strides {x.strides} dim {dim} {dtype} T={t!r}"
    assert_matches(y, ref_out, dtype, what)
    if want_lse:
        assert_matches(lse, ref_l, "float64" if dtype == "float64" else "float32", "lse " + what)
    if backward and x.ndim and x.size and t == 1.0:
        dy = rng.standard_normal(x.shape).astype(x.dtype)
        dx = softlight.log_softmax_backward(dy, y, dim=dim)
        with np.errstate(all="ignore"):
            dy64, y64 = dy.astype(np.float64), y.astype(np.float64)
            ref_dx = dy64 - np.exp(y64) * dy64.sum(axis=d, keepdims=True)
        held_dx = ref_dx.astype(x.dtype).astype(np.float64)
        ref_dx = np.where(np.isinf(held_dx), held_dx, ref_dx)
        if not long_axes:
            assert_matches(dx, ref_dx, dtype, "backward " + what)
            return
        # Over a long axis, dx carries the accumulation type's rounding of sum(dy), |sum(dy)| up to
        # sum(|dy|), times exp(y).
        atol, rtol = TOL_GRAD[dtype]
        with np.errstate(all="ignore"):
            bound = atol + rtol * (1 + np.abs(ref_dx) + np.exp(y64) * np.abs(dy64).sum(axis=d, keepdims=True))
            err = np.abs(dx.astype(np.float64) - ref_dx)
        fin = np.isfinite(ref_dx)
        assert np.array_equal(np.isnan(dx.astype(np.float64)), np.isnan(ref_dx)), "backward NaN " + what
        assert (err[fin] <= bound[fin]).all(), ("backward " + what, err[fin].max())


# --- the consumers of the log-sum-exp ------------------------------------------------------------

def consumer_reference(x64, index, t):
    """Float64 statistics of each row of x / t (rows on the last axis), each against the row's max
    (as softlight computes them), with torch's special-value rules."""
    sc = 1.0 / t
    with np.errstate(all="ignore"):
        m = np.where(np.isnan(x64), -np.inf, x64).max(-1, keepdims=True, initial=-np.inf)
        bad = (np.isnan(x64).any(-1) | (x64 == np.inf).any(-1))[..., None]
        shift = np.where(np.isfinite(m), m, 0.0)
        d = shifted(x64, shift, t)
        e = np.exp(d)
        s = e.sum(-1, keepdims=True)
        log_s = np.log(s)
        tt = np.where(e > 0, e * d, 0.0).sum(-1, keepdims=True)
        lse = np.where(bad, np.nan, shift * sc + log_s)[..., 0]
        ent = np.where(bad | (m == -np.inf), np.nan, log_s - tt / s)[..., 0]
        out = {"lse": lse, "entropy": ent, "log_s": np.where(bad, np.nan, log_s)[..., 0], "log_p": d - log_s}
        if index is not None:
            idx = index if index.ndim == x64.ndim else index[..., None]
            lp = shifted(np.take_along_axis(x64, idx, -1), shift, t) - log_s
            lp = np.where(bad, np.nan, lp)
            out["logprobs"] = lp if index.ndim == x64.ndim else lp[..., 0]
    return out


# The backward's tolerance: the storage type's rounding of dx, plus float32 arithmetic on terms as
# large as |lse| p (the entropy's log p + H).
TOL_GRAD = {"float64": (1e-11, 1e-11), "float32": (1e-5, 2e-6), "float16": (1e-3, 1e-3), "bfloat16": (8e-3, 8e-3)}


def _held(ref, acc):
    """The reference as the accumulation type holds it: its infinity past the type's range."""
    with np.errstate(all="ignore"):
        held = ref.astype(acc).astype(np.float64)
    return np.where(np.isinf(held), held, ref)


@st.composite
def consumer_problems(draw):
    lead = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 5]), min_size=0, max_size=2)))
    vocab = draw(st.sampled_from([1, 2, 3, 7, 17, 64, 300, 2100]))
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    k = draw(st.sampled_from([None, 1, 3]))
    t = draw_temperature(draw, dtype, ["one", "one", "log", "edge"])
    huge = draw(st.sampled_from([False, False, False, True]))
    return lead, vocab, dtype, k, t, draw(st.integers(0, 3)), draw(st.integers(0, 2**32 - 1)), huge


@settings(max_examples=max(1, CASES // 2), deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(consumer_problems())
def test_consumers_against_float64(case):
    """row_stats (lse, entropy, log-probs), cross_entropy and row_stats_backward, against float64."""
    lead, vocab, dtype, k, t, specials, seed, huge = case
    rng = np.random.default_rng(seed)
    x = np.asarray(values(rng, lead + (vocab,), dtype, huge)).astype(DTYPES[dtype])
    for _ in range(specials):
        x[tuple(int(rng.integers(0, n)) for n in x.shape)] = rng.choice([np.inf, -np.inf, np.nan, -np.inf])
    index = None if k is None else rng.integers(0, vocab, lead + ((k,) if k > 1 else ()))
    lo, hi = T_RANGE["float64" if dtype == "float64" else "other"]
    acc = np.float64 if dtype == "float64" else np.float32
    tol = "float64" if dtype == "float64" else "float32"
    what = f"{x.shape} {dtype} T={t!r} K={k} huge={huge}"
    if not lo <= t <= hi:
        with pytest.raises(softlight.InvalidArgumentError):
            softlight.row_stats(x, index, stats=("lse",), temperature=t)
        return
    x64 = x.astype(np.float64)
    ref = consumer_reference(x64, index, t)
    stats = ("lse", "entropy") + (("logprobs",) if index is not None else ())
    got = softlight.row_stats(x, index, stats=stats, temperature=t)
    for name in stats:
        assert got[name].dtype == acc and got[name].shape == ref[name].shape, (name, what)
        # The entropy is a difference of terms up to |lse|: its error scales with 1 + |lse|.
        r = _held(ref[name], acc)
        if name == "entropy":
            fin = np.isfinite(r)
            err = np.abs(got[name][fin] - r[fin])
            atol, rtol = (1e-12, 1e-12) if tol == "float64" else (1e-5, 1e-5)
            assert (err <= atol + rtol * (1 + np.abs(ref["lse"][fin]))).all(), (what, err.max())
            assert np.array_equal(np.isnan(got[name]), np.isnan(r)), what
        else:
            assert_matches(got[name], r, tol, f"{name} {what}")
    if index is not None and 1e-3 <= t <= 1e3:
        # The gradient of a random combination of the statistics, where they are finite.
        d_lse, d_ent = rng.standard_normal(lead).astype(acc), rng.standard_normal(lead).astype(acc)
        d_lp = rng.standard_normal(got["logprobs"].shape).astype(acc)
        dx = softlight.row_stats_backward(x, got["lse"], entropy=got["entropy"], d_lse=d_lse, d_entropy=d_ent,
                                          d_logprobs=d_lp, index=index, temperature=t)
        with np.errstate(all="ignore"):
            log_p = ref["log_p"]
            p = np.exp(log_p)
            kk = 1 if index.ndim == len(lead) else index.shape[-1]
            idx = index.reshape(lead + (kk,))
            glp = d_lp.astype(np.float64).reshape(lead + (kk,))
            a = d_lse - glp.sum(-1)
            dz = np.where(p > 0, p * (a[..., None] - d_ent[..., None] * (log_p + ref["entropy"][..., None])), 0.0)
            hot = np.zeros_like(dz)
            for q in range(kk):
                np.put_along_axis(hot, idx[..., q:q + 1],
                                  np.take_along_axis(hot, idx[..., q:q + 1], -1) + glp[..., q:q + 1], -1)
            want = (dz + hot) / t
        # (where the lse, an input of the backward, overflowed its type, the row's gradient is NaN:
        # docs/consumers.md)
        fine = np.isfinite(_held(ref["lse"], acc)) & np.isfinite(ref["entropy"])
        over = np.isfinite(ref["lse"]) & ~np.isfinite(_held(ref["lse"], acc))
        assert np.isnan(dx.astype(np.float64)[over]).all(), what
        if fine.any():
            w, g = want[fine], dx.astype(np.float64)[fine]
            atol, rtol = TOL_GRAD[dtype]
            scale = 1.0 + np.abs(w) + np.abs(ref["lse"][fine])[..., None] * np.abs(p[fine]) / t
            assert (np.abs(g - w) <= atol + rtol * scale).all(), (what, np.abs(g - w).max())
    if index is None or index.ndim != len(lead):
        return
    # Cross-entropy of the same rows, every row kept but one (where there are two or more).
    target = index.copy()
    if target.size > 1:
        target.reshape(-1)[0] = -100
    rows = int(np.prod(lead)) if lead else 1
    x2, t2 = x.reshape(rows, vocab), target.reshape(rows)
    loss, g = softlight.cross_entropy(x2, t2, reduction="none", temperature=t, grad=True, label_smoothing=0.1)
    lp = ref["logprobs"].reshape(rows)
    with np.errstate(all="ignore"):
        m = np.where(np.isnan(x2.astype(np.float64)), -np.inf, x2.astype(np.float64)).max(-1, initial=-np.inf)
        shift = np.where(np.isfinite(m), m, 0.0)
        lse_minus_mean = ref["log_s"].reshape(rows) - shifted(x2.astype(np.longdouble).mean(-1), shift, t)
        want = np.where(t2 == -100, 0.0, 0.9 * -lp + 0.1 * lse_minus_mean)
    assert_matches(loss, _held(want, acc), tol, f"cross_entropy {what}")
    assert g.shape == x2.shape and (g[t2 == -100] == 0).all()
