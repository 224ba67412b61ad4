"""Two calls of a provider at a given shape, for Nsight Compute (profile the second, with
--launch-skip 1, so that a provider that compiles at its first call is seen warm):
    ncu --clock-control none -k regex:cluster_rows --launch-skip 1 -c 1 python tools/profile_once.py 4096x393216 float32
    ncu --clock-control none -k regex:[Ss]oftmax --launch-skip 1 -c 1 python tools/profile_once.py 7629x65536 bfloat16 quack
"""
import sys

import torch

rows, cols = map(int, sys.argv[1].split("x"))
dtype = getattr(torch, sys.argv[2] if len(sys.argv) > 2 else "float32")
provider = sys.argv[3] if len(sys.argv) > 3 else "softlight"
x = (torch.randn(rows, cols, device="cuda") * 3).to(dtype)
if provider == "softlight":
    import softlight
    y = torch.empty_like(x)

    def call():
        softlight.log_softmax(x, out=y)
elif provider == "quack":
    from quack import softmax

    def call():
        softmax(x)
else:
    raise SystemExit(f"unknown provider {provider!r}: softlight or quack")
for _ in range(2):
    call()
    torch.cuda.synchronize()
