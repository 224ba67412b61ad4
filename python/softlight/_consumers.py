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
from ._arrays import (DEVICE_ID, DTYPE, FRAMEWORK, ON_GPU, PTR, SHAPE, STRIDES, contiguous, copy_into, device_name,
                      empty_like, read)
from ._api import _check_dim, _check_temperature, _finish, _first, _int_arg, _output, _real, log_softmax
from ._errors import ArgumentTypeError, AxisError, InvalidArgumentError, check

STATS = ("lse", "entropy", "logprobs", "picked", "sum", "max", "sumexp", "moment")
_REDUCTIONS = {"none": 0, "sum": 1, "mean": 2}


def _rows(arr, name):
    """(rows, cols, row stride) of an array read as `arr`, or None where its layout is not rows the C
    ABI reads in place: the last axis contiguous and the others one evenly strided axis, as
    softlight_layout_nd forms them along the last axis (docs/semantics.md)."""
    shape, strides = tuple(arr[SHAPE]), arr[STRIDES]
    if len(shape) == 0:
        raise InvalidArgumentError(f"softlight: {name} must have at least one axis (the vocabulary's)")
    cols = shape[-1]
    if strides is None or 0 in shape:
        return math.prod(shape[:-1]), cols, cols
    status, n, s = _C.layout(shape, tuple(strides), -1)
    if status != 0 or (cols > 1 and s[1] != 1):  # the last axis must be contiguous
        return None
    return n[0], cols, s[0] if n[0] > 1 else cols


def _logits(logits, name="logits"):
    """(array as read, (rows, cols, row stride), stream handle, the array read) of the logits: a
    contiguous copy where their layout is not rows that the C ABI reads in place (docs/semantics.md)."""
    xa, handle = _first(logits, None, name)
    rows = _rows(xa, name)
    if rows is None:
        logits = contiguous(logits, xa[FRAMEWORK])
        xa = read(logits, handle)[0]
        rows = _rows(xa, name)
    return xa, rows, handle, logits


def _device_array(a, xa, shape, name, integer):
    """(pointer, keep) of a C-contiguous int64 (integer) or accumulation-type array of `shape` on the
    logits' GPU."""
    if not hasattr(a, "__dlpack__"):
        raise ArgumentTypeError(f"softlight: {name} must be an array on {device_name(xa)}")
    ptr, ashape, strides, dl, (dev_type, dev_id), _ = _C.dlpack_view(cap := a.__dlpack__())
    want = (0, 64, 1) if integer else ((2, 64, 1) if xa[DTYPE] == 3 else (2, 32, 1))
    kind = "int64" if integer else ("float64" if xa[DTYPE] == 3 else "float32")
    if dev_type not in (2, 13) or dev_id != xa[DEVICE_ID]:
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
    arr = _host_integers(index, name)
    arr = np.ascontiguousarray(arr, dtype=np.int64).reshape(np.shape(arr))  # (0-d stays 0-d)
    if arr.shape == lead:
        return arr, None
    if arr.shape[:-1] == lead:
        return arr, arr.shape[-1]
    raise InvalidArgumentError(f"softlight: {name} has shape {arr.shape}; the logits' leading shape is {lead} "
                               f"(one index a position, or (..., K) for K)")


def _host_integers(index, name):
    """index (any integer array on the host, a list, a Python or numpy int) as a numpy integer array
    whose values fit int64."""
    if isinstance(index, np.ndarray):
        arr = index
    elif hasattr(index, "__dlpack__"):
        try:
            arr = np.from_dlpack(index)
        except (TypeError, BufferError, RuntimeError, ValueError) as e:
            raise ArgumentTypeError(f"softlight: {name} must be an integer array on the CPU: {e}") from None
    else:
        try:
            arr = np.asarray(index)
        except (TypeError, ValueError, OverflowError) as e:
            raise ArgumentTypeError(f"softlight: {name} must be an integer array, got {type(index).__qualname__}: "
                                    f"{e}") from None
        if arr.dtype == object:
            raise InvalidArgumentError(f"softlight: {name} holds values that do not fit int64")
    if arr.dtype.kind not in "iu":
        raise ArgumentTypeError(f"softlight: {name} must hold integers, got {arr.dtype}")
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) > 2**63 - 1:
        raise InvalidArgumentError(f"softlight: {name} holds {int(arr.max())}, which does not fit int64")
    return arr


def _ignore_index(v):
    """cross-entropy's ignore_index as an int64 value (None: none ignored)."""
    if v is None:
        return None
    if type(v) is int and -2**63 <= v < 2**63:
        return v
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise ArgumentTypeError(f"softlight: ignore_index must be an int, got {type(v).__qualname__} {v!r}")
    v = v.__index__()
    if not -2**63 <= v < 2**63:
        raise InvalidArgumentError(f"softlight: ignore_index {v} does not fit int64")
    return v


def ce_options(reduction, ignore_index, label_smoothing, z_loss):
    """cross-entropy's options checked, as (reduction code, ignore_index, label_smoothing, z_loss): the
    one check of the plain, torch and vocab-parallel functions."""
    if type(reduction) is not str or reduction not in _REDUCTIONS:
        raise InvalidArgumentError(f"softlight: reduction must be one of {', '.join(_REDUCTIONS)}, got {reduction!r}")
    label_smoothing, z_loss = _real(label_smoothing, "label_smoothing"), _real(z_loss, "z_loss")
    if not 0.0 <= label_smoothing <= 1.0:
        raise InvalidArgumentError(f"softlight: label_smoothing must be in [0, 1], got {label_smoothing}")
    if not (z_loss >= 0.0 and math.isfinite(z_loss)):
        raise InvalidArgumentError(f"softlight: z_loss must be finite and non-negative, got {z_loss}")
    return _REDUCTIONS[reduction], _ignore_index(ignore_index), label_smoothing, z_loss


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


def _rows_output(out, oa, logits, xa, handle):
    """(array written, as read) for a row-sized output `out`: itself where its layout is rows the C
    ABI writes in place, else a new contiguous array whose values the caller copies into it."""
    if _rows(oa, "out") is not None:
        return out, oa
    tmp = empty_like(logits, xa)
    return tmp, read(tmp, handle)[0]


def _acc_dtype(xa):
    return "float64" if xa[DTYPE] == 3 else "float32"


def _new(like, xa, shape):
    out = empty_like(like, xa, shape=shape, dtype=_acc_dtype(xa))
    return out, read(out)[0][PTR]


def row_stats(logits, index=None, *, stats=("lse",), temperature=1.0, index_offset=0, shard=False, threads=0):
    """Statistics of each row of z = logits / temperature from one read (dict name -> array):

    lse (log-sum-exp), entropy (-sum p log p), logprobs (z[index] - lse, shape of index), picked
    (z[index]), sum (sum of z), max, sumexp (sum exp(z - max)) and moment (sum exp(z - max) (z - max)),
    which merge the statistics of vocabulary shards. With shard=True the logits are the columns of
    tokens index_offset .. index_offset + V - 1 and indices outside them pick 0; otherwise every index
    must be in [0, V)."""
    temperature = _check_temperature(temperature)
    if isinstance(stats, str) or not hasattr(stats, "__iter__"):
        raise ArgumentTypeError(f"softlight: stats must be a sequence of names, got {type(stats).__qualname__}")
    for s in stats:
        if type(s) is not str or s not in STATS:
            raise InvalidArgumentError(f"softlight: stats names an unknown statistic {s!r}; known: {', '.join(STATS)}")
    index_offset = _int_arg(index_offset, "index_offset")
    xa, (rows, cols, xs), handle, logits = _logits(logits)
    lead = tuple(xa[SHAPE])[:-1]
    idx_ptr, k, keep = _index_of(index, xa, lead, cols, shard)
    if index is None and ("logprobs" in stats or "picked" in stats):
        raise InvalidArgumentError("softlight: logprobs and picked need an index")
    count = 0 if index is None else (1 if k is None else k)
    outs, ptrs = {}, [0] * 8
    for s in stats:
        shape = (lead + (() if k is None else (k,))) if s in ("logprobs", "picked") else lead
        outs[s], ptrs[STATS.index(s)] = _new(logits, xa, shape)
    st = _C.row_stats(xa[PTR], xs, rows, cols, xa[DTYPE], temperature, idx_ptr, count, count, index_offset,
                      bool(shard), ptrs, _threads(threads), xa[ON_GPU], handle)
    check(st)
    del keep
    _finish(xa, handle)
    return outs


def _index_of(index, xa, lead, cols, shard, name="index", ignore=None):
    """(pointer, K or None, what keeps it alive) of the token indices: host int64 on the CPU (checked
    against the vocabulary unless shard), an int64 device array on the GPU."""
    if index is None:
        return 0, None, None
    if not xa[ON_GPU]:
        idx, k = _indices(index, lead, name)
        if not shard:
            _check_range(idx, cols, name, ignore)
        return idx.ctypes.data, k, idx
    if not hasattr(index, "__dlpack__") or not hasattr(index, "shape"):
        raise ArgumentTypeError(f"softlight: {name} must be an int64 array on {device_name(xa)}, got "
                                f"{type(index).__qualname__}")
    shape = tuple(index.shape)
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
    index_offset = _int_arg(index_offset, "index_offset")
    xa, (rows, cols, xs), handle, logits = _logits(logits)
    lead = tuple(xa[SHAPE])[:-1]
    idx_ptr, k, keep_index = _index_of(index, xa, lead, cols, shard)
    count = 0 if index is None else (1 if k is None else k)
    acc = np.float64 if xa[DTYPE] == 3 else np.float32
    keep = [keep_index]

    def small(a, name, per_index=False):
        if a is None:
            return 0
        want = lead + ((() if k is None else (k,)) if per_index else ())
        if xa[ON_GPU]:
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
    target, ta = _rows_output(out, oa, logits, xa, handle)
    st = _C.row_stats_backward(xa[PTR], xs, ta[PTR], _rows(ta, "out")[2], rows, cols, xa[DTYPE], temperature, idx_ptr,
                               count, count, index_offset, bool(shard), ins, _threads(threads), xa[ON_GPU], handle)
    check(st)
    if target is not out:
        copy_into(out, target, xa[FRAMEWORK])
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
    red, ignore_index, label_smoothing, z_loss = ce_options(reduction, ignore_index, label_smoothing, z_loss)
    if grad is not None and grad is not False and grad is not True and not hasattr(grad, "__dlpack__") and \
            not hasattr(grad, "__array_interface__"):
        raise ArgumentTypeError(f"softlight: grad must be None, True or an array, got {type(grad).__qualname__}")
    xa, (rows, cols, xs), handle, logits = _logits(logits)
    if len(xa[SHAPE]) > 2:
        raise InvalidArgumentError(f"softlight: logits of shape {tuple(xa[SHAPE])}: pass (N, C) or (C,) "
                                   f"(softlight.torch.cross_entropy takes torch's (N, C, d1, ...) too)")
    lead = tuple(xa[SHAPE])[:-1]
    idx_ptr, k, keep = _index_of(target, xa, lead, cols, False, "target", ignore_index)
    if k is not None:
        raise InvalidArgumentError(f"softlight: target has shape {lead + (k,)}, expected {lead}")
    loss, loss_ptr = _new(logits, xa, lead if red == 0 else ())
    lse, lse_ptr = _new(logits, xa, lead) if return_lse else (None, 0)
    g, gt, gptr, gstride = None, None, 0, 0
    if grad is not None and grad is not False:
        g, ga = _output(None if grad is True else grad, logits, xa, handle, "grad")
        gt, ga = _rows_output(g, ga, logits, xa, handle)
        gptr, gstride = ga[PTR], _rows(ga, "grad")[2]
    st = _C.cross_entropy(xa[PTR], xs, idx_ptr, rows, cols, xa[DTYPE], temperature, label_smoothing, z_loss,
                          ignore_index is not None, 0 if ignore_index is None else ignore_index, red, loss_ptr,
                          lse_ptr, gptr, gstride, _threads(threads), xa[ON_GPU], handle)
    check(st)
    del keep
    if gt is not g:
        copy_into(g, gt, xa[FRAMEWORK])
    _finish(xa, handle)
    extra = ((lse,) if return_lse else ()) + ((g,) if g is not None else ())
    return (loss,) + extra if extra else loss


def token_logprobs(logits, index, *, temperature=1.0, threads=0):
    """log_softmax(logits / temperature) at `index` (shape (...) or (..., K) for K tokens a position),
    without a vocabulary-sized output: gather(log_softmax(x), -1, index), from one read."""
    return row_stats(logits, index, stats=("logprobs",), temperature=temperature, threads=threads)["logprobs"]


def _moved(logits, dim, axis):
    """logits with the axis `dim` (or `axis`) last, as a view (read through a copy where needed)."""
    dim = _check_dim(dim, axis)
    xa = _first(logits, None, "logits")[0]
    nd = len(xa[SHAPE])
    if not -max(nd, 1) <= dim < max(nd, 1):
        raise AxisError(f"softlight: dim {dim} is out of range for a {nd}-d array")
    if nd == 0 or dim % nd == nd - 1:
        return logits
    if xa[FRAMEWORK] == "torch":
        return logits.movedim(dim, -1)
    if xa[FRAMEWORK] in ("numpy", "cupy"):
        d = dim % nd
        return logits.transpose([i for i in range(nd) if i != d] + [d])
    raise InvalidArgumentError(f"softlight: dim {dim} of a {type(logits).__module__} array: move the axis last first")


def entropy(logits, dim=-1, *, axis=None, temperature=1.0, threads=0):
    """The entropy -sum p log p of p = softmax(logits / temperature) along `dim` (or `axis`; default the
    last), from one read (another axis than the last is read through a contiguous copy)."""
    x = _moved(logits, dim, axis)
    return row_stats(x, stats=("entropy",), temperature=temperature, threads=threads)["entropy"]


def logsumexp(logits, dim=-1, *, axis=None, keepdim=False, threads=0):
    """log(sum(exp(logits))) along `dim` (or `axis`; default the last), as torch.logsumexp and
    scipy.special.logsumexp (keepdim keeps the axis, of size 1), in float32 (float64 for float64),
    from one read. Over the last axis the row statistics' pass; over another, the log-softmax's
    strided pass (which writes the log-softmax too)."""
    dim = _check_dim(dim, axis)
    xa = _first(logits, None, "logits")[0]
    nd = len(xa[SHAPE])
    if not -max(nd, 1) <= dim < max(nd, 1):
        raise AxisError(f"softlight: dim {dim} is out of range for a {nd}-d array")
    if type(keepdim) is not bool:
        raise ArgumentTypeError(f"softlight: keepdim must be a bool, got {type(keepdim).__qualname__}")
    if nd == 0 or dim % nd == nd - 1:
        lse = row_stats(logits, stats=("lse",), threads=threads)["lse"]
    else:
        lse = log_softmax(logits, dim, return_lse=True)[1]
    if keepdim and nd:
        d = dim % nd
        lse = lse.reshape(tuple(xa[SHAPE])[:d] + (1,) + tuple(xa[SHAPE])[d + 1:])
    return lse


def _threads(threads):
    return _int_arg(threads, "threads", 0, 2**31 - 1)
