"""The consumers of a row's log-sum-exp on the CPU (row statistics, their gradient, cross-entropy)
against float64 references: fresh random inputs with -inf, +inf and NaN, outputs poisoned before each
call, every dtype, rows short and long (past a block), one and several threads."""
import ctypes

import numpy as np
import pytest

import softlight
from reference import logsumexp_ref
from softlight import _C
from reference import TOL, from_bfloat16_bits, in_threads, to_bfloat16_bits

CODES = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}
STATS = ("lse", "entropy", "logprobs", "picked", "sum", "max", "sumexp", "moment")
POISON = 7.25


def _storage(x, dtype):
    """(array handed to softlight, its values in float64)."""
    if dtype == "bfloat16":
        b = to_bfloat16_bits(x)
        return b, from_bfloat16_bits(b).astype(np.float64)
    with np.errstate(over="ignore"):  # (1e30 is +-inf in float16)
        a = np.asarray(x, dtype=dtype)
    return a, a.astype(np.float64)


def _values(a, dtype):
    return from_bfloat16_bits(a).astype(np.float64) if dtype == "bfloat16" else a.astype(np.float64)


def _acc(dtype):
    return np.float64 if dtype == "float64" else np.float32


def _logits(rng, rows, cols, special, low=-1e30):
    x = rng.standard_normal((rows, cols)) * 4
    if special and rows >= 6 and cols >= 2:
        x[1, cols // 2] = -np.inf  # one -inf among finite values
        x[2, :] = -np.inf          # a row of all -inf
        x[3, cols - 1] = np.nan
        x[4, 0] = np.inf
        x[5, :] = low if cols > 1 else 0.0  # all equal, very negative
    return x


def stats_ref(z, index):
    """Float64 statistics of each row of z (torch's special-value rules)."""
    with np.errstate(all="ignore"):
        m = np.where(np.isnan(z), -np.inf, z).max(-1, initial=-np.inf)
        bad = np.isnan(z).any(-1) | (z == np.inf).any(-1)
        shift = np.where(m == -np.inf, 0.0, m)
        d = z - shift[:, None]
        e = np.exp(d)
        s = e.sum(-1)
        t = np.where(e > 0, e * d, 0.0).sum(-1)
        lse = np.where(bad, np.nan, m + np.log(s))
        ent = np.where(bad | (m == -np.inf), np.nan, np.log(s) - t / s)
        out = {"lse": lse, "entropy": ent, "sum": z.sum(-1), "max": np.where(np.isnan(z).any(-1), np.nan, m)}
        if index is not None:
            picked = np.take_along_axis(z, index, -1)
            out["picked"] = picked
            # (z - m) - log s, not z - lse: at |z| ~ 1e30 float64's lse has lost log s.
            out["logprobs"] = np.where(bad[:, None], np.nan, (picked - shift[:, None]) - np.log(s)[:, None])
    return out


def _check(got, ref, dtype, what, scale=None):
    """got against ref: NaN exactly where ref has NaN, the same infinities, finite values within the
    accumulation type's tolerance (scaled by `scale` where a sum's terms set it)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    assert np.array_equal(np.isnan(got), np.isnan(ref)), \
        f"{what}: NaN at {np.argwhere(np.isnan(got) != np.isnan(ref))[:4].tolist()}"
    inf = np.isinf(ref)
    assert np.array_equal(got[inf], ref[inf]), f"{what}: infinities differ"
    fin = np.isfinite(ref)
    atol, rtol = TOL["float64" if dtype == "float64" else "float32"]
    lim = atol + rtol * (np.abs(ref[fin]) if scale is None else np.broadcast_to(scale, ref.shape)[fin])
    err = np.abs(got[fin] - ref[fin])
    assert (err <= lim).all(), f"{what}: error {err.max():.3e} over {lim[np.argmax(err - lim)]:.3e}"


SHAPES = [(1, 1), (9, 7), (17, 1000), (6, 5000), (3, 70000)]


@pytest.mark.parametrize("dtype", list(CODES))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("threads", [1, 3])
def test_row_stats_match_float64(rng, dtype, shape, threads):
    rows, cols = shape
    for temperature, special, k in ((1.0, True, 1), (0.37, False, 4), (3.0, True, 2)):
        x, xv = _storage(_logits(rng, rows, cols, special), dtype)
        index = rng.integers(0, cols, (rows, k))
        outs = {s: np.full((rows, k) if s in ("picked", "logprobs") else rows, POISON, _acc(dtype)) for s in STATS}
        st = _C.row_stats(x.ctypes.data, cols, rows, cols, CODES[dtype], temperature, index.ctypes.data, k, k, 0,
                          False, [outs[s].ctypes.data for s in STATS], threads)
        assert st == 0
        z = xv / temperature
        ref = stats_ref(z, index)
        what = f"{dtype} {shape} T={temperature}"
        for s in ("lse", "entropy", "logprobs", "picked"):
            _check(outs[s], ref[s], dtype, f"{what} {s}", None if s != "entropy" else 1.0 + np.abs(ref["lse"]))
        with np.errstate(all="ignore"):
            _check(outs["sum"], ref["sum"], dtype, f"{what} sum", np.abs(z).sum(-1))
            # The shard statistics make the same lse and entropy again.
            merged_lse = outs["max"].astype(np.float64) + np.log(outs["sumexp"].astype(np.float64))
            fine = np.isfinite(ref["lse"])
            _check(merged_lse[fine], ref["lse"][fine], dtype, f"{what} max + log sumexp")
            assert (outs["sumexp"][fine] >= 1).all()


@pytest.mark.parametrize("dtype", list(CODES))
@pytest.mark.parametrize("shape", [(9, 7), (17, 1000), (4, 5000)], ids=str)
@pytest.mark.parametrize("in_place", [False, True])
def test_row_stats_backward_matches_float64(rng, dtype, shape, in_place):
    rows, cols = shape
    k, temperature = 3, 0.8
    # (The gradient's p = exp(z - lse) is as precise as lse, |lse| 2^-24 in float32: docs/consumers.md.
    # Rows of equal values sit at -50 here, not at -1e30.)
    x, xv = _storage(_logits(rng, rows, cols, True, low=-50.0), dtype)
    index = rng.integers(0, cols, (rows, k))
    index[0, 1] = index[0, 0]  # a token picked twice
    acc = _acc(dtype)
    z = xv / temperature
    ref = stats_ref(z, index)
    lse, ent = ref["lse"].astype(acc), ref["entropy"].astype(acc)
    g = {n: rng.standard_normal(s).astype(acc) for n, s in
         (("d_lse", rows), ("d_entropy", rows), ("d_logprobs", (rows, k)), ("d_picked", (rows, k)), ("d_sum", rows))}
    poison = to_bfloat16_bits(np.float32(POISON))[()] if dtype == "bfloat16" else POISON
    out = x if in_place else np.full_like(x, poison)
    ins = [lse.ctypes.data, ent.ctypes.data] + [g[n].ctypes.data for n in ("d_lse", "d_entropy", "d_logprobs",
                                                                               "d_picked", "d_sum")]
    st = _C.row_stats_backward(x.ctypes.data, cols, out.ctypes.data, cols, rows, cols, CODES[dtype], temperature,
                               index.ctypes.data, k, k, 0, False, ins, 2)
    assert st == 0
    # dz = p (d_lse - sum d_logprobs - d_entropy (log p + H)) + d_sum + scatter(d_picked + d_logprobs)
    with np.errstate(all="ignore"):
        lse64, ent64 = lse.astype(np.float64), ent.astype(np.float64)
        logp = z - lse64[:, None]
        p = np.exp(logp)
        a = g["d_lse"] - g["d_logprobs"].sum(-1)
        term = np.where(p > 0, p * (a[:, None] - g["d_entropy"][:, None] * (logp + ent64[:, None])), 0.0)
        dz = term + g["d_sum"][:, None]
        for q in range(k):
            np.add.at(dz, (np.arange(rows), index[:, q]), (g["d_picked"][:, q] + g["d_logprobs"][:, q]))
        want = dz / temperature
    got = _values(out, dtype)
    fine = np.isfinite(lse64) & np.isfinite(ent64)  # rows whose statistics are finite
    tol_dtype = dtype if dtype != "float64" else "float64"
    atol, rtol = TOL[tol_dtype]
    err = np.abs(got[fine] - want[fine])
    lim = 4 * (atol + rtol * (np.abs(want[fine]) + 1.0))
    assert np.isfinite(got[fine]).all() and (err <= lim).all(), f"{dtype}: {err.max():.3e}"
    assert np.isnan(got[~fine]).all(axis=-1).any() or (~fine).sum() == 0


def ce_ref(z, target, reduction, eps, zl, ignore=-100):
    rows, cols = z.shape
    with np.errstate(all="ignore"):
        lse = stats_ref(z, None)["lse"]
        keep = target != ignore
        t = np.where(keep, target, 0)
        zt = z[np.arange(rows), t]
        loss = (1 - eps) * (lse - zt) + (eps * (lse - z.sum(-1) / cols) if eps else 0.0) + zl * lse * lse
        loss = np.where(keep, loss, 0.0)
        p = np.exp(z - lse[:, None])
        g = np.ones(rows) if reduction != "mean" else np.full(rows, 1.0 / keep.sum())
        grad = (g * (1 + 2 * zl * lse))[:, None] * p - (g * eps / cols)[:, None]
        grad[np.arange(rows), t] -= g * (1 - eps)
        grad[~keep] = 0.0
    red = {"none": loss, "sum": loss.sum(), "mean": loss.sum() / keep.sum()}[reduction]
    return red, lse, grad


@pytest.mark.parametrize("dtype", list(CODES))
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("shape", [(9, 7), (33, 1000), (5, 5000)], ids=str)
def test_cross_entropy_matches_float64(rng, dtype, reduction, shape):
    rows, cols = shape
    for eps, zl, temperature, in_place in ((0.0, 0.0, 1.0, False), (0.1, 1e-3, 0.6, True)):
        x, xv = _storage(rng.standard_normal(shape) * 3, dtype)
        target = rng.integers(0, cols, rows)
        target[1] = -100
        acc = _acc(dtype)
        loss = np.full(rows if reduction == "none" else 1, POISON, acc)
        lse = np.full(rows, POISON, acc)
        grad = x if in_place else np.full_like(x, 0x7f7f if dtype == "bfloat16" else POISON)
        red = {"none": 0, "sum": 1, "mean": 2}[reduction]
        st = _C.cross_entropy(x.ctypes.data, cols, target.ctypes.data, rows, cols, CODES[dtype], temperature, eps, zl,
                              True, -100, red, loss.ctypes.data, lse.ctypes.data, grad.ctypes.data, cols, 2)
        assert st == 0
        want_loss, want_lse, want_grad = ce_ref(xv / temperature, target, reduction, eps, zl)
        what = f"{dtype} {shape} {reduction} eps={eps}"
        _check(loss if reduction == "none" else loss[0], want_loss, dtype, what + " loss",
               None if reduction == "none" else 1.0 + np.abs(want_loss) * rows)
        _check(lse, want_lse, dtype, what + " lse")
        atol, rtol = TOL[dtype]
        got = _values(grad, dtype)
        want = want_grad / temperature
        err = np.abs(got - want)
        assert (err <= 2 * (atol + rtol * np.abs(want))).all(), f"{what} grad: {err.max():.3e}"
        assert (got[1] == 0).all()  # the ignored row


def test_cross_entropy_special_values():
    x = np.array([[0.0, -np.inf, 1.0], [np.nan, 0.0, 0.0], [-np.inf, -np.inf, -np.inf], [1.0, 2.0, np.inf]],
                 np.float32)
    target = np.array([1, 0, 0, 2])
    loss, grad = softlight.cross_entropy(x, target, reduction="none", grad=True)
    assert loss[0] == np.inf and np.isnan(loss[1:]).all()
    assert np.isnan(grad[1:]).all() and np.isfinite(grad[0]).all()
    assert np.isnan(softlight.cross_entropy(x, target))


def test_cross_entropy_all_ignored_is_nan_and_zero_rows():
    x = np.zeros((3, 4), np.float32)
    assert np.isnan(softlight.cross_entropy(x, np.full(3, -100)))
    assert softlight.cross_entropy(x, np.full(3, -100), reduction="sum") == 0.0
    e = np.zeros((0, 4), np.float32)
    assert np.isnan(softlight.cross_entropy(e, np.zeros(0, np.int64)))
    assert softlight.cross_entropy(e, np.zeros(0, np.int64), reduction="sum") == 0.0


def test_python_api_shapes(rng):
    x = (rng.standard_normal((2, 3, 50)) * 2).astype(np.float32)
    idx = rng.integers(0, 50, (2, 3, 4))
    lp = softlight.token_logprobs(x, idx)
    ref = stats_ref(x.reshape(6, 50).astype(np.float64), idx.reshape(6, 4))
    assert lp.shape == (2, 3, 4) and lp.dtype == np.float32
    _check(lp.reshape(6, 4), ref["logprobs"], "float32", "token_logprobs")
    h = softlight.entropy(x)
    assert h.shape == (2, 3)
    _check(h.reshape(6), ref["entropy"], "float32", "entropy")
    _check(softlight.logsumexp(x, -1).reshape(6), ref["lse"], "float32", "logsumexp")
    one = softlight.token_logprobs(x, idx[..., 0])
    assert one.shape == (2, 3)
    # A view with evenly strided rows is read in place; the same values as its copy.
    v = x.reshape(6, 50)[::2, :40]
    _check(softlight.entropy(v), stats_ref(np.ascontiguousarray(v).astype(np.float64), None)["entropy"], "float32",
           "strided rows")
    both = softlight.row_stats(x, idx, stats=("lse", "entropy", "logprobs"))
    assert set(both) == {"lse", "entropy", "logprobs"}


def test_cross_entropy_grad_over_the_logits(rng):
    x = (rng.standard_normal((8, 100)) * 2).astype(np.float32)
    keep = x.copy()
    t = rng.integers(0, 100, 8)
    loss, g = softlight.cross_entropy(keep, t, grad=True)
    loss2, g2 = softlight.cross_entropy(x, t, grad=x)
    assert g2 is x and np.array_equal(g, x) and loss == loss2


def test_refusals(rng):
    x = rng.standard_normal((4, 10)).astype(np.float32)
    with pytest.raises(softlight.InvalidArgumentError, match=r"target\[2\] = 10 is outside"):
        softlight.cross_entropy(x, np.array([0, 1, 10, 3]))
    with pytest.raises(softlight.InvalidArgumentError, match=r"index\[0, 1\] = -1"):
        softlight.token_logprobs(x, np.array([[0, -1], [1, 1], [2, 2], [3, 3]]))
    with pytest.raises(softlight.InvalidArgumentError, match="reduction"):
        softlight.cross_entropy(x, np.zeros(4, np.int64), reduction="avg")
    with pytest.raises(softlight.InvalidArgumentError, match="label_smoothing"):
        softlight.cross_entropy(x, np.zeros(4, np.int64), label_smoothing=1.5)
    with pytest.raises(softlight.InvalidArgumentError, match="z_loss"):
        softlight.cross_entropy(x, np.zeros(4, np.int64), z_loss=-1.0)
    with pytest.raises(softlight.ArgumentTypeError, match="integers"):
        softlight.token_logprobs(x, np.zeros(4, np.float32))
    with pytest.raises(softlight.AxisError, match="out of range"):
        softlight.logsumexp(x, 2)
    with pytest.raises(softlight.UnsupportedDTypeError):
        softlight.entropy(np.zeros((2, 3), np.int32))


def test_broadcast_logits_are_computed(rng):
    """Inputs may alias themselves: logits broadcast over rows (row stride 0) give every row the
    one row's results, with the gradient written into a fresh array."""
    row = rng.standard_normal((1, 7))
    b = np.broadcast_to(row, (5, 7))
    t = np.array([3, 3, 3, 3, 3])
    loss, g = softlight.cross_entropy(b, t, reduction="none", grad=True)
    one, g1 = softlight.cross_entropy(row, t[:1], reduction="none", grad=True)
    assert np.allclose(loss, one[0], rtol=1e-14) and np.allclose(g, g1, rtol=1e-14)
    assert np.allclose(softlight.entropy(b), softlight.entropy(row)[0], rtol=1e-14)


def test_every_layout_and_axis_is_computed(rng):
    """Layouts the C ABI does not read in place (a Fortran-ordered array, a transpose, a reversed
    axis) go through a contiguous copy; logsumexp and entropy take any axis (dim= or axis=), logsumexp
    keepdim as torch and scipy do; all against float64."""
    x = rng.standard_normal((6, 9)) * 3
    for view in (np.asfortranarray(x), x.T.copy().T, x[::-1], x[:, ::-1]):
        ref = logsumexp_ref(np.ascontiguousarray(view))
        assert np.allclose(softlight.logsumexp(view), ref, rtol=1e-12, atol=1e-12)
        p = np.exp(np.ascontiguousarray(view) - ref[:, None])
        assert np.allclose(softlight.entropy(view), -(p * np.log(p)).sum(-1), rtol=1e-10, atol=1e-12)
    x3 = rng.standard_normal((3, 4, 5))
    for d in range(-3, 3):
        m = x3.max(axis=d, keepdims=True)
        ref = (np.log(np.exp(x3 - m).sum(axis=d, keepdims=True)) + m)
        assert np.allclose(softlight.logsumexp(x3, d, keepdim=True), ref, rtol=1e-12, atol=1e-12)
        assert np.allclose(softlight.logsumexp(x3, axis=d), ref.squeeze(d), rtol=1e-12, atol=1e-12)
        p = np.exp(x3 - ref)
        assert np.allclose(softlight.entropy(x3, axis=d), -(p * np.log(p)).sum(d), rtol=1e-10, atol=1e-12)
    with pytest.raises(softlight.ArgumentTypeError, match="not both"):
        softlight.logsumexp(x3, 0, axis=0)


def test_backward_takes_scalars_and_refuses_non_arrays(rng):
    """The gradients of one row may be numpy or Python scalars (as the forward returns them); an
    object that is no array is refused with a SoftlightError, not an AttributeError."""
    x = rng.standard_normal(50).astype(np.float32)
    got = softlight.row_stats(x, np.array(3), stats=("lse", "entropy", "logprobs"))
    kw = dict(entropy=got["entropy"], index=np.array(3), temperature=1.5)
    want = softlight.row_stats_backward(x, got["lse"], d_lse=np.array(0.5, np.float32),
                                        d_entropy=np.array(-0.25, np.float32), d_logprobs=np.array(2.0, np.float32),
                                        **kw)
    for d_lse, d_ent, d_lp in ((np.float32(0.5), np.float64(-0.25), 2.0), (0.5, -0.25, np.float32(2.0))):
        dx = softlight.row_stats_backward(x, got["lse"][()], d_lse=d_lse, d_entropy=d_ent, d_logprobs=d_lp, **kw)
        assert np.array_equal(dx, want)
    with pytest.raises(softlight.InvalidArgumentError, match="d_lse is not an array"):
        softlight.row_stats_backward(x, got["lse"], d_lse=object(), **kw)


@pytest.mark.parametrize("dtype", list(CODES))
def test_grad_scale_in_place(rng, dtype):
    """softlight_cross_entropy_grad_scale_cpu: each row times its factor (or the one factor), rounded
    once; a row whose factor is 1 left as it is (NaN there stays NaN, unread); refusals write nothing."""
    rows, cols, stride = 9, 1000, 1003
    g, gv = _storage(rng.standard_normal((rows, stride)), dtype)
    g[4, :cols] = g[4, 0] * np.nan if dtype != "bfloat16" else 0x7fc0  # a NaN row whose factor is 1
    gv = _values(g, dtype)
    acc = _acc(dtype)
    f = np.array([2.0, 1.0, -0.5, 256.0, 1.0, 0.0, 1.0, 3.0, 1e-3], acc)
    lib = ctypes.CDLL(softlight.library_path())
    before = g.copy()
    for bad in (dict(count=5), dict(count=0), dict(f=0)):
        kw = dict(f=f.ctypes.data, count=rows)
        kw.update(bad)
        assert _C.cross_entropy_grad_scale(g.ctypes.data, stride, rows, cols, CODES[dtype], kw["f"], kw["count"],
                                           2) != 0
    assert _C.cross_entropy_grad_scale(g.ctypes.data, stride, rows, cols, CODES[dtype], g.ctypes.data, rows, 2) == 5
    assert _C.cross_entropy_grad_scale(g.ctypes.data + 1, stride, rows, cols, CODES[dtype], f.ctypes.data, rows,
                                       2) == 11
    assert np.array_equal(g.view(np.uint8), before.view(np.uint8))  # nothing written
    assert _C.cross_entropy_grad_scale(g.ctypes.data, stride, rows, cols, CODES[dtype], f.ctypes.data, rows, 2) == 0
    got = _values(g, dtype)
    with np.errstate(invalid="ignore"):
        want = gv[:, :cols] * f[:, None].astype(np.float64)
    assert np.isnan(got[4, :cols]).all() and np.array_equal(got[1], gv[1])
    keep = np.arange(rows) != 4
    assert np.allclose(got[keep, :cols], want[keep], rtol=TOL[dtype][1], atol=TOL[dtype][0])
    assert np.array_equal(got[:, cols:], gv[:, cols:])  # past cols: untouched
    one = np.array([1.0], acc)  # one factor for every row; 1: nothing at all
    assert _C.cross_entropy_grad_scale(g.ctypes.data, stride, rows, cols, CODES[dtype], one.ctypes.data, 1, 2) == 0
    assert np.array_equal(_values(g, dtype)[keep], got[keep])
    assert lib.softlight_cross_entropy_grad_scale_cpu is not None


def test_c_abi_statuses_and_nothing_written(rng):
    """Each refusal returns its status with every output as it was."""
    lib = ctypes.CDLL(softlight.library_path())
    x = rng.standard_normal((4, 10)).astype(np.float32)
    out = np.full(4, POISON, np.float32)
    idx = np.array([0, 1, 10, 3])
    ptrs = [out.ctypes.data] + [0] * 7

    def stats(**kw):
        a = dict(x=x.ctypes.data, xs=10, rows=4, cols=10, dtype=0, t=1.0, idx=idx.ctypes.data, k=1, ks=1, off=0,
                 shard=False, outs=ptrs)
        a.update(kw)
        return _C.row_stats(*a.values(), 1)

    assert stats() == 11  # index 10 outside [0, 10)
    assert stats(shard=True) == 0 and np.isfinite(out).all()  # a shard: outside picks 0
    out[:] = POISON
    assert stats(idx=0, k=0, ks=0, outs=[x.ctypes.data] + [0] * 7) == 5  # an output over x
    assert stats(idx=0, k=0, ks=0, xs=-1) == 3  # a negative row stride (one under cols is an input's right)
    assert stats(idx=0, k=0, ks=0, x=x.ctypes.data + 2) == 11  # misaligned
    assert stats(idx=0, k=0, ks=0, t=-1.0) == 11
    assert stats(idx=0, k=0, ks=0, off=-1) == 11
    assert stats(idx=0, k=0, ks=0, x=0) == 1
    assert stats(idx=0, k=3, ks=3) == 1  # index_count without an index
    assert stats(idx=0, k=0, ks=0, rows=-1) == 2
    assert (out == POISON).all()
    f = lib.softlight_row_stats_cpu
    f.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p,
                  ctypes.c_int]
    assert f(x.ctypes.data, 10, 4, 10, 0, None, 1) == 1  # no options
    assert f(x.ctypes.data, 10, 4, 10, 9, None, 1) == 1
    loss = np.full(1, POISON, np.float32)
    t = np.array([0, 1, 2, 3])
    def ce(**kw):
        return _C.cross_entropy(*dict(dict(x=x.ctypes.data, xs=10, t=t.ctypes.data, rows=4, cols=10, dtype=0,
                                           temp=1.0, eps=0.0, zl=0.0, ign=True, ii=-100, red=2,
                                           loss=loss.ctypes.data, lse=0, grad=0, gs=0), **kw).values(), 1)
    assert ce(loss=0) == 1
    assert ce(loss=0, rows=0, red=0) == 0  # no rows, no reduction: the loss is a zero-size array
    assert ce(loss=0, rows=0, red=2) == 1  # a reduction writes its one value, even of nothing
    assert ce(red=3) == 11
    assert ce(eps=2.0) == 11
    assert ce(dtype=7) == 4
    assert ce(grad=x.ctypes.data + 4, gs=10) == 5  # a gradient over x, shifted
    assert (loss == POISON).all()
    assert ce(grad=x.ctypes.data, gs=10) == 0  # over x exactly: allowed


def test_sixteen_host_threads_give_exact_results(rng):
    """16 Python threads (the bindings release the GIL) on arrays of their own, each result equal to
    the same call made alone; the library's worker pool is shared among them."""
    xs = [(rng.standard_normal((64, 3000 + 7 * i)) * 3).astype(np.float32) for i in range(16)]
    ts = [rng.integers(0, x.shape[1], 64) for x in xs]

    def work(i):
        loss, g = softlight.cross_entropy(xs[i], ts[i], reduction="none", grad=True, label_smoothing=0.05)
        st = softlight.row_stats(xs[i], ts[i], stats=("lse", "entropy", "logprobs"))
        return loss, g, st

    alone = [work(i) for i in range(16)]
    for _ in range(3):
        together = in_threads(16, work)
        for (l0, g0, s0), (l1, g1, s1) in zip(alone, together):
            assert np.array_equal(l0, l1) and np.array_equal(g0, g1)
            assert all(np.array_equal(s0[k], s1[k]) for k in s0)


@pytest.mark.parametrize("offset", [0.0, 1e4, 1e6])
def test_label_smoothing_keeps_precision_at_an_offset(rng, offset):
    """The smoothing term from the differences from the row's max: logits sharing a large offset lose
    nothing more than torch's float64 reference allows (relative 1e-7 of the loss)."""
    x = (rng.standard_normal((64, 1000)) + offset).astype(np.float32)
    t = rng.integers(0, 1000, 64)
    x64 = x.astype(np.float64)
    m = x64.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(x64 - m).sum(-1, keepdims=True)))[:, 0]
    want = (0.9 * (lse - x64[np.arange(64), t]) + 0.1 * (lse - x64.mean(-1))).mean()
    got = float(softlight.cross_entropy(x, t, label_smoothing=0.1))
    assert abs(got - want) <= 1e-7 * abs(want), (got, want)


def test_float64_logits_near_the_largest(rng):
    """float64 logits near 1e308, whose log-sum-exp overflows: the loss and its gradient are finite
    (z_loss 0 multiplies nothing by the infinite lse), also with label_smoothing 1."""
    x = rng.uniform(1.5e308, 1.7e308, (4, 10))
    t = np.array([1, 2, 3, 4])
    for eps in (0.0, 0.3, 1.0):
        loss, g = softlight.cross_entropy(x, t, label_smoothing=eps, grad=True)
        assert np.isfinite(loss) and np.isfinite(g).all(), (eps, loss)
        d = x - x.max(-1, keepdims=True)
        log_sum = np.log(np.exp(d).sum(-1))
        want = ((1 - eps) * (log_sum - d[np.arange(4), t]) + eps * (log_sum - d.mean(-1))).mean()
        assert abs(float(loss) - want) <= 1e-12 * abs(want), (eps, loss, want)


def test_targets_and_ignore_index_refused_by_name(rng):
    """Targets that do not fit int64 and non-integral ignore_index are refused (no wrap to -100, no
    truncation to a class); lists, Python and numpy ints are taken."""
    x = rng.standard_normal((2, 5))
    with pytest.raises(softlight.InvalidArgumentError, match="does not fit int64"):
        softlight.cross_entropy(x, np.array([2**64 - 100, 1], np.uint64))
    with pytest.raises(softlight.ArgumentTypeError, match="ignore_index must be an int"):
        softlight.cross_entropy(x, [1, 2], ignore_index=1.5)
    with pytest.raises(softlight.InvalidArgumentError, match="does not fit int64"):
        softlight.cross_entropy(x, [1, 2], ignore_index=2**70)
    want = softlight.cross_entropy(x, np.array([1, 2]))
    assert softlight.cross_entropy(x, [1, 2]) == want
    assert softlight.token_logprobs(x[0], np.int64(3)) == softlight.token_logprobs(x[0], 3)
