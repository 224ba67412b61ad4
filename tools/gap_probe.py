"""Does the distance from x to y change the time? x and y are two views of one allocation, y
starting `gap` bytes after x's end, for each gap given (K and M suffixes: KiB, MiB); at each, a copy
and softlight write y, in alternating rounds (medians over the rounds; ratios against the copy at
the same gap):

    python tools/gap_probe.py 1907x262144:bfloat16 954x262144:float32 --gaps 0,4K,64K,1M,3M --rounds 3

Nothing is checked: the tests do that.
"""
import argparse

import numpy as np
import torch

import softlight
from softlight._device import Gpu


def size(text):
    mult = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    return int(text[:-1] if text[-1:] in "KM" else text) * mult


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("items", nargs="+", help="ROWSxCOLS:dtype")
    ap.add_argument("--gaps", default="0,256,4K,64K,1M,2M,3M,5M")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    gaps = [size(g) for g in a.gaps.split(",")]
    gpu = Gpu(0)
    ext = torch.cuda.ExternalStream(gpu.handle)
    for item in a.items:
        shape, dtype = item.split(":")
        rows, cols = map(int, shape.split("x"))
        t = getattr(torch, dtype)
        n = rows * cols
        e = torch.empty((), dtype=t).element_size()
        assert all(g % 16 == 0 for g in gaps), "gaps in whole 16-byte packs"
        with torch.cuda.stream(ext):
            buf = torch.empty(2 * n + max(gaps) // e, device="cuda", dtype=t)
            buf[:n] = (torch.randn(n, device="cuda") * 3).to(t)
        ext.synchronize()
        x = buf[:n]
        times = {}
        with torch.cuda.stream(ext):
            for _ in range(a.rounds):
                for g in gaps:
                    y = buf[n + g // e: 2 * n + g // e]
                    yp, xp = y.data_ptr(), x.data_ptr()
                    times.setdefault(("copy", g), []).append(
                        gpu.time_ms(lambda: gpu.copy(yp, xp, n * e), 2, a.reps))
                    times.setdefault(("softlight", g), []).append(gpu.time_ms(
                        lambda: softlight.log_softmax_raw(xp, yp, rows, cols, dtype=dtype, stream=gpu.handle),
                        2, a.reps))
        print(f"{item}")
        for g in gaps:
            c, s = (float(np.median(times[(k, g)])) for k in ("copy", "softlight"))
            print(f"  gap {g:>9d}  copy {c:.4f} ms  softlight {s:.4f} ms  {s / c:.3f}x", flush=True)
        del buf, x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
