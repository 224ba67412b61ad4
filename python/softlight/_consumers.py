"""The consumers of a row's log-sum-exp for any DLPack array: cross-entropy, the log-probabilities of
chosen tokens, entropy, the log-sum-exp, and the row statistics they come from (docs/consumers.md).

Logits are (..., V), the vocabulary on the last axis, its elements contiguous and the leading axes
merging into one evenly strided axis of rows. On the CPU token indices are any integer array (made
int64 on the host); on the GPU they are a C-contiguous int64 array on the logits' device, and the
statistics' gradient takes its inputs as C-contiguous arrays of the accumulation type there too.
Results are of the accumulation type: float32, or float64 for float64 logits. On the GPU a token
outside the row gives NaN for what it picks (the CPU refuses the call).
"""
import math

import numpy as np

from . import _C
from ._arrays import device_name, empty_like, read
from ._api import _check_temperature, _finish, _first, _output
from ._errors import ArgumentTypeError, InvalidArgumentError, check

STATS = ("lse", "entropy", "logprobs", "picked", "sum", "max", "sumexp", "moment")
_REDUCTIONS = {"none": 0, "sum": 1, "mean": 2}


def _rows(arr, name):
    """(rows, cols, row stride) of an array read as `arr`, or raise where its layout is not rows."""
    shape, strides = tuple(arr[1]), arr[2]
    if len(shape) == 0:
        raise InvalidArgumentError(f"softlight: {name} must have at least one axis (the vocabulary's)")
    cols = shape[-1]
    if strides is None or 0 in shape:
        return math.prod(shape[:-1]), cols, cols
    strides = tuple(strides)
    if cols > 1 and strides[-1] != 1:
        raise InvalidArgumentError(f"softlight: the last axis of {name} (strides {strides}) is not contiguous; "
                                   f"pass a contiguous array")
    lead = [(n, s) for n, s in zip(shape[:-1], strides[:-1]) if n != 1]
    rows = math.prod(shape[:-1])
    if not lead:
        return rows, cols, cols
    for (n0, s0), (n1, s1) in zip(lead, lead[1:]):
        if s0 != s1 * n1:
            raise InvalidArgumentError(f"softlight: the leading axes of {name} (shape {shape}, strides {strides}) "
                                       f"do not merge into one evenly strided axis; pass a contiguous array")
    return rows, cols, lead[-1][1]


def _logits(logits, name="logits"):
    """(array as read, (rows, cols, row stride), stream handle) of the logits."""
    xa, handle = _first(logits, None)
    return xa, _rows(xa, name), handle


def _device_array(a, xa, shape, name, integer):
    """(pointer, keep) of a C-contiguous int64 (integer) or accumulation-type array of `shape` on the
    logits' GPU."""
    if not hasattr(a, "__dlpack__"):
        raise ArgumentTypeError(f"softlight: {name} must be an array on {device_name(xa)}")
    ptr, ashape, strides, dl, (dev_type, dev_id), _ = _C.dlpack_view(cap := a.__dlpack__())
    want = (0, 64, 1) if integer else ((2, 64, 1) if xa[3] == 3 else (2, 32, 1))
    kind = "int64" if integer else ("float64" if xa[3] == 3 else "float32")
    if dev_type not in (2, 13) or dev_id != xa[5]:
        raise InvalidArgumentError(f"softlight: {name} must be on {device_name(xa)}")
    if tuple(dl) != want:
        raise InvalidArgumentError(f"softlight: {name} must be {kind} on the GPU")
    if tuple(ashape) != tuple(shape):
        raise InvalidArgumentError(f"softlight: {name} has shape {tuple(ashape)}, expected {tuple(shape)}")
    expect, step = [], 1
    for n in reversed(tuple(shape)):
        expect.insert(0, step)
        step *= n
    if any(s != e for n, s, e in zip(shape, strides, expect) if n != 1):
        raise InvalidArgumentError(f"softlight: {name} must be C-contiguous")
    return ptr, cap


def _indices(index, lead, name):
    """index as a C-contiguous int64 numpy array of shape lead or lead + (K,), and K (None: one per row)."""
    if index is None:
        return None, 0
    try:
        arr = np.from_dlpack(index) if not isinstance(index, np.ndarray) else index
    except (TypeError, BufferError, RuntimeError) as e:
        raise ArgumentTypeError(f"softlight: {name} must be an integer array on the CPU: {e}") from e
    if arr.dtype.kind not in "iu":
        raise ArgumentTypeError(f"softlight: {name} must hold integers, got {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.int64).reshape(np.shape(arr))  # (0-d stays 0-d)
    if arr.shape == lead:
        return arr, None
    if arr.shape[:-1] == lead:
        return arr, arr.shape[-1]
    raise InvalidArgumentError(f"softlight: {name} has shape {arr.shape}; the logits' leading shape is {lead} "
                               f"(one index a position, or (..., K) for K)")


def _check_range(idx, cols, name, ignore=None):
    """Raise, naming the first, where an index is outside [0, cols) (and not `ignore`)."""
    if idx is None or idx.size == 0:
        return
    bad = (idx < 0) | (idx >= cols)
    if ignore is not None:
        bad &= idx != ignore
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InvalidArgumentError(f"softlight: {name}{list(where)} = {int(idx[where])} is outside the vocabulary "
                                   f"[0, {cols})" + ("" if ignore is None else f" and is not ignore_index ({ignore})"))


def _acc_dtype(xa):
    return "float64" if xa[3] == 3 else "float32"


def _new(like, xa, shape):
    out = empty_like(like, xa, shape=shape, dtype=_acc_dtype(xa))
    return out, read(out)[0][0]


def row_stats(logits, index=None, *, stats=("lse",), temperature=1.0, index_offset=0, shard=False, threads=0):
    """Statistics of each row of z = logits / temperature from one read (dict name -> array):

    lse (log-sum-exp), entropy (-sum p log p), logprobs (z[index] - lse, shape of index), picked
    (z[index]), sum (sum of z), max, sumexp (sum exp(z - max)) and moment (sum exp(z - max) (z - max)),
    which merge the statistics of vocabulary shards. With shard=True the logits are the columns of
    tokens index_offset .. index_offset + V - 1 and indices outside them pick 0; otherwise every index
    must be in [0, V)."""
    temperature = _check_temperature(temperature)
    for s in stats:
        if s not in STATS:
            raise InvalidArgumentError(f"softlight: unknown statistic {s!r}; known: {', '.join(STATS)}")
    xa, (rows, cols, xs), handle = _logits(logits)
    lead = tuple(xa[1])[:-1]
    idx_ptr, k, keep = _index_of(index, xa, lead, cols, shard)
    if index is None and ("logprobs" in stats or "picked" in stats):
        raise InvalidArgumentError("softlight: logprobs and picked need an index")
    count = 0 if index is None else (1 if k is None else k)
    outs, ptrs = {}, [0] * 8
    for s in stats:
        shape = (lead + (() if k is None else (k,))) if s in ("logprobs", "picked") else lead
        outs[s], ptrs[STATS.index(s)] = _new(logits, xa, shape)
    st = _C.row_stats(xa[0], xs, rows, cols, xa[3], temperature, idx_ptr, count, count, int(index_offset),
                      bool(shard), ptrs, threads, xa[4], handle)
    check(st)
    del keep
    _finish(xa, handle)
    return outs


def _index_of(index, xa, lead, cols, shard, name="index", ignore=None):
    """(pointer, K or None, what keeps it alive) of the token indices: host int64 on the CPU (checked
    against the vocabulary unless shard), an int64 device array on the GPU."""
    if index is None:
        return 0, None, None
    if not xa[4]:
        idx, k = _indices(index, lead, name)
        if not shard:
            _check_range(idx, cols, name, ignore)
        return idx.ctypes.data, k, idx
    shape = tuple(getattr(index, "shape", ()))
    if shape != lead and shape[:-1] != lead:
        raise InvalidArgumentError(f"softlight: {name} has shape {shape}; the logits' leading shape is {lead}")
    ptr, keep = _device_array(index, xa, shape, name, True)
    return ptr, (None if shape == lead else shape[-1]), keep


def row_stats_backward(logits, lse, *, entropy=None, d_lse=None, d_entropy=None, d_logprobs=None, d_picked=None,
                       d_sum=None, index=None, temperature=1.0, index_offset=0, shard=False, out=None, threads=0):
    """The gradient with respect to the logits of a loss of their row statistics, given the loss's
    gradient with respect to each (arrays of the accumulation type shaped as row_stats returns them,
    None for zero), in one read of the logits and one write: dz = p (d_lse - sum d_logprobs -
    d_entropy (log p + entropy)) + d_sum + (d_picked + d_logprobs) at each index, dx = dz / temperature.
    lse (and entropy, with d_entropy) are the forward's. `out` may be the logits themselves."""
    temperature = _check_temperature(temperature)
    xa, (rows, cols, xs), handle = _logits(logits)
    lead = tuple(xa[1])[:-1]
    idx_ptr, k, keep_index = _index_of(index, xa, lead, cols, shard)
    count = 0 if index is None else (1 if k is None else k)
    acc = np.float64 if xa[3] == 3 else np.float32
    keep = [keep_index]

    def small(a, name, per_index=False):
        if a is None:
            return 0
        want = lead + ((() if k is None else (k,)) if per_index else ())
        if xa[4]:
            ptr, cap = _device_array(a, xa, want, name, False)
            keep.append(cap)
            return ptr
        if isinstance(a, (np.ndarray, np.generic, int, float)):  # (numpy scalars have no __dlpack__)
            v = np.asarray(a)
        else:
            try:
                v = np.from_dlpack(a)
            except (AttributeError, TypeError, BufferError, RuntimeError) as e:
                raise InvalidArgumentError(f"softlight: {name} is not an array on the host ({e})") from None
        v = np.ascontiguousarray(v, dtype=acc).reshape(np.shape(v))
        if v.shape != want:
            raise InvalidArgumentError(f"softlight: {name} has shape {v.shape}, expected {want}")
        keep.append(v)
        return v.ctypes.data

    if (d_logprobs is not None or d_picked is not None) and index is None:
        raise InvalidArgumentError("softlight: d_logprobs and d_picked need the index")
    ins = [small(lse, "lse"), small(entropy, "entropy"), small(d_lse, "d_lse"), small(d_entropy, "d_entropy"),
           small(d_logprobs, "d_logprobs", True), small(d_picked, "d_picked", True), small(d_sum, "d_sum")]
    out, oa = _output(out, logits, xa, handle, "out")
    ostride = _rows(oa, "out")[2]
    st = _C.row_stats_backward(xa[0], xs, oa[0], ostride, rows, cols, xa[3], temperature, idx_ptr, count, count,
                               int(index_offset), bool(shard), ins, threads, xa[4], handle)
    check(st)
    del keep
    _finish(xa, handle)
    return out


def cross_entropy(logits, target, *, ignore_index=-100, label_smoothing=0.0, reduction="mean", z_loss=0.0,
                  temperature=1.0, return_lse=False, grad=None, threads=0):
    """torch.nn.functional.cross_entropy of (N, C) or (C,) logits against class indices, plus z_loss *
    lse^2 per row and a temperature, from one read of the logits.

    grad: None, True (a new array) or an array of the logits' shape and dtype (the logits themselves
    allowed) that receives the gradient of the loss with respect to the logits, written in the same
    pass. Returns the loss (an array of the accumulation type: shape (N,) for reduction="none", else
    0-d), followed by lse (return_lse) and the gradient (grad), as a tuple where either is asked."""
    temperature = _check_temperature(temperature)
    if reduction not in _REDUCTIONS:
        raise InvalidArgumentError(f"softlight: reduction must be one of {', '.join(_REDUCTIONS)}, got {reduction!r}")
    label_smoothing, z_loss = float(label_smoothing), float(z_loss)
    if not 0.0 <= label_smoothing <= 1.0:
        raise InvalidArgumentError(f"softlight: label_smoothing must be in [0, 1], got {label_smoothing}")
    if not (z_loss >= 0.0 and math.isfinite(z_loss)):
        raise InvalidArgumentError(f"softlight: z_loss must be finite and non-negative, got {z_loss}")
    xa, (rows, cols, xs), handle = _logits(logits)
    if len(xa[1]) > 2:
        raise InvalidArgumentError(f"softlight: logits of shape {tuple(xa[1])}: pass (N, C) or (C,) "
                                   f"(softlight.torch.cross_entropy takes torch's (N, C, d1, ...) too)")
    lead = tuple(xa[1])[:-1]
    idx_ptr, k, keep = _index_of(target, xa, lead, cols, False, "target", ignore_index)
    if k is not None:
        raise InvalidArgumentError(f"softlight: target has shape {lead + (k,)}, expected {lead}")
    red = _REDUCTIONS[reduction]
    loss, loss_ptr = _new(logits, xa, lead if red == 0 else ())
    lse, lse_ptr = _new(logits, xa, lead) if return_lse else (None, 0)
    g, gptr, gstride = None, 0, 0
    if grad is not None and grad is not False:
        g, ga = _output(None if grad is True else grad, logits, xa, handle, "grad")
        gptr, gstride = ga[0], _rows(ga, "grad")[2]
    st = _C.cross_entropy(xa[0], xs, idx_ptr, rows, cols, xa[3], temperature, label_smoothing, z_loss,
                          ignore_index is not None, 0 if ignore_index is None else int(ignore_index), red, loss_ptr,
                          lse_ptr, gptr, gstride, threads, xa[4], handle)
    check(st)
    del keep
    _finish(xa, handle)
    extra = ((lse,) if return_lse else ()) + ((g,) if g is not None else ())
    return (loss,) + extra if extra else loss


def token_logprobs(logits, index, *, temperature=1.0, threads=0):
    """log_softmax(logits / temperature) at `index` (shape (...) or (..., K) for K tokens a position),
    without a vocabulary-sized output: gather(log_softmax(x), -1, index), from one read."""
    return row_stats(logits, index, stats=("logprobs",), temperature=temperature, threads=threads)["logprobs"]


def entropy(logits, *, temperature=1.0, threads=0):
    """The entropy -sum p log p of p = softmax(logits / temperature) over the last axis, from one read."""
    return row_stats(logits, stats=("entropy",), temperature=temperature, threads=threads)["entropy"]


def logsumexp(logits, dim=-1, *, threads=0):
    """log(sum(exp(logits))) over the last axis (dim must name it), from one read."""
    nd = len(_first(logits, None)[0][1])
    if type(dim) is not int or not -max(nd, 1) <= dim < max(nd, 1) or dim % max(nd, 1) != max(nd, 1) - 1:
        raise InvalidArgumentError(f"softlight: logsumexp runs over the last axis; got dim={dim!r} for a {nd}-d "
                                   f"array (move the axis last first)")
    return row_stats(logits, stats=("lse",), threads=threads)["lse"]
