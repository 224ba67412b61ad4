"""Host time per call of softlight's Python entries and of the pieces they are made of, on torch
tensors of 4 x 1000 fp32 on the current stream (each timed over a loop of 3000 calls, which the host
bounds, as the GPU work is a few microseconds), then a profile of log_softmax(x):

    python tools/python_call_cost.py
"""
import cProfile
import io
import pstats
import time

import torch

import softlight
from softlight import _C
from softlight._arrays import NO_SYNC, empty_like, export, torch_view


def per_call_us(fn, n=3000):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return dt


def main():
    x = torch.randn(4, 1000, device="cuda")
    y = torch.empty_like(x)
    h = torch.cuda.current_stream(0).cuda_stream
    xv = export(x, 2, NO_SYNC)
    cases = {
        "log_softmax(x)": lambda: softlight.log_softmax(x),
        "log_softmax(x, out=y)": lambda: softlight.log_softmax(x, out=y),
        "log_softmax_raw": lambda: softlight.log_softmax_raw(x.data_ptr(), y.data_ptr(), 4, 1000, dtype="float32",
                                                             stream=h),
        "_C.forward_3d": lambda: _C.forward_3d(xv.ptr, (1000, 1, 0), y.data_ptr(), (1000, 1, 0), 4, 1000, 1, 0, h),
        "export, no synchronization": lambda: export(x, 2, NO_SYNC),
        "export, stream given": lambda: export(x, 2, 1 if h == 0 else h),
        "torch_view (attributes)": lambda: torch_view(x),
        "torch.empty_like": lambda: torch.empty_like(x),
        "torch.empty_like, contiguous": lambda: torch.empty_like(x, memory_format=torch.contiguous_format),
        "empty_like (softlight's)": lambda: empty_like(x, xv),
        "torch.log_softmax": lambda: torch.log_softmax(x, -1),
    }
    for name, fn in cases.items():
        print(f"{name:28s} {per_call_us(fn):7.2f} us/call", flush=True)
    for name in ("log_softmax(x)", "log_softmax(x, out=y)"):
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(3000):
            cases[name]()
        pr.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12)
        print(f"# profile of {name}\n" + s.getvalue())


if __name__ == "__main__":
    main()
