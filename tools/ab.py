"""Alternate tuning-knob settings on one problem, round by round, against its floor in the same run:

    python tools/ab.py 4096x393216 float32 forward "EXCHANGE=0" "EXCHANGE=1"
    python tools/ab.py 4096x393216 float32 backward "EXCHANGE=0" "EXCHANGE=1"

Each setting is a space-separated list of SOFTLIGHT_* knobs without the prefix. Every round times
the floor (a copy; for the backward torch.add(dy, y, out=dx)) and then each setting, so that drift
of the GPU over the run hits all of them alike; the medians over the rounds are printed. Needs torch
for the inputs; times with cuda.core events. Results are not checked: check a setting with
tools/tune.py or the tests first.

--torch times torch's own call in each round too (torch.log_softmax, or its backward
torch._log_softmax_backward_data); --compile times torch.compile's, compiled for this shape as the
bench compiles it (softlight.bench.compile_op, dynamic=False), compiled and autotuned before the
first round (with TORCH_LOGS=output_code its kernels go to stderr). --fresh gives every call a new
output from torch's allocator, as the bench does (else one buffer, made once). --sleep N queues
torch.cuda._sleep(N) ahead of each timed call, so that host work is hidden and the times are the
GPU's alone.
"""
import argparse
import os

import numpy as np
import torch

import softlight
from softlight._device import Gpu
from softlight.bench import compile_op


def set_knobs(setting):
    for k in [k for k in os.environ if k.startswith("SOFTLIGHT_")]:
        del os.environ[k]
    for kv in setting.split():
        k, v = kv.split("=")
        os.environ["SOFTLIGHT_" + k] = v


def problem(rows, cols, dtype, op, gpu, ext, fresh=False):
    """One problem on `gpu`'s stream (`ext`, torch's view of it): x (dy for the backward), y (the
    forward's output from x, backward only), out (all NaN), softlight's call and its floor (forward: a copy
    of the same bytes; backward: torch.add(dy, y, out=dx), two tensors read and one written)."""
    with torch.cuda.stream(ext):
        x = (torch.randn(rows, cols, device="cuda") * 3).to(getattr(torch, dtype))
        y = torch.log_softmax(x.float(), -1).to(x.dtype) if op == "backward" else None
        out = torch.full_like(x, float("nan"))  # poisoned: a call that writes nothing shows
    ext.synchronize()
    target = (lambda: torch.empty_like(x)) if fresh else (lambda: out)  # noqa: E731
    if op == "backward":
        run = lambda: softlight.log_softmax_backward(x, y, grad_in=target(), stream=gpu.handle)  # noqa: E731
        floor = lambda: torch.add(x, y, out=target())  # noqa: E731
    else:
        run = lambda: softlight.log_softmax_raw(x.data_ptr(), target().data_ptr(), rows, cols,  # noqa: E731
                                                dtype=dtype, stream=gpu.handle)
        floor = lambda: gpu.copy(target().data_ptr(), x.data_ptr(), x.numel() * x.element_size())  # noqa: E731
    return x, y, out, run, floor


def torch_call(x, y, op):
    """torch's own call on the same problem (it allocates its output)."""
    if op == "backward":
        return lambda: torch._log_softmax_backward_data(x, y, -1, x.dtype)
    return lambda: torch.log_softmax(x, -1)


def compiled_call(x, y, op):
    """torch.compile's call on the same problem, as the bench compiles it, run once (compiled and
    autotuned) before it is timed."""
    f = compile_op(torch, op, -1, dynamic=False)
    call = (lambda: f(x, y)) if op == "backward" else (lambda: f(x))
    call()
    torch.cuda.synchronize()
    return call


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("dtype")
    ap.add_argument("op", choices=["forward", "backward"])
    ap.add_argument("settings", nargs="+")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--torch", action="store_true", help="time torch's own call alongside")
    ap.add_argument("--compile", action="store_true", help="time torch.compile's call alongside")
    ap.add_argument("--fresh", action="store_true", help="a new output at every call, as the bench")
    ap.add_argument("--sleep", type=int, default=0, help="torch.cuda._sleep cycles ahead of each timed call")
    a = ap.parse_args()
    rows, cols = map(int, a.shape.split("x"))
    gpu = Gpu(0)
    ext = torch.cuda.ExternalStream(gpu.handle)
    x, y, out, run, floor = problem(rows, cols, a.dtype, a.op, gpu, ext, a.fresh)
    # (label, knobs, call): each setting, then torch's and torch.compile's calls under no knobs.
    calls = [(s or "default", s, run) for s in a.settings]
    if a.torch:
        calls.append(("torch", "", torch_call(x, y, a.op)))
    if a.compile:
        with torch.cuda.stream(ext):
            calls.append(("torch.compile", "", compiled_call(x, y, a.op)))
    before = (lambda: torch.cuda._sleep(a.sleep)) if a.sleep > 0 else None  # noqa: E731
    times = {label: [] for label, _, _ in calls}
    floors = []
    for _ in range(a.rounds):
        with torch.cuda.stream(ext):
            floors.append(gpu.time_ms(floor, 2, a.reps, before=before))
            for label, knobs, fn in calls:
                set_knobs(knobs)
                times[label].append(gpu.time_ms(fn, 2, a.reps, before=before))
    set_knobs("")
    f = float(np.median(floors))
    print(f"{a.shape} {a.dtype} {a.op}: floor {f:.4f} ms")
    for label, t in times.items():
        m = float(np.median(t))
        print(f"  {label:40s} {m:.4f} ms  {m / f:.3f}x  rounds {' '.join(f'{v:.3f}' for v in t)}")


if __name__ == "__main__":
    main()
