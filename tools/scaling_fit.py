"""Splits each provider's time into a fixed cost and a cost per byte, from a bench run over several
row counts of the same row length:

    python -m softlight bench --shapes 1907x32768,3815x32768,7629x32768,15258x32768 --dtypes float32 \
        --providers softlight,quack --no-compile --passes 3 --name scaling
    python tools/scaling_fit.py docs/perf/NVIDIA-H200-...-scaling.json

Fits ms = fixed + bytes / rate by least squares for each (cols, dtype, op, provider) and prints the
fixed part in microseconds and the rate in GB/s (bytes read and written, as the bench counts them),
each beside the copy's of the same run. A provider behind the copy by a constant is paying for
filling and draining its pipeline; one behind by a ratio, for its pace.
"""
import json
import sys
from collections import defaultdict

import numpy as np

from softlight.bench import moved_bytes


def fit(points):
    """points: [(bytes, ms)] -> (fixed ms, ms per byte)."""
    b = np.array([p[0] for p in points], dtype=np.float64)
    t = np.array([p[1] for p in points], dtype=np.float64)
    slope, fixed = np.polyfit(b, t, 1)
    return fixed, slope


def main(path):
    rows = json.load(open(path))["rows"]
    groups = defaultdict(list)
    for r in rows:
        if r.get("status") == "ok" and r.get("ms"):
            groups[(r["shape"][-1], r["dtype"], r.get("op", "forward"), r["provider"])].append((moved_bytes(r), r["ms"]))
    print(f"{'cols':>9} {'dtype':9} {'op':8} {'provider':10} {'fixed us':>9} {'GB/s':>7} {'vs copy':>16}  points")
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2], k[3] != "copy", k[3])):
        pts = sorted(groups[key])
        if len(pts) < 2:
            continue
        fixed, slope = fit(pts)
        rate = 1e-6 / slope if slope > 0 else float("inf")
        copy = groups.get(key[:3] + ("copy",))
        vs = ""
        if key[3] != "copy" and copy and len(copy) >= 2:
            cf, cs = fit(sorted(copy))
            vs = f"{(fixed - cf) * 1e3:+7.1f} us {cs / slope:5.3f}x"
        print(f"{key[0]:>9} {key[1]:9} {key[2]:8} {key[3]:10} {fixed * 1e3:9.1f} {rate:7.0f} {vs:>16}  {len(pts)}")


if __name__ == "__main__":
    main(sys.argv[1])
