"""KernelBench level 1, problem 24 (LogSoftmax), with softlight as ModelNew.

Model is the reference (torch.log_softmax over dim 1 of a 4096 x 393216 float32 input); ModelNew
computes the same with softlight. Run this file to compare them on the GPU:

    python examples/kernelbench/24_LogSoftmax.py
"""
import torch
import torch.nn as nn

import softlight

batch_size = 4096
dim = 393216


class Model(nn.Module):
    """Simple model that performs a LogSoftmax activation."""

    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x, dim=self.dim)


class ModelNew(nn.Module):
    """The same function through softlight (one DRAM read and one write per element)."""

    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softlight.log_softmax(x, dim=self.dim)


def get_inputs():
    x = torch.rand(batch_size, dim)
    return [x]


def get_init_inputs():
    return []


if __name__ == "__main__":
    from triton.testing import do_bench

    x = get_inputs()[0].cuda()
    ref, new = Model(*get_init_inputs()).cuda(), ModelNew(*get_init_inputs()).cuda()
    torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)
    t_ref = do_bench(lambda: ref(x), return_mode="median")
    t_new = do_bench(lambda: new(x), return_mode="median")
    print(f"Model {t_ref:.3f} ms, ModelNew {t_new:.3f} ms: speedup {t_ref / t_new:.2f}x")
