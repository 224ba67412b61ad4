"""Builds of softlight against each other, one process per build and round, each timing a floor and
softlight at every shape (a few rows spot-checked against float64 first):

    PYTHONPATH=/tmp/b_old python tools/ab_builds.py time old "3906250x128:bfloat16,61035x4096:float32" >> ab.txt
    PYTHONPATH=/tmp/b_new python tools/ab_builds.py time new "3906250x128:bfloat16,61035x4096:float32" >> ab.txt
    (repeat the pair over rounds)
    python tools/ab_builds.py summary ab.txt

A shape is rows x cols:dtype, the forward, whose floor is a copy of the same bytes; or
rows x cols:dtype:backward (dx from dy and y), whose floor is torch.add(dy, y, out=dx): two
tensors read and one written, as the backward moves.

`time` prints one RESULT line: label and {shape: [floor ms, softlight ms, largest spot-check error]};
`summary` prints, per shape and build, the median over rounds and its ratio to the floor of the same
process. Needs torch for the inputs; times with cuda.core events.
"""
import collections
import json
import sys

import numpy as np


def time_builds(label, spec):
    import torch

    from ab import problem  # tools/ab.py: the problem and its floor
    from softlight._device import Gpu
    gpu = Gpu(0)
    ext = torch.cuda.ExternalStream(gpu.handle)
    out = {}
    for item in spec.split(","):
        shape, dtype, *op = item.split(":")
        op = op[0] if op else "forward"
        rows, cols = map(int, shape.split("x"))
        x, y, result, run, floor = problem(rows, cols, dtype, op, gpu, ext)
        run()
        gpu.sync()
        idx = torch.randint(0, rows, (64,), device="cuda")
        if op == "backward":
            dy, f = x[idx].double(), y[idx].double()
            ref = dy - f.exp() * dy.sum(1, keepdim=True)
        else:
            ref = torch.log_softmax(x[idx].double(), 1)
        err = float((result[idx].double() - ref).abs().max())
        with torch.cuda.stream(ext):
            floor_ms = gpu.time_ms(floor, 2, 10)
            ms = gpu.time_ms(run, 2, 10)
        out[item] = (floor_ms, ms, err)
        del x, y, result, run, floor
        torch.cuda.empty_cache()
    print("RESULT", label, json.dumps(out), flush=True)


def summary(path):
    res = collections.defaultdict(lambda: collections.defaultdict(list))
    for line in open(path):
        if line.startswith("RESULT "):
            _, label, js = line.split(" ", 2)
            for k, v in json.loads(js).items():
                res[k][label].append(v)
    labels = sorted({label for k in res for label in res[k]})
    print(f"{'shape':28s}" + "".join(f"{label:>22s}" for label in labels) + "   (ms, x floor, largest error)")
    for k, by in res.items():
        row = f"{k:28s}"
        for label in labels:
            v = by.get(label)
            if not v:
                row += f"{'-':>22s}"
                continue
            c, t = np.median([a[0] for a in v]), np.median([a[1] for a in v])
            row += f"  {t:.4f} {t / c:.3f}x {max(a[2] for a in v):.0e}"
        print(row)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "time":
        time_builds(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "summary":
        summary(sys.argv[2])
    else:
        raise SystemExit(__doc__)
