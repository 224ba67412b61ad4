"""What host work adds to a timed call. For softlight, a copy, torch and (where importable) Quack at a
few 1 GB shapes: the event time from an idle stream (as the bench times), the same with the stream
kept busy by a sleep kernel queued first (host work then hidden), and the host time per call:

    python tools/host_overhead.py
"""
import time

import numpy as np
import torch

import softlight
from softlight._device import Gpu

CASES = [(15259, 32768, "bfloat16"), (7629, 32768, "float32"), (122070, 4096, "bfloat16"),
         (3906250, 128, "bfloat16"), (1272, 393216, "bfloat16"), (4096, 393216, "float32")]


def main():
    gpu = Gpu(0)
    ext = torch.cuda.ExternalStream(gpu.handle)
    try:
        from quack import softmax as quack_softmax
    except Exception:  # noqa: BLE001 - an anchor that is not installed is left out
        quack_softmax = None

    def sleep(cycles):
        with torch.cuda.stream(ext):
            torch.cuda._sleep(cycles)

    def host_us(fn, n=20):
        gpu.sync()
        sleep(50_000_000)  # the calls queue behind it: their host time alone is measured
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        gpu.sync()
        return (t1 - t0) / n * 1e6

    for rows, cols, dtype in CASES:
        with torch.cuda.stream(ext):
            x = (torch.randn(rows, cols, device="cuda") * 3).to(getattr(torch, dtype))
            y = torch.empty_like(x)
        ext.synchronize()
        nbytes = x.numel() * x.element_size()
        providers = {
            "copy": lambda: gpu.copy(y.data_ptr(), x.data_ptr(), nbytes),
            "softlight": lambda: softlight.log_softmax_raw(x.data_ptr(), y.data_ptr(), rows, cols, dtype=dtype,
                                                           stream=gpu.handle),
            "torch": lambda: torch.log_softmax(x, 1),
        }
        if quack_softmax is not None:
            providers["quack"] = lambda: quack_softmax(x)
        results = {k: ([], [], []) for k in providers}
        for _ in range(3):
            for k, fn in providers.items():
                with torch.cuda.stream(ext):
                    results[k][0].append(gpu.time_ms(fn, 2, 8))
                    results[k][1].append(gpu.time_ms(fn, 0, 8, before=lambda: sleep(1_000_000)))
                    results[k][2].append(host_us(fn))
        print(f"{rows}x{cols} {dtype}")
        for k in providers:
            idle, busy, host = (float(np.median(v)) for v in results[k])
            print(f"   {k:10s} idle {idle:.4f} ms  busy {busy:.4f} ms  idle-busy {1000 * (idle - busy):6.1f} us  "
                  f"host {host:6.1f} us/call")
        del x, y
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
