"""GPU test under compute-sanitizer's memcheck: one small problem of each kernel family (the ring's
clusters, rows in registers over a cluster, grid groups, rows in a grid's rings, peeled rows, tiles
over a non-last axis, rows in registers and in flat tiles, the backward), no access outside the
arrays. Raw allocations of the arrays' exact sizes (cuMemAlloc, sizes off 16 bytes) catch any read
past an array's last byte. Each result is checked against float64 too. Skipped without a GPU or
without compute-sanitizer on PATH."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from gpu_util import HAVE_GPU, WHY

SANITIZER = shutil.which("compute-sanitizer")

CHILD = textwrap.dedent(r"""
    import numpy as np
    import torch
    from cuda.bindings import driver as cu

    import softlight

    def check(y, x, dim, tol, what):
        ref = torch.log_softmax(x.double(), dim)
        err = float((y.double() - ref).abs().max())
        assert err <= tol, f"{what}: error {err}"

    torch.manual_seed(0)
    force = getattr(softlight._C, "force", None)  # tuning builds: forced paths (else those cases skip)
    ring = {"register_cluster": 0}  # rows the planner would hold in a cluster's registers
    cases = [((64, 32000), torch.bfloat16, -1, 0.07, ring),   # the ring, clusters of two
             ((8, 65536), torch.float32, -1, 1e-5, ring),     # the ring, clusters of eight
             ((64, 32000), torch.bfloat16, -1, 0.07, {}),     # rows in registers over a cluster, 4 CTAs
             ((9, 130000), torch.float32, -1, 1e-5, {}),      # the same, 16 CTAs, the last one short
             ((2, 1000000), torch.float32, -1, 1e-5, {}),     # grid groups
             ((4, 16384, 64), torch.float32, 1, 1e-5, {}),    # tiles over a non-last axis
             ((300, 100), torch.bfloat16, -1, 0.07, {}),      # flat tiles
             ((100, 8192), torch.float16, -1, 0.01, {}),      # rows in registers
             ((50, 50257), torch.float64, -1, 1e-12, {}),     # peeled rows in the ring
             ((50, 50257), torch.float32, -1, 1e-5, ring),    # the same, fp32
             ((50, 50257), torch.bfloat16, -1, 0.07, {}),     # peeled rows in registers over a cluster
             # rows held in a grid's rings (values to -36: half a bf16 step is 0.125), and forced on
             # rows of a partial last chunk, items of two chunks
             ((2, 2621440), torch.bfloat16, -1, 0.13, {}),
             ((37, 100000), torch.float32, -1, 1e-5, {"grid_rows": 1, "item_chunks": 2})]
    for shape, dtype, dim, tol, knobs in cases:
        if knobs and force is None:
            print("skipped (no tuning interface):", shape, dtype, knobs)
            continue
        if knobs:
            assert force(knobs) == 0
        x = torch.randn(shape, device="cuda", dtype=dtype) * 3
        check(softlight.log_softmax(x, dim=dim), x, dim, tol, f"{shape} {dtype} {knobs}")
        if knobs:
            force({})
    x = torch.randn(8, 65536, device="cuda") * 3
    y = torch.log_softmax(x, -1)
    dy = torch.randn_like(x)
    dx = softlight.log_softmax_backward(dy, y)
    ref = dy.double() - torch.exp(y.double()) * dy.double().sum(-1, keepdim=True)
    assert float((dx.double() - ref).abs().max()) <= 1e-4, "backward"

    # Peeled rows (x and y equally off 16 bytes) in exact-size allocations.
    def ok(r):
        e, *rest = r if isinstance(r, tuple) else (r,)
        assert e == cu.CUresult.CUDA_SUCCESS, e
        return rest[0] if len(rest) == 1 else rest
    rng = np.random.default_rng(0)
    # 50 257 and 32 767: rows in registers over a cluster; 999 and 1001: rows in one CTA's registers.
    for dtype, cols, off in [(np.float32, 50257, 0), (np.float16, 50257, 3), (np.float16, 32767, 1),
                             (np.float32, 999, 1), (np.float16, 1001, 5)]:
        rows = 5
        x = (rng.standard_normal((rows, cols)) * 3).astype(dtype)
        n = x.nbytes + off * x.itemsize
        xb, yb = ok(cu.cuMemAlloc(n)), ok(cu.cuMemAlloc(n))
        xp, yp = int(xb) + off * x.itemsize, int(yb) + off * x.itemsize
        ok(cu.cuMemcpyHtoD(xp, x.ctypes.data, x.nbytes))
        ok(cu.cuMemsetD8(yb, 0xFF, n))
        softlight.log_softmax_raw(xp, yp, rows, cols, dtype=np.dtype(dtype).name)
        ok(cu.cuCtxSynchronize())
        y = np.empty_like(x)
        ok(cu.cuMemcpyDtoH(y.ctypes.data, yp, y.nbytes))
        xd = x.astype(np.float64)
        ref = xd - xd.max(1, keepdims=True)
        ref -= np.log(np.exp(ref).sum(1, keepdims=True))
        err = float(np.abs(y.astype(np.float64) - ref).max())
        assert err <= (1e-5 if dtype == np.float32 else 0.01), f"raw {cols} {dtype}: error {err}"
        ok(cu.cuMemFree(xb))
        ok(cu.cuMemFree(yb))
    print("done")
""")


@pytest.mark.skipif(not HAVE_GPU or SANITIZER is None,
                    reason=WHY if not HAVE_GPU else "compute-sanitizer is not on PATH")
def test_memcheck_clean():
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    # Errors the driver API returns to its callers (cuda.bindings probes for entry points) are not
    # memory errors: not reported.
    r = subprocess.run([SANITIZER, "--tool", "memcheck", "--report-api-errors", "no", "--error-exitcode", "97",
                        "--print-limit", "5", sys.executable, "-c", CHILD],
                       capture_output=True, text=True, timeout=600, env=env)
    out = r.stdout + r.stderr
    found = [line for line in out.splitlines()
             if any(w in line for w in ("Invalid", "ERROR SUMMARY", "Error", "error:", "at "))]
    assert r.returncode == 0 and "done" in r.stdout and "ERROR SUMMARY: 0 errors" in out, "\n".join(found[:60])
