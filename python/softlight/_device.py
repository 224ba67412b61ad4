"""Device memory, copies and timing through cuda-python (cuda.core and cuda.bindings, the `cuda`
extra), so that the benchmark and the demo run without any array framework installed."""
import numpy as np

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
