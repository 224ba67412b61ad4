"""The LM head with its loss: cross-entropy of hidden @ weight.T (+ bias) without the logits in memory.

Tokens go in chunks: each chunk's logits come from torch.matmul, softlight's cross-entropy takes their
loss and, where gradients are wanted, writes the logits' gradient over them in the same pass; that
gradient goes through the two matmuls of the backward (to hidden and to weight) before the next chunk
reuses the memory. Exact: no gradient is filtered. Reached as softlight.torch.linear_cross_entropy.

memory="speed" takes a quarter of the tokens a chunk (a quarter of the logits' bytes at most) and
computes the gradients in the forward where the loss is reduced (mean or sum), as the backward then
only scales them; memory="low_memory" takes chunks of at most 64 MiB of logits. With reduction="none"
the backward runs the chunks again, the loss's upstream gradient known only then.
"""
import math

import torch

from . import _consumers
from ._api import _check_temperature
from ._errors import ArgumentTypeError, InvalidArgumentError

MODES = ("speed", "low_memory")
_LOW_MEMORY_CHUNK_BYTES = 64 << 20
_SPEED_CHUNKS = 4


def _segments(hidden, target, shift):
    """Blocks of (hidden rows (n, D), their targets (n,) or indices (n, K), their place in a (..., D)
    gradient), views of the inputs, and the tokens' leading shape; with shift, position t of each
    sequence predicts target t + 1 (the last has none)."""
    d = hidden.shape[-1]
    k = tuple(target.shape[hidden.dim() - 1:])  # () for a target a token, (K,) for K indices
    if not shift:
        return [(hidden.reshape(-1, d), target.reshape((-1,) + k), slice(None))], tuple(hidden.shape[:-1])
    if hidden.dim() < 2 or hidden.shape[-2] < 1:
        raise InvalidArgumentError("softlight: shift=True needs hidden of shape (..., T, D) with T >= 1")
    t = hidden.shape[-2]
    h3, t3 = hidden.reshape(-1, t, d), target.reshape((-1, t) + k)
    return [(h3[b, :-1], t3[b, 1:], b) for b in range(h3.shape[0])], tuple(hidden.shape[:-2]) + (t - 1,)


def _chunk_rows(tokens, vocab, elem, memory):
    if memory == "speed":
        return max(1, -(-tokens // _SPEED_CHUNKS))
    return max(1, _LOW_MEMORY_CHUNK_BYTES // max(1, vocab * elem))


def _logits(hc, weight, bias, softcap):
    """A chunk's logits (softcapped where asked) and, with softcap, the factor 1 - (z / c)^2 that its
    gradient takes back through the cap."""
    z = torch.matmul(hc, weight.t())
    if bias is not None:
        z += bias
    if softcap is None:
        return z, None
    z.div_(softcap).tanh_()
    factor = 1 - z * z
    return z.mul_(softcap), factor


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, target, opts):
        shift, ignore_index, smoothing, z_loss, softcap, temperature, reduction, memory = opts
        segs, lead = _segments(hidden, target, shift)
        tokens = sum(s[0].shape[0] for s in segs)
        acc = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        need = ctx.needs_input_grad[:3]
        eager = any(need) and reduction != "none"
        rows = _chunk_rows(tokens, weight.shape[0], weight.element_size(), memory)
        loss_rows = torch.empty(tokens, dtype=acc, device=hidden.device) if reduction == "none" else None
        lse_rows = torch.empty(tokens, dtype=acc, device=hidden.device)
        total = torch.zeros((), dtype=torch.float64, device=hidden.device)  # chunks' sums, rounded once
        grads = _Grads(hidden, weight, bias, need) if eager else None
        at = 0
        for h2, t1, where in segs:
            for s in range(0, h2.shape[0], rows):
                hc, tc = h2[s:s + rows], t1[s:s + rows]
                z, factor = _logits(hc, weight, bias, softcap)
                out = _consumers.cross_entropy(z, tc, ignore_index=ignore_index, label_smoothing=smoothing,
                                               z_loss=z_loss, temperature=temperature,
                                               reduction="none" if reduction == "none" else "sum",
                                               return_lse=True, grad=z if eager else None)
                n = hc.shape[0]
                if reduction == "none":
                    loss_rows[at:at + n] = out[0]
                else:
                    total += out[0]
                lse_rows[at:at + n] = out[1]
                if eager:
                    grads.add(z if factor is None else z.mul_(factor), hc, where, s)
                at += n
        if reduction == "mean":  # the kept tokens, on the device (no host sync); none kept: NaN, as torch's
            count = sum((t1 != ignore_index).sum() if ignore_index is not None else t1.numel() for _, t1, _ in segs)
            count = torch.as_tensor(count, device=hidden.device)
            scale = (1.0 / count.double()).to(acc)
            loss = (total / count).to(acc)
        else:
            scale = None
            loss = loss_rows.reshape(lead) if reduction == "none" else total.to(acc)
        if eager:
            grads.finish(scale)
        ctx.opts, ctx.eager, ctx.lead = opts, eager, lead
        ctx.grads = grads
        ctx.save_for_backward(hidden, weight, bias, target)
        ctx.mark_non_differentiable(lse_rows)
        return loss, lse_rows.reshape(lead)

    @staticmethod
    def backward(ctx, d_loss, _d_lse):
        hidden, weight, bias, target = ctx.saved_tensors
        if ctx.eager:
            g = ctx.grads
            out = [None if t is None else t * d_loss.to(t.dtype) for t in (g.hidden, g.weight, g.bias)]
            return out[0], out[1], out[2], None, None
        shift, ignore_index, smoothing, z_loss, softcap, temperature, reduction, memory = ctx.opts
        segs, _ = _segments(hidden, target, shift)
        d_rows = d_loss.reshape(-1)
        grads = _Grads(hidden, weight, bias, ctx.needs_input_grad[:3])
        rows = _chunk_rows(d_rows.numel(), weight.shape[0], weight.element_size(), memory)
        at = 0
        with torch.no_grad():
            for h2, t1, where in segs:
                for s in range(0, h2.shape[0], rows):
                    hc, tc = h2[s:s + rows], t1[s:s + rows]
                    z, factor = _logits(hc, weight, bias, softcap)
                    _consumers.cross_entropy(z, tc, ignore_index=ignore_index, label_smoothing=smoothing,
                                             z_loss=z_loss, temperature=temperature, reduction="none", grad=z)
                    n = hc.shape[0]
                    z.mul_(d_rows[at:at + n, None].to(z.dtype))
                    grads.add(z if factor is None else z.mul_(factor), hc, where, s)
                    at += n
        grads.finish(None)
        return grads.hidden, grads.weight, grads.bias, None, None


class _Grads:
    """The gradients to hidden, weight and bias, summed chunk by chunk: the weight's in float32 (float64
    for float64), the bias's in float64, each written in the weight's dtype at the end."""

    def __init__(self, hidden, weight, bias, need):
        acc = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        self.hidden = torch.zeros(hidden.shape, dtype=hidden.dtype, device=hidden.device) if need[0] else None
        self._w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need[1] else None
        self._b = torch.zeros(bias.shape, dtype=torch.float64, device=bias.device) if bias is not None and need[2] \
            else None  # (V values: summed in float64, a sum of every token's)
        self._weight, self._bias = weight, bias
        self.weight = self.bias = None

    def add(self, g, hc, where, s):
        """g: the chunk's gradient to its logits (n, V); hc its hidden rows; where, s: their place."""
        if self.hidden is not None:
            d = self.hidden.shape[-1]
            if isinstance(where, slice):
                dst = self.hidden.view(-1, d)[s:s + g.shape[0]]
            else:
                t = self.hidden.shape[-2] if self.hidden.dim() >= 2 else 1
                dst = self.hidden.view(-1, t, d)[where, s:s + g.shape[0]]
            torch.matmul(g, self._weight, out=dst)
        if self._w is not None:  # each chunk's part summed in float32, rounded once at the end, as one matmul is
            self._w.addmm_(g.t().to(self._w.dtype), hc.to(self._w.dtype))
        if self._b is not None:
            self._b += g.sum(0, dtype=self._b.dtype)

    def finish(self, scale):
        if scale is not None:
            if self.hidden is not None:
                self.hidden.mul_(scale.to(self.hidden.dtype))
            if self._w is not None:
                self._w.mul_(scale)
            if self._b is not None:
                self._b.mul_(scale)
        self.weight = None if self._w is None else self._w.to(self._weight.dtype)
        self.bias = None if self._b is None else self._b.to(self._bias.dtype)
        self._w = self._b = None


def _check_linear(hidden, weight, bias, memory):
    """The arguments linear_cross_entropy and linear_row_stats share, checked."""
    if memory not in MODES:
        raise InvalidArgumentError(f"softlight: memory must be one of {MODES}, got {memory!r}")
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


def linear_cross_entropy(hidden, weight, target, *, bias=None, ignore_index=-100, label_smoothing=0.0, z_loss=0.0,
                         softcap=None, temperature=1.0, reduction="mean", shift=False, return_lse=False,
                         memory="speed"):
    """cross_entropy(hidden @ weight.T + bias, target) (softlight.torch.cross_entropy's options), with
    gradients to hidden, weight and bias, without the (tokens, vocabulary) logits in memory.

    hidden (..., D) and weight (V, D) of one floating dtype and device; target (...) class indices;
    bias (V,) or None. softcap: Gemma 2's final logit soft-capping, c * tanh(z / c). shift: position t
    of each sequence (hidden (..., T, D)) predicts target t + 1, as causal LM labels are, without copying
    hidden. memory: "speed" or "low_memory" (module docstring). The loss is in float32 (float64 for
    float64): a scalar, or (...) for reduction="none"; with return_lse, also each token's log-sum-exp
    (without a gradient)."""
    _check_linear(hidden, weight, bias, memory)
    red, ignore_index, label_smoothing, z_loss = _consumers.ce_options(reduction, ignore_index, label_smoothing,
                                                                      z_loss)
    if not isinstance(target, torch.Tensor):
        raise ArgumentTypeError(f"softlight: target must be a torch tensor, got {type(target).__qualname__}")
    if target.is_floating_point() or target.dtype == torch.bool or tuple(target.shape) != tuple(hidden.shape[:-1]):
        raise InvalidArgumentError(f"softlight: target must be class indices of shape {tuple(hidden.shape[:-1])}, "
                                   f"got {target.dtype} {tuple(target.shape)}")
    softcap = _check_softcap(softcap)
    opts = (bool(shift), ignore_index, label_smoothing, z_loss, softcap, float(temperature), reduction, memory)
    loss, lse = _LinearCrossEntropy.apply(hidden, weight, bias, target, opts)
    return (loss, lse) if return_lse else loss


class _LinearRowStats(torch.autograd.Function):
    """Token log-probs and entropy of hidden @ weight.T (+ bias), by chunks: the forward keeps each
    token's lse and entropy; the backward runs the chunks again, the outputs' upstream gradients known
    only then."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, index, opts):
        shift, softcap, temperature, memory = opts
        segs, lead = _segments(hidden, index, shift)
        tokens = sum(seg[0].shape[0] for seg in segs)
        acc = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        k = tuple(index.shape[hidden.dim() - 1:])
        logprobs = torch.empty((tokens,) + k, dtype=acc, device=hidden.device)
        entropy = torch.empty(tokens, dtype=acc, device=hidden.device)
        lse = torch.empty(tokens, dtype=acc, device=hidden.device)
        rows = _chunk_rows(tokens, weight.shape[0], weight.element_size(), memory)
        at = 0
        for h2, i2, _ in segs:
            for s in range(0, h2.shape[0], rows):
                hc, ic = h2[s:s + rows], i2[s:s + rows]
                z, _ = _logits(hc, weight, bias, softcap)
                out = _consumers.row_stats(z, ic, stats=("lse", "logprobs", "entropy"), temperature=temperature)
                n = hc.shape[0]
                logprobs[at:at + n], entropy[at:at + n], lse[at:at + n] = out["logprobs"], out["entropy"], out["lse"]
                at += n
        ctx.opts = opts
        ctx.save_for_backward(hidden, weight, bias, index, lse, entropy)
        return logprobs.reshape(lead + k), entropy.reshape(lead)

    @staticmethod
    def backward(ctx, d_logprobs, d_entropy):
        hidden, weight, bias, index, lse, entropy = ctx.saved_tensors
        shift, softcap, temperature, memory = ctx.opts
        segs, _ = _segments(hidden, index, shift)
        k = tuple(index.shape[hidden.dim() - 1:])
        d_lp = None if d_logprobs is None else d_logprobs.reshape((-1,) + k)
        d_en = None if d_entropy is None else d_entropy.reshape(-1)
        grads = _Grads(hidden, weight, bias, ctx.needs_input_grad[:3])
        rows = _chunk_rows(lse.numel(), weight.shape[0], weight.element_size(), memory)
        at = 0
        with torch.no_grad():
            for h2, i2, where in segs:
                for s in range(0, h2.shape[0], rows):
                    hc, ic = h2[s:s + rows], i2[s:s + rows]
                    n = hc.shape[0]
                    z, factor = _logits(hc, weight, bias, softcap)
                    _consumers.row_stats_backward(
                        z, lse[at:at + n], entropy=entropy[at:at + n],
                        d_logprobs=None if d_lp is None else d_lp[at:at + n].contiguous(),
                        d_entropy=None if d_en is None else d_en[at:at + n].contiguous(), index=ic,
                        temperature=temperature, out=z)
                    grads.add(z if factor is None else z.mul_(factor), hc, where, s)
                    at += n
        grads.finish(None)
        return grads.hidden, grads.weight, grads.bias, None, None


def linear_row_stats(hidden, weight, index, *, bias=None, temperature=1.0, softcap=None, shift=False,
                     memory="speed"):
    """{"logprobs", "entropy"} of log_softmax((hidden @ weight.T + bias) / temperature) without the
    logits in memory: each token's log-prob at index ((...) or (..., K) indices) and the entropy of its
    distribution, both differentiable with respect to hidden, weight and bias (RL's log-probs and
    entropy from one pass). Options as linear_cross_entropy's; float32 (float64 for float64) results."""
    _check_linear(hidden, weight, bias, memory)
    if not isinstance(index, torch.Tensor):
        raise ArgumentTypeError(f"softlight: index must be a torch tensor, got {type(index).__qualname__}")
    lead = tuple(hidden.shape[:-1])
    if index.is_floating_point() or index.dtype == torch.bool or \
            (tuple(index.shape) != lead and tuple(index.shape[:-1]) != lead):
        raise InvalidArgumentError(f"softlight: index must be class indices of shape {lead} or {lead} + (K,), got "
                                   f"{index.dtype} {tuple(index.shape)}")
    softcap = _check_softcap(softcap)
    temperature = _check_temperature(temperature)
    logprobs, entropy = _LinearRowStats.apply(hidden, weight, bias, index, (bool(shift), softcap, temperature, memory))
    return {"logprobs": logprobs, "entropy": entropy}


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
