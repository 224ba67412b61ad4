"""`python -m softlight bench --device cpu`: the CPU backend against numpy's three-line form and
torch's CPU log_softmax, side by side in one run, over row lengths 1 to 16 M, float32, float64 and
bfloat16, along the last axis and a middle one.

Every provider is called as its users call it, returning a new array, and checked against float64
before it is timed; the floor is a copy of the same bytes into a new array (np.copy). The providers take
turns, each timed call right after an untimed one of its own. Each case holds about CPU_ELEMENTS
elements. Results: docs/perf/cpu.json and cpu.png.
"""
import datetime
import math
import sys
import time
from pathlib import Path

import numpy as np

from .common import cpu_name, parse_shapes, save_figure, write_results

CPU_COLS = (1, 7, 128, 1000, 32000, 393216, 1 << 24)
CPU_ELEMENTS = 1 << 24
CPU_DTYPES = ("float32", "float64", "bfloat16")
TOL = {"float32": (1e-5, 1e-5), "float64": (1e-12, 1e-12), "bfloat16": (1e-3, 8e-3)}


def cpu_cases(dtypes):
    """(shape, dim, dtype): each row length along the last axis, then as the middle of three axes
    (16 inner positions, 2 where the axis alone holds more than a sixteenth of the elements)."""
    for dtype in dtypes:
        for cols in CPU_COLS:
            yield (max(1, CPU_ELEMENTS // cols), cols), 1, dtype
            inner = 16 if cols * 16 <= CPU_ELEMENTS else 2
            yield (max(1, CPU_ELEMENTS // (cols * inner)), cols, inner), 1, dtype


def _numpy_dtype(name):
    """The numpy dtype of a name; None for bfloat16 where ml_dtypes (the bench extra) is missing."""
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            return None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def numpy_log_softmax(x, dim):
    """The three-line form, in float32 for bfloat16 (numpy has no bfloat16 arithmetic of its own)."""
    xf = x.astype(np.float32) if x.dtype.name == "bfloat16" else x
    m = xf.max(dim, keepdims=True)
    y = xf - m - np.log(np.exp(xf - m).sum(dim, keepdims=True))
    return y.astype(x.dtype, copy=False)


def providers(torch):
    import softlight
    provs = {"copy": lambda x, t, d: np.copy(x),
             "softlight": lambda x, t, d: softlight.log_softmax(x, d),
             "numpy": lambda x, t, d: numpy_log_softmax(x, d)}
    if torch is not None:
        provs["torch"] = lambda x, t, d: torch.log_softmax(t, d)
    return provs


def _as_torch(torch, x):
    if torch is None:
        return None
    if x.dtype.name == "bfloat16":
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(x)


def _as_numpy(torch, y):
    if torch is not None and isinstance(y, torch.Tensor):
        return y.float().numpy() if y.dtype == torch.bfloat16 else y.numpy()
    return np.asarray(y, np.float32) if y.dtype.name == "bfloat16" else y


def check(y, ref, dtype):
    """None if y matches the float64 reference (NaN exactly where it has NaN), else what is wrong."""
    atol, rtol = TOL[dtype]
    y = y.astype(np.float64)
    err = np.abs(y - ref)
    bad = ~(err <= atol + rtol * np.abs(ref)) & ~(np.isnan(y) & np.isnan(ref))
    return None if not bad.any() else f"wrong (max |error| {float(np.nanmax(err)):.3g})"


def run(args, torch):
    provs = providers(torch)
    names = [p for p in provs if not args.providers or p in args.providers.split(",") or p == "copy"]
    rng = np.random.default_rng(0)
    dtypes = [d for d in args.dtypes.split(",")] if args.dtypes else list(CPU_DTYPES)
    if "bfloat16" in dtypes and _numpy_dtype("bfloat16") is None:
        print("# bfloat16 skipped: numpy needs ml_dtypes for it (pip install 'softlight[bench]')", flush=True)
        dtypes.remove("bfloat16")
    if args.shapes:  # the shapes asked, along --dim
        cases = [(shape, args.dim % len(shape), d) for shape in parse_shapes(args.shapes) for d in dtypes]
    else:
        cases = list(cpu_cases(dtypes))
    rows = []
    started = time.monotonic()
    for i, (shape, dim, dtype) in enumerate(cases):
        if i:
            spent = time.monotonic() - started
            print(f"[{i + 1}/{len(cases)}] {spent:.0f} s so far, about {spent / i * (len(cases) - i):.0f} s left",
                  file=sys.stderr, flush=True)
        x = (rng.standard_normal(shape, np.float32) * 3).astype(_numpy_dtype(dtype))
        xt = _as_torch(torch, x)
        xd = x.astype(np.float64)
        ref = xd - xd.max(dim, keepdims=True)
        ref -= np.log(np.exp(ref).sum(dim, keepdims=True))
        case = []
        for name in names:
            row = {"op": "forward", "device": "cpu", "provider": name, "shape": list(shape), "dim": dim,
                   "dtype": dtype, "ms": None, "status": "ok"}
            fn = provs[name]
            try:
                y = fn(x, xt, dim)
                wrong = None if name == "copy" else check(_as_numpy(torch, y), ref, dtype)
                if wrong:
                    row["status"] = wrong
                del y
            except Exception as e:  # noqa: BLE001 - a provider that fails is reported, not fatal
                row["status"] = f"failed: {type(e).__name__}: {e}"
                fn = None
            case.append((row, fn))
            rows.append(row)
        del ref, xd
        times = {id(r): [] for r, _ in case}
        for _ in range(args.reps):  # the providers take turns, each call timed alone
            for row, fn in case:
                if fn is None:
                    continue
                # An untimed call first: the threads a provider leaves behind (torch's OpenMP workers
                # spin for milliseconds after a call) then slow that call, not the next provider's.
                fn(x, xt, dim)
                t0 = time.perf_counter()
                fn(x, xt, dim)
                times[id(row)].append((time.perf_counter() - t0) * 1e3)
        copy_ms = float(np.median(times[id(case[0][0])]))
        for row, fn in case:
            if fn is not None:
                row["ms"] = float(np.median(times[id(row)]))
            row["copy_ms"] = copy_ms
        line = "  ".join((f"{r['provider']} {r['ms']:.2f}" if r["ms"] else f"{r['provider']} -") +
                         ("" if r["status"] == "ok" else f" [{r['status'].upper()}]") for r, _ in case)
        print(f"{'x'.join(map(str, shape)):>18s} d{dim} {dtype:9s} ms: {line}", flush=True)
    return rows


def main(args, argv, torch, commit):
    import os

    import softlight
    rows = run(args, torch)
    meta = {"cpu": f"{cpu_name()}, {os.cpu_count()} threads", "commit": commit,
            "command": "python -m softlight bench " + " ".join(argv if argv is not None else sys.argv[1:]),
            "softlight_version": softlight.__version__, "torch": torch.__version__ if torch else None,
            "numpy": np.__version__, "date": datetime.date.today().isoformat()}
    worst = []
    for shape, dim, dtype in {(tuple(r["shape"]), r["dim"], r["dtype"]) for r in rows}:
        by = {r["provider"]: r["ms"] for r in rows
              if (tuple(r["shape"]), r["dim"], r["dtype"]) == (shape, dim, dtype) and r["status"] == "ok"}
        anchors = [by[p] for p in ("numpy", "torch") if by.get(p)]
        if by.get("softlight") and anchors:
            worst.append((by["softlight"] / min(anchors), shape, dim, dtype))
    if worst:
        ratio, shape, dim, dtype = max(worst)
        print(f"softlight / the faster of numpy and torch: at most {ratio:.2f} "
              f"({'x'.join(map(str, shape))} dim {dim} {dtype}), {len(worst)} cases")
    if args.out_dir:
        out = Path(args.out_dir)
        write_results(meta, rows, out, args.name or "cpu", plot)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def plot(meta, rows, path):
    """Time over the copy's against the row length (log axis): a panel per dtype and axis, a line
    per provider."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = sorted({(r["dtype"], len(r["shape"]) == 2) for r in rows}, key=lambda k: (k[0], not k[1]))
    fig, axes = plt.subplots(2, math.ceil(len(panels) / 2), figsize=(4.2 * math.ceil(len(panels) / 2), 6.4),
                             squeeze=False, sharey=True)
    colors = {}
    for k, (dtype, last) in enumerate(panels):
        ax = axes[k % 2][k // 2]
        for prov in ("softlight", "torch", "numpy"):
            pts = sorted((r["shape"][r["dim"]], r["ms"] / r["copy_ms"]) for r in rows
                         if r["provider"] == prov and r["dtype"] == dtype and (len(r["shape"]) == 2) == last
                         and r["status"] == "ok" and r["ms"] and r["copy_ms"])
            if pts:
                c = colors.setdefault(prov, plt.get_cmap("tab10")(len(colors)))
                ax.plot([p for p, _ in pts], [q for _, q in pts], marker="o", ms=3, lw=1.2, color=c, label=prov)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_title(f"{dtype}, {'last axis' if last else 'middle axis'}", fontsize=9)
        ax.set_xlabel("row length (elements)")
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel("time / copy of the same bytes")
    axes[0][-1].legend(fontsize=7)
    return save_figure(fig, f"log-softmax on the CPU, {meta['cpu']}, {meta['date']}, commit {meta['commit']}", path)
