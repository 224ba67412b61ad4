"""Alternate tuning-knob settings on one problem, round by round, against its floor in the same run:

    python tools/ab.py 4096x393216 float32 forward "EXCHANGE=0" "EXCHANGE=1"
    python tools/ab.py 4096x393216 float32 backward "EXCHANGE=0" "EXCHANGE=1"

Each setting is a space-separated list of SOFTLIGHT_* knobs without the prefix. Every round times
the floor (a copy; for the backward torch.add(dy, y, out=dx)) and then each setting, so that drift
of the GPU over the run hits all of them alike; the medians over the rounds are printed. Needs torch
for the inputs; times with cuda.core events. Results are not checked: check a setting with
tools/tune.py or the tests first.
"""
import argparse
import os

import numpy as np
import torch

import softlight
from softlight._device import Gpu


def set_knobs(setting):
    for k in [k for k in os.environ if k.startswith("SOFTLIGHT_")]:
        del os.environ[k]
    for kv in setting.split():
        k, v = kv.split("=")
        os.environ["SOFTLIGHT_" + k] = v


def problem(rows, cols, dtype, op, gpu, ext):
    """One problem on `gpu`'s stream (`ext`, torch's view of it): x (dy for the backward), y (the
    forward's output from x, backward only), out (all NaN), softlight's call and its floor (forward: a copy
    of the same bytes; backward: torch.add(dy, y, out=dx), two tensors read and one written)."""
    with torch.cuda.stream(ext):
        x = (torch.randn(rows, cols, device="cuda") * 3).to(getattr(torch, dtype))
        y = torch.log_softmax(x.float(), -1).to(x.dtype) if op == "backward" else None
        out = torch.full_like(x, float("nan"))  # poisoned: a call that writes nothing shows
    ext.synchronize()
    if op == "backward":
        run = lambda: softlight.log_softmax_backward(x, y, grad_in=out, stream=gpu.handle)  # noqa: E731
        floor = lambda: torch.add(x, y, out=out)  # noqa: E731
    else:
        run = lambda: softlight.log_softmax_raw(x.data_ptr(), out.data_ptr(), rows, cols,  # noqa: E731
                                                dtype=dtype, stream=gpu.handle)
        floor = lambda: gpu.copy(out.data_ptr(), x.data_ptr(), x.numel() * x.element_size())  # noqa: E731
    return x, y, out, run, floor


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("dtype")
    ap.add_argument("op", choices=["forward", "backward"])
    ap.add_argument("settings", nargs="+")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=8)
    a = ap.parse_args()
    rows, cols = map(int, a.shape.split("x"))
    gpu = Gpu(0)
    ext = torch.cuda.ExternalStream(gpu.handle)
    x, y, out, run, floor = problem(rows, cols, a.dtype, a.op, gpu, ext)
    times = {s: [] for s in a.settings}
    floors = []
    for _ in range(a.rounds):
        with torch.cuda.stream(ext):
            floors.append(gpu.time_ms(floor, 2, a.reps))
        for s in a.settings:
            set_knobs(s)
            times[s].append(gpu.time_ms(run, 2, a.reps))
    set_knobs("")
    f = float(np.median(floors))
    print(f"{a.shape} {a.dtype} {a.op}: floor {f:.3f} ms")
    for s in a.settings:
        m = float(np.median(times[s]))
        print(f"  {s or 'default':40s} {m:.3f} ms  {m / f:.3f}x  rounds {' '.join(f'{t:.3f}' for t in times[s])}")


if __name__ == "__main__":
    main()
