"""`python -m softlight bench`: softlight against a copy of the same bytes and the public anchors,
side by side in one run, timed with CUDA events through cuda.core.

Every provider's output is checked against a float64 reference before it is timed; a provider that
is wrong is reported as wrong (its time is recorded, but no table or plot counts it). Results go to
<out-dir>/<name>.json and a PNG (one pair per benchmark, overwritten when measured again; the default
out-dir is softlight-bench/ in the working directory, the repository's figures --out-dir docs/perf).
"""
import argparse
import contextlib
import datetime
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from . import _C
from . import _dtypes
from ._api import log_softmax_raw
from ._device import Gpu
from ._errors import check

FOUNDING = (4096, 393216)
ATOL_RTOL = {"float32": (1e-5, 1e-5), "float16": (1e-4, 1e-3), "bfloat16": (1e-3, 4e-3), "float64": (1e-12, 1e-12)}


# The sweep of cols (rows chosen per dtype so that each tensor holds about --sweep-gb GB).
SWEEP_COLS = [1, 7, 32, 100, 128, 1000, 1024, 4096, 8192, 32000, 32768, 50257, 65536, 128256, 131072,
              262144, 393216, 1048576, 4194304]
GRAD_TOL = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 8e-3}


def parse_shapes(text):
    """'4096x393216,64x4096x4096' -> [(4096, 393216), (64, 4096, 4096)]."""
    out = []
    for item in text.split(","):
        if not re.fullmatch(r"\s*\d+(\s*[xX]\s*\d+)+\s*", item):
            raise SystemExit(f"bad shape {item!r}: write extents joined by x, e.g. 4096x393216")
        out.append(tuple(int(v) for v in re.split(r"[xX]", item.strip())))
    return out


def sweep_cases(dtypes, gb):
    return [((max(1, round(gb * 1e9 / (cols * _dtypes.itemsize(d)))), cols), d) for d in dtypes for cols in SWEEP_COLS]


def c_strides(shape):
    """The strides, in elements, of a C-contiguous array of `shape`."""
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))


# --- inputs and checks, with torch or with cuda-python alone -------------------------------------

class TorchData:
    """Inputs made and outputs checked with torch on the device (the whole tensor is checked)."""

    def __init__(self, torch, gpu):
        self.torch = torch
        self.ext = torch.cuda.ExternalStream(gpu.handle)

    def on_stream(self):
        """Context in which torch work goes to our stream."""
        return self.torch.cuda.stream(self.ext)

    def make(self, shape, dtype, op="forward", dim=-1):
        """forward: (x, y); backward: ((dy, y), dx), y a log-softmax output along dim."""
        t = self.torch
        with self.on_stream():
            if op == "forward":
                a = (t.randn(shape, device="cuda") * 3).to(getattr(t, dtype))
            else:
                y = t.log_softmax(t.randn(shape, device="cuda") * 3, dim).to(getattr(t, dtype))
                a = (t.randn(shape, device="cuda").to(getattr(t, dtype)), y)
            out = t.empty(shape, device="cuda", dtype=getattr(t, dtype))
        self.ext.synchronize()
        return a, out

    @staticmethod
    def ptr(a):
        return a.data_ptr()

    def _chunks(self, arrays, dim):
        """The arrays with `dim` moved last, as matching 2-d chunks of about 2^27 elements."""
        flat = [a.movedim(dim, -1).reshape(-1, a.shape[dim]) for a in arrays]
        step = max(1, (1 << 27) // flat[0].shape[1])
        for r0 in range(0, flat[0].shape[0], step):
            yield [f[r0:r0 + step].double() for f in flat]

    def check(self, out, inputs, dtype, kind, dim=-1):
        """(ok, worst error) of a provider's output: kind 'log' / 'prob' (forward, of x) or
        'grad' (backward, of (dy, y); errors relative to 1 + sum |dy| along the axis)."""
        t = self.torch
        worst, ok = 0.0, True
        arrays = [out] + (list(inputs) if kind == "grad" else [inputs])
        with self.on_stream():
            for chunk in self._chunks(arrays, dim):
                if kind == "grad":
                    o, dy, y = chunk
                    ref = dy - t.exp(y) * dy.sum(-1, keepdim=True)
                    err = (o - ref).abs() / (1 + dy.abs().sum(-1, keepdim=True))
                    ok = ok and bool((err <= GRAD_TOL[dtype]).all())
                else:
                    o, x = chunk
                    ref = t.log_softmax(x, -1) if kind == "log" else t.softmax(x, -1)
                    err = (o - ref).abs()
                    atol, rtol = ATOL_RTOL[dtype]
                    ok = ok and bool((err <= atol + rtol * ref.abs()).all())
                ok = ok and not bool(t.isnan(o).any())
                worst = max(worst, float(err.max()))
        return ok, worst


class HostData:
    """Without torch: inputs drawn on the host and uploaded; a sample of rows checked on the host."""

    def __init__(self, gpu):
        self.gpu = gpu

    @staticmethod
    def on_stream():
        return contextlib.nullcontext()

    def make(self, shape, dtype, op="forward", dim=-1):
        if op != "forward" or len(shape) != 2 or dim not in (-1, 1):
            raise SystemExit("softlight bench: without torch only the forward over the last axis of 2-d shapes runs")
        rows, cols = shape
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

    def check(self, y, x, dtype, kind, dim=-1):
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


def _git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).resolve().parent).stdout.strip()
    except Exception:  # noqa: BLE001 - outside a checkout
        return "unknown"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m softlight bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=None, help="comma-separated shapes, e.g. 4096x393216,64x4096x4096 (default: "
                                                   "4096x393216)")
    ap.add_argument("--dim", type=int, default=-1, help="the axis of the softmax (default: the last)")
    ap.add_argument("--dtypes", default=None, help="comma-separated (default: float32,bfloat16; with --device cpu "
                                                   "float32,float64,bfloat16)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: the CPU backend's sweep against numpy and torch's CPU kernel (bench_cpu.py)")
    ap.add_argument("--op", default="forward",
                    choices=["forward", "backward", "cross_entropy", "token_logprobs", "entropy", "logsumexp"],
                    help="cross_entropy, token_logprobs, entropy, logsumexp: the consumers of the log-sum-exp against "
                         "their anchors over vocabularies (bench_consumers.py), on --device cuda or cpu")
    ap.add_argument("--vocabs", default="", help="with a consumer --op: comma-separated vocabulary sizes (default: "
                                                 "32000,50257,128256,151936,262144)")
    ap.add_argument("--vocab-parallel", action="store_true",
                    help="under torchrun: softlight.vocab_parallel over the ranks against one rank and plain torch "
                         "(bench_vocab_parallel.py); every consumer op and log_softmax, or the --op given; --shapes "
                         "are the whole logits (default 8192x128256,8192x262144; 64x32000 on the CPU)")
    ap.add_argument("--sweep", action="store_true",
                    help=f"instead of --shapes: rows x cols for cols in {SWEEP_COLS}, each tensor about "
                         f"--sweep-gb GB")
    ap.add_argument("--sweep-gb", type=float, default=1.0)
    ap.add_argument("--host", action="store_true",
                    help="instead: the host time of one call at 8 x 1000 float32 on the GPU, softlight's entries "
                         "and torch.log_softmax side by side (median of --passes rounds of 2000 calls)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=None,
                    help="timed calls a provider and pass (default: 30; 5 on the CPU)")
    ap.add_argument("--passes", type=int, default=1,
                    help="rounds of timing over all providers; each result is the median of its rounds")
    ap.add_argument("--providers", default="", help="comma-separated subset (copy is always timed)")
    ap.add_argument("--no-torch", action="store_true", help="do not use torch even if installed")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--compile", default="static", choices=["static", "dynamic"],
                    help="torch.compile compiled afresh for each shape (static, the default) or once a dim "
                         "with dynamic=True")
    ap.add_argument("--out-dir", default="softlight-bench",
                    help="where the JSON and PNG go (default: a folder softlight-bench in the working directory; "
                         "'' for none; the repository's own figures are written with --out-dir docs/perf)")
    ap.add_argument("--name", default="", help="the result files' name: <out-dir>/<name>.json and .png (default: "
                                               "host, sweep, backward or forward, by what is measured)")
    ap.add_argument("--commit", default=None, help="commit to record (default: git rev-parse HEAD)")
    args = ap.parse_args(argv)
    consumer = args.op in ("cross_entropy", "token_logprobs", "entropy", "logsumexp")
    vp_name = "vocab-parallel" + ("-cpu" if args.device == "cpu" else "")
    args.name = args.name or (vp_name if args.vocab_parallel else f"{args.op}-cpu" if consumer and args.device == "cpu"
                              else args.op if consumer
                              else "cpu" if args.device == "cpu" else "host" if args.host else "sweep" if args.sweep
                              else args.op)
    args.reps = args.reps if args.reps is not None else 5 if args.device == "cpu" else 30
    if args.passes < 1 or args.reps < 1 or args.warmup < 0:
        raise SystemExit("softlight bench: --passes and --reps must be at least 1, --warmup at least 0")

    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            print("# torch not installed: timing softlight and the copy only", file=sys.stderr)
    if args.vocab_parallel:
        if torch is None or (args.device == "cuda" and not torch.cuda.is_available()):
            raise SystemExit("softlight bench --vocab-parallel: needs torch, and a GPU unless --device cpu")
        from . import bench_vocab_parallel
        if args.op not in ("forward",) + bench_vocab_parallel.OPS:
            raise SystemExit(f"softlight bench --vocab-parallel: times {', '.join(bench_vocab_parallel.OPS)} "
                             f"(every one without --op); not --op {args.op}")
        return bench_vocab_parallel.run(args, argv, torch, args.commit or _git_commit())
    if consumer:
        if torch is None:
            raise SystemExit(f"softlight bench --op {args.op}: needs torch (the anchors and the arrays)")
        if args.device == "cuda" and not torch.cuda.is_available():
            raise SystemExit("softlight bench: no CUDA GPU is visible; pass --device cpu")
        from . import bench_consumers
        return bench_consumers.run(args, argv, torch, args.commit or _git_commit())
    if args.device == "cpu":
        if args.op != "forward" or args.sweep or args.host:
            raise SystemExit("softlight bench --device cpu: times the forward (the CPU backend's sweep, or --shapes "
                             "along --dim) and the consumer --op values; not "
                             + ("--sweep" if args.sweep else "--host" if args.host else f"--op {args.op}"))
        from . import bench_cpu
        return bench_cpu.main(args, argv, torch, args.commit or _git_commit())
    args.dtypes = args.dtypes or "float32,bfloat16"
    from ._device import gpu_count
    if gpu_count() == 0:
        raise SystemExit("softlight bench: no CUDA GPU is visible; pass --device cpu for the CPU backend's benchmark")
    if args.host:
        if torch is None:
            raise SystemExit("softlight bench --host: needs torch (the anchor and the arrays)")
        return host_main(args, argv, torch)
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

    meta = {"gpu": gpu.name, "commit": args.commit or _git_commit(),
            "command": "python -m softlight bench " + " ".join(argv if argv is not None else sys.argv[1:]),
            "softlight_version": __import__("softlight").__version__,
            "torch": getattr(torch, "__version__", None), "date": datetime.date.today().isoformat()}
    if args.op == "backward":
        meta["copy"] = "torch.add(dy, y, out=dx): two tensors read, one written"
    print_table(rows_out)
    if args.out_dir:
        write_results(meta, rows_out, Path(args.out_dir), args.name)
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


def host_main(args, argv, torch):
    us = host_times(torch, passes=max(args.passes, 5))
    rows = [{"op": "host", "provider": k, "shape": list(HOST_SHAPE), "dtype": "float32", "us": v, "status": "ok"}
            for k, v in us.items()]
    for r in rows:
        ref = "torch_grad" if r["provider"].endswith("_grad") else "torch"
        print(f"{r['provider']:21s} {r['us']:7.2f} us  ({r['us'] / us[ref]:.2f} x {ref})")
    meta = {"gpu": torch.cuda.get_device_name(0), "commit": args.commit or _git_commit(),
            "command": "python -m softlight bench " + " ".join(argv if argv is not None else sys.argv[1:]),
            "softlight_version": __import__("softlight").__version__, "torch": torch.__version__,
            "date": datetime.date.today().isoformat()}
    if args.out_dir:
        write_results(meta, rows, Path(args.out_dir), args.name)
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


def write_results(meta, rows, out_dir, name="", plot_fn=None):
    """<out_dir>/<name>.json and its PNG, drawn by plot_fn(meta, rows, path) (default: the GPU sweep's
    plot, or the CPU sweep's for CPU results)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # One file per benchmark, overwritten when it is measured again (the GPU and date are in meta).
    stem = name or "results"
    path = out_dir / f"{stem}.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(f"# wrote {path}")
    try:
        if plot_fn is not None:
            png = plot_fn(meta, rows, out_dir / f"{stem}.png")
        elif "cpu" in meta:
            from . import bench_cpu
            png = bench_cpu.plot(meta, rows, out_dir / f"{stem}.png")
        else:
            png = plot(meta, rows, out_dir / f"{stem}.png")
        print(f"# wrote {png}")
    except ImportError:
        print("# matplotlib not installed: no plot", file=sys.stderr)


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


def save_figure(fig, title, path):
    """The figure's title, its layout tightened, saved at `path` (PNG) and closed."""
    import matplotlib.pyplot as plt
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
