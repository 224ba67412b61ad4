"""One softlight call at a given shape, for Nsight Compute:
    ncu --clock-control none -k regex:rows_kernel -c 1 python tools/profile_once.py 4096x393216 float32
"""
import sys

import torch

import softlight

rows, cols = map(int, sys.argv[1].split("x"))
dtype = getattr(torch, sys.argv[2] if len(sys.argv) > 2 else "float32")
x = (torch.randn(rows, cols, device="cuda") * 3).to(dtype)
y = torch.empty_like(x)
softlight.log_softmax(x, out=y)
torch.cuda.synchronize()
