"""Hostile input on the GPU: the CPU suite's differential generator against the GPU (20,000 cases),
misaligned device pointers, a full GPU at a workspace's allocation, and sixteen threads on sixteen
streams. The CUDA context survives each, and the next call works.
Skipped without a GPU."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import softlight
from gpu_util import assert_close_to_float64, needs_gpu, random_rows, torch
from reference import POISON, assert_matches, in_threads, log_softmax_ref, logsumexp_ref

pytestmark = needs_gpu
hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install '.[test]')")
from hypothesis import HealthCheck, given, settings  # noqa: E402

import test_differential as diff  # noqa: E402  (the same generator and reference)

GPU_CASES = int(os.environ.get("SOFTLIGHT_GPU_TEST_CASES", "20000"))
TORCH_DTYPES = {"float32": "float32", "float16": "float16", "float64": "float64", "bfloat16": "bfloat16"}


@settings(max_examples=GPU_CASES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(diff.problems())
def test_gpu_against_float64(case):
    check_on_the_gpu(case)


@settings(max_examples=max(1, GPU_CASES // 25), deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(diff.long_problems())
def test_gpu_long_axes_against_float64(case):
    """The CPU's long-axis generator (up to 1.5M elements) against the GPU's kernel families."""
    check_on_the_gpu(case, long_axes=True)


def check_on_the_gpu(case, long_axes=False):
    shape, dtype, dim, steps, t, specials, seed, want_lse, backward, huge = case
    steps = tuple(abs(s) for s in steps)  # torch has no negative strides
    rng = np.random.default_rng(seed)
    base = np.asarray(diff.values(rng, tuple(n * s for n, s in zip(shape, steps)), dtype, huge), dtype=np.float64)
    full = torch.from_numpy(base).to("cuda", getattr(torch, TORCH_DTYPES[dtype]))
    x = full[tuple(slice(None, None, s) for s in steps)] if full.dim() else full
    if x.numel() and specials:
        for _ in range(specials):
            where = tuple(int(rng.integers(0, n)) for n in x.shape)
            x[where] = float(rng.choice([np.inf, -np.inf, np.nan, -np.inf]))
    xh = x.double().cpu().numpy()
    d = dim % max(x.dim(), 1)
    strides = x.stride()
    lo, hi = diff.T_RANGE["float64" if dtype == "float64" else "other"]
    refused = not (lo <= t <= hi)  # (every layout is computed: those that do not merge through a copy)
    out = torch.full_like(x, POISON)
    if refused:
        with pytest.raises(softlight.InvalidArgumentError):
            softlight.log_softmax(x, dim=dim, out=out, temperature=t)
        assert bool((out == POISON).all())
        return
    y, lse = softlight.log_softmax(x, dim=dim, out=out, temperature=t, return_lse=True)
    with np.errstate(all="ignore"):
        ref, ref_lse = diff.reference(xh, d, t)
        held = torch.from_numpy(ref).to(x.dtype).double().numpy()
        ref = np.where(np.isinf(held), held, ref)
        held_l = ref_lse.astype(np.float64 if dtype == "float64" else np.float32).astype(np.float64)
        ref_lse = np.where(np.isinf(held_l), held_l, ref_lse)
    what = f"shape {tuple(x.shape)} strides {strides} dim {dim} {dtype} T={t!r}"
    assert_matches(y.double().cpu().numpy(), ref, dtype, what)
    if want_lse:
        assert_matches(lse.double().cpu().numpy(), ref_lse, "float64" if dtype == "float64" else "float32", what)
    if backward and x.dim() and x.numel() and t == 1.0:
        dy = torch.randn_like(x)
        dx = softlight.log_softmax_backward(dy, y, dim=dim)
        dy64, y64 = dy.double(), y.double()
        ref_dx = (dy64 - torch.exp(y64) * dy64.sum(d, keepdim=True)).cpu().numpy()
        if not long_axes:
            assert_matches(dx.double().cpu().numpy(), ref_dx, dtype, "backward " + what)
            return
        # (the CPU test's bound: the accumulation type's rounding of sum(dy), times exp(y))
        atol, rtol = diff.TOL_GRAD[dtype]
        bound = (atol + rtol * (1 + np.abs(ref_dx) + (torch.exp(y64) * dy64.abs().sum(d, keepdim=True)).cpu().numpy()))
        err = np.abs(dx.double().cpu().numpy() - ref_dx)
        fin = np.isfinite(ref_dx)
        assert (err[fin] <= bound[fin]).all(), ("backward " + what, err[fin].max())


@pytest.mark.parametrize("shape,dim", [((3, 2), 1), ((3, 5000), 1), ((2, 300_000), 1), ((2, 4_000_000), 1),
                                       ((64, 4096), 1), ((8, 3000, 16), 1), ((3000, 5), 0)], ids=str)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_difference_from_the_max_past_the_type(dtype, shape, dim):
    """Rows whose x - max overflows the type ([3e38, -1e38] in float32) at a temperature that brings
    (x - max) / T back in range: y and the lse are finite, in each kernel family the shapes reach
    (tests/test_cpu_backend.py has the CPU's)."""
    big = float(np.finfo(dtype).max)
    t = big / 20
    x = (np.random.default_rng(7).uniform(-0.9, 0.9, shape) * big).astype(dtype)
    y, lse = softlight.log_softmax(torch.from_numpy(x).cuda(), dim=dim, temperature=t, return_lse=True)
    z = np.moveaxis((x.astype(np.longdouble) / t).astype(np.float64), dim, -1)
    assert_matches(np.moveaxis(y.cpu().numpy(), dim, -1), log_softmax_ref(z), dtype)
    assert_matches(lse.cpu().numpy(), logsumexp_ref(z), dtype)


def test_misaligned_device_pointers_are_refused_and_the_context_survives():
    raw = torch.zeros(4 * 1000 + 8, dtype=torch.uint8, device="cuda")
    y = torch.full((10, 100), POISON, device="cuda")
    with pytest.raises(softlight.InvalidArgumentError):
        softlight.log_softmax_raw(raw.data_ptr() + 2, y.data_ptr(), 10, 100, dtype="float32")
    torch.cuda.synchronize()
    assert bool((y == POISON).all())
    x = random_rows(10, 100, "float32")
    softlight.log_softmax(x, out=y)
    torch.cuda.synchronize()
    assert_close_to_float64(y, x, "float32")


FULL_GPU = textwrap.dedent(r"""
    import torch, softlight
    x = torch.randn(2, 1_000_000, device="cuda")  # grid groups: a workspace table a call
    y = torch.full_like(x, 7.0)
    filler, size = [], 1 << 34
    while size >= 1 << 20:
        try:
            filler.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        except RuntimeError:
            size //= 2
    try:
        softlight.log_softmax(x, out=y)
        torch.cuda.synchronize()
        print("no error: the workspace pool had memory")
    except softlight.OutOfMemoryError as e:
        assert isinstance(e, softlight.DeviceError) and isinstance(e, MemoryError), e
        print("out of memory:", e)
    del filler
    torch.cuda.empty_cache()
    assert bool((y == 7.0).all()), "written"  # (checked once there is memory for the check)
    softlight.log_softmax(x, out=y)
    torch.cuda.synchronize()
    assert float((y.double() - torch.log_softmax(x.double(), -1)).abs().max()) < 1e-5
    print("done")
""")


def test_a_full_gpu_gives_out_of_memory_and_the_next_call_works():
    r = subprocess.run([sys.executable, "-c", FULL_GPU], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1"))
    assert r.returncode == 0 and "done" in r.stdout, r.stdout + r.stderr
    assert "out of memory" in r.stdout, r.stdout  # the allocation failed, and said so


def test_sixteen_threads_on_sixteen_streams_get_exact_results():
    xs = [random_rows(64, 5000, "float32") for _ in range(16)]
    want = [torch.log_softmax(x, -1) for x in xs]
    mine = [softlight.log_softmax(x) for x in xs]
    torch.cuda.synchronize()

    def work(i):
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            for _ in range(20):
                y = softlight.log_softmax(xs[i])
        s.synchronize()
        return y
    got = in_threads(16, work)
    torch.cuda.synchronize()
    assert all(torch.equal(g, m) for g, m in zip(got, mine))
    assert all(float((g - w).abs().max()) < 1e-5 for g, w in zip(got, want))
