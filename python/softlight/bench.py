"""`python -m softlight bench`: softlight against a copy of the same bytes and the public anchors,
side by side in one run, timed with CUDA events through cuda.core.

Every provider's output is checked against a float64 reference before it is timed; a provider that
is wrong is reported as wrong and not timed. Results go to docs/perf/<gpu>-<date>.json and a PNG.
"""
import argparse
import contextlib
import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from . import _dtypes
from ._api import log_softmax_raw
from ._device import Gpu

FOUNDING = (4096, 393216)
ATOL_RTOL = {"float32": (1e-5, 1e-5), "float16": (1e-4, 1e-3), "bfloat16": (1e-3, 4e-3), "float64": (1e-12, 1e-12)}


def parse_shapes(text):
    out = []
    for item in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", item)
        if not m:
            raise SystemExit(f"bad shape {item!r}: write ROWSxCOLS, e.g. 4096x393216")
        out.append((int(m.group(1)), int(m.group(2))))
    return out


# --- inputs and checks, with torch or with cuda-python alone -------------------------------------

class TorchData:
    """Inputs made and outputs checked with torch on the device (the whole tensor is checked)."""

    def __init__(self, torch, gpu):
        self.torch = torch
        self.ext = torch.cuda.ExternalStream(gpu.handle)

    def on_stream(self):
        """Context in which torch work goes to our stream."""
        return self.torch.cuda.stream(self.ext)

    def make(self, rows, cols, dtype):
        t = self.torch
        with self.on_stream():
            x = (t.randn(rows, cols, device="cuda") * 3).to(getattr(t, dtype))
            y = t.empty_like(x)
        self.ext.synchronize()
        return x, y

    @staticmethod
    def ptr(a):
        return a.data_ptr()

    def check(self, y, x, dtype, kind):
        t = self.torch
        atol, rtol = ATOL_RTOL[dtype]
        worst, ok = 0.0, True
        step = max(1, (1 << 27) // x.shape[1])
        with self.on_stream():
            for r0 in range(0, x.shape[0], step):
                xd = x[r0:r0 + step].double()
                ref = t.log_softmax(xd, -1) if kind == "log" else t.softmax(xd, -1)
                yd = y[r0:r0 + step].double()
                err = (yd - ref).abs()
                ok = ok and bool((err <= atol + rtol * ref.abs()).all()) and not bool(t.isnan(yd).any())
                worst = max(worst, float(err.max()))
        return ok, worst


class HostData:
    """Without torch: inputs drawn on the host and uploaded; a sample of rows checked on the host."""

    def __init__(self, gpu):
        self.gpu = gpu

    @staticmethod
    def on_stream():
        return contextlib.nullcontext()

    def make(self, rows, cols, dtype):
        n = rows * cols
        size = _dtypes.itemsize(dtype)
        x = DeviceMatrix(self.gpu.alloc(n * size), (rows, cols))
        y = DeviceMatrix(self.gpu.alloc(n * size), (rows, cols))
        rng = np.random.default_rng()
        block = min(n, 1 << 24)
        for off in range(0, n, block):  # fresh data block by block, to keep host memory small
            self.gpu.upload_at(x.buf, off * size, to_storage(rng.standard_normal(min(block, n - off)) * 3, dtype))
        return x, y

    @staticmethod
    def ptr(a):
        return int(a.buf.handle)

    def check(self, y, x, dtype, kind):
        rows, cols = x.shape
        size = _dtypes.itemsize(dtype)
        atol, rtol = ATOL_RTOL[dtype]
        worst, ok = 0.0, True
        self.gpu.sync()
        for r in sorted({0, rows // 2, rows - 1}):
            xs = np.empty(cols * size, np.uint8)
            ys = np.empty(cols * size, np.uint8)
            self.gpu.download(x.buf, r * cols * size, xs)
            self.gpu.download(y.buf, r * cols * size, ys)
            xv, yv = from_storage(xs, dtype), from_storage(ys, dtype)
            m = xv.max()
            ref = (xv - m) - np.log(np.exp(xv - m).sum())
            if kind == "prob":
                ref = np.exp(ref)
            err = np.abs(yv - ref)
            ok = ok and bool((err <= atol + rtol * np.abs(ref)).all())
            worst = max(worst, float(err.max()))
        return ok, worst


class DeviceMatrix:
    def __init__(self, buf, shape):
        self.buf, self.shape = buf, shape


def to_storage(values, dtype):
    """float64 values as the bytes of `dtype` (bfloat16 rounded to nearest even)."""
    if dtype == "bfloat16":
        u = values.astype(np.float32).view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).view(np.uint8)
    return values.astype(dtype).view(np.uint8)


def from_storage(raw, dtype):
    if dtype == "bfloat16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return raw.view(dtype).astype(np.float64)


# --- providers ----------------------------------------------------------------------------------

def providers(args, gpu, data, torch):
    """name -> (kind, make(x, y, rows, cols, dtype) -> callable enqueuing one run on our stream)."""
    p = {}
    nbytes = lambda rows, cols, dtype: rows * cols * _dtypes.itemsize(dtype)  # noqa: E731
    p["copy"] = (None, lambda x, y, r, c, d: lambda: gpu.copy(data.ptr(y), data.ptr(x), nbytes(r, c, d)))
    p["softlight"] = ("log", lambda x, y, r, c, d: lambda: log_softmax_raw(
        data.ptr(x), data.ptr(y), r, c, dtype=d, stream=gpu.handle))
    if torch is None:
        return p
    p["torch"] = ("log", lambda x, y, r, c, d: lambda: torch.log_softmax(x, -1))
    if not args.no_compile:
        compiled = torch.compile(lambda t: torch.log_softmax(t, -1))
        p["torch.compile"] = ("log", lambda x, y, r, c, d: lambda: compiled(x))
    try:
        from quack import softmax as quack_softmax
        p["quack"] = ("prob", lambda x, y, r, c, d: lambda: quack_softmax(x))
    except Exception as e:  # noqa: BLE001 - an anchor that is not installed is skipped, and said so
        print(f"# quack not available: {type(e).__name__}: {e}", file=sys.stderr)
    try:
        from liger_kernel.transformers.functional import liger_softmax
        p["liger"] = ("prob", lambda x, y, r, c, d: lambda: liger_softmax(x))
    except Exception as e:  # noqa: BLE001
        print(f"# liger not available: {type(e).__name__}: {e}", file=sys.stderr)
    if args.providers:
        keep = set(args.providers.split(",")) | {"copy"}
        p = {k: v for k, v in p.items() if k in keep}
    return p


def run_once(fn, data, y):
    """Run fn once on our stream; returns its output (for providers that allocate their own)."""
    with data.on_stream():
        r = fn()
    return y if r is None else r


def _git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).resolve().parent).stdout.strip()
    except Exception:  # noqa: BLE001 - outside a checkout
        return "unknown"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m softlight bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="4096x393216", help="comma-separated ROWSxCOLS")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--op", default="forward", choices=["forward"], help="operation (forward)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--providers", default="", help="comma-separated subset (copy is always timed)")
    ap.add_argument("--no-torch", action="store_true", help="do not use torch even if installed")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--out-dir", default="docs/perf", help="where the JSON and PNG go ('' for none)")
    ap.add_argument("--commit", default=None, help="commit to record (default: git rev-parse HEAD)")
    args = ap.parse_args(argv)

    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            print("# torch not installed: timing softlight and the copy only", file=sys.stderr)
    from ._device import gpu_count
    if gpu_count() == 0:
        raise SystemExit("softlight bench: no CUDA GPU is visible; the benchmark needs one")
    gpu = Gpu(0)
    data = TorchData(torch, gpu) if torch is not None else HostData(gpu)
    provs = providers(args, gpu, data, torch)
    shapes = parse_shapes(args.shapes)
    dtypes = [_dtypes.normalize(d) for d in args.dtypes.split(",")]
    total = len(shapes) * len(dtypes) * len(provs)
    rows_out, done = [], 0
    for rows, cols in shapes:
        for dtype in dtypes:
            x, y = data.make(rows, cols, dtype)
            copy_ms = None
            for name, (kind, make) in provs.items():
                done += 1
                print(f"[{done}/{total}] {name:14s} {rows}x{cols} {dtype}", file=sys.stderr, flush=True)
                row = {"op": args.op, "provider": name, "shape": [rows, cols], "dtype": dtype}
                try:
                    fn = make(x, y, rows, cols, dtype)
                    out = run_once(fn, data, y)
                    if kind is not None:
                        ok, err = data.check(out, x, dtype, kind)
                        row["max_abs_err"] = err
                        if not ok:
                            row.update(status="wrong", ms=None)
                            rows_out.append(row)
                            continue
                    del out
                    with data.on_stream():
                        ms = gpu.time_ms(fn, args.warmup, args.reps)
                    if name == "copy":
                        copy_ms = ms
                    row.update(status="ok", ms=ms)
                except Exception as e:  # noqa: BLE001 - one failing anchor must not end the run
                    row.update(status=f"failed: {type(e).__name__}: {str(e)[:160]}", ms=None)
                rows_out.append(row)
                if torch is not None:
                    torch.cuda.empty_cache()
            for r in rows_out:
                if r["shape"] == [rows, cols] and r["dtype"] == dtype:
                    r["copy_ms"] = copy_ms
            del x, y
            if torch is not None:
                torch.cuda.empty_cache()

    meta = {"gpu": gpu.name, "commit": args.commit or _git_commit(),
            "command": "python -m softlight bench " + " ".join(argv if argv is not None else sys.argv[1:]),
            "softlight_version": __import__("softlight").__version__,
            "torch": getattr(torch, "__version__", None), "date": datetime.date.today().isoformat()}
    print_table(rows_out)
    if args.out_dir:
        write_results(meta, rows_out, Path(args.out_dir))
    return 0


def print_table(rows):
    print(f"{'provider':14s} {'shape':>14s} {'dtype':9s} {'ms':>8s} {'GB/s':>6s} {'x copy':>7s}  status")
    for r in rows:
        m, n = r["shape"]
        nbytes = 2 * m * n * _dtypes.itemsize(r["dtype"])
        ms, copy_ms = r.get("ms"), r.get("copy_ms")
        t = f"{ms:8.3f} {nbytes / ms / 1e6:6.0f} {ms / copy_ms:7.3f}" if ms and copy_ms else f"{'-':>8s} {'-':>6s} {'-':>7s}"
        print(f"{r['provider']:14s} {f'{m}x{n}':>14s} {r['dtype']:9s} {t}  {r['status']}")
    by = {(r["provider"], tuple(r["shape"]), r["dtype"]): r.get("ms") for r in rows}
    sl, tm = by.get(("softlight", FOUNDING, "float32")), by.get(("torch", FOUNDING, "float32"))
    if sl and tm:
        print(f"KernelBench level 1 #24 (LogSoftmax, 4096x393216 float32): ModelNew (softlight) is "
              f"{tm / sl:.2f}x faster than Model (torch.log_softmax)")


def write_results(meta, rows, out_dir):
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9]+", "-", meta["gpu"]).strip("-") + "-" + meta["date"]
    path = out_dir / f"{stem}.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(f"# wrote {path}")
    try:
        png = plot(meta, rows, out_dir / f"{stem}.png")
        print(f"# wrote {png}")
    except ImportError:
        print("# matplotlib not installed: no plot", file=sys.stderr)


def plot(meta, rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cases = []
    for r in rows:
        key = (tuple(r["shape"]), r["dtype"], r["op"])
        if key not in cases:
            cases.append(key)
    provs = []  # providers with at least one timed result, in the order they ran
    for r in rows:
        if r["provider"] not in provs and r.get("ms"):
            provs.append(r["provider"])
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(cases) * max(1, len(provs)) / 3), 4.5))
    width = 0.8 / max(1, len(provs))
    for i, p in enumerate(provs):
        xs, ys = [], []
        for j, (shape, dtype, op) in enumerate(cases):
            for r in rows:
                if r["provider"] == p and tuple(r["shape"]) == shape and r["dtype"] == dtype and r.get("ms"):
                    xs.append(j + i * width)
                    ys.append(2 * shape[0] * shape[1] * _dtypes.itemsize(dtype) / r["ms"] / 1e6)
        ax.bar(xs, ys, width, label=p, color=plt.get_cmap("tab10")(i % 10))
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))])
    ax.set_xticklabels([f"{s[0]}x{s[1]}\n{d} {o}" for s, d, o in cases], fontsize=8)
    ax.set_ylabel("GB/s (one read + one write)")
    ax.set_title(f"log-softmax on {meta['gpu']} ({meta['date']}, commit {meta['commit']})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
