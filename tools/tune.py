"""Time the cluster families' launch shapes against a copy, side by side, on one GPU.

    python tools/tune.py --shapes 4096x393216 --dtypes float32,bfloat16 --clusters 8,16 --chunks 8192,16384
    python tools/tune.py --shapes 64x4096x4096 --dim 1 --clusters 8,16 --tiles 128,256,512

    python tools/tune.py --shapes 4096x393216 --exchange 0,1 --clusters 0,16,22

Each variant (set through SOFTLIGHT_CLUSTER / _CHUNK_BYTES / _THREADS / _HINTS / _TILE_BYTES / _EXCHANGE) is
checked against float64 on a few rows (or, along a non-last axis, the first two outer slices)
before it is timed. Needs torch for the inputs; times with cuda.core events.
"""
import argparse
import os
import sys

import torch

import softlight
from softlight._device import Gpu
from softlight.bench import ATOL_RTOL, parse_shapes


def check_rows(y, x, idx, dtype, dim=-1):
    """None if the slices x[i] match float64 along dim within the dtype's bound, else the worst error."""
    atol, rtol = ATOL_RTOL[dtype]
    for i in idx:
        ref = torch.log_softmax(x[i].double(), dim)
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
    ap.add_argument("--tiles", default="0", help="cluster_tiles: tile widths in bytes")
    ap.add_argument("--exchange", default="-1", help="cluster_rows: 0 clusters, 1 grid groups")
    ap.add_argument("--dim", type=int, default=-1)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    gpu = Gpu(0)
    ext = torch.cuda.ExternalStream(gpu.handle)
    print(f"{'shape':>14s} {'dtype':9s} {'x':>2s} {'cluster':>7s} {'chunk':>6s} {'thr':>4s} {'h':>2s} {'tile':>4s} "
          f"{'ms':>8s} {'x copy':>7s}")
    for shape in parse_shapes(a.shapes):
        rows, cols = shape[0], shape[-1]
        last = a.dim in (-1, len(shape) - 1)
        name = "x".join(map(str, shape)) + ("" if last else f" d{a.dim}")
        for dt in a.dtypes.split(","):
            with torch.cuda.stream(ext):
                x = (torch.randn(*shape, device="cuda") * 3).to(getattr(torch, dt))
                y = torch.empty_like(x)
            ext.synchronize()
            nbytes = x.numel() * x.element_size()
            copy_ms = gpu.time_ms(lambda: gpu.copy(y.data_ptr(), x.data_ptr(), nbytes), 3, a.reps)
            variants = [(xc, c, ch, th, h, t) for xc in a.exchange.split(",") for c in a.clusters.split(",")
                        for ch in a.chunks.split(",") for th in a.threads.split(",") for h in a.hints.split(",")
                        for t in a.tiles.split(",")]
            for xc, c, ch, th, h, t in variants:
                os.environ["SOFTLIGHT_EXCHANGE"] = xc
                os.environ["SOFTLIGHT_CLUSTER"], os.environ["SOFTLIGHT_CHUNK_BYTES"] = c, ch
                os.environ["SOFTLIGHT_THREADS"], os.environ["SOFTLIGHT_HINTS"] = th, h
                os.environ["SOFTLIGHT_TILE_BYTES"] = t
                if last and len(shape) == 2:
                    run = lambda: softlight.log_softmax_raw(x.data_ptr(), y.data_ptr(), rows, cols,  # noqa: E731
                                                            dtype=dt, stream=gpu.handle)
                else:
                    run = lambda: softlight.log_softmax(x, dim=a.dim, out=y, stream=gpu.handle)  # noqa: E731
                y.fill_(float("nan"))
                torch.cuda.synchronize()
                run()
                gpu.sync()
                if last:
                    bad = check_rows(y.reshape(-1, cols), x.reshape(-1, cols), sorted({0, 1, rows // 2, rows - 1}), dt)
                else:
                    bad = check_rows(y[:2], x[:2], [0, 1], dt, a.dim - 1)
                ms = gpu.time_ms(run, 3, a.reps) if bad is None else float("nan")
                print(f"{name:>14s} {dt:9s} {xc:>2s} {c:>7s} {ch:>6s} {th:>4s} {h:>2s} {t:>4s} {ms:8.3f} {ms / copy_ms:7.3f}"
                      + (f"  WRONG (err {bad})" if bad is not None else ""), flush=True)
            print(f"{name:>14s} {dt:9s} {'':>2s} {'copy':>7s} {'':>6s} {'':>4s} {'':>2s} {'':>4s} {copy_ms:8.3f} {1:7.3f}",
                  flush=True)
            del x, y
            torch.cuda.empty_cache()
    for k in ("SOFTLIGHT_CLUSTER", "SOFTLIGHT_CHUNK_BYTES", "SOFTLIGHT_THREADS", "SOFTLIGHT_HINTS", "SOFTLIGHT_TILE_BYTES",
              "SOFTLIGHT_EXCHANGE"):
        os.environ.pop(k, None)


if __name__ == "__main__":
    sys.exit(main())
