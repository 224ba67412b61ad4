"""Float64 references and comparisons shared by the CPU and GPU tests."""
import numpy as np

# Tolerances by dtype: half an ulp of the output format (relative) plus float32 arithmetic, and an
# absolute floor for results near zero. They follow from the formats; they are not tuned.
TOL = {
    "float64": (1e-12, 1e-12),
    "float32": (1e-5, 1e-5),
    "float16": (1e-4, 1e-3),
    "bfloat16": (1e-3, 4e-3),
}
POISON = 7.0  # log-softmax is never positive, so a 7 left in an output was never written


def log_softmax_ref(x):
    """Float64 log-softmax over the last axis with torch's special-value rules: NaN or +inf in a
    row, or a row of all -inf, gives all NaN; -inf among finite values gives -inf."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        m = np.where(np.isnan(x), -np.inf, x).max(axis=-1, keepdims=True)
        shift = np.where(m == -np.inf, 0.0, m)
        s = np.exp(x - shift).sum(axis=-1, keepdims=True)
        return (x - m) - np.log(s)


def log_softmax_ref_axis(x, axis):
    """log_softmax_ref along any axis."""
    return np.moveaxis(log_softmax_ref(np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)), -1, axis)


def log_softmax_grad_ref(dy, y, axis=-1):
    """Float64 gradient of log-softmax: dy - exp(y) * sum(dy) along the axis."""
    dy = np.asarray(dy, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    with np.errstate(all="ignore"):
        return dy - np.exp(y) * dy.sum(axis=axis, keepdims=True)


def logsumexp_ref(x):
    """Float64 m + log(s) per row, by the same rules: NaN for rows holding NaN or +inf, -inf for
    rows of all -inf (and for empty rows)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        m = np.where(np.isnan(x), -np.inf, x).max(axis=-1, keepdims=True, initial=-np.inf)
        shift = np.where(m == -np.inf, 0.0, m)
        s = np.exp(x - shift).sum(axis=-1, keepdims=True)
        return (m + np.log(s))[..., 0]


def assert_matches(y, ref, dtype, what=""):
    """y (any float array, converted to float64) against the float64 reference: NaN exactly where
    the reference has NaN, the same infinities, finite values within the dtype's tolerance."""
    y = np.asarray(y, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert y.shape == ref.shape, (y.shape, ref.shape)
    atol, rtol = TOL[dtype]
    nan_y, nan_r = np.isnan(y), np.isnan(ref)
    bad = np.argwhere(nan_y != nan_r)
    assert bad.size == 0, f"{what}: NaN mismatch at {bad[:5].tolist()}"
    inf_r = np.isinf(ref)
    assert np.array_equal(y[inf_r], ref[inf_r]), f"{what}: infinities differ"
    fin = ~nan_r & ~inf_r
    assert np.isfinite(y[fin]).all(), f"{what}: non-finite output where the reference is finite"
    err = np.abs(y[fin] - ref[fin])
    lim = atol + rtol * np.abs(ref[fin])
    if err.size:
        worst = int(np.argmax(err - lim))
        assert (err <= lim).all(), (f"{what}: |y - ref| = {err[worst]:.3e} > {lim[worst]:.3e} "
                                    f"(ref {ref[fin][worst]:.6g}, dtype {dtype})")


def to_bfloat16_bits(x):
    """Round float32 values to bfloat16 (nearest even), returned as uint16 bit patterns."""
    f = np.asarray(x, dtype=np.float32)
    u = f.reshape(-1).view(np.uint32).astype(np.uint64)
    nan = np.isnan(f.reshape(-1))
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r.reshape(f.shape)


def from_bfloat16_bits(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# Rows whose results torch.log_softmax fixes (CUDA, float32 and bfloat16 alike).
SPECIAL_ROWS = [
    ([1.0, np.nan, 2.0], [np.nan] * 3),
    ([1.0, np.inf, 2.0], [np.nan] * 3),
    ([np.inf, np.inf, 0.0], [np.nan] * 3),
    ([np.inf, -np.inf, 0.0], [np.nan] * 3),
    ([-np.inf, -np.inf, -np.inf], [np.nan] * 3),
    ([-np.inf, 0.0, 1.0], [-np.inf, -1.3132616875182228, -0.31326168751822286]),
]


def special_matrix(rng, cols, dtype_np=np.float32):
    """Rows of random data with special values planted: NaN, +inf, all -inf, some -inf, and
    -inf at the first and last positions."""
    rows = []
    for kind in ("nan", "posinf", "allneginf", "someneginf", "edges", "plain", "onefinite"):
        r = rng.standard_normal(cols).astype(np.float64) * 3
        if kind == "nan":
            r[rng.integers(cols)] = np.nan
        elif kind == "posinf":
            r[rng.integers(cols)] = np.inf
        elif kind == "allneginf":
            r[:] = -np.inf
        elif kind == "someneginf":
            r[rng.random(cols) < 0.5] = -np.inf
        elif kind == "edges":
            r[0] = r[-1] = -np.inf
        elif kind == "onefinite":
            r[:] = -np.inf
            r[rng.integers(cols)] = 2.5
        rows.append(r)
    return np.stack(rows).astype(dtype_np)


def in_threads(n, work):
    """work(i) for i in range(n), each on its own thread; returns what each returned, and raises the
    first error any of them met."""
    import threading
    results, errors = [None] * n, []

    def run(i):
        try:
            results[i] = work(i)
        except Exception as e:  # noqa: BLE001 - raised below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
