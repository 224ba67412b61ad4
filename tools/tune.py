"""Time the cluster family's launch shapes against a copy, side by side, on one GPU.

    python tools/tune.py --shapes 4096x393216 --dtypes float32,bfloat16 --clusters 8,16 --chunks 8192,16384

Each variant (set through SOFTLIGHT_CLUSTER / SOFTLIGHT_CHUNK_BYTES) is checked against float64 on
a few rows before it is timed. Needs torch for the inputs; times with cuda.core events.
"""
import argparse
import os
import sys

import torch

import softlight
from softlight._device import Gpu
from softlight.bench import ATOL_RTOL, parse_shapes


def check_rows(y, x, idx, dtype):
    """None if the rows match float64 within the dtype's bound, else the worst error."""
    atol, rtol = ATOL_RTOL[dtype]
    for i in idx:
        ref = torch.log_softmax(x[i].double(), -1)
        err = (y[i].double() - ref).abs()
        if not bool((err <= atol + rtol * ref.abs()).all()):
            return float(err.max())
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x393216")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--clusters", default="0")
    ap.add_argument("--chunks", default="0")
    ap.add_argument("--threads", default="0")
    ap.add_argument("--hints", default="-1")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    gpu = Gpu(0)
    ext = torch.cuda.ExternalStream(gpu.handle)
    print(f"{'shape':>14s} {'dtype':9s} {'cluster':>7s} {'chunk':>6s} {'thr':>4s} {'h':>2s} {'ms':>8s} {'x copy':>7s}")
    for rows, cols in parse_shapes(a.shapes):
        for dt in a.dtypes.split(","):
            with torch.cuda.stream(ext):
                x = (torch.randn(rows, cols, device="cuda") * 3).to(getattr(torch, dt))
                y = torch.empty_like(x)
            ext.synchronize()
            nbytes = x.numel() * x.element_size()
            copy_ms = gpu.time_ms(lambda: gpu.copy(y.data_ptr(), x.data_ptr(), nbytes), 3, a.reps)
            variants = [(c, ch, th, h) for c in a.clusters.split(",") for ch in a.chunks.split(",")
                        for th in a.threads.split(",") for h in a.hints.split(",")]
            for c, ch, th, h in variants:
                os.environ["SOFTLIGHT_CLUSTER"], os.environ["SOFTLIGHT_CHUNK_BYTES"] = c, ch
                os.environ["SOFTLIGHT_THREADS"], os.environ["SOFTLIGHT_HINTS"] = th, h
                run = lambda: softlight.log_softmax_raw(x.data_ptr(), y.data_ptr(), rows, cols, dtype=dt,  # noqa: E731
                                                        stream=gpu.handle)
                y.fill_(float("nan"))
                torch.cuda.synchronize()
                run()
                gpu.sync()
                bad = check_rows(y, x, sorted({0, 1, rows // 2, rows - 1}), dt)
                ms = gpu.time_ms(run, 3, a.reps) if bad is None else float("nan")
                print(f"{f'{rows}x{cols}':>14s} {dt:9s} {c:>7s} {ch:>6s} {th:>4s} {h:>2s} {ms:8.3f} {ms / copy_ms:7.3f}"
                      + (f"  WRONG (err {bad})" if bad is not None else ""), flush=True)
            print(f"{f'{rows}x{cols}':>14s} {dt:9s} {'copy':>7s} {'':>6s} {'':>4s} {'':>2s} {copy_ms:8.3f} {1:7.3f}", flush=True)
            del x, y
            torch.cuda.empty_cache()
    for k in ("SOFTLIGHT_CLUSTER", "SOFTLIGHT_CHUNK_BYTES", "SOFTLIGHT_THREADS", "SOFTLIGHT_HINTS"):
        os.environ.pop(k, None)


if __name__ == "__main__":
    sys.exit(main())
