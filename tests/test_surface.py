"""Every public entry, walked with a table of bad values for each argument: each raises a
SoftlightError subclass whose message names the argument, and writes nothing."""
import numpy as np
import pytest

import softlight
from softlight import SoftlightError

X = np.linspace(-2, 2, 12).reshape(3, 4)
T = np.array([0, 1, 3])

# (entry, good keyword arguments, {argument: [bad values]}) ; the first positional is the array.
BAD_REAL = [np.array([1.0, 2.0]), "2", b"2", [1.0], None, object()]
BAD_INT = [1.5, "1", None, object(), np.array([1, 2])]
TABLE = [
    (softlight.log_softmax, dict(x=X), {
        "x": [[[1.0, 2.0]], "x", object(), None, np.ones((2, 2), np.int32)],
        "dim": [2**70, -2**70, 1.5, "1", True, 2, -3],
        "axis": [1.5, "1", 2**70],
        "temperature": BAD_REAL + [0.0, -1.0, float("inf"), float("nan")],
        "out": [np.zeros((3, 5)), np.zeros((3, 4), np.float32), [1.0], "out"],
        "stream": [0, "s"],
    }),
    (softlight.log_softmax_backward, dict(grad=X, y=X), {
        "grad": [[[1.0]], "g", None],
        "y": [np.zeros((3, 5)), np.zeros((3, 4), np.float32), "y"],
        "dim": [2**70, 1.5, 2],
        "grad_in": [np.zeros((2, 4)), "gi"],
    }),
    (softlight.cross_entropy, dict(logits=X, target=T), {
        "logits": ["x", None, np.ones((3, 4), np.int64)],
        "target": ["abc", 1.5, [1.5, 2.0, 0.0], object(), np.array([0, 1, 4]), np.array([0, 1]),
                   np.array([2**64 - 100, 0, 0], np.uint64)],
        "ignore_index": [1.5, 2**70, "x", [1]],
        "reduction": [["mean"], "avg", None, 1],
        "label_smoothing": BAD_REAL + [1.5, -0.1],
        "z_loss": BAD_REAL + [-1.0, float("inf")],
        "temperature": BAD_REAL + [0.0],
        "grad": ["g", np.zeros((3, 5)), 3],
        "threads": [2**40, -1, 1.5, "2"],
    }),
    (softlight.token_logprobs, dict(logits=X, index=T), {
        "index": ["abc", [0.5, 1, 2], np.array([0, 1, 9]), object()],
        "temperature": BAD_REAL,
        "threads": [2**40, -1],
    }),
    (softlight.entropy, dict(logits=X), {
        "dim": [2**70, 1.5, 2],
        "axis": [2**70, "a"],
        "temperature": BAD_REAL,
        "threads": [2**40],
    }),
    (softlight.logsumexp, dict(logits=X), {
        "dim": [2**70, 1.5, 2, np.array([0, 1])],
        "keepdim": ["yes", None],
        "threads": [2**40],
    }),
    (softlight.row_stats, dict(logits=X), {
        "stats": ["lse", ["nope"], [1], None],
        "index_offset": [-1, 1.5, 2**70],
        "temperature": BAD_REAL,
    }),
    (softlight.row_stats_backward, dict(logits=X, lse=np.zeros(3)), {
        "lse": [np.zeros(4), "l", object()],
        "d_lse": [np.zeros(5), "d", object()],
        "index_offset": [-1, 1.5],
        "out": [np.zeros((3, 5)), "o"],
    }),
]
CASES = [(fn, good, arg, bad) for fn, good, table in TABLE for arg, bads in table.items() for bad in bads]


@pytest.mark.parametrize("fn,good,arg,bad", CASES,
                         ids=[f"{fn.__name__}-{arg}-{i}" for i, (fn, good, arg, bad) in enumerate(CASES)])
def test_bad_argument_is_named(fn, good, arg, bad):
    kw = dict(good)
    kw[arg] = bad
    first = list(kw)[0]
    x = kw.pop(first)
    with pytest.raises(SoftlightError) as e:
        fn(x, **kw)
    text = str(e.value)
    names = {arg, "x" if arg == first else arg}
    assert any(n in text for n in names) or (arg in ("x", "logits", "grad") and "array" in text) or \
        "dtype" in text, (arg, bad, text)


def test_raw_entry_arguments_are_named():
    y = np.zeros((3, 4))
    for kw, name in ((dict(threads=2**40), "threads"), (dict(threads=-1), "threads"), (dict(dtype="int8"), "dtype"),
                     (dict(dtype=np.float64, rows=-1), "rows"), (dict(x_stride=1.5), "x_stride")):
        args = dict(dtype=np.float64, device="cpu", rows=3)
        args.update(kw)
        rows = args.pop("rows")
        with pytest.raises(SoftlightError, match=name):
            softlight.log_softmax_raw(X.ctypes.data, y.ctypes.data, rows, 4, **args)
    assert (y == 0).all()
    assert softlight.log_softmax_raw(X.ctypes.data, y.ctypes.data, 3, 4, dtype=np.float64, device="cpu") is None
    assert np.allclose(y, softlight.log_softmax(X))
    softlight.log_softmax_raw(X.ctypes.data, y.ctypes.data, 3, 4, dtype=np.dtype("float64"), device="cpu")


def test_numpy_ints_everywhere():
    assert np.array_equal(softlight.logsumexp(X, np.int64(-1)), softlight.logsumexp(X, -1))
    assert np.array_equal(softlight.log_softmax(X, np.int32(0)), softlight.log_softmax(X, 0))
    assert softlight.cross_entropy(X, T, ignore_index=np.int64(1)) == softlight.cross_entropy(X, T, ignore_index=1)




def test_torch_entries_name_bad_arguments():
    """softlight.torch's entries, the same way (where torch is installed)."""
    torch = pytest.importorskip("torch")
    import softlight.torch as slt
    x, t = torch.randn(3, 4), torch.tensor([0, 1, 2])
    cases = [
        (lambda: slt.log_softmax(x, 2**70), "dim"), (lambda: slt.log_softmax(x, 1.5), "dim"),
        (lambda: slt.log_softmax(x, 5), "dim"), (lambda: slt.log_softmax(x, temperature="a"), "temperature"),
        (lambda: slt.log_softmax("x"), "x"),
        (lambda: slt.cross_entropy(x, t, reduction=["m"]), "reduction"),
        (lambda: slt.cross_entropy(x, t, ignore_index=1.5), "ignore_index"),
        (lambda: slt.cross_entropy(x, [0.5, 1, 2]), "target"), (lambda: slt.cross_entropy("x", t), "logits"),
        (lambda: slt.cross_entropy(x, t, label_smoothing=np.array([0.1, 0.2])), "label_smoothing"),
        (lambda: slt.cross_entropy(x, t, weight=torch.ones(5)), "weight"),
        (lambda: slt.token_logprobs(x, "abc"), "index"), (lambda: slt.entropy(x, dim=1.5), "dim"),
        (lambda: slt.logsumexp(x, 7), "dim"), (lambda: slt.row_stats(x, stats=["zz"]), "stats"),
        (lambda: slt.cross_entropy(x, t, temperature=0), "temperature"),
    ]
    for fn, name in cases:
        with pytest.raises(SoftlightError, match=name):
            fn()


def test_malformed_dlpack_device_and_raw_dtypes():
    class Odd:
        def __dlpack__(self, **kw):
            return X.__dlpack__()

        def __dlpack_device__(self):
            return ("cpu",)

    with pytest.raises(softlight.InvalidArgumentError, match="__dlpack_device__"):
        softlight.log_softmax(Odd())
    x = np.ones((2, 3), np.float32)
    y = np.zeros((2, 3), np.float32)
    softlight.log_softmax_raw(x.ctypes.data, y.ctypes.data, 2, 3, dtype=np.float32, device="cpu")
    assert np.allclose(y, -np.log(3))
