"""Device memory, copies and timing through cuda-python (cuda.core and cuda.bindings, the `cuda`
extra), so that the benchmark and the demo run without any array framework installed; and the
forward's inputs made and outputs checked, with torch or with cuda-python alone."""
import contextlib

import numpy as np

from . import _dtypes

from ._streams import _cuda_core


def _driver():
    from cuda.bindings import driver
    return driver


def _ok(result, what):
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: CUDA error {int(err)}")
    return result[1:] if isinstance(result, tuple) else ()


def gpu_count():
    """Number of CUDA devices, 0 when there is no driver or no device (the library's own runtime)."""
    from . import _C
    return _C.device_count()


def _timing_options(cc):
    """EventOptions that record timing, across cuda.core releases (the field was renamed)."""
    for kwargs in ({"timing_enabled": True}, {"enable_timing": True}, {"timing_disabled": False}):
        try:
            return cc.EventOptions(**kwargs)
        except TypeError:
            continue
    raise RuntimeError("this cuda.core has no timing option for events")


class Gpu:
    """One device, one stream of our own, and the few operations the benchmark needs."""

    def __init__(self, device_id=0):
        cc = _cuda_core()
        self.cc = cc
        self.dev = cc.Device(device_id)
        self.dev.set_current()
        self.stream = self.dev.create_stream()
        self.handle = int(self.stream.handle)
        self._timing = _timing_options(cc)

    @property
    def name(self):
        return self.dev.name

    def alloc(self, nbytes):
        return self.dev.allocate(nbytes, stream=self.stream)

    def upload_at(self, buf, offset, host):
        host = np.ascontiguousarray(host)
        _ok(_driver().cuMemcpyHtoD(int(buf.handle) + offset, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")

    def download(self, buf, offset, host):
        _ok(_driver().cuMemcpyDtoH(host.ctypes.data, int(buf.handle) + offset, host.nbytes), "cuMemcpyDtoH")

    def copy(self, dst_ptr, src_ptr, nbytes):
        d = _driver()
        _ok(d.cuMemcpyDtoDAsync(dst_ptr, src_ptr, nbytes, d.CUstream(self.handle)), "cuMemcpyDtoDAsync")

    def sync(self):
        self.stream.sync()

    def time_ms(self, fn, warmup, reps, before=None):
        """Median over `reps` of the device time of fn() on our stream, after `warmup` calls;
        before(), if given, runs ahead of each timed call's start event (to queue work that keeps
        the stream busy, say, so that the host's part of the call is hidden)."""
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            if before is not None:
                before()
            start = self.stream.record(options=self._timing)
            fn()
            end = self.stream.record(options=self._timing)
            end.sync()
            times.append(end - start)
        return float(np.median(times))


# The founding problem (KernelBench level 1 #24) and the bounds of a checked result.
FOUNDING = (4096, 393216)
ATOL_RTOL = {"float32": (1e-5, 1e-5), "float16": (1e-4, 1e-3), "bfloat16": (1e-3, 4e-3), "float64": (1e-12, 1e-12)}
GRAD_TOL = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 8e-3}


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
