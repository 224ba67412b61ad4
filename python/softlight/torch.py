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

`log_softmax` calls softlight directly where no autograd or compiler is involved (a torch operator's
dispatch costs several microseconds a call); both paths give the same results.
"""
import torch

from . import _C, _api
from ._errors import AxisError, InvalidArgumentError, UnsupportedDTypeError

_lib = torch.library.Library("softlight", "DEF")
_lib.define("log_softmax(Tensor x, int dim, float temperature=1.0) -> Tensor")
_lib.define("log_softmax_backward(Tensor grad, Tensor y, int dim, float temperature=1.0) -> Tensor")


def _readable(t, dim):
    """t, or a contiguous copy where softlight cannot read its layout along dim in place."""
    return t if t.is_contiguous() or _C.layout_code(t.shape, t.stride(), dim) == 0 else t.contiguous()


def _forward(x, dim, temperature=1.0):
    x = _readable(x, dim)
    return _api.log_softmax(x, dim, temperature=temperature)


def _backward(grad, y, dim, temperature=1.0):
    grad, y = _readable(grad, dim), _readable(y, dim)
    dx = _api.log_softmax_backward(grad, y, dim)
    return dx if temperature == 1.0 else dx.div_(temperature)


for _key in ("CPU", "CUDA"):
    _lib.impl("log_softmax", _forward, _key)
    _lib.impl("log_softmax_backward", _backward, _key)


@torch.library.register_fake("softlight::log_softmax")
def _forward_fake(x, dim, temperature=1.0):
    _check(x, dim)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("softlight::log_softmax_backward")
def _backward_fake(grad, y, dim, temperature=1.0):
    _check(grad, dim)
    return torch.empty_like(grad, memory_format=torch.contiguous_format)


def _check(x, dim):
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise UnsupportedDTypeError(f"softlight: unsupported dtype {x.dtype}")
    n = max(x.dim(), 1)
    if not -n <= dim < n:
        raise AxisError(f"softlight: dim {dim} is out of range for a {x.dim()}-d tensor")


def _setup_forward(ctx, inputs, output):
    _, dim, temperature = (tuple(inputs) + (1.0,))[:3]
    ctx.dim, ctx.temperature = dim, temperature
    ctx.save_for_backward(output)


def _grad_forward(ctx, grad):
    (y,) = ctx.saved_tensors
    return torch.ops.softlight.log_softmax_backward(grad, y, ctx.dim, ctx.temperature), None, None


torch.library.register_autograd("softlight::log_softmax", _grad_forward, setup_context=_setup_forward)


def _setup_backward(ctx, inputs, output):
    grad, y, dim, temperature = (tuple(inputs) + (1.0,))[:4]
    ctx.dim, ctx.temperature = dim, temperature
    ctx.save_for_backward(grad, y)


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


torch.library.register_autograd("softlight::log_softmax_backward", _grad_backward, setup_context=_setup_backward)

for _device in ("cpu", "cuda"):
    torch.library.register_autocast("softlight::log_softmax", _device, torch.float32)
    torch.library.register_autocast("softlight::log_softmax_backward", _device, torch.float32)


def log_softmax(x, dim=-1, *, temperature=1.0):
    """log_softmax(x / temperature) along dim, as torch.log_softmax (with autograd and torch.compile)."""
    if (x.requires_grad and torch.is_grad_enabled()) or torch.compiler.is_compiling() or \
            torch.is_autocast_enabled(x.device.type) or type(x) is not torch.Tensor:
        return torch.ops.softlight.log_softmax(x, dim, temperature)
    return _forward(x, dim, temperature)


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
