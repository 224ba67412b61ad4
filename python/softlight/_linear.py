"""The LM head with its loss: cross-entropy (or the chosen tokens' log-probs and the entropy) of
hidden @ weight.T (+ bias) without the (tokens, vocabulary) logits in memory. Reached as
softlight.torch.linear_cross_entropy, linear_row_stats and linear_token_logprobs.

The logits come a chunk at a time from torch.matmul (cuBLAS on the GPU); softlight's kernels take
their loss or statistics and write their gradient over them; that gradient goes through the
backward's matmuls before the next chunk reuses the memory. Exact: no gradient is filtered, and
every sum over tokens or vocabulary is kept in float32 (float64 for float64) until it is written.
Two forms, chosen by `memory` (docs/consumers.md, "The LM head with its loss"):

- "speed": the tokens in four chunks, each a quarter of the logits; three matmuls, as the plain
  computation. Where the loss is reduced (mean or sum) the forward computes the gradients too, as the
  backward then only scales them (in place, in eager mode). The weight's gradient is summed over the
  chunks in float32, a buffer of 4 V D bytes.
- "low_memory": the vocabulary in chunks of at most 64 MiB of logits for every token (at least 128
  columns). The forward merges the chunks' statistics as vocabulary shards merge; the backward
  computes the logits again: each chunk's rows of the weight's gradient come from one matmul over
  every token, the hidden's gradient is summed over the chunks in float32 (4 N D bytes). Four
  matmuls.

With shift, position t of each sequence predicts target t + 1: hidden is read in place, the last
position of each sequence is computed with an ignored target and dropped from the results.
"""
import math
from typing import Optional, Tuple

import torch

from . import _consumers
from . import _torch_private as _private
from ._api import _check_temperature
from ._errors import ArgumentTypeError, InvalidArgumentError
from ._shards import combine, finish

MODES = ("speed", "low_memory")
_SPEED_CHUNKS = 4
_LOW_MEMORY_CHUNK_BYTES = 64 << 20
_LOW_MEMORY_MIN_COLUMNS = 128
_NO_TARGET = -2**63  # the ignored target of a sequence's last position under shift, where none is ignored


def _acc(t):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _flat(hidden, target, shift, fill):
    """(hidden as (N, D) rows, targets as (N,) or indices as (N, K), the results' leading shape). With
    shift, the target of position t is target t + 1 of its sequence and the last position's is fill."""
    d = hidden.shape[-1]
    k = tuple(target.shape[hidden.dim() - 1:])
    lead = tuple(hidden.shape[:-1])
    if shift:
        if hidden.dim() < 2 or hidden.shape[-2] < 1:
            raise InvalidArgumentError("softlight: shift=True needs hidden of shape (..., T, D) with T >= 1")
        axis = hidden.dim() - 2
        nxt = target.narrow(axis, 1, hidden.shape[-2] - 1)
        pad = torch.full(nxt.shape[:axis] + (1,) + k, fill, dtype=target.dtype, device=target.device)
        target = torch.cat([nxt, pad], axis)
    return hidden.reshape(-1, d), target.reshape((-1,) + k), lead


def _unshift(rows, lead, shift, extra=()):
    """Per-token results (N, ...) in the results' shape: lead, without each sequence's last position
    under shift."""
    out = rows.reshape(lead + extra)
    return out.narrow(len(lead) - 1, 0, lead[-1] - 1) if shift else out


def _logits(hc, weight, bias, softcap):
    """A chunk's logits (softcapped where asked) and, with softcap, the factor 1 - (z / c)^2 that their
    gradient takes back through the cap."""
    z = torch.matmul(hc, weight.t())
    if bias is not None:
        z += bias
    if softcap is None:
        return z, None
    z.div_(softcap).tanh_()
    factor = 1 - z * z
    return z.mul_(softcap), factor


_IN_PLACE_OK = {}  # device -> whether addmm(out_dtype=float32, out=acc) sums into acc as it should


def _in_place_ok(device):
    """Whether this torch's addmm with out_dtype writes acc + a @ b into acc itself, checked once a
    device on small arrays (pytorch issue 154086 found the out= form of mixed-dtype addmm broken in
    one build); never inside a CUDA graph capture, where the answer is taken as no."""
    ok = _IN_PLACE_OK.get(device)
    if ok is None:
        if torch.cuda.is_current_stream_capturing():
            return False
        g = torch.Generator(device=device).manual_seed(0)
        a, b = (torch.randn(s, device=device, generator=g).to(torch.bfloat16) for s in ((64, 32), (32, 48)))
        acc = torch.randn(64, 48, device=device, generator=g)
        want = acc + a.float() @ b.float()
        try:
            torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
            ok = bool(torch.allclose(acc, want, rtol=1e-4, atol=1e-4))
        except (RuntimeError, TypeError):
            ok = False
        _IN_PLACE_OK[device] = ok
    return ok


def _add_product(acc, a, b):
    """acc += a @ b, the product summed in acc's dtype. From 16-bit a and b into float32 on the GPU,
    cuBLAS's out_dtype: in place where this torch does it right, else into a float32 product added
    after; on the CPU, whose matmul has no out_dtype, float32 copies of a and b."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    elif a.is_cuda and _in_place_ok(a.device):
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    elif a.is_cuda:
        acc.add_(torch.mm(a, b, out_dtype=acc.dtype))
    else:
        acc.addmm_(a.to(acc.dtype), b.to(acc.dtype))


def _product(a, b, dtype):
    """a @ b summed and written in dtype (as _add_product's sums)."""
    if a.dtype == dtype:
        return torch.mm(a, b)
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=dtype)
    return torch.mm(a.to(dtype), b.to(dtype))


def _chunk_tokens(tokens):
    return max(1, -(-tokens // _SPEED_CHUNKS))


def _chunk_columns(tokens, vocab, elem):
    cols = _LOW_MEMORY_CHUNK_BYTES // max(1, tokens * elem)
    return min(vocab, max(_LOW_MEMORY_MIN_COLUMNS, cols // _LOW_MEMORY_MIN_COLUMNS * _LOW_MEMORY_MIN_COLUMNS))


def _vocab_chunks(vocab, width):
    return [(v, min(vocab, v + width)) for v in range(0, vocab, width)] or [(0, 0)]


class _TokenGrads:
    """speed: the gradients to hidden, weight and bias over token chunks. The hidden's rows are each
    one matmul's; the weight's and the bias's sums over chunks are kept in float32 (float64 for
    float64 and for the bias) and written in their dtype at the end. The weight's sum is the first
    chunk's product, written (no zeros to read), and is scaled and rounded to the weight's dtype in
    one pass: three passes over 4 V D bytes fewer than zeros, a scale in place and a cast."""

    def __init__(self, h2, weight, bias, need):
        # (rows in order, as the weight's below: the backward may scale them in place as rows)
        self.hidden = torch.empty(h2.shape, dtype=h2.dtype, device=h2.device) if need[0] else None
        self._need_w = need[1]
        self._w = None  # the weight's sum, from the first chunk on
        self._b = torch.zeros(bias.shape, dtype=torch.float64, device=bias.device) \
            if bias is not None and need[2] else None
        self._weight, self._bias = weight, bias
        self.weight = self.bias = None

    def add(self, g, hc, s):
        """g: the gradient to the logits of the tokens s .. s + n (n, V); hc their hidden rows."""
        if self.hidden is not None:
            torch.matmul(g, self._weight, out=self.hidden[s:s + g.shape[0]])
        if self._need_w:
            if self._w is None:
                self._w = _product(g.t(), hc, _acc(self._weight))
            else:
                _add_product(self._w, g.t(), hc)
        if self._b is not None:
            self._b += g.sum(0, dtype=self._b.dtype)

    def finish(self, scale):
        for t in (self.hidden, self._b):
            if t is not None and scale is not None:
                t.mul_(scale.to(t.dtype))
        if self._need_w and self._w is None:  # no tokens
            self.weight = torch.zeros_like(self._weight)
        elif self._need_w:
            self.weight = torch.empty(self._weight.shape, dtype=self._weight.dtype, device=self._weight.device)
            if scale is None:
                self.weight.copy_(self._w)
            else:
                torch.mul(self._w, scale.to(self._w.dtype), out=self.weight)
        self._w = None
        self.bias = None if self._b is None else self._b.to(self._bias.dtype)
        self._b = None


def _token_backward(h2, weight, bias, softcap, need, grad_of_chunk):
    """speed's backward: for each token chunk [s, s + n), its logits again, grad_of_chunk(z, s, n)
    writing their gradient over them, then through _TokenGrads."""
    grads = _TokenGrads(h2, weight, bias, need)
    step = _chunk_tokens(h2.shape[0])
    for s in range(0, h2.shape[0], step):
        hc = h2[s:s + step]
        z, factor = _logits(hc, weight, bias, softcap)
        grad_of_chunk(z, s, hc.shape[0])
        grads.add(z if factor is None else z.mul_(factor), hc, s)
        del z, factor
    grads.finish(None)
    return grads.hidden, grads.weight, grads.bias


def _vocab_backward(h2, weight, bias, softcap, need, width, grad_of_chunk, shard=None):
    """low_memory's backward: for each vocabulary chunk [v0, v1), its logits again, grad_of_chunk(z, v0)
    writing their gradient over them, then the weight's and the bias's rows of the chunk (one matmul
    over every token, one sum) and the hidden's gradient summed in float32 (over the ranks too, for a
    shard: each holds a part of the vocabulary's sum)."""
    dh = torch.zeros(h2.shape, dtype=_acc(h2), device=h2.device) if need[0] else None
    dw = torch.empty_like(weight) if need[1] else None
    db = torch.empty_like(bias) if bias is not None and need[2] else None
    for v0, v1 in _vocab_chunks(weight.shape[0], width):
        wc = weight[v0:v1]
        z, factor = _logits(h2, wc, None if bias is None else bias[v0:v1], softcap)
        grad_of_chunk(z, v0)
        if factor is not None:
            z.mul_(factor)
        if dw is not None:
            torch.matmul(z.t(), h2, out=dw[v0:v1])
        if db is not None:
            db[v0:v1] = z.sum(0, dtype=_acc(z))
        if dh is not None:
            _add_product(dh, z, wc)
        del z, factor
    if dh is not None and shard is not None:
        shard.all_reduce(dh)
    return None if dh is None else dh.to(h2.dtype), dw, db


def _outside(index, keep, vocab):
    """Where a token's (kept) index is outside [0, vocab): refused on the CPU; on a GPU, where ids are
    not read back, NaN results for those tokens (as softlight's GPU kernels pick NaN there)."""
    bad = (index < 0) | (index >= vocab)
    if keep is not None:
        bad &= keep
    if not index.is_cuda and bool(bad.any()):
        where = tuple(int(i) for i in torch.nonzero(bad)[0])
        raise InvalidArgumentError(f"softlight: index{list(where)} = {int(index[where])} is outside the vocabulary "
                                   f"[0, {vocab})")
    return bad


def _vocab_stats(h2, weight, bias, softcap, temperature, index, width, zsum=False, shard=None):
    """low_memory's forward: each token's (lse, entropy, picked at index, sum of z) over the whole
    vocabulary (z = logits / temperature), merged from its chunks' row_stats (and, for a shard of
    the vocabulary, from every rank's: shard.merge)."""
    names = ("max", "sumexp", "moment") + (("picked",) if index is not None else ()) + (("sum",) if zsum else ())
    start = 0 if shard is None else shard.start
    parts = []
    for v0, v1 in _vocab_chunks(weight.shape[0], width):
        z, _ = _logits(h2, weight[v0:v1], None if bias is None else bias[v0:v1], softcap)
        parts.append(_consumers.row_stats(z, index, stats=names, temperature=temperature, index_offset=start + v0,
                                          shard=True))
        del z
    m, se, mom = combine(*(torch.stack([p[s] for p in parts]) for s in ("max", "sumexp", "moment")))
    picked = sum(p["picked"] for p in parts) if index is not None else None
    zs = sum(p["sum"] for p in parts) if zsum else None
    if shard is not None:
        m, se, mom, picked, zs = shard.merge(m, se, mom, picked, zs)
    lse, ent = finish(m, se, mom)
    return lse, ent, picked, zs


def _detached(*ts):
    """The arrays as the kernels take them (no autograd history: the operators' implementations run
    below autograd, and the arrays they get may still say they require a gradient)."""
    return tuple(None if t is None else t.detach() for t in ts)


def _targets(opts):
    """(the target that shift gives each sequence's last position, the ignored value or None): with
    shift, that target is ignored, ignore_index or, where none is, a value no vocabulary holds."""
    shift, ignore = opts[0], opts[1]
    fill = _NO_TARGET if ignore is None else ignore
    ignore = fill if shift else ignore
    return fill, ignore


def _ce_forward(hidden, weight, bias, target, need, opts, shard):
    """The loss ((), or (N,) rows for reduction="none"), each token's lse (N,), and the gradients to
    hidden (as (N, D)), weight and bias where speed computes them in the forward (else None)."""
    shift, _, smoothing, z_loss, softcap, temperature, reduction, memory = opts
    hidden, weight, bias = _detached(hidden, weight, bias)
    fill, ignore = _targets(opts)
    h2, t1, lead = _flat(hidden, target, shift, fill)
    tokens, vocab = h2.shape[0], weight.shape[0] if shard is None else shard.vocab
    keep = t1 != ignore if ignore is not None else torch.ones_like(t1, dtype=torch.bool)
    count = keep.sum()  # on the device: no host sync
    grads = None
    if memory == "low_memory" or shard is not None:
        width = _chunk_columns(tokens, weight.shape[0], h2.element_size())
        bad = _outside(t1, keep, vocab)
        idx = torch.where(keep, t1, torch.zeros_like(t1))
        lse, _, picked, zsum = _vocab_stats(h2, weight, bias, softcap, temperature, idx, width, smoothing > 0, shard)
        rows = (1.0 - smoothing) * (lse - picked)
        if smoothing > 0:
            rows = rows + smoothing * (lse - zsum / vocab)
        if z_loss:
            rows = rows + z_loss * lse * lse
        rows = torch.where(keep, rows, torch.zeros_like(rows)).masked_fill_(bad, math.nan)
    else:
        acc = _acc(h2)
        eager = any(need) and reduction != "none"
        rows = torch.empty(tokens, dtype=acc, device=h2.device)
        lse = torch.empty(tokens, dtype=acc, device=h2.device)
        grads = _TokenGrads(h2, weight, bias, need) if eager else None
        step = _chunk_tokens(tokens)
        for s in range(0, tokens, step):
            hc = h2[s:s + step]
            z, factor = _logits(hc, weight, bias, softcap)
            rows[s:s + step], lse[s:s + step] = _consumers.cross_entropy(
                z, t1[s:s + step], ignore_index=ignore, label_smoothing=smoothing, z_loss=z_loss,
                temperature=temperature, reduction="none", return_lse=True, grad=z if eager else None)[:2]
            if eager:
                grads.add(z if factor is None else z.mul_(factor), hc, s)
            del z, factor
    if reduction == "mean":  # none kept: NaN, as torch's
        scale = (1.0 / count.double()).to(rows.dtype)
        loss = (rows.sum(dtype=torch.float64) / count).to(rows.dtype)
    elif reduction == "sum":
        scale, loss = None, rows.sum(dtype=torch.float64).to(rows.dtype)
    else:
        scale, loss = None, rows
    if grads is None:
        return loss, lse, (None, None, None)
    grads.finish(scale)
    return loss, lse, (grads.hidden, grads.weight, grads.bias)


def _ce_backward(d_loss, hidden, weight, bias, target, lse, need, opts, shard):
    """The gradients to hidden (as (N, D)), weight and bias (None where not needed) for the loss's
    upstream gradient d_loss (() or (N,) rows), the logits computed again."""
    shift, _, smoothing, z_loss, softcap, temperature, reduction, memory = opts
    d_loss, hidden, weight, bias, lse = _detached(d_loss, hidden, weight, bias, lse)
    fill, ignore = _targets(opts)
    h2, t1, _ = _flat(hidden, target, shift, fill)
    keep = t1 != ignore if ignore is not None else torch.ones_like(t1, dtype=torch.bool)
    if reduction == "none":
        d_rows = d_loss
    else:
        d_rows = d_loss.expand(h2.shape[0]) / (keep.sum() if reduction == "mean" else 1)
    with torch.no_grad():
        if memory == "low_memory" or shard is not None:
            start, vocab = (0, weight.shape[0]) if shard is None else (shard.start, shard.vocab)
            width = _chunk_columns(h2.shape[0], weight.shape[0], h2.element_size())
            bad = _outside(t1, keep, vocab)
            idx = torch.where(keep, t1, torch.zeros_like(t1))
            d_tok = torch.where(keep, d_rows.to(lse.dtype), torch.zeros_like(lse)).masked_fill_(bad, math.nan)
            d_lse = d_tok * (1 + 2 * z_loss * lse) if z_loss else d_tok
            d_picked = -(1.0 - smoothing) * d_tok
            d_sum = -smoothing / vocab * d_tok if smoothing > 0 else None

            def grad_of_chunk(z, v0):
                _consumers.row_stats_backward(z, lse, d_lse=d_lse, d_picked=d_picked, d_sum=d_sum, index=idx,
                                              temperature=temperature, index_offset=start + v0, shard=True, out=z)

            return _vocab_backward(h2, weight, bias, softcap, need, width, grad_of_chunk, shard)

        def grad_of_tokens(z, s, n):
            _consumers.cross_entropy(z, t1[s:s + n], ignore_index=ignore, label_smoothing=smoothing, z_loss=z_loss,
                                     temperature=temperature, reduction="none", grad=z)
            z.mul_(d_rows[s:s + n, None].to(z.dtype))

        return _token_backward(h2, weight, bias, softcap, need, grad_of_tokens)


def _scaled(grads, d_loss):
    """speed's gradients from the forward, scaled by the loss's upstream gradient."""
    return tuple(None if t is None else t * d_loss.to(t.dtype) for t in grads)


def _scaled_in_place(grads, d_loss):
    """_scaled's gradients, scaled in place by cross-entropy's gradient scale (rows whose factor is 1
    left alone, decided on the device: loss.backward() of the loss itself touches none), so that no
    second copy of the weight's gradient is made. (Eager only: the operator's body, without its
    dispatch, from softlight.torch, which imports this module.)"""
    from .torch import _cross_entropy_grad_scale
    for t in grads:
        if t is not None:
            _cross_entropy_grad_scale(t.reshape(-1, t.shape[-1]) if t.dim() > 1 else t.view(1, -1), d_loss)
    return tuple(grads)


class _ShardCrossEntropy(torch.autograd.Function):
    """linear_cross_entropy over a vocabulary shard (softlight.vocab_parallel; eager: the process
    group is no operator argument)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, opts, shard):
        need = ctx.needs_input_grad[:3]
        loss, lse, _ = _ce_forward(hidden, weight, bias, target, need, opts, shard)
        ctx.opts, ctx.shard = opts, shard
        ctx.save_for_backward(hidden, weight, bias, target, lse)
        ctx.mark_non_differentiable(lse)
        return loss, lse

    @staticmethod
    def backward(ctx, d_loss, _d_lse):
        hidden, weight, bias, target, lse = ctx.saved_tensors
        dh, dw, db = _ce_backward(d_loss, hidden, weight, bias, target, lse, ctx.needs_input_grad[:3], ctx.opts,
                                  ctx.shard)
        return None if dh is None else dh.reshape(hidden.shape), dw, db, None, None, None


# The custom operators (one process): torch.compile sees them whole (fullgraph, no graph break) and
# autograd takes their backward from register_autograd. Options travel as the operators' arguments;
# a gradient that is not computed travels as an empty tensor.
_OPTS = ("shift", "ignore_index", "label_smoothing", "z_loss", "softcap", "temperature", "reduction", "memory")


def _none(t):
    """A gradient the operators passed as an empty tensor, as None."""
    return None if t is None or t.shape == (0,) else t


@torch.library.custom_op("softlight::linear_cross_entropy", mutates_args=())
def _ce_op(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], target: torch.Tensor,
           need_hidden: bool, need_weight: bool, need_bias: bool, shift: bool, ignore_index: Optional[int],
           label_smoothing: float, z_loss: float, softcap: Optional[float], temperature: float, reduction: str,
           memory: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    opts = (shift, ignore_index, label_smoothing, z_loss, softcap, temperature, reduction, memory)
    loss, lse, grads = _ce_forward(hidden, weight, bias, target, (need_hidden, need_weight, need_bias), opts, None)
    return (loss, lse) + tuple(hidden.new_empty(0) if g is None else g for g in grads)


def _eager_grads(hidden, weight, bias, need, reduction, memory):
    """The shapes speed computes in the forward (else empty)."""
    eager = memory == "speed" and reduction != "none"
    return [hidden.new_empty((math.prod(hidden.shape[:-1]), hidden.shape[-1])) if eager and need[0]
            else hidden.new_empty(0),
            weight.new_empty(weight.shape) if eager and need[1] else hidden.new_empty(0),
            bias.new_empty(bias.shape) if eager and need[2] and bias is not None else hidden.new_empty(0)]


@_ce_op.register_fake
def _ce_fake(hidden, weight, bias, target, need_hidden, need_weight, need_bias, shift, ignore_index, label_smoothing,
             z_loss, softcap, temperature, reduction, memory):
    acc = _acc(hidden)
    tokens = target.numel()
    loss = hidden.new_empty((tokens,) if reduction == "none" else (), dtype=acc)
    grads = _eager_grads(hidden, weight, bias, (need_hidden, need_weight, need_bias), reduction, memory)
    return (loss, hidden.new_empty((tokens,), dtype=acc)) + tuple(grads)


@torch.library.custom_op("softlight::linear_cross_entropy_backward", mutates_args=())
def _ce_backward_op(d_loss: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                    target: torch.Tensor, lse: torch.Tensor, need_hidden: bool, need_weight: bool, need_bias: bool,
                    shift: bool, ignore_index: Optional[int], label_smoothing: float, z_loss: float,
                    softcap: Optional[float], temperature: float, reduction: str,
                    memory: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    opts = (shift, ignore_index, label_smoothing, z_loss, softcap, temperature, reduction, memory)
    grads = _ce_backward(d_loss, hidden, weight, bias, target, lse, (need_hidden, need_weight, need_bias), opts, None)
    return tuple(hidden.new_empty(0) if g is None else g for g in grads)


@_ce_backward_op.register_fake
def _ce_backward_fake(d_loss, hidden, weight, bias, target, lse, need_hidden, need_weight, need_bias, *opts):
    need = (need_hidden, need_weight, need_bias)
    return tuple(_eager_grads(hidden, weight, bias, need, "mean", "speed"))


def _ce_setup(ctx, inputs, output):
    hidden, weight, bias, target = inputs[:4]
    ctx.args = inputs[4:]
    grads = [_none(g) for g in output[2:]]
    ctx.grads, ctx.eager = None, False
    if torch.compiler.is_compiling() or _private.is_fake(hidden):  # a traced graph: speed's gradients saved
        ctx.save_for_backward(hidden, weight, bias, target, output[1], *output[2:])
    else:  # eager: speed's gradients, if any, scaled in place by the backward, so kept untracked
        ctx.save_for_backward(hidden, weight, bias, target, output[1])
        ctx.eager = any(g is not None for g in grads)
        ctx.grads = grads if ctx.eager else None


def _ce_grad(ctx, d_loss, _d_lse, *_):
    saved = ctx.saved_tensors
    hidden, weight, bias, target, lse = saved[:5]
    traced = [_none(g) for g in saved[5:]]
    if any(g is not None for g in traced) or (ctx.grads is not None and torch.is_grad_enabled()):
        dh, dw, db = _scaled(traced if traced else ctx.grads, d_loss)
    elif ctx.eager:
        grads, ctx.grads = ctx.grads, None
        if grads is None:  # handed out by an earlier backward (retain_graph): the forward's again, the same bits
            grads = _ce_forward(hidden, weight, bias, target, tuple(ctx.args[:3]), tuple(ctx.args[3:]), None)[2]
        dh, dw, db = _scaled_in_place(grads, d_loss)
    else:
        dh, dw, db = (_none(g) for g in _ce_backward_op(d_loss, hidden, weight, bias, target, lse, *ctx.args))
    return (None if dh is None else dh.reshape(hidden.shape), dw, db) + (None,) * (len(ctx.args) + 1)


_ce_op.register_autograd(_ce_grad, setup_context=_ce_setup)


def _check_memory(memory):
    if memory not in MODES:
        raise InvalidArgumentError(f"softlight: memory must be one of {MODES}, got {memory!r}")


def _check_linear(hidden, weight, bias, memory):
    """The arguments linear_cross_entropy and linear_row_stats share, checked."""
    _check_memory(memory)
    for name, t in (("hidden", hidden), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise ArgumentTypeError(f"softlight: {name} must be a torch tensor, got {type(t).__qualname__}")
    if not hidden.is_floating_point() or hidden.dtype != weight.dtype or hidden.device != weight.device:
        raise InvalidArgumentError(f"softlight: hidden and weight must share a floating dtype and a device, got "
                                   f"{hidden.dtype} on {hidden.device} and {weight.dtype} on {weight.device}")
    if hidden.dim() < 1 or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise InvalidArgumentError(f"softlight: hidden (..., D) and weight (V, D) expected, got {tuple(hidden.shape)} "
                                   f"and {tuple(weight.shape)}")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (weight.shape[0],)
                             or bias.dtype != weight.dtype or bias.device != weight.device):
        raise InvalidArgumentError(f"softlight: bias must be a tensor of shape ({weight.shape[0]},) in the weight's "
                                   f"dtype and device")


def _check_softcap(softcap):
    if softcap is None:
        return None
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise ArgumentTypeError(f"softlight: softcap must be a number or None, got {type(softcap).__qualname__}")
    softcap = float(softcap)
    if not (softcap > 0 and math.isfinite(softcap)):
        raise InvalidArgumentError(f"softlight: softcap must be a positive finite number or None, got {softcap}")
    return softcap


def _check_indices(t, hidden, name, k_allowed):
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(f"softlight: {name} must be a torch tensor, got {type(t).__qualname__}")
    lead = tuple(hidden.shape[:-1])
    if t.is_floating_point() or t.dtype == torch.bool or t.is_complex() or t.device != hidden.device or \
            (tuple(t.shape) != lead and not (k_allowed and t.dim() == len(lead) + 1 and tuple(t.shape[:-1]) == lead)):
        want = f"{lead}" + (f" or {lead} + (K,)" if k_allowed else "")
        raise InvalidArgumentError(f"softlight: {name} must be class indices of shape {want} on {hidden.device}, "
                                   f"got {t.dtype} {tuple(t.shape)} on {t.device}")


def linear_cross_entropy(hidden, weight, target, *, bias=None, ignore_index=-100, label_smoothing=0.0, z_loss=0.0,
                         softcap=None, temperature=1.0, reduction="mean", shift=False, return_lse=False,
                         memory="speed", _shard=None):
    """cross_entropy(hidden @ weight.T + bias, target) (softlight.torch.cross_entropy's options), with
    gradients to hidden, weight and bias, without the (tokens, vocabulary) logits in memory.

    hidden (..., D) and weight (V, D) of one floating dtype and device; target (...) class indices;
    bias (V,) or None. softcap: Gemma 2's final logit soft-capping, c * tanh(z / c). shift: position t
    of each sequence (hidden (..., T, D)) predicts target t + 1, as causal LM labels are, without copying
    hidden. memory: "speed" or "low_memory" (module docstring). The loss is in float32 (float64 for
    float64): a scalar, or (...) for reduction="none"; with return_lse, also each token's log-sum-exp
    (without a gradient)."""
    _check_linear(hidden, weight, bias, memory)
    _, ignore_index, label_smoothing, z_loss = _consumers.ce_options(reduction, ignore_index, label_smoothing, z_loss)
    _check_indices(target, hidden, "target", False)
    softcap = _check_softcap(softcap)
    temperature = _check_temperature(temperature)
    opts = (bool(shift), ignore_index, label_smoothing, z_loss, softcap, temperature, reduction, memory)
    lead = tuple(hidden.shape[:-1])
    if _shard is not None:
        loss, lse = _ShardCrossEntropy.apply(hidden, weight, bias, target, opts, _shard)
    else:
        grad = torch.is_grad_enabled()
        need = (grad and hidden.requires_grad, grad and weight.requires_grad,
                grad and bias is not None and bias.requires_grad)
        loss, lse, *_ = _ce_op(hidden, weight, bias, target, *need, *opts)
    if reduction == "none":
        loss = _unshift(loss, lead, opts[0])
    lse = _unshift(lse, lead, opts[0])
    return (loss, lse) if return_lse else loss


def _stats_forward(hidden, weight, bias, index, opts, shard):
    """Each token's (log-probs at index (N,) or (N, K), entropy (N,), lse (N,)) over the whole
    vocabulary."""
    shift, softcap, temperature, memory = opts
    hidden, weight, bias = _detached(hidden, weight, bias)
    h2, i2, _ = _flat(hidden, index, shift, 0 if shard is None else shard.start)
    k = tuple(i2.shape[1:])
    tokens = h2.shape[0]
    if memory == "low_memory" or shard is not None:
        width = _chunk_columns(tokens, weight.shape[0], h2.element_size())
        bad = _outside(i2, None, weight.shape[0] if shard is None else shard.vocab)
        lse, entropy, picked, _ = _vocab_stats(h2, weight, bias, softcap, temperature, i2, width, False, shard)
        return (picked - (lse[:, None] if k else lse)).masked_fill_(bad, math.nan), entropy, lse
    acc = _acc(h2)
    logprobs = torch.empty((tokens,) + k, dtype=acc, device=h2.device)
    entropy = torch.empty(tokens, dtype=acc, device=h2.device)
    lse = torch.empty(tokens, dtype=acc, device=h2.device)
    step = _chunk_tokens(tokens)
    for s in range(0, tokens, step):
        z, _ = _logits(h2[s:s + step], weight, bias, softcap)
        out = _consumers.row_stats(z, i2[s:s + step], stats=("lse", "logprobs", "entropy"), temperature=temperature)
        logprobs[s:s + step], entropy[s:s + step], lse[s:s + step] = out["logprobs"], out["entropy"], out["lse"]
        del z
    return logprobs, entropy, lse


def _stats_backward(d_lp, d_en, hidden, weight, bias, index, lse, entropy, need, opts, shard):
    """The gradients to hidden (as (N, D)), weight and bias for the upstream gradients of the log-probs
    and the entropy (per token, (N, ...), or None), the logits computed again."""
    shift, softcap, temperature, memory = opts
    d_lp, d_en, hidden, weight, bias, lse, entropy = _detached(d_lp, d_en, hidden, weight, bias, lse, entropy)
    start = 0 if shard is None else shard.start
    h2, i2, _ = _flat(hidden, index, shift, start)
    d_lp = None if d_lp is None else d_lp.contiguous()
    d_en = None if d_en is None else d_en.contiguous()
    with torch.no_grad():
        if memory == "low_memory" or shard is not None:
            width = _chunk_columns(h2.shape[0], weight.shape[0], h2.element_size())

            def grad_of_chunk(z, v0):
                _consumers.row_stats_backward(z, lse, entropy=entropy, d_logprobs=d_lp, d_entropy=d_en, index=i2,
                                              temperature=temperature, index_offset=start + v0, shard=True, out=z)

            return _vocab_backward(h2, weight, bias, softcap, need, width, grad_of_chunk, shard)

        def grad_of_tokens(z, s, n):
            _consumers.row_stats_backward(
                z, lse[s:s + n], entropy=entropy[s:s + n], d_logprobs=None if d_lp is None else d_lp[s:s + n],
                d_entropy=None if d_en is None else d_en[s:s + n], index=i2[s:s + n], temperature=temperature,
                out=z)

        return _token_backward(h2, weight, bias, softcap, need, grad_of_tokens)


class _ShardRowStats(torch.autograd.Function):
    """linear_row_stats over a vocabulary shard (softlight.vocab_parallel, eager)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, index, opts, shard):
        logprobs, entropy, lse = _stats_forward(hidden, weight, bias, index, opts, shard)
        ctx.opts, ctx.shard = opts, shard
        ctx.save_for_backward(hidden, weight, bias, index, lse, entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, d_lp, d_en):
        hidden, weight, bias, index, lse, entropy = ctx.saved_tensors
        dh, dw, db = _stats_backward(d_lp, d_en, hidden, weight, bias, index, lse, entropy, ctx.needs_input_grad[:3],
                                     ctx.opts, ctx.shard)
        return None if dh is None else dh.reshape(hidden.shape), dw, db, None, None, None


@torch.library.custom_op("softlight::linear_row_stats", mutates_args=())
def _stats_op(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], index: torch.Tensor,
              shift: bool, softcap: Optional[float], temperature: float,
              memory: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _stats_forward(hidden, weight, bias, index, (shift, softcap, temperature, memory), None)


@_stats_op.register_fake
def _stats_fake(hidden, weight, bias, index, shift, softcap, temperature, memory):
    tokens = torch.Size(hidden.shape[:-1]).numel()
    k = tuple(index.shape[hidden.dim() - 1:])
    acc = _acc(hidden)
    return (hidden.new_empty((tokens,) + k, dtype=acc), hidden.new_empty((tokens,), dtype=acc),
            hidden.new_empty((tokens,), dtype=acc))


@torch.library.custom_op("softlight::linear_row_stats_backward", mutates_args=())
def _stats_backward_op(d_logprobs: Optional[torch.Tensor], d_entropy: Optional[torch.Tensor], hidden: torch.Tensor,
                       weight: torch.Tensor, bias: Optional[torch.Tensor], index: torch.Tensor, lse: torch.Tensor,
                       entropy: torch.Tensor, need_hidden: bool, need_weight: bool, need_bias: bool, shift: bool,
                       softcap: Optional[float], temperature: float,
                       memory: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    grads = _stats_backward(d_logprobs, d_entropy, hidden, weight, bias, index, lse, entropy,
                            (need_hidden, need_weight, need_bias), (shift, softcap, temperature, memory), None)
    return tuple(hidden.new_empty(0) if g is None else g for g in grads)


@_stats_backward_op.register_fake
def _stats_backward_fake(d_logprobs, d_entropy, hidden, weight, bias, index, lse, entropy, need_hidden, need_weight,
                         need_bias, *opts):
    return tuple(_eager_grads(hidden, weight, bias, (need_hidden, need_weight, need_bias), "mean", "speed"))


def _stats_setup(ctx, inputs, output):
    hidden, weight, bias, index = inputs[:4]
    ctx.opts = inputs[4:]
    ctx.need = tuple(t is not None and t.requires_grad for t in (hidden, weight, bias))
    ctx.save_for_backward(hidden, weight, bias, index, output[2], output[1])


def _stats_grad(ctx, d_lp, d_en, _d_lse):
    hidden, weight, bias, index, lse, entropy = ctx.saved_tensors
    dh, dw, db = (_none(g) for g in _stats_backward_op(d_lp, d_en, hidden, weight, bias, index, lse, entropy,
                                                        *ctx.need, *ctx.opts))
    return (None if dh is None else dh.reshape(hidden.shape), dw, db) + (None,) * (len(ctx.opts) + 1)


_stats_op.register_autograd(_stats_grad, setup_context=_stats_setup)


def linear_row_stats(hidden, weight, index, *, bias=None, temperature=1.0, softcap=None, shift=False,
                     memory="speed", _shard=None):
    """{"logprobs", "entropy"} of log_softmax((hidden @ weight.T + bias) / temperature) without the
    logits in memory: each token's log-prob at index ((...) or (..., K) indices) and the entropy of its
    distribution, both differentiable with respect to hidden, weight and bias (RL's log-probs and
    entropy from one pass). Options as linear_cross_entropy's; float32 (float64 for float64) results."""
    _check_linear(hidden, weight, bias, memory)
    _check_indices(index, hidden, "index", True)
    softcap = _check_softcap(softcap)
    temperature = _check_temperature(temperature)
    opts = (bool(shift), softcap, temperature, memory)
    lead, k = tuple(hidden.shape[:-1]), tuple(index.shape[hidden.dim() - 1:])
    if _shard is not None:
        logprobs, entropy = _ShardRowStats.apply(hidden, weight, bias, index, opts, _shard)
    else:
        logprobs, entropy, _ = _stats_op(hidden, weight, bias, index, *opts)
    return {"logprobs": _unshift(logprobs, lead, opts[0], k), "entropy": _unshift(entropy, lead, opts[0])}


def linear_token_logprobs(hidden, weight, index, *, bias=None, temperature=1.0, softcap=None, shift=False,
                          memory="speed"):
    """Each token's log_softmax((hidden @ weight.T + bias) / temperature) at index, without the logits
    (linear_row_stats' logprobs)."""
    return linear_row_stats(hidden, weight, index, bias=bias, temperature=temperature, softcap=softcap, shift=shift,
                            memory=memory)["logprobs"]


class LinearCrossEntropyLoss(torch.nn.Module):
    """linear_cross_entropy as a module: forward(hidden, weight, target, bias=None)."""

    def __init__(self, ignore_index=-100, reduction="mean", label_smoothing=0.0, *, z_loss=0.0, softcap=None,
                 temperature=1.0, shift=False, memory="speed"):
        super().__init__()
        self.kw = dict(ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing, z_loss=z_loss,
                       softcap=softcap, temperature=temperature, shift=shift, memory=memory)

    def forward(self, hidden, weight, target, bias=None):
        return linear_cross_entropy(hidden, weight, target, bias=bias, **self.kw)
