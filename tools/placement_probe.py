"""Does where y lies against x change the time? A copy and softlight into one fixed y, into a new y
from torch's caching allocator at each call (as the bench does), and into three other fixed
buffers, with torch.log_softmax alongside; medians over three rounds:

    python tools/placement_probe.py 3906250x128:bfloat16 122070x4096:bfloat16 61035x4096:float32
"""
import sys

import numpy as np
import torch

import softlight
from softlight._device import Gpu


def main(items):
    gpu = Gpu(0)
    ext = torch.cuda.ExternalStream(gpu.handle)
    for item in items:
        shape, dtype = item.split(":")
        rows, cols = map(int, shape.split("x"))
        with torch.cuda.stream(ext):
            x = (torch.randn(rows, cols, device="cuda") * 3).to(getattr(torch, dtype))
            fixed = torch.empty_like(x)
            others = [torch.empty_like(x) for _ in range(3)]
        ext.synchronize()
        nbytes = x.numel() * x.element_size()

        def ours(o):
            softlight.log_softmax_raw(x.data_ptr(), o.data_ptr(), rows, cols, dtype=dtype, stream=gpu.handle)

        def copy(o):
            gpu.copy(o.data_ptr(), x.data_ptr(), nbytes)

        def fresh(write):
            def run():
                o = torch.empty_like(x)
                write(o)
                return o
            return run

        cases = [("copy fixed", lambda: copy(fixed)), ("softlight fixed", lambda: ours(fixed)),
                 ("copy fresh", fresh(copy)), ("softlight fresh", fresh(ours)),
                 ("torch", lambda: torch.log_softmax(x, 1))]
        cases += [(f"softlight y{i}", (lambda o: lambda: ours(o))(o)) for i, o in enumerate(others)]
        cases += [(f"copy y{i}", (lambda o: lambda: copy(o))(o)) for i, o in enumerate(others)]
        times = {}
        with torch.cuda.stream(ext):
            for _ in range(3):
                for name, fn in cases:
                    times.setdefault(name, []).append(gpu.time_ms(fn, 2, 10))
        print(f"{item}: " + "  ".join(f"{k} {np.median(v):.3f}" for k, v in times.items()), flush=True)
        del x, fixed, others
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:] or ["3906250x128:bfloat16", "122070x4096:bfloat16", "61035x4096:float32",
                          "15259x32768:bfloat16"])
