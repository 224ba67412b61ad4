"""What every benchmark of `python -m softlight bench` shares: shapes, the commit, the results'
files and figures. The op modules (forward, consumers, linear, cpu, vocab_parallel) import this module,
never one another; cli.py dispatches to them."""
import json
import math
import platform
import re
import subprocess
import sys
from pathlib import Path


def parse_shapes(text):
    """'4096x393216,64x4096x4096' -> [(4096, 393216), (64, 4096, 4096)]."""
    out = []
    for item in text.split(","):
        if not re.fullmatch(r"\s*\d+(\s*[xX]\s*\d+)+\s*", item):
            raise SystemExit(f"bad shape {item!r}: write extents joined by x, e.g. 4096x393216")
        out.append(tuple(int(v) for v in re.split(r"[xX]", item.strip())))
    return out


def c_strides(shape):
    """The strides, in elements, of a C-contiguous array of `shape`."""
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).resolve().parent).stdout.strip()
    except Exception:  # noqa: BLE001 - outside a checkout
        return "unknown"


def write_results(meta, rows, out_dir, name, plot_fn):
    """<out_dir>/<name>.json and its PNG, drawn by plot_fn(meta, rows, path)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # One file per benchmark, overwritten when it is measured again (the GPU and date are in meta).
    stem = name or "results"
    path = out_dir / f"{stem}.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(f"# wrote {path}")
    try:
        png = plot_fn(meta, rows, out_dir / f"{stem}.png")
        print(f"# wrote {png}")
    except ImportError:
        print("# matplotlib not installed: no plot", file=sys.stderr)


def save_figure(fig, title, path):
    """The figure's title, its layout tightened, saved at `path` (PNG) and closed."""
    import matplotlib.pyplot as plt
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def time_ms(torch, fn, device, reps, untimed_each=True):
    """Median of reps calls of fn, in milliseconds: CUDA events on the GPU, perf_counter on the CPU.
    untimed_each: an untimed call before each timed one (else one before them all)."""
    import time

    import numpy as np
    if not untimed_each:
        fn()
    times = []
    for _ in range(reps):
        if untimed_each:
            fn()
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))
