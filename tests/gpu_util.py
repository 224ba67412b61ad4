"""Helpers for the GPU tests: skipping where there is no GPU, checking on the device, the plans the
library makes."""
import math

import pytest

from reference import POISON, TOL

from softlight._device import gpu_count

try:  # the planner queries and the tuning interface: tuning builds alone
    from softlight import _planner as planner
except ImportError:
    planner = None

try:
    import torch
except ImportError:  # the GPU tests build their arrays with torch
    torch = None

if gpu_count() == 0:
    HAVE_GPU, WHY = False, "no CUDA GPU or driver on this machine"
elif torch is None:
    HAVE_GPU, WHY = False, "torch is not installed (the GPU tests build their arrays with torch)"
else:
    HAVE_GPU, WHY = torch.cuda.is_available(), "torch sees no CUDA GPU"

needs_gpu = pytest.mark.skipif(not HAVE_GPU, reason=WHY)

DTYPES = ["float32", "float16", "bfloat16", "float64"]


def tdtype(name):
    return getattr(torch, name)


def device_plan_args():
    """The device properties the library plans with, read through torch."""
    p = torch.cuda.get_device_properties(0)
    optin = getattr(p, "shared_memory_per_block_optin", 232448 if p.major >= 9 else 166912)
    return dict(cc_major=p.major, cc_minor=p.minor, sm_count=p.multi_processor_count, smem_optin=optin,
                max_cluster=16 if p.major >= 9 else 0)


def axis_plan(x, d, **kw):
    """The library's plan for the forward of contiguous x along d on this GPU."""
    outer = math.prod(x.shape[:d])
    inner = math.prod(x.shape[d + 1:])
    e = x.element_size()
    dev = {k: v for k, v in device_plan_args().items() if k != "cc_minor"}
    aligned = inner > 1 and inner * e % 16 == 0 and x.data_ptr() % 16 == 0
    return plan_axis_args(outer, x.shape[d], inner, e, inner == 1, False, False, **dev, tiles_aligned=aligned, **kw)


_DEVICE = ("cc_major", "cc_minor", "sm_count", "smem_optin", "max_cluster")
_ROWS_FLAGS = ("aligned8", "rows128", "peelable", "flat16")


def _planner():
    if planner is None:
        pytest.skip(NO_PLANNER)
    return planner


def plan(rows, cols, elem_bytes, aligned16, **kw):
    """softlight._planner.plan_rows with the problem's flags, the device and forced values as keywords
    (a tuning build's; elsewhere the test calling it skips)."""
    dev = {k: kw.pop(k) for k in _DEVICE if k in kw}
    prob = dict(rows=rows, cols=cols, elem_bytes=elem_bytes, aligned16=aligned16,
                **{k: kw.pop(k) for k in _ROWS_FLAGS if k in kw})
    return _planner().plan_rows(prob, dev, kw)


def plan_axis_args(outer, dim, inner, elem_bytes, rows, aligned16, backward, tiles_aligned=False, **kw):
    """softlight._planner.plan_axis with the problem positional, the device and forced values as
    keywords (a tuning build's; elsewhere the test calling it skips)."""
    dev = {k: kw.pop(k) for k in _DEVICE if k in kw}
    prob = dict(outer=outer, dim=dim, inner=inner, elem_bytes=elem_bytes, rows=rows, aligned16=aligned16,
                backward=backward, tiles_aligned=tiles_aligned)
    return _planner().plan_axis(prob, dev, kw)


# Values forced on the library through its tuning interface (softlight._planner, tuning builds only;
# the `force` fixture of conftest.py), so that the tests' plans are the library's.
FORCED = {}
TUNING = planner is not None
NO_TUNING = ("a default build has no tuning interface: build with "
             "-C cmake.define.SOFTLIGHT_TUNING=ON to run the tests that force a path")
NO_PLANNER = ("a default build has no planner queries (softlight._planner): build with "
              "-C cmake.define.SOFTLIGHT_TUNING=ON to run the tests that read the library's plan")


def on_path(ok, what):
    """Skip unless this GPU plans the problem down the path the test exercises: which path an H100
    takes is pinned on the CPU (test_planner, tests/paths.py); the GPU tests check the kernels."""
    if not ok:
        pytest.skip(f"this GPU does not plan {what} down the path this test exercises (test_planner pins "
                    "the H100's plan)")


def random_rows(rows, cols, dtype, scale=3.0, gen=None):
    return (torch.randn(rows, cols, device="cuda", generator=gen) * scale).to(tdtype(dtype))


def poisoned_like(x):
    return torch.full_like(x, POISON)


def assert_close_to_float64(y, x, dtype, what="", chunk_elems=1 << 28, transform=None):
    """y against float64 log-softmax of x (same shape, last axis), on the GPU, in row chunks:
    NaN exactly where the reference has NaN, equal infinities, finite values within TOL."""
    atol, rtol = TOL[dtype]
    assert y.shape == x.shape and y.dtype == x.dtype
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)
    y2 = y.reshape(-1, max(1, x.shape[-1] if x.dim() else 1))
    step = max(1, chunk_elems // max(1, x2.shape[1]))
    for r0 in range(0, x2.shape[0], step):
        xd = x2[r0:r0 + step].double()
        ref = torch.log_softmax(xd if transform is None else transform(xd), -1)
        yy = y2[r0:r0 + step].double()
        nan_r = torch.isnan(ref)
        mism = torch.nonzero(torch.isnan(yy) != nan_r)
        where = (mism[:5] + torch.tensor([r0, 0], device=mism.device)).tolist()
        assert mism.numel() == 0, f"{what}: NaN mismatch at rows/cols {where}"
        inf_r = torch.isinf(ref)
        assert torch.equal(yy[inf_r], ref[inf_r]), f"{what}: infinities differ"
        fin = ~nan_r & ~inf_r
        err = torch.where(fin, (yy - ref).abs(), torch.zeros_like(ref))
        lim = atol + rtol * ref.abs()
        over = err > lim
        if over.any():
            i = torch.nonzero(over)[0]
            a, b = i[0], i[1]
            raise AssertionError(f"{what}: row {r0 + int(a)} col {int(b)}: |y - ref| = {float(err[a, b]):.3e} "
                                 f"> {float(lim[a, b]):.3e} (y {float(yy[a, b])}, ref {float(ref[a, b])})")
        del ref, yy, xd


def assert_lse_close(lse, x, temperature, dtype):
    """The per-row log-sum-exp of x / temperature against float64: NaN for rows holding NaN or +inf
    (docs/semantics.md; torch gives +inf for the latter), -inf for rows of -inf, else within 1e-5
    (1e-12 for float64) relative and absolute."""
    ref = torch.logsumexp(x.double() / temperature, -1)
    ref[torch.isposinf(ref)] = float("nan")
    assert torch.equal(torch.isnan(lse), torch.isnan(ref)), "NaN where the reference has NaN, nowhere else"
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref)), "-inf for rows of -inf, nowhere else"
    fin = torch.isfinite(ref)
    tol = 1e-12 if dtype == "float64" else 1e-5
    assert bool(((lse.double() - ref).abs()[fin] <= tol * ref.abs()[fin] + tol).all())
