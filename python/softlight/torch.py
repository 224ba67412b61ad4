"""softlight as torch operators: autograd, torch.compile, CUDA graphs.

    import softlight.torch as slt
    y = slt.log_softmax(x, dim=-1)              # as torch.log_softmax, with autograd
    layer = slt.LogSoftmax(dim=-1)              # as torch.nn.LogSoftmax

The operators, registered through torch.library under the `softlight` namespace:

    torch.ops.softlight.log_softmax(Tensor x, int dim, float temperature) -> Tensor
    torch.ops.softlight.log_softmax_backward(Tensor grad, Tensor y, int dim, float temperature) -> Tensor

Each has CPU and CUDA kernels (softlight's), a fake implementation (shapes for torch.compile and
meta tensors) and autograd: the forward saves only its output y, and the backward runs softlight's
backward kernel, dx = (dy - exp(y) * sum(dy)) / temperature. The backward has a derivative of its
own, written in torch operations, so double backward works. Under autocast the operators take
float32 inputs, as torch.log_softmax does, and return float32. Layouts softlight cannot read in place
(axes that do not merge into one evenly strided axis) are made contiguous first.

The consumers of the log-sum-exp (cross_entropy, token_logprobs, entropy, logsumexp, row_stats;
docs/consumers.md) are the operators row_stats, row_stats_backward and cross_entropy, on the CPU and
on CUDA.

`log_softmax` calls softlight directly where no compiler, autocast, tensor subclass, torch.func
transform, dispatch mode or jit tracer is involved (a torch operator's dispatch costs several
microseconds a call): without autograd the forward alone, read in C (python/torch_entry.cpp), under
eager autograd an autograd.Function over the same kernels; all paths give the same results.
"""
import math

import torch

from . import _C, _api, _arrays, _consumers
from . import _torch_private as _private
from ._arrays import DTYPE, ON_GPU, PTR, SHAPE, STRIDES
from ._consumers import STATS
from ._errors import ArgumentTypeError, AxisError, InvalidArgumentError, UnsupportedDTypeError, check

_lib = torch.library.Library("softlight", "DEF")


def _operator(schema, kernel, fake, *, grad=None, setup=None, autograd=None, autocast=(), eager=None):
    """Registers the operator softlight::<name> of `schema`, whole: `kernel` for CPU and CUDA tensors,
    `fake` (shapes, for torch.compile and meta tensors), its autograd (`grad` and `setup` as
    torch.library.register_autograd takes them, or `autograd`, a kernel of its own at the Autograd
    key), float32 under autocast on each device in `autocast`. With `eager` (a class name), returns
    the operator's eager bypass: `kernel` and its autograd as that autograd.Function's apply, without the dispatch
    (several microseconds each way), for the calls that nothing but eager torch sees (`_plain`); its
    forward calls setup(ctx, args, out, eager=True), its backward grad(ctx, *grads, eager=True) where
    the backward builds no graph (then grad may call kernels, not operators)."""
    name = schema.split("(", 1)[0]
    qualified = f"softlight::{name}"
    _lib.define(schema)
    for key in ("CPU", "CUDA"):
        _lib.impl(name, kernel, key)
    torch.library.register_fake(qualified)(fake)
    if autograd is not None:
        _lib.impl(name, autograd, "Autograd")
    elif grad is not None:
        torch.library.register_autograd(qualified, grad, setup_context=setup)
    for device in autocast:
        torch.library.register_autocast(qualified, device, torch.float32)
    if eager is None:
        return None

    def forward(ctx, *args):
        out = kernel(*args)
        setup(ctx, args, out, eager=True)
        return out

    def backward(ctx, *grads):
        return grad(ctx, *grads, eager=not torch.is_grad_enabled())

    function = type(eager, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                         "backward": staticmethod(backward), "__module__": __name__})
    # The C++ apply under Function.apply's Python wrapper, whose work (binding setup_context's arguments,
    # functorch's checks and unwrapping: ~3 us a call) is done for a call found plain.
    return super(torch.autograd.Function, function).apply


def _readable(t, dim):
    """t, or a contiguous copy where softlight cannot read its layout along dim in place."""
    return t if t.is_contiguous() or _C.layout(t.shape, t.stride(), dim)[0] == 0 else t.contiguous()


# The eager calls read in C (python/torch_entry.cpp): the output, or None where the general path
# below is to take the call. torch's objects are handed to the C reader once, here.
_arrays._torch_setup()
_eager_forward, _eager_backward = _C.torch_forward, _C.torch_backward
# Read on every eager call: bound here, one global lookup each.
_any_autocast, _transforms_active = _private.any_autocast, _private.transforms_active
_dispatch_stack_len, _tracing_state, _below_autograd = (_private.dispatch_stack_len, _private.tracing_state,
                                                         _private.below_autograd)


def _forward(x, dim, temperature=1.0):
    y = _eager_forward(x, dim, temperature, False)
    if y is not None:
        return y
    x = _readable(x, dim)
    # (The operator's kernel, below autograd: the plain API's refusal of a tensor that requires grad
    # is for calls that autograd does not see.)
    return _api.log_softmax(x.detach() if x.requires_grad else x, dim, temperature=temperature)


def _backward(grad, y, dim, temperature=1.0):
    dx = _eager_backward(grad, y, dim)
    if dx is None:
        grad, y = _readable(grad, dim).detach(), _readable(y, dim).detach()
        dx = _api.log_softmax_backward(grad, y, dim)
    return dx if temperature == 1.0 else dx.div_(temperature)


def _forward_fake(x, dim, temperature=1.0):
    _check(x, dim)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _backward_fake(grad, y, dim, temperature=1.0):
    _check(grad, dim)
    return torch.empty_like(grad, memory_format=torch.contiguous_format)


_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3}


def _check(x, dim):
    """The C ABI's dtype code of x, or raise for its dtype or a dim out of range."""
    code = _CODES.get(x.dtype)
    if code is None:
        raise UnsupportedDTypeError(f"softlight: unsupported dtype {x.dtype}")
    n = max(x.dim(), 1)
    if not -n <= dim < n:
        raise AxisError(f"softlight: dim {dim} is out of range for a {x.dim()}-d tensor")
    return code


def _grad_forward(ctx, grad):
    """The forward's gradient through the backward operator (which has a derivative of its own)."""
    (y,) = ctx.saved_tensors
    return torch.ops.softlight.log_softmax_backward(grad, y, ctx.dim, ctx.temperature), None, None


def _grad_backward(ctx, h):
    """The derivative of dx = (g - e * S) / T, e = exp(y), S = sum(g) along dim: dL/dg = (h - sum(h e)) / T
    and dL/dy = -h e S / T."""
    grad, y = ctx.saved_tensors
    e = torch.exp(y.to(torch.float32) if y.dtype in (torch.float16, torch.bfloat16) else y)
    hh = h.to(e.dtype)
    t = ctx.temperature
    d_grad = (hh - (hh * e).sum(ctx.dim, keepdim=True)) / t
    d_y = -(hh * e * grad.to(e.dtype).sum(ctx.dim, keepdim=True)) / t
    return d_grad.to(grad.dtype), d_y.to(y.dtype), None, None


# The two operators' autograd, registered at the Autograd key by hand: register_autograd's kernel
# costs about 9 us a call even where nothing requires grad; this one checks, and otherwise computes
# at once (the eager path in C, where no mode or transform must see the call) or goes on below
# autograd. Where grad is needed, an autograd.Function whose forward runs the operator below
# autograd, so that tracers and fake tensors see the operator itself.
class _LogSoftmaxGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, temperature):  # (not setup_context's form: binding costs ~40 us)
        with _below_autograd():
            y = torch.ops.softlight.log_softmax(x, dim, temperature)
        ctx.save_for_backward(y)
        ctx.dim, ctx.temperature = dim, temperature
        return y

    backward = staticmethod(_grad_forward)


class _LogSoftmaxGradEager(torch.autograd.Function):
    """log_softmax's autograd in plain eager autograd (log_softmax below): the operators' bodies
    without their dispatch (several microseconds each way: the same kernels, the same results). A
    backward that builds a graph (create_graph) runs the backward operator."""

    @staticmethod
    def forward(ctx, x, dim, temperature):
        y = _forward(x, dim, temperature)
        ctx.save_for_backward(y)
        ctx.dim, ctx.temperature = dim, temperature
        return y

    @staticmethod
    def backward(ctx, grad):
        if torch.is_grad_enabled():
            return _grad_forward(ctx, grad)
        (y,) = ctx.saved_tensors
        return _backward(grad, y, ctx.dim, ctx.temperature), None, None


# The C++ apply under Function.apply's Python wrapper, whose work (binding setup_context's arguments,
# functorch's checks and unwrapping: ~3 us a call) is done for a call that the C path has found plain.
_apply_eager = super(torch.autograd.Function, _LogSoftmaxGradEager).apply


class _LogSoftmaxBackwardGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, grad, y, dim, temperature):
        with _below_autograd():
            dx = torch.ops.softlight.log_softmax_backward(grad, y, dim, temperature)
        ctx.save_for_backward(grad, y)
        ctx.dim, ctx.temperature = dim, temperature
        return dx

    backward = staticmethod(_grad_backward)


def _forward_autograd(x, dim, temperature=1.0):
    if torch.is_grad_enabled() and x.requires_grad:
        return _LogSoftmaxGrad.apply(x, dim, temperature)
    y = _eager_forward(x, dim, temperature, True)  # (never True here: grad is not needed)
    if y is not None:
        return y
    with _below_autograd():
        return torch.ops.softlight.log_softmax(x, dim, temperature)


def _backward_autograd(grad, y, dim, temperature=1.0):
    if torch.is_grad_enabled() and (grad.requires_grad or y.requires_grad):
        return _LogSoftmaxBackwardGrad.apply(grad, y, dim, temperature)
    with _below_autograd():
        return torch.ops.softlight.log_softmax_backward(grad, y, dim, temperature)


# Autocast as torch.log_softmax's: float32 under CUDA autocast; on the CPU, the input's dtype (CPU
# autocast leaves log_softmax alone).
_operator("log_softmax(Tensor x, int dim, float temperature=1.0) -> Tensor", _forward, _forward_fake,
          autograd=_forward_autograd, autocast=("cuda",))
_operator("log_softmax_backward(Tensor grad, Tensor y, int dim, float temperature=1.0) -> Tensor", _backward,
          _backward_fake, autograd=_backward_autograd, autocast=("cuda",))


def _plain(x):
    """Whether nothing but eager torch sees a call on x: no compiler, autocast, tensor subclass,
    torch.func transform, dispatch mode or jit tracer (otherwise the operator takes the call)."""
    return type(x) is torch.Tensor and not torch.compiler.is_compiling() and not _any_autocast() and \
        not _transforms_active() and not _dispatch_stack_len() and \
        _tracing_state() is None


def log_softmax(x, dim=-1, *, temperature=1.0):
    """log_softmax(x / temperature) along dim, as torch.log_softmax (with autograd and torch.compile)."""
    if not torch.compiler.is_compiling():
        y = _eager_forward(x, dim, temperature, True)  # plain eager without grad: at once
        if y is True:  # plain eager, recorded by autograd
            return _apply_eager(x, dim, temperature)
        if y is not None:
            return y
        if _plain(x):  # (plain, but the C path does not read x as it is)
            if x.requires_grad and torch.is_grad_enabled():
                return _LogSoftmaxGradEager.apply(x, dim, temperature)
            return _forward(x, dim, temperature)
    if not isinstance(x, torch.Tensor):
        raise ArgumentTypeError(f"softlight: x must be a torch tensor, got {type(x).__qualname__}")
    return torch.ops.softlight.log_softmax(x, dim, temperature)


class LogSoftmax(torch.nn.Module):
    """torch.nn.LogSoftmax through softlight."""

    def __init__(self, dim=-1, temperature=1.0):
        super().__init__()
        self.dim, self.temperature = dim, temperature

    def forward(self, x):
        return log_softmax(x, self.dim, temperature=self.temperature)

    def extra_repr(self):
        return f"dim={self.dim}" + (f", temperature={self.temperature}" if self.temperature != 1.0 else "")


__all__ = ["log_softmax", "LogSoftmax", "InvalidArgumentError"]


# --- consumers of a row's log-sum-exp (docs/consumers.md) -------------------------------------------

# row_stats's outputs, in order; `stats` is a mask of those to compute (bit i: output i). lse is always
# computed (the backward reads it); the others not asked come back empty (0 elements), and the kernels
# take only what is asked: token_logprobs reads the logits without the entropy's moment or the row's
# sum.
ALL_STATS = (1 << len(STATS)) - 1

_REDUCTIONS = {"none": 0, "sum": 1, "mean": 2}


def _acc(x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _ptr(t):
    return 0 if t is None else t.data_ptr()


def _rows_ready(x):
    """x (rows, V) with its last axis contiguous and its rows evenly spaced, as the C ABI reads it."""
    return x if x.stride(-1) == 1 or x.shape[-1] <= 1 else x.contiguous()


def _index_ready(index, rows, cols, shard, name="index", ignore=None):
    if index is None:
        return None, 0
    if index.is_floating_point() or index.is_complex() or index.dtype == torch.bool:
        raise ArgumentTypeError(f"softlight: {name} must hold integers, got {index.dtype}")
    if index.dtype == getattr(torch, "uint64", None) and index.numel() and index.device.type == "cpu" and \
            bool((index.view(torch.int64) < 0).any()):
        raise InvalidArgumentError(f"softlight: {name} holds values past 2**63 - 1, which do not fit int64")
    index = index.to(torch.int64).contiguous()
    if not shard and index.numel() and index.device.type == "cpu":  # (on the GPU: NaN, docs/consumers.md)
        bad = (index < 0) | (index >= cols)
        if ignore is not None:
            bad &= index != ignore
        if bool(bad.any()):
            where = tuple(int(i) for i in bad.nonzero()[0])
            raise InvalidArgumentError(f"softlight: {name}{list(where)} = {int(index[where])} is outside the "
                                       f"vocabulary [0, {cols})")
    return index, (1 if index.dim() == 1 else index.shape[1])


def _read(x):
    """x as the C reader gives it (_arrays.read_torch; its error where it does not take x) and the
    stream handle of the call (0 on the CPU)."""
    xa, stream = _read_torch(x, None)
    return xa, stream or 0


_read_torch = _arrays.read_torch


def _stats_shapes(rows, index, stats):
    """Each output's shape: (rows,), the index's for logprobs and picked, (0,) where not asked."""
    pick = (rows, 0) if index is None else tuple(index.shape)
    asked = stats | 1
    return [(pick if i in (2, 3) else (rows,)) if asked >> i & 1 else (0,) for i in range(len(STATS))]


def _row_stats(logits, index, temperature=1.0, index_offset=0, shard=False, stats=ALL_STATS):
    x = _rows_ready(logits)
    xa, stream = _read(x)
    rows, cols = xa[SHAPE]
    idx, k = _index_ready(index, rows, cols, shard)
    acc = _acc(x)
    shapes = _stats_shapes(rows, idx, stats)
    outs = [torch.empty(shape, dtype=acc, device=x.device) for shape in shapes]
    ptrs = [t.data_ptr() if shape != (0,) else 0 for t, shape in zip(outs, shapes)]
    check(_C.row_stats(xa[PTR], xa[STRIDES][0] if rows > 1 else cols, rows, cols, xa[DTYPE], temperature, _ptr(idx),
                       k, k, index_offset, shard, ptrs, 0, xa[ON_GPU], stream))
    return tuple(outs)


def _row_stats_backward(logits, lse, entropy, index, d_lse, d_entropy, d_logprobs, d_picked, d_sum, temperature=1.0,
                        index_offset=0, shard=False):
    x = _rows_ready(logits)
    xa, stream = _read(x)
    rows, cols = xa[SHAPE]
    idx, k = _index_ready(index, rows, cols, shard)
    acc = _acc(x)
    ready = [None if t is None else t.to(acc).contiguous()
             for t in (lse, entropy, d_lse, d_entropy, d_logprobs, d_picked, d_sum)]
    if d_entropy is None:
        ready[1] = None
    dx = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    check(_C.row_stats_backward(xa[PTR], xa[STRIDES][0] if rows > 1 else cols, dx.data_ptr(), cols, rows, cols,
                                xa[DTYPE], temperature, _ptr(idx), k, k, index_offset, shard, [_ptr(t) for t in ready],
                                0, xa[ON_GPU], stream))
    return dx


def _cross_entropy(logits, target, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, temperature=1.0,
                   reduction=2, with_grad=False):
    x = _rows_ready(logits)
    xa, stream = _read(x)
    rows, cols = xa[SHAPE]
    idx, _ = _index_ready(target, rows, cols, False, "target", ignore_index)
    acc = _acc(x)
    dev = x.device
    loss = torch.empty(rows if reduction == 0 else (), dtype=acc, device=dev)
    lse = torch.empty(rows, dtype=acc, device=dev)
    grad = torch.empty((rows, cols) if with_grad else 0, dtype=x.dtype, device=dev)
    check(_C.cross_entropy(xa[PTR], xa[STRIDES][0] if rows > 1 else cols, idx.data_ptr(), rows, cols, xa[DTYPE],
                           temperature, label_smoothing, z_loss, True, ignore_index, reduction, loss.data_ptr(),
                           lse.data_ptr(), grad.data_ptr() if with_grad else 0, cols, 0, xa[ON_GPU], stream))
    return loss, lse, grad


def _cross_entropy_grad_scale(grad, d_loss):
    if grad.dim() != 2 or grad.stride(-1) != 1 or d_loss.numel() not in (1, grad.shape[0]):
        raise InvalidArgumentError(f"softlight: cross_entropy_grad_scale_ takes rows of a gradient and one factor or "
                                   f"one a row, got {tuple(grad.shape)} and {tuple(d_loss.shape)}")
    ga, stream = _read(grad)
    rows, cols = ga[SHAPE]
    f = d_loss.to(device=grad.device, dtype=_acc(grad)).contiguous()
    check(_C.cross_entropy_grad_scale(ga[PTR], ga[STRIDES][0] if rows > 1 else cols, rows, cols, ga[DTYPE],
                                      f.data_ptr(), f.numel(), 0, ga[ON_GPU], stream))


def _cross_entropy_backward(logits, target, d_loss, ignore_index=-100, label_smoothing=0.0, z_loss=0.0,
                            temperature=1.0, reduction=2):
    grad = _cross_entropy(logits, target, ignore_index, label_smoothing, z_loss, temperature, reduction, True)[2]
    _cross_entropy_grad_scale(grad, d_loss)
    return grad


def _cross_entropy_grad_scale_fake(grad, d_loss):
    return None


def _row_stats_fake(logits, index, temperature=1.0, index_offset=0, shard=False, stats=ALL_STATS):
    _check(logits, -1)
    acc = _acc(logits)
    return tuple(logits.new_empty(shape, dtype=acc) for shape in _stats_shapes(logits.shape[0], index, stats))


def _row_stats_backward_fake(logits, lse, entropy, index, d_lse, d_entropy, d_logprobs, d_picked, d_sum,
                             temperature=1.0, index_offset=0, shard=False):
    _check(logits, -1)
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


def _cross_entropy_fake(logits, target, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, temperature=1.0,
                        reduction=2, with_grad=False):
    _check(logits, -1)
    rows = logits.shape[0]
    acc = _acc(logits)
    loss = logits.new_empty((rows,) if reduction == 0 else (), dtype=acc)
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format) if with_grad else logits.new_empty(0)
    return loss, logits.new_empty((rows,), dtype=acc), grad


def _cross_entropy_backward_fake(logits, target, d_loss, ignore_index=-100, label_smoothing=0.0, z_loss=0.0,
                                 temperature=1.0, reduction=2):
    _check(logits, -1)
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


def _setup_stats(ctx, inputs, output, eager=False):
    logits, index, temperature, index_offset, shard = (tuple(inputs) + (1.0, 0, False))[:5]  # (stats: not needed)
    ctx.args = (temperature, index_offset, shard)
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(output[5], output[6], output[7])
    ctx.save_for_backward(logits, index, output[0], output[1])


def _grad_stats(ctx, d_lse, d_entropy, d_logprobs, d_picked, d_sum, *_, eager=False):
    """(eager: the gradient by the operator's kernel, not the operator.)"""
    logits, index, lse, entropy = ctx.saved_tensors
    if entropy.shape != lse.shape:  # (not asked: then no gradient reaches it, and the backward reads none)
        entropy = lse
    backward = _row_stats_backward if eager else torch.ops.softlight.row_stats_backward
    dx = backward(logits, lse, entropy, index, d_lse, d_entropy, d_logprobs, d_picked, d_sum, *ctx.args)
    return dx, None, None, None, None, None


def _no_double_backward(ctx, *grads):
    raise InvalidArgumentError("softlight: the gradient of row statistics or cross-entropy has no derivative of "
                               "its own (double backward is not supported)")


def _no_setup(ctx, inputs, output):
    return None


def _setup_ce(ctx, inputs, output, eager=False):
    """(eager: the eager bypass's call, which no compiler or fake tensor sees.)"""
    logits, target, ignore_index, label_smoothing, z_loss, temperature, reduction, with_grad = \
        (tuple(inputs) + (-100, 0.0, 0.0, 1.0, 2, False))[:8]
    ctx.temperature = temperature
    ctx.ce = (ignore_index, label_smoothing, z_loss, temperature, reduction, True)  # the kernel writing the gradient
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(output[2])
    # A traced graph: the compiler's own flag, or fake inputs (torch 2.11 raises the flag only while
    # Dynamo reads the code, not while AOTAutograd traces the forward and backward).
    ctx.traced = not eager and (torch.compiler.is_compiling() or _private.is_fake(logits))
    if with_grad and ctx.traced:  # a traced graph's gradient of the forward: multiplied below
        ctx.save_for_backward(logits, target, output[1], output[2])
        ctx.grad = None
    else:  # eager: the forward's gradient, if any, is scaled in place by the backward, so it is kept untracked
        ctx.save_for_backward(logits, target, output[1])
        ctx.grad = output[2] if with_grad else None


def _grad_ce_graph(logits, target, d_loss, d_lse, ignore_index, label_smoothing, z_loss, temperature, reduction):
    """cross_entropy's gradient written in torch operations, for a backward that builds a graph
    (create_graph=True): differentiable in the logits and the upstream gradients, so that the
    gradient of a gradient (a gradient penalty) is computed, as torch computes it."""
    z = logits.to(_acc(logits)) / temperature
    lse = torch.logsumexp(z, -1, keepdim=True)
    p = torch.exp(z - lse)
    dz = None
    if d_loss is not None:
        cols = z.shape[-1]
        keep = (target != ignore_index).unsqueeze(-1)
        pick = torch.nn.functional.one_hot(torch.where(keep[:, 0], target, 0), cols).to(z.dtype)
        g = p * (1.0 + 2.0 * z_loss * lse) - (1.0 - label_smoothing) * pick - label_smoothing / cols
        g = torch.where(keep, g, torch.zeros_like(g))
        if reduction == 2:
            g = g / keep.sum()
        dz = g * (d_loss.unsqueeze(-1) if d_loss.dim() else d_loss).to(z.dtype)
    if d_lse is not None:
        extra = p * d_lse.to(z.dtype).unsqueeze(-1)
        dz = extra if dz is None else dz + extra
    return (dz / temperature).to(logits.dtype)


def _grad_ce(ctx, d_loss, d_lse, _, eager=False):
    """(eager: the forward's gradient scaled in place by the kernel, not the operator.)"""
    saved = ctx.saved_tensors
    logits, target, lse = saved[:3]
    if torch.is_grad_enabled() and (d_loss is not None or d_lse is not None):
        ignore_index, label_smoothing, z_loss, temperature, reduction = ctx.ce[:5]
        dx = _grad_ce_graph(logits, target, d_loss, d_lse, ignore_index, label_smoothing, z_loss, temperature,
                            reduction)
        return dx, None, None, None, None, None, None, None
    dx = None
    if d_loss is not None and len(saved) == 4:
        dx = saved[3] * (d_loss.unsqueeze(-1) if d_loss.dim() else d_loss).to(saved[3].dtype)
    elif d_loss is not None:
        # The gradient for an upstream gradient of 1: the forward's (with_grad), or written here by the
        # forward's kernel (without it, and in a second backward through the graph, retain_graph, so
        # that it gives the same bits); then scaled in place by d_loss (nothing done where it is 1:
        # loss.backward() of the loss itself) and handed out as it is.
        if ctx.grad is None and ctx.traced:
            dx = torch.ops.softlight.cross_entropy_backward(logits, target, d_loss, *ctx.ce[:5])
        else:
            grad = ctx.grad if ctx.grad is not None else torch.ops.softlight.cross_entropy(logits, target, *ctx.ce)[2]
            ctx.grad = None
            (_cross_entropy_grad_scale if eager else torch.ops.softlight.cross_entropy_grad_scale_)(grad, d_loss)
            dx = grad
    if d_lse is not None:
        extra = torch.ops.softlight.row_stats_backward(logits, lse, lse, None, d_lse, None, None, None, None,
                                                       ctx.temperature)
        dx = extra if dx is None else dx + extra
    return dx, None, None, None, None, None, None, None


# The consumers' operators. row_stats and cross_entropy take float32 under autocast on both devices,
# and have eager bypasses: without the dispatch and register_autograd's wrapper, which took a third of
# a forward and backward's time on the host (docs/consumers.md); a backward that builds a graph
# (create_graph) goes through the operators.
_apply_stats_eager = _operator(
    "row_stats(Tensor logits, Tensor? index, float temperature=1.0, int index_offset=0, bool shard=False, "
    "int stats=255) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    _row_stats, _row_stats_fake, grad=_grad_stats, setup=_setup_stats, autocast=("cpu", "cuda"),
    eager="_RowStatsEager")
_operator("row_stats_backward(Tensor logits, Tensor lse, Tensor entropy, Tensor? index, Tensor? d_lse, "
          "Tensor? d_entropy, Tensor? d_logprobs, Tensor? d_picked, Tensor? d_sum, float temperature=1.0, "
          "int index_offset=0, bool shard=False) -> Tensor",
          _row_stats_backward, _row_stats_backward_fake, grad=_no_double_backward, setup=_no_setup)
_apply_ce_eager = _operator(
    "cross_entropy(Tensor logits, Tensor target, int ignore_index=-100, float label_smoothing=0.0, "
    "float z_loss=0.0, float temperature=1.0, int reduction=2, bool with_grad=False) -> (Tensor, Tensor, Tensor)",
    _cross_entropy, _cross_entropy_fake, grad=_grad_ce, setup=_setup_ce, autocast=("cpu", "cuda"),
    eager="_CrossEntropyEager")
# cross_entropy's gradient (written for an upstream gradient of 1) times the loss's upstream gradient,
# in place; rows whose factor is 1 are left alone, decided where d_loss is (no read of it on the host).
_operator("cross_entropy_grad_scale_(Tensor(a!) grad, Tensor d_loss) -> ()", _cross_entropy_grad_scale,
          _cross_entropy_grad_scale_fake)
# cross_entropy's gradient for the loss's upstream gradient d_loss, written by the forward's kernel and
# scaled by d_loss in place (a traced graph's backward: it depends on d_loss, so the compiler keeps it
# there, and nothing of it is functionalized).
_operator("cross_entropy_backward(Tensor logits, Tensor target, Tensor d_loss, int ignore_index=-100, "
          "float label_smoothing=0.0, float z_loss=0.0, float temperature=1.0, int reduction=2) -> Tensor",
          _cross_entropy_backward, _cross_entropy_backward_fake, grad=_no_double_backward, setup=_no_setup)


def _as_rows(logits, dim=-1):
    """logits with `dim` moved last, as (rows, V), and the leading shape."""
    if not isinstance(logits, torch.Tensor):
        raise ArgumentTypeError(f"softlight: logits must be a torch tensor, got {type(logits).__qualname__}")
    if logits.dim() == 0:
        raise InvalidArgumentError("softlight: logits must have at least one axis")
    dim = _api._check_dim(dim)
    if not -logits.dim() <= dim < logits.dim():
        raise AxisError(f"softlight: dim {dim} is out of range for a {logits.dim()}-d tensor")
    x = logits if dim in (-1, logits.dim() - 1) else logits.movedim(dim, -1)
    lead = tuple(x.shape[:-1])
    return x.reshape(math.prod(lead), x.shape[-1]), lead


def row_stats(logits, index=None, *, temperature=1.0, dim=-1, stats=None):
    """softlight.row_stats for tensors, with autograd: a dict of lse, entropy, logprobs and picked (where
    an index is given; shape (...) or (..., K)), sum, max, sumexp and moment (the last three without
    gradients), over `dim` of logits / temperature, from one read. `stats` names those to compute (by
    default all; lse always): the fewer, the less work a row."""
    if index is not None:
        index = _index_tensor(index, logits, "index")
    x, lead = _as_rows(logits, dim)
    idx = None if index is None else (index.reshape(-1) if index.shape == lead else
                                      index.reshape(math.prod(lead), index.shape[-1]))
    if index is not None and index.shape != lead and tuple(index.shape[:-1]) != lead:
        raise InvalidArgumentError(f"softlight: index has shape {tuple(index.shape)}; the logits' leading shape is "
                                   f"{lead}")
    mask = ALL_STATS
    if stats is not None:
        unknown = [n for n in stats if n not in STATS]
        if unknown:
            raise InvalidArgumentError(f"softlight: stats names an unknown statistic {unknown[0]!r}; known: "
                                       f"{', '.join(STATS)}")
        mask = sum(1 << STATS.index(n) for n in set(stats) | {"lse"})
    args = (x, idx, float(temperature), 0, False, mask)
    if not (_plain(logits) and (index is None or type(index) is torch.Tensor)):
        out = torch.ops.softlight.row_stats(*args)
    elif logits.requires_grad and torch.is_grad_enabled():  # plain eager autograd: without the dispatch
        out = _apply_stats_eager(*args)
    else:
        out = _row_stats(*args)
    pick = () if index is None else tuple(index.shape)
    return {n: (t.reshape(pick) if n in ("logprobs", "picked") else t.reshape(lead))
            for i, (n, t) in enumerate(zip(STATS, out))
            if mask >> i & 1 and (index is not None or n not in ("logprobs", "picked"))}


def token_logprobs(logits, index, *, temperature=1.0):
    """log_softmax(logits / temperature, -1) gathered at index ((...) or (..., K)), in float32 (float64 for
    float64), without a vocabulary-sized output; its backward is one read and one write of the logits."""
    return row_stats(logits, index, temperature=temperature, stats=("logprobs",))["logprobs"]


def entropy(logits, *, temperature=1.0, dim=-1):
    """The entropy of softmax(logits / temperature) along dim, from one read."""
    return row_stats(logits, temperature=temperature, dim=dim, stats=("entropy",))["entropy"]


def logsumexp(logits, dim=-1):
    """torch.logsumexp(logits, dim) in float32 (float64 for float64), from one read."""
    return row_stats(logits, dim=dim, stats=("lse",))["lse"]


def _index_tensor(index, like, name):
    """index as a tensor on like's device: a tensor as it is; a list, a Python or numpy int made one
    (integers only)."""
    if isinstance(index, torch.Tensor):
        return index
    if index is None or isinstance(index, (bool, float, str, bytes)):
        raise ArgumentTypeError(f"softlight: {name} must be an integer tensor, got {type(index).__qualname__}")
    try:
        t = torch.as_tensor(index, device=like.device)
    except (TypeError, ValueError, RuntimeError, OverflowError) as e:
        raise ArgumentTypeError(f"softlight: {name} must be integers: {e}") from None
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ArgumentTypeError(f"softlight: {name} must hold integers, got {t.dtype}")
    return t


def _weighted_ce(x, target, weight, ignore_index, label_smoothing, reduction, z_loss, temperature):
    """cross_entropy with a per-class weight, as F.cross_entropy defines it, in torch operations over
    softlight's log-softmax: loss_i = (1 - eps) w[t_i] (lse_i - z_i[t_i]) + eps / C sum_c w_c (lse_i -
    z_i[c]) + z_loss lse_i^2, the mean divided by sum_i w[t_i] over the rows not ignored. Its gradient
    is torch's autograd over these operations (docs/semantics.md, "Cross-entropy")."""
    cols = x.shape[-1]
    w = weight.to(device=x.device, dtype=_acc(x))
    lp = log_softmax(x.to(_acc(x)), -1, temperature=temperature)
    keep = target != ignore_index
    safe = torch.where(keep, target, 0)
    wt = torch.where(keep, w[safe], torch.zeros((), dtype=w.dtype, device=w.device))
    loss = -(1.0 - label_smoothing) * wt * lp.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    if label_smoothing:
        loss = loss - label_smoothing / cols * torch.where(keep, (lp * w).sum(-1), torch.zeros_like(wt))
    if z_loss:
        lse = (x.to(_acc(x)) / temperature).logsumexp(-1)
        loss = loss + z_loss * torch.where(keep, lse * lse, torch.zeros_like(wt))
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.sum() / wt.sum()


def cross_entropy(logits, target, weight=None, *, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                  z_loss=0.0, temperature=1.0, return_lse=False):
    """torch.nn.functional.cross_entropy with class-index targets ((C,), (N, C) or (N, C, d1, ...) logits),
    plus z_loss * lse^2 per row and a temperature. Where the logits need a gradient, it is written in
    the forward's single pass over them and kept for the backward (one read and one write in all).

    weight: a per-class weight (C,), as torch's (computed through torch operations, docs/semantics.md).
    The loss is in the logits' dtype, as torch returns it (bfloat16 logits give a bfloat16 loss,
    computed in float32); lse (return_lse) in float32 (float64 for float64). Probability targets
    (floating-point targets of the logits' shape) are refused by name: pass class indices."""
    red, ignore_index, label_smoothing, z_loss = _consumers.ce_options(reduction, ignore_index, label_smoothing,
                                                                      z_loss)
    temperature = _api._check_temperature(temperature)
    if not isinstance(logits, torch.Tensor):
        raise ArgumentTypeError(f"softlight: logits must be a torch tensor, got {type(logits).__qualname__}")
    if isinstance(target, torch.Tensor) and target.is_floating_point():
        raise InvalidArgumentError("softlight: cross_entropy takes class indices as targets, not probabilities "
                                   "(a floating-point target); pass the class of each row as an integer tensor")
    target = _index_tensor(target, logits, "target")
    if logits.dim() == 0:
        raise InvalidArgumentError("softlight: logits must have at least one axis (the classes')")
    x = logits.movedim(1, -1) if logits.dim() > 2 else logits
    lead = tuple(x.shape[:-1])
    if tuple(target.shape) != lead:
        raise InvalidArgumentError(f"softlight: target has shape {tuple(target.shape)}, expected {lead}")
    if weight is not None:
        if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
            raise InvalidArgumentError(f"softlight: weight must be a tensor of shape ({x.shape[-1]},), one value a "
                                       f"class")
        if return_lse:
            raise InvalidArgumentError("softlight: return_lse is not available with weight")
        rows = math.prod(lead)
        flat_t = target.reshape(rows)
        _index_ready(flat_t, rows, x.shape[-1], False, "target", ignore_index)
        loss = _weighted_ce(x.reshape(rows, x.shape[-1]), flat_t.to(torch.int64), weight, ignore_index,
                            label_smoothing, reduction, z_loss, temperature)
        loss = loss.reshape(lead) if reduction == "none" else loss
        return loss.to(logits.dtype) if logits.dtype in (torch.float16, torch.bfloat16) and not _any_autocast() \
            else loss
    # The logits' gradient is written in the forward's pass where they need one (one read and one write
    # in all); under torch.compile by the backward instead, a read and a write there: a traced graph
    # cannot know that the loss's upstream gradient is 1, and scaling the forward's costs a pass more.
    with_grad = logits.requires_grad and torch.is_grad_enabled() and not torch.compiler.is_compiling()
    args = (x.reshape(math.prod(lead), x.shape[-1]), target.reshape(-1), ignore_index, label_smoothing, z_loss,
            temperature, red, with_grad)
    if not (_plain(logits) and type(target) is torch.Tensor):
        loss, lse, _ = torch.ops.softlight.cross_entropy(*args)
    elif with_grad:  # plain eager autograd: the operator's body and autograd, without its dispatch
        loss, lse, _ = _apply_ce_eager(*args)
    else:
        loss, lse, _ = _cross_entropy(*args)
    if reduction == "none":
        loss = loss.reshape(lead)
    if logits.dtype in (torch.float16, torch.bfloat16) and not _any_autocast():
        loss = loss.to(logits.dtype)  # as torch returns it (float32 under autocast, as torch's)
    return (loss, lse.reshape(lead)) if return_lse else loss


class CrossEntropyLoss(torch.nn.Module):
    """torch.nn.CrossEntropyLoss (class-index targets) through softlight, in torch's argument order
    (weight, ignore_index, reduction, label_smoothing), with z_loss and temperature."""

    def __init__(self, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0, *, z_loss=0.0,
                 temperature=1.0):
        super().__init__()
        self.register_buffer("weight", weight)
        self.ignore_index, self.reduction, self.label_smoothing = ignore_index, reduction, label_smoothing
        self.z_loss, self.temperature = z_loss, temperature

    def forward(self, logits, target):
        return cross_entropy(logits, target, self.weight, ignore_index=self.ignore_index,
                             label_smoothing=self.label_smoothing, reduction=self.reduction, z_loss=self.z_loss,
                             temperature=self.temperature)


__all__ += ["cross_entropy", "CrossEntropyLoss", "token_logprobs", "entropy", "logsumexp", "row_stats"]


from ._linear import (  # noqa: E402  (the LM head with its loss, its log-probs and entropy)
    LinearCrossEntropyLoss, linear_cross_entropy, linear_row_stats, linear_token_logprobs)

__all__ += ["linear_cross_entropy", "LinearCrossEntropyLoss", "linear_row_stats", "linear_token_logprobs"]
