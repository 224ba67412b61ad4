"""softlight's command line (python -m softlight --help).

  python -m softlight demo     the founding problem: log-softmax of a 4096x393216 float32 array on
                               the GPU, checked and timed (on the CPU, a smaller one, if no GPU)
  python -m softlight bench    the benchmark (see python -m softlight bench --help)
  python -m softlight info     version, library paths, GPU
"""
import sys
import time

import numpy as np

import softlight
from ._device import gpu_count
from ._device import FOUNDING


def demo(argv):
    rows, cols = FOUNDING
    print(f"softlight {softlight.__version__}: log-softmax over the last axis")
    if gpu_count() == 0:
        return demo_cpu()
    from ._device import ATOL_RTOL, HostData, TorchData
    from ._device import Gpu
    try:
        import torch
    except ImportError:
        torch = None
    gpu = Gpu(0)
    data = TorchData(torch, gpu) if torch is not None else HostData(gpu)
    print(f"GPU: {gpu.name}; {rows} x {cols} float32 ({rows * cols * 4 / 1e9:.1f} GB in, the same out); "
          f"checked {'in full with torch' if torch is not None else 'on three rows (torch not installed)'}")
    x, y = data.make((rows, cols), "float32")
    run = lambda: softlight.log_softmax_raw(data.ptr(x), data.ptr(y), rows, cols, dtype="float32",  # noqa: E731
                                            stream=gpu.handle)
    run()
    gpu.sync()
    ok, err = data.check(y, x, "float32", "log")
    atol, rtol = ATOL_RTOL["float32"]
    print(f"check against a float64 reference: max |error| {err:.2e} (bound {atol:g} + {rtol:g}*|ref|): "
          f"{'ok' if ok else 'WRONG'}")
    ms = gpu.time_ms(run, 5, 20)
    nbytes = rows * cols * 4
    copy_ms = gpu.time_ms(lambda: gpu.copy(data.ptr(y), data.ptr(x), nbytes), 5, 20)
    print(f"softlight: {ms:.3f} ms ({2 * nbytes / ms / 1e6:.0f} GB/s); copy of the same bytes: {copy_ms:.3f} ms; "
          f"softlight / copy = {ms / copy_ms:.3f}  (median of 20, CUDA events)")
    return 0 if ok else 1


def demo_cpu():
    import os
    rows, cols = 64, FOUNDING[1]
    print(f"No CUDA GPU found: running the CPU backend instead, on a smaller problem ({rows} x {cols} float32; "
          f"the GPU problem is {FOUNDING[0]} x {FOUNDING[1]}).")
    x = (np.random.default_rng().standard_normal((rows, cols)) * 3).astype(np.float32)
    t0 = time.perf_counter()
    y = softlight.log_softmax(x)
    ms = (time.perf_counter() - t0) * 1e3
    x64 = x.astype(np.float64)
    m = x64.max(axis=1, keepdims=True)
    ref = (x64 - m) - np.log(np.exp(x64 - m).sum(axis=1, keepdims=True))
    err = float(np.abs(y - ref).max())
    ok = err <= 1e-5 + 1e-5 * float(np.abs(ref).max())
    print(f"CPU ({os.cpu_count()} cores): {ms:.1f} ms; max |error| against float64 {err:.2e}: "
          f"{'ok' if ok else 'WRONG'}")
    return 0 if ok else 1


def info(as_json=False):
    import json
    d = {"version": softlight.__version__, "c_library": ".".join(map(str, softlight.version())),
         "library": softlight.library_path(), "include": softlight.include_dir(), "cmake_dir": softlight.cmake_dir(),
         "gpu_kernels_built": bool(softlight._C.gpu_built()), "cuda_gpus": gpu_count()}
    if as_json:
        print(json.dumps(d, indent=2))
        return 0
    print(f"softlight {d['version']} (C library {d['c_library']})")
    print(f"library:   {d['library']}")
    print(f"include:   {d['include']}")
    print(f"cmake dir: {d['cmake_dir']}")
    built = "built" if d["gpu_kernels_built"] else "not built (no CUDA toolkit at build time: CPU only)"
    print(f"GPU kernels: {built}")
    print(f"CUDA GPUs: {d['cuda_gpus']}")
    return 0


def main(argv=None):
    import argparse
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog="python -m softlight", description="softlight's command line.")
    sub = ap.add_subparsers(dest="command", metavar="{demo,bench,info}")
    sub.add_parser("demo", help="the founding problem on the GPU, checked and timed (a smaller one on the CPU "
                                "where there is no GPU)")
    sub.add_parser("bench", help="the benchmark (python -m softlight bench --help)", add_help=False)
    p_info = sub.add_parser("info", help="version, library paths, GPU")
    p_info.add_argument("--json", action="store_true", help="as a JSON object")
    if argv and argv[0] == "bench":  # the bench parses its own options
        from .bench import main as bench_main
        return bench_main(argv[1:])
    args = ap.parse_args(argv)
    if args.command == "info":
        return info(args.json)
    return demo([])  # demo, or no command


if __name__ == "__main__":
    sys.exit(main())
