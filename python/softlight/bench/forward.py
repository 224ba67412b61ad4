"""The GPU's log-softmax, forward and backward, against a copy of the same bytes and the public
anchors (`python -m softlight bench`, the default op), and the host cost of a call (--host)."""
import datetime
import math
import sys
import time
from pathlib import Path

import numpy as np

from .. import _C, _dtypes
from .._api import log_softmax_raw
from .._device import FOUNDING, Gpu, HostData, TorchData, gpu_count
from .._errors import check
from .common import c_strides, parse_shapes, save_figure, write_results

# The sweep of cols (rows chosen per dtype so that each tensor holds about --sweep-gb GB).
SWEEP_COLS = [1, 7, 32, 100, 128, 1000, 1024, 4096, 8192, 32000, 32768, 50257, 65536, 128256, 131072,
              262144, 393216, 1048576, 4194304]



def sweep_cases(dtypes, gb):
    return [((max(1, round(gb * 1e9 / (cols * _dtypes.itemsize(d)))), cols), d) for d in dtypes for cols in SWEEP_COLS]


# --- providers ----------------------------------------------------------------------------------

def providers(args, gpu, data, torch, op):
    """name -> (kind, make(case) -> callable enqueuing one run on our stream). kind: how the output
    is checked (None: not checked, the floor). For the forward the floor is a device copy of x; for
    the backward, reading two tensors and writing one (torch.add(dy, y)).

    With torch, every provider writes a new output at each call, taken from torch's caching
    allocator (as the anchors, which allocate their own, do): where the output lies against the
    input changes even a cudaMemcpy of 1 GB by up to 10 % on an H200 (docs/design.md), so a floor
    and softlight writing one fixed buffer while the anchors write recycled ones would compare
    placements as much as kernels."""
    p = {}

    def fresh(c, write):
        """A call that writes a new output (write(pointer) enqueues the work) and returns it."""
        if torch is None:
            return lambda: write(data.ptr(c.out))

        def run():
            o = torch.empty_like(c.out)
            write(o.data_ptr())
            return o
        return run

    if op == "forward":
        p["copy"] = (None, lambda c: fresh(c, lambda o: gpu.copy(o, data.ptr(c.inp), c.nbytes)))

        def softlight_forward(c):
            if len(c.shape) == 2 and c.dim == 1:
                return fresh(c, lambda o: log_softmax_raw(data.ptr(c.inp), o, *c.shape, dtype=c.dtype,
                                                          stream=gpu.handle))
            st, code = c_strides(c.shape), _dtypes.code(c.dtype)
            return fresh(c, lambda o: check(_C.forward(data.ptr(c.inp), c.shape, st, o, st, c.dim, code, True,
                                                       gpu.handle, 1.0, 0)))
        p["softlight"] = ("log", softlight_forward)
    else:
        if torch is None:
            raise SystemExit("softlight bench: --op backward needs torch (for its inputs and its floor)")
        p["copy"] = (None, lambda c: lambda: torch.add(c.inp[0], c.inp[1]))

        def softlight_backward(c):
            st, code = c_strides(c.shape), _dtypes.code(c.dtype)
            dy, y = (data.ptr(a) for a in c.inp)
            return fresh(c, lambda o: check(_C.backward(dy, c.shape, st, y, st, o, st, c.dim, code, True, gpu.handle)))
        p["softlight"] = ("grad", softlight_backward)
    if torch is None:
        return p
    compiled = {}

    def compiled_for(dim):
        """torch.compile of the op along dim. "static" (the default): compiled afresh for each case,
        after torch._dynamo.reset(), so that every shape gets the kernels Inductor makes for that
        shape alone (a function recompiled for many shapes turns dynamic, and past dynamo's
        recompile limit runs eagerly). "dynamic": one function a dim, compiled with dynamic=True."""
        dynamic = args.compile == "dynamic"
        if dynamic and dim in compiled:
            return compiled[dim]
        if not dynamic:
            torch._dynamo.reset()
        f = compile_op(torch, op, dim, dynamic)
        if dynamic:
            compiled[dim] = f
        return f
    if op == "forward":
        p["torch"] = ("log", lambda c: lambda: torch.log_softmax(c.inp, c.dim))
        if not args.no_compile:
            p["torch.compile"] = ("log", lambda c: (lambda f: lambda: f(c.inp))(compiled_for(c.dim)))
        try:
            from quack import softmax as quack_softmax
            p["quack"] = ("prob", lambda c: lambda: quack_softmax(c.inp) if c.last2d() else _skip("2-d, last axis"))
        except Exception as e:  # noqa: BLE001 - an anchor that is not installed is skipped, and said so
            print(f"# quack not available: {type(e).__name__}: {e}", file=sys.stderr)
        try:
            from liger_kernel.transformers.functional import liger_softmax
            p["liger"] = ("prob", lambda c: lambda: liger_softmax(c.inp) if c.last2d() else _skip("2-d, last axis"))
        except Exception as e:  # noqa: BLE001
            print(f"# liger not available: {type(e).__name__}: {e}", file=sys.stderr)
    else:
        p["torch"] = ("grad", lambda c: lambda: torch._log_softmax_backward_data(c.inp[0], c.inp[1], c.dim,
                                                                               c.inp[1].dtype))
        if not args.no_compile:
            p["torch.compile"] = ("grad", lambda c: (lambda f: lambda: f(*c.inp))(compiled_for(c.dim)))
    if args.providers:
        keep = set(args.providers.split(",")) | {"copy"}
        p = {k: v for k, v in p.items() if k in keep}
    return p


def compile_op(torch, op, dim, dynamic):
    """torch.compile of the op along dim: log_softmax, or the backward as dy - exp(y) * sum(dy)."""
    if op == "forward":
        return torch.compile(lambda t: torch.log_softmax(t, dim), dynamic=dynamic)
    return torch.compile(lambda g, y: g - torch.exp(y) * g.sum(dim, keepdim=True), dynamic=dynamic)


def _skip(why):
    raise NotImplementedError(f"this anchor takes {why} only")


class Case:
    def __init__(self, op, shape, dim, dtype, inp, out):
        self.op, self.shape, self.dim, self.dtype, self.inp, self.out = op, shape, dim, dtype, inp, out
        self.nbytes = math.prod(shape) * _dtypes.itemsize(dtype)

    def last2d(self):
        return len(self.shape) == 2 and self.dim == 1


def run_once(fn, data, out):
    """Run fn once on our stream; returns its output (for providers that allocate their own)."""
    with data.on_stream():
        r = fn()
    return out if r is None else r


def time_passes(gpu, data, ready, args):
    """Times each ready provider: one untimed pass over all of them, then `passes` rounds over all
    of them (so that drift of the GPU over the run reaches every provider alike), each a median over
    `reps` calls; the row's ms is the median of its passes (all of them under ms_passes when there
    are several). The untimed pass: the providers timed first after the checks ran about 10 % slow
    in every sweep, and the others not (docs/design.md, "The first pass, untimed")."""
    for k in range(-1, args.passes):
        if k >= 0 and args.passes > 1:
            print(f"# timing pass {k + 1}/{args.passes}", file=sys.stderr, flush=True)
        for row, fn in ready:
            if row["status"].startswith("failed"):
                continue
            try:
                with data.on_stream():
                    ms = gpu.time_ms(fn, args.warmup, args.reps)
                if k >= 0:
                    row.setdefault("ms_passes", []).append(ms)
            except Exception as e:  # noqa: BLE001 - one failing anchor must not end the run
                row.update(status=f"failed: {type(e).__name__}: {str(e)[:160]}", ms=None)
    for row, _ in ready:
        if not row["status"].startswith("failed"):
            row["ms"] = float(np.median(row["ms_passes"]))
            if args.passes == 1:
                del row["ms_passes"]


def run(args, argv, torch, commit):
    """The GPU's forward and backward (--shapes, --sweep) or the host cost of a call (--host)."""
    args.dtypes = args.dtypes or "float32,bfloat16"
    if gpu_count() == 0:
        raise SystemExit("softlight bench: no CUDA GPU is visible; pass --device cpu for the CPU backend's benchmark")
    if args.host:
        if torch is None:
            raise SystemExit("softlight bench --host: needs torch (the anchor and the arrays)")
        return host_main(args, argv, torch, commit)
    gpu = Gpu(0)
    data = TorchData(torch, gpu) if torch is not None else HostData(gpu)
    provs = providers(args, gpu, data, torch, args.op)
    dtypes = [_dtypes.normalize(d) for d in args.dtypes.split(",")]
    cases = sweep_cases(dtypes, args.sweep_gb) if args.sweep else [
        (shape, d) for shape in parse_shapes(args.shapes or "4096x393216") for d in dtypes]
    total = len(cases) * len(provs)
    rows_out, done, started = [], 0, time.monotonic()
    for shape, dtype in cases:
        dim = args.dim % len(shape)
        inp, out = data.make(shape, dtype, args.op, dim)
        case = Case(args.op, shape, dim, dtype, inp, out)
        these, ready = [], []  # every provider's row; (row, fn) of those checked and ready to time
        for name, (kind, make) in provs.items():
            done += 1
            print(f"[{done}/{total}] {name:14s} {'x'.join(map(str, shape))} {dtype} {args.op} "
                  f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
            row = {"op": args.op, "provider": name, "shape": list(shape), "dtype": dtype}
            if dim != len(shape) - 1:
                row["dim"] = dim
            these.append(row)
            try:
                fn = make(case)
                result = run_once(fn, data, out)
                ok = True
                if kind is not None:
                    ok, err = data.check(result, inp, dtype, kind, dim)
                    row["max_abs_err"] = err
                del result
                # A wrong result is timed all the same (its speed is worth knowing), but it keeps
                # its status: no table or plot counts it as a result.
                row.update(status="ok" if ok else f"wrong (max |error| {err:.2e})", ms=None)
                if not ok:
                    print(f"    {name}: WRONG against the float64 reference (max |error| {err:.2e}); timed, "
                          f"never counted", file=sys.stderr, flush=True)
                ready.append((row, fn))
            except Exception as e:  # noqa: BLE001 - one failing anchor must not end the run
                row.update(status=f"failed: {type(e).__name__}: {str(e)[:160]}", ms=None)
            if torch is not None:
                torch.cuda.empty_cache()
        time_passes(gpu, data, ready, args)
        copy_ms = next((r["ms"] for r in these if r["provider"] == "copy" and counted(r)), None)
        for r in these:
            r["copy_ms"] = copy_ms
        rows_out += these
        del inp, out, case
        if torch is not None:
            torch.cuda.empty_cache()

    meta = {"gpu": gpu.name, "commit": commit,
            "command": "python -m softlight bench " + " ".join(argv if argv is not None else sys.argv[1:]),
            "softlight_version": __import__("softlight").__version__,
            "torch": getattr(torch, "__version__", None), "date": datetime.date.today().isoformat()}
    if args.op == "backward":
        meta["copy"] = "torch.add(dy, y, out=dx): two tensors read, one written"
    print_table(rows_out)
    if args.out_dir:
        write_results(meta, rows_out, Path(args.out_dir), args.name, plot)
    return 0


HOST_SHAPE = (8, 1000)


def host_times(torch, passes=5, calls=2000):
    """us a call of each entry, median over `passes` rounds of `calls` calls, the entries taking
    turns within each round: softlight.log_softmax on a torch tensor (new output), with out=, on a
    CuPy array (if CuPy is installed), log_softmax_raw on pointers, and torch.log_softmax; and the
    torch adapter: softlight.torch.log_softmax, the operator torch.ops.softlight.log_softmax, and
    forward + backward under autograd (torch.autograd.grad, "_grad") of softlight.torch's and torch's;
    and, as the least that an adapter written in Python can cost there, a torch.autograd.Function
    around torch's own two kernels ("function_grad")."""
    import softlight
    import softlight.torch as slt
    class TorchKernels(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            y = torch.log_softmax(a, -1)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, dy):
            y, = ctx.saved_tensors
            return torch._log_softmax_backward_data(dy, y, -1, y.dtype)

    x = torch.randn(*HOST_SHAPE, device="cuda")
    xg, g = x.clone().requires_grad_(), torch.randn_like(x)
    out = torch.empty_like(x)
    stream = torch.cuda.current_stream().cuda_stream
    xp, yp = x.data_ptr(), out.data_ptr()  # the raw entry takes pointers, read once as its callers do
    entries = {
        "torch": lambda: torch.log_softmax(x, -1),
        "softlight": lambda: softlight.log_softmax(x),
        "softlight_out": lambda: softlight.log_softmax(x, out=out),
        "softlight_raw": lambda: softlight.log_softmax_raw(xp, yp, *HOST_SHAPE, dtype="float32", stream=stream),
        "softlight.torch": lambda: slt.log_softmax(x, -1),
        "softlight_op": lambda: torch.ops.softlight.log_softmax(x, -1),
        "torch_grad": lambda: torch.autograd.grad(torch.log_softmax(xg, -1), xg, g),
        "softlight.torch_grad": lambda: torch.autograd.grad(slt.log_softmax(xg, -1), xg, g),
        "function_grad": lambda: torch.autograd.grad(TorchKernels.apply(xg), xg, g),
    }
    try:
        import cupy
        xc = cupy.asarray(x)
        entries["softlight_cupy"] = lambda: softlight.log_softmax(xc)
    except Exception as e:  # noqa: BLE001 - CuPy is optional
        print(f"# cupy not available: {type(e).__name__}: {e}", file=sys.stderr)
    for f in entries.values():  # checked once, then warm
        f()
    torch.cuda.synchronize()
    ref = torch.log_softmax(x.double(), -1)
    errs = [softlight.log_softmax(x).double() - ref, slt.log_softmax(x, -1).double() - ref,
            torch.ops.softlight.log_softmax(x, -1).double() - ref,
            entries["softlight.torch_grad"]()[0].double() - entries["torch_grad"]()[0].double(),
            entries["function_grad"]()[0].double() - entries["torch_grad"]()[0].double()]
    if max(float(e.abs().max()) for e in errs) > 1e-5:
        raise SystemExit("softlight bench --host: wrong result")
    times = {k: [] for k in entries}
    for _ in range(passes):
        for name, f in entries.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            times[name].append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
    return {k: float(np.median(v)) for k, v in times.items()}


def host_main(args, argv, torch, commit):
    us = host_times(torch, passes=max(args.passes, 5))
    rows = [{"op": "host", "provider": k, "shape": list(HOST_SHAPE), "dtype": "float32", "us": v, "status": "ok"}
            for k, v in us.items()]
    for r in rows:
        ref = "torch_grad" if r["provider"].endswith("_grad") else "torch"
        print(f"{r['provider']:21s} {r['us']:7.2f} us  ({r['us'] / us[ref]:.2f} x {ref})")
    meta = {"gpu": torch.cuda.get_device_name(0), "commit": commit,
            "command": "python -m softlight bench " + " ".join(argv if argv is not None else sys.argv[1:]),
            "softlight_version": __import__("softlight").__version__, "torch": torch.__version__,
            "date": datetime.date.today().isoformat()}
    if args.out_dir:
        write_results(meta, rows, Path(args.out_dir), args.name, plot)
    return 0


def moved_bytes(r):
    """Bytes a provider must move at least: one read and one write (forward), two reads and one
    write (backward)."""
    return (3 if r["op"] == "backward" else 2) * math.prod(r["shape"]) * _dtypes.itemsize(r["dtype"])


def print_table(rows):
    print(f"{'provider':14s} {'op':8s} {'shape':>16s} {'dtype':9s} {'ms':>8s} {'GB/s':>6s} {'x copy':>7s}  status")
    for r in rows:
        ms, copy_ms = r.get("ms"), r.get("copy_ms")
        shape = "x".join(map(str, r["shape"])) + (f" d{r['dim']}" if "dim" in r else "")
        t = (f"{ms:8.3f} {moved_bytes(r) / ms / 1e6:6.0f} {ms / copy_ms:7.3f}" if ms and copy_ms
             else f"{'-':>8s} {'-':>6s} {'-':>7s}")
        print(f"{r['provider']:14s} {r['op']:8s} {shape:>16s} {r['dtype']:9s} {t}  {r['status']}")
    by = {(r["provider"], tuple(r["shape"]), r["dtype"], r["op"]): r["ms"] for r in rows if counted(r)}
    sl, tm = by.get(("softlight", FOUNDING, "float32", "forward")), by.get(("torch", FOUNDING, "float32", "forward"))
    if sl and tm:
        print(f"KernelBench level 1 #24 (LogSoftmax, 4096x393216 float32): ModelNew (softlight) is "
              f"{tm / sl:.2f}x faster than Model (torch.log_softmax)")


def counted(r):
    """A row's time counts as a result: timed, and checked right."""
    return r["status"] == "ok" and bool(r.get("ms"))


def row_length(r):
    """The length of the softmax's axis in a result row."""
    return r["shape"][r.get("dim", len(r["shape"]) - 1)]


def ratio_lines(rows):
    """The plot's lines: (provider, dtype, op, [(row length, time / copy time)]) of every provider
    but the copy, from the results that count."""
    lines = {}
    for r in rows:
        if r["provider"] != "copy" and r.get("op") != "host" and counted(r) and r.get("copy_ms"):
            lines.setdefault((r["provider"], r["dtype"], r["op"]), []).append((row_length(r), r["ms"] / r["copy_ms"]))
    return [(p, d, o, sorted(pts)) for (p, d, o), pts in lines.items()]


def plot(meta, rows, path):
    """Time over the copy's against the row length (log axis), a panel per dtype, a line per
    provider; host-cost results as bars of microseconds a call."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    title = f"{meta['gpu']}, {meta['date']}, commit {meta['commit']}"
    host = [r for r in rows if r.get("op") == "host" and r.get("us")]
    if host:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.barh([r["provider"] for r in host], [r["us"] for r in host], color="tab:blue")
        ax.set_xlabel("host time a call (us), x = 8 x 1000 float32 on the GPU")
        ax.set_title(f"host cost, {title}", fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
    lines = ratio_lines(rows)
    dtypes = sorted({d for _, d, _, _ in lines}) or ["float32"]
    fig, axes = plt.subplots(1, len(dtypes), figsize=(4.2 * len(dtypes), 3.6), squeeze=False, sharey=True)
    colors = {}
    for ax, dtype in zip(axes[0], dtypes):
        for prov, d, op, pts in lines:
            if d != dtype:
                continue
            c = colors.setdefault(prov, plt.get_cmap("tab10")(len(colors) % 10))
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", ms=3, lw=1.2, color=c,
                    label=prov if op == "forward" else f"{prov} ({op})")
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_ylim(0.9, 4.0)  # points above 4 x copy are cut off: the JSON holds them
        ax.set_xscale("log", base=2)
        ax.set_title(dtype, fontsize=9)
        ax.set_xlabel("row length (elements)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("time / copy of the same bytes")
    axes[0][-1].legend(fontsize=7)
    return save_figure(fig, f"log-softmax, {title}", path)


