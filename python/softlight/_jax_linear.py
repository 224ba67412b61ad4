"""The LM head with its loss in JAX (softlight.jax.linear_cross_entropy): cross-entropy of
hidden @ weight.T (+ bias) without the (tokens, vocabulary) logits in memory, under jax.jit and
jax.grad.

The tokens go in chunks through a lax.fori_loop: each chunk's logits from a matmul (XLA's GEMM, cuBLAS
on a GPU), its loss and the gradient of its logits from float32 (XLA fuses the log-sum-exp and the
gradient into the matmuls' neighbours), the gradient through the two matmuls of the backward before
the next chunk. The chunk windows are dynamic slices of hidden, never a copy: the last one is moved
back to end at the last token, and its rows that an earlier chunk took are masked. Sums over chunks
(the weight's and the bias's gradients) are kept in float32 (float64 for float64) and rounded once.
memory="speed": four chunks, the gradients computed in the forward where the loss is reduced;
"low_memory": chunks of at most 64 MiB of logits. Both keep the weight gradient's float32 sum (4 V D
bytes); the vocabulary-chunked low-memory form is softlight.torch's alone.
"""
from functools import partial

import jax
import jax.numpy as jnp

from ._errors import InvalidArgumentError

MODES = ("speed", "low_memory")
_SPEED_CHUNKS = 4
_LOW_MEMORY_CHUNK_BYTES = 64 << 20


def _acc(dtype):
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


def _chunk(tokens, vocab, itemsize, memory):
    if memory == "speed":
        return max(1, -(-tokens // _SPEED_CHUNKS))
    return max(1, min(tokens, _LOW_MEMORY_CHUNK_BYTES // max(1, vocab * itemsize)))


def _chunk_grads(hc, tc, valid, d_rows, weight, bias, opts):
    """A chunk's loss rows, lse, and the gradient of d_rows . loss with respect to its logits (in the
    weight's dtype), masked to the valid rows."""
    ignore, smoothing, z_loss, softcap, temperature = opts
    acc = _acc(weight.dtype)
    z = jnp.matmul(hc, weight.T, preferred_element_type=acc)
    if bias is not None:
        z = z + bias.astype(acc)
    z = z.astype(weight.dtype).astype(acc)  # the logits in the inputs' dtype, as the plain computation has them
    factor = None
    if softcap is not None:
        th = jnp.tanh(z / softcap)
        z, factor = softcap * th, 1 - th * th
    zt = z / temperature
    keep = valid & ((tc != ignore) if ignore is not None else True)
    safe_t = jnp.where(keep, tc, 0)
    lse = jax.nn.logsumexp(zt, axis=-1)
    picked = jnp.take_along_axis(zt, safe_t[:, None], axis=-1)[:, 0]
    vocab = z.shape[-1]
    rows = (1 - smoothing) * (lse - picked)
    if smoothing:
        rows = rows + smoothing * (lse - zt.mean(-1))
    if z_loss:
        rows = rows + z_loss * lse * lse
    rows = jnp.where(keep, rows, 0)
    if d_rows is None:
        return rows, lse, None
    p = jnp.exp(zt - lse[:, None])
    g = p * (1 + 2 * z_loss * lse)[:, None] - (1 - smoothing) * jax.nn.one_hot(safe_t, vocab, dtype=acc)
    if smoothing:
        g = g - smoothing / vocab
    g = g * (jnp.where(keep, d_rows, 0) / temperature)[:, None]
    if factor is not None:
        g = g * factor
    return rows, lse, g.astype(weight.dtype)


def _loop(h2, t1, weight, bias, opts, memory, d_rows, need):
    """Loss rows (N,), lse (N,) and, with d_rows, the gradients (hidden (N, D), weight, bias)."""
    n, d = h2.shape
    acc = _acc(weight.dtype)
    size = _chunk(n, weight.shape[0], weight.dtype.itemsize, memory)
    count = -(-n // size)
    grads = d_rows is not None
    init = (jnp.zeros(n, acc), jnp.zeros(n, acc),
            jnp.zeros((n, d), weight.dtype) if grads and need[0] else None,
            jnp.zeros(weight.shape, acc) if grads and need[1] else None,
            jnp.zeros(bias.shape, acc) if grads and need[2] and bias is not None else None)

    def body(i, carry):
        rows, lse, dh, dw, db = carry
        start = jnp.minimum(i * size, n - size)  # the last window ends at the last token
        valid = jnp.arange(size) + start >= i * size  # (rows an earlier window took are masked)
        hc = jax.lax.dynamic_slice_in_dim(h2, start, size)
        tc = jax.lax.dynamic_slice_in_dim(t1, start, size)
        dc = None if d_rows is None else jax.lax.dynamic_slice_in_dim(d_rows, start, size)
        r, lc, g = _chunk_grads(hc, tc, valid, dc, weight, bias, opts)
        old_r = jax.lax.dynamic_slice_in_dim(rows, start, size)
        old_l = jax.lax.dynamic_slice_in_dim(lse, start, size)
        rows = jax.lax.dynamic_update_slice_in_dim(rows, jnp.where(valid, r, old_r), start, 0)
        lse = jax.lax.dynamic_update_slice_in_dim(lse, jnp.where(valid, lc, old_l), start, 0)
        if dh is not None:
            new = jnp.matmul(g, weight, preferred_element_type=acc).astype(weight.dtype)
            old = jax.lax.dynamic_slice_in_dim(dh, start, size)
            dh = jax.lax.dynamic_update_slice_in_dim(dh, jnp.where(valid[:, None], new, old), start, 0)
        if dw is not None:
            dw = dw + jnp.matmul(g.T, hc, preferred_element_type=acc)
        if db is not None:
            db = db + g.astype(acc).sum(0)
        return rows, lse, dh, dw, db

    rows, lse, dh, dw, db = jax.lax.fori_loop(0, count, body, init) if n else init
    return rows, lse, dh, None if dw is None else dw.astype(weight.dtype), \
        None if db is None else db.astype(bias.dtype)


def _flat(hidden, target, shift, fill):
    d = hidden.shape[-1]
    lead = hidden.shape[:-1]
    if shift:
        if hidden.ndim < 2 or hidden.shape[-2] < 1:
            raise InvalidArgumentError("softlight: shift=True needs hidden of shape (..., T, D) with T >= 1")
        nxt = target[..., 1:]
        target = jnp.concatenate([nxt, jnp.full(nxt.shape[:-1] + (1,), fill, target.dtype)], -1)
    return hidden.reshape(-1, d), target.reshape(-1), lead


@partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _head(hidden, weight, bias, target, opts, form):
    return _head_fwd(hidden, weight, bias, target, opts, form)[0]


def _reduce(rows, keep_count, reduction):
    if reduction == "mean":
        return rows.sum() / keep_count
    return rows.sum() if reduction == "sum" else rows


def _head_fwd(hidden, weight, bias, target, opts, form):
    shift, reduction, memory, fill = form
    h2, t1, lead = _flat(hidden, target, shift, fill)
    keep_count = (t1 != opts[0]).sum() if opts[0] is not None else t1.size
    eager = reduction != "none"
    d_rows = jnp.full(t1.shape, 1.0 / keep_count if reduction == "mean" else 1.0, _acc(weight.dtype)) \
        if eager else None
    rows, lse, dh, dw, db = _loop(h2, t1, weight, bias, opts, memory, d_rows, (True, True, True))
    loss = _reduce(rows, keep_count, reduction)
    return loss, (hidden, weight, bias, target, (dh, dw, db) if eager else None)


def _head_bwd(opts, form, res, g):
    shift, reduction, memory, fill = form
    hidden, weight, bias, target, grads = res
    if grads is not None:
        dh, dw, db = (None if t is None else (t.astype(_acc(t.dtype)) * g).astype(t.dtype) for t in grads)
    else:
        h2, t1, _ = _flat(hidden, target, shift, fill)
        _, _, dh, dw, db = _loop(h2, t1, weight, bias, opts, memory, g.reshape(-1).astype(_acc(weight.dtype)),
                                 (True, True, True))
    return dh.reshape(hidden.shape), dw, db, None


_head.defvjp(_head_fwd, _head_bwd)


def linear_cross_entropy(hidden, weight, target, *, bias=None, ignore_index=-100, label_smoothing=0.0, z_loss=0.0,
                         softcap=None, temperature=1.0, reduction="mean", shift=False, memory="speed"):
    """cross_entropy(hidden @ weight.T + bias, target) as softlight.torch.linear_cross_entropy computes it
    (its options; the loss in float32, float64 for float64), without the logits in memory, under
    jax.jit and jax.grad (with respect to hidden, weight and bias)."""
    if memory not in MODES:
        raise InvalidArgumentError(f"softlight: memory must be one of {MODES}, got {memory!r}")
    if reduction not in ("mean", "sum", "none"):
        raise InvalidArgumentError(f"softlight: reduction must be mean, sum or none, got {reduction!r}")
    if hidden.dtype != weight.dtype or weight.ndim != 2 or hidden.ndim < 1 or hidden.shape[-1] != weight.shape[1]:
        raise InvalidArgumentError(f"softlight: hidden (..., D) and weight (V, D) of one dtype expected, got "
                                   f"{hidden.dtype} {hidden.shape} and {weight.dtype} {weight.shape}")
    if tuple(target.shape) != tuple(hidden.shape[:-1]) or not jnp.issubdtype(target.dtype, jnp.integer):
        raise InvalidArgumentError(f"softlight: target must be class indices of shape {hidden.shape[:-1]}, got "
                                   f"{target.dtype} {target.shape}")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != weight.dtype):
        raise InvalidArgumentError(f"softlight: bias must be of shape ({weight.shape[0]},) in the weight's dtype")
    if not (0.0 <= label_smoothing <= 1.0) or z_loss < 0 or not temperature > 0 or \
            (softcap is not None and not softcap > 0):
        raise InvalidArgumentError("softlight: label_smoothing in [0, 1], z_loss >= 0, temperature > 0 and softcap "
                                   "> 0 (or None) expected")
    fill = ignore_index if ignore_index is not None else jnp.iinfo(target.dtype).min
    ignore = fill if shift else ignore_index
    opts = (ignore, float(label_smoothing), float(z_loss), None if softcap is None else float(softcap),
            float(temperature))
    loss = _head(hidden, weight, bias, target, opts, (bool(shift), reduction, memory, fill))
    if reduction == "none":
        loss = loss.reshape(hidden.shape[:-1])
        if shift:
            loss = loss[..., :-1]
    return loss
