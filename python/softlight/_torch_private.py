"""The private torch entry points softlight's adapters use: each named once, here, with why.

Imported only where torch is (softlight.torch, and the plain API's torch readers once torch is
loaded). Each has a public equivalent that costs more on every call, or none at all; where torch
drops one, the fallback beside it keeps softlight working at that cost.
"""
import torch
from torch._subclasses.fake_tensor import is_fake as _is_fake

# The current CUDA stream's handle for a device index, without making a Stream object (several
# microseconds less a call than torch.cuda.current_stream(dev).cuda_stream, the fallback).
raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or \
    (lambda dev: torch.cuda.current_stream(dev).cuda_stream)

# Bumps a tensor's autograd version counter after softlight wrote it in place (out=, grad=), so that
# autograd refuses a graph that saved it, as for torch's own in-place ops;
# torch.autograd.graph.increment_version wraps it with a per-call Python layer.
increment_version = torch._C._increment_version

# Whether autocast is on for any device, in one query (torch.is_autocast_enabled(x.device.type) costs
# ~0.8 us a call, most of it in x.device; the fallback asks CUDA and the CPU).
any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or \
    (lambda: torch.is_autocast_enabled("cuda") or torch.is_autocast_enabled("cpu"))

# What the eager bypass must not skip (softlight.torch runs the library directly only where nothing
# but eager torch sees the call): a functorch transform (vmap, grad), a TorchDispatchMode, the jit
# tracer. None of the three has a public query.
transforms_active = torch._C._are_functorch_transforms_active
dispatch_stack_len = torch._C._len_torch_dispatch_stack
tracing_state = torch._C._get_tracing_state

# Runs an operator's kernel from inside its own autograd node without entering autograd again, as
# torch's generated nodes do (the eager autograd.Functions over the operators' bodies).
below_autograd = torch._C._AutoDispatchBelowAutograd

# Whether a tensor is a FakeTensor (torch.compile's tracing), where cross-entropy's backward must
# build its gradient from traceable operations rather than a saved one.
is_fake = _is_fake
