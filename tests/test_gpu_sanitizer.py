"""GPU tests under compute-sanitizer: memcheck, racecheck, synccheck and initcheck, each over one
small problem of every kernel softlight launches (KERNELS), each result checked against float64.
memcheck, synccheck and initcheck must report nothing. racecheck models __syncthreads-style
barriers only: it also reports the ring kernels' accesses ordered by mbarriers, relaxed atomics
and volatile hand-offs, which are not data races in PTX's memory model; the test requires every
report to be of those classes (modelled_elsewhere) and none between plain accesses.

Which kernel a problem reaches is the planner's own answer (kernel_of, from _C.plan_rows and
_C.plan_axis with the problem's layout flags as the library computes them), and test_coverage
asserts that the cases reach every kernel. The arrays are raw allocations of their exact sizes
(cuMemAlloc, offsets in elements where a case asks for one), so that memcheck sees any access past
an array's last byte and initcheck any read of memory never written. Skipped without a GPU or
without compute-sanitizer on PATH; cases that force a path need a tuning build.

Run one tool over some cases by hand:
    python tests/test_gpu_sanitizer.py racecheck grid_rows register_rows
"""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import paths
from gpu_util import HAVE_GPU, TUNING, WHY
from reference import TOL

SANITIZER = shutil.which("compute-sanitizer")
TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
ELEM = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}

# kernel -> the case that reaches it: op, shape, dim, dtype, offset of x and of the output (in
# elements from a 256-byte aligned allocation), values forced through the tuning interface.
CASES = {
    "register_rows": dict(shape=(100, 8192), dtype="float16"),
    "register_rows_peeled": dict(shape=(64, 1001), dtype="float16", offset=(5, 5)),
    "warp_rows": dict(shape=(64, 203), dtype="float32", offset=(1, 1)),
    "flat_rows": dict(shape=(300, 100), dtype="bfloat16"),
    "short_rows": dict(shape=(1000, 4), dtype="float32"),
    "single_column": dict(shape=(1000, 1), dtype="float32"),
    "block_rows": dict(shape=(6, 100003), dtype="float32", offset=(1, 2)),
    "register_clusters": dict(shape=(64, 32000), dtype="bfloat16"),
    "register_clusters_peeled": dict(shape=(50, 50257), dtype="bfloat16", offset=(3, 3)),
    "cluster_rows": dict(shape=(8, 65536), dtype="float32", force={"register_cluster": 0}),
    "cluster_rows_peeled": dict(shape=(50, 50257), dtype="float64"),
    "grid_rows": dict(shape=(2, 1000000), dtype="float32"),
    "grid_rows_spill": dict(shape=(2, 2097152), dtype="float32"),
    "cluster_tiles": dict(shape=(4, 512, 64), dtype="float32", dim=1),
    "split_rows": dict(shape=(3, 5000, 7), dtype="float32", dim=1),
    "short_rows_backward": dict(op="backward", shape=(1000, 8), dtype="float16"),
    "warp_rows_backward": dict(op="backward", shape=(64, 1000), dtype="float32"),
    "cta_rows_backward": dict(op="backward", shape=(16, 4000), dtype="float32"),
    "cluster_rows_backward": dict(op="backward", shape=(8, 65536), dtype="float32"),
    "split_rows_backward": dict(op="backward", shape=(3, 5000, 7), dtype="float32", dim=1),
    # The consumers of the log-sum-exp (consumer_rows.cu: a CTA a row, no planner), each checked
    # against the CPU entry on the same values. x at an odd offset: the element-wise path.
    "row_stats": dict(op="row_stats", shape=(37, 3001), dtype="bfloat16", offset=(3, 0)),
    # The gradient's flat pass (one token a row; x and dx 16 bytes apart: at the same place in a pack),
    # and a CTA a row (two tokens a row, dx 4 bytes off x's place; rows of 2250 packs: a step of four
    # packs a thread, then the rest).
    "row_stats_grad": dict(op="row_stats_grad", shape=(9, 9001), dtype="float32", offset=(0, 4), tokens=1),
    "row_stats_grad_rows": dict(op="row_stats_grad", shape=(9, 9000), dtype="float32", offset=(0, 1)),
    "cross_entropy": dict(op="cross_entropy", shape=(37, 3000), dtype="float16", offset=(8, 8)),
    # Without label smoothing, in the register clusters of the log-softmax (rows off 16 bytes: peeled).
    "cross_entropy_clusters": dict(op="cross_entropy", shape=(9, 50257), dtype="bfloat16", offset=(3, 3),
                                   smoothing=0.0),
    # ... and in cluster_rows' ring (rows of 151936 bf16; rows of 200003 fp32 off 16 bytes: peeled).
    "cross_entropy_ring": dict(op="cross_entropy", shape=(9, 151936), dtype="bfloat16", smoothing=0.0),
    "cross_entropy_ring_peeled": dict(op="cross_entropy", shape=(5, 200003), dtype="float32", offset=(3, 3),
                                      smoothing=0.0),
    # Only the statistics of the max and sum, in the register clusters of the log-softmax (peeled);
    # and with the entropy and moment (every statistic but the row's sum), peeled too.
    "row_stats_clusters": dict(op="row_stats", shape=(9, 50257), dtype="bfloat16", offset=(3, 0), stats="max_sum"),
    "row_stats_clusters_moment": dict(op="row_stats", shape=(9, 32001), dtype="bfloat16", offset=(3, 0),
                                      stats="no_sum"),
    # Both again in one group's registers (register_rows): cross-entropy in packs and peeled; the
    # statistics of the max and sum in packs, and every statistic but the sum peeled.
    "cross_entropy_registers": dict(op="cross_entropy", shape=(37, 3000), dtype="float16", smoothing=0.0),
    "cross_entropy_registers_peeled": dict(op="cross_entropy", shape=(37, 3001), dtype="bfloat16", offset=(3, 3),
                                           smoothing=0.0),
    "row_stats_registers": dict(op="row_stats", shape=(37, 3000), dtype="float32", stats="max_sum"),
    "row_stats_registers_moment": dict(op="row_stats", shape=(37, 3001), dtype="bfloat16", offset=(3, 0),
                                       stats="no_sum"),
    # ... in short rows (a pack of each of four rows a lane) and in flat tiles (rows of 10 bf16, 20
    # bytes; a last tile of 44 rows): cross-entropy; the statistics of the max and sum, and every
    # statistic but the sum.
    "cross_entropy_short_rows": dict(op="cross_entropy", shape=(1000, 16), dtype="float32", smoothing=0.0),
    "cross_entropy_flat_rows": dict(op="cross_entropy", shape=(300, 10), dtype="bfloat16", smoothing=0.0),
    "row_stats_short_rows": dict(op="row_stats", shape=(1000, 32), dtype="bfloat16", stats="max_sum"),
    "row_stats_short_rows_moment": dict(op="row_stats", shape=(1000, 8), dtype="float32", stats="no_sum"),
    "row_stats_flat_rows": dict(op="row_stats", shape=(300, 100), dtype="bfloat16", stats="max_sum"),
    "row_stats_flat_rows_moment": dict(op="row_stats", shape=(300, 7), dtype="float32", stats="no_sum"),
    # Cross-entropy's loss alone (no gradient) where the statistics are planned: a group's registers,
    # the register clusters (peeled), short rows and flat tiles.
    "cross_entropy_loss_registers": dict(op="cross_entropy", shape=(37, 3000), dtype="float16", smoothing=0.0,
                                         loss_only=True),
    "cross_entropy_loss_clusters": dict(op="cross_entropy", shape=(9, 50257), dtype="bfloat16", offset=(3, 0),
                                        smoothing=0.0, loss_only=True),
    "cross_entropy_loss_short_rows": dict(op="cross_entropy", shape=(1000, 16), dtype="float32", smoothing=0.0,
                                          loss_only=True),
    "cross_entropy_loss_flat_rows": dict(op="cross_entropy", shape=(300, 10), dtype="bfloat16", smoothing=0.0,
                                         loss_only=True),
    # Cross-entropy's gradient in block_rows' shared memory: x one element into its rows and a fresh
    # gradient (element by element); rows misaligned alike, peeled, the clusters' peeling off.
    "cross_entropy_block_rows": dict(op="cross_entropy", shape=(9, 20000), dtype="float32", offset=(1, 0),
                                     smoothing=0.0),
    "cross_entropy_block_rows_peeled": dict(op="cross_entropy", shape=(9, 20001), dtype="float32", offset=(3, 3),
                                            smoothing=0.0, force={"peel_clusters": 0}),
    # More than 65536 rows: the kept rows' count over a grid and the losses' sum in pieces.
    "cross_entropy_pieces": dict(op="cross_entropy", shape=(70001, 10), dtype="bfloat16", smoothing=0.0),
    "grad_scale": dict(op="grad_scale", shape=(37, 3001), dtype="float64", offset=(1, 1)),
}
CONSUMERS = ("row_stats", "row_stats_grad", "cross_entropy", "grad_scale")


def _case(name):
    c = dict(op="forward", dim=-1, offset=(0, 0), force={})
    c.update(CASES[name])
    c["dim"] %= len(c["shape"])
    return c


def _device():
    import gpu_util
    return gpu_util.device_plan_args()


def _rows_flags(c, elem):
    """The layout flags of a rows problem as the library computes them (entry/gpu_entry.cpp, rows_problem)
    for arrays at the case's offsets from 256-byte aligned allocations, contiguous rows."""
    x, y = (o * elem for o in c["offset"])
    rows, cols = c["shape"]
    row = cols * elem

    def start_on(b):
        return x % b == 0 and y % b == 0 and (rows == 1 or row % b == 0)
    return dict(aligned16=row % 16 == 0 and start_on(16), aligned8=row % 8 == 0 and start_on(8),
                rows128=start_on(128), peelable=x % elem == 0 and (x - y) % 16 == 0,
                flat16=x % 16 == 0 and y % 16 == 0)


def kernel_of(name, device=None):
    """The kernel the library launches for the case on `device` (this GPU's by default): the
    planner's answer, named as KERNELS."""
    import gpu_util
    dev = device or _device()
    c = _case(name)
    if c["op"] in CONSUMERS:
        if c["op"] == "cross_entropy" and c["shape"][0] > 65536:
            return "cross_entropy_pieces"
        if (c["op"] == "cross_entropy" and c.get("smoothing", 0.1) == 0.0) or c.get("stats") in ("max_sum", "no_sum"):
            # (row_stats and the loss alone plan their rows with x as y: the library writes no element)
            gathers = c["op"] == "row_stats" or c.get("loss_only")
            flags = _rows_flags(dict(c, offset=(c["offset"][0],) * 2) if gathers else c, ELEM[c["dtype"]])
            p = gpu_util.plan(*c["shape"], ELEM[c["dtype"]], flags.pop("aligned16"), **flags, **dev, **c["force"])
            op = "cross_entropy_loss" if c.get("loss_only") else c["op"]
            if op == "cross_entropy" and p["family"] == "block_rows" and p["resident"]:
                return "cross_entropy_block_rows" + ("_peeled" if p["peel"] else "")
            if p["family"] == "register_clusters":
                return op + "_clusters" + ("_moment" if c.get("stats") == "no_sum" else "")
            if p["family"] == "register_rows" and p["vec"] * ELEM[c["dtype"]] == 16:
                if c["op"] == "row_stats":
                    return "row_stats_registers" + ("_moment" if c.get("stats") == "no_sum" else "")
                return op + "_registers" + ("_peeled" if p["peel"] else "")
            if p["family"] == "flat_rows" or (p["family"] == "short_rows" and p["rows_per_lane"] == 4):
                return f"{op}_{p['family']}" + ("_moment" if c.get("stats") == "no_sum" else "")
            if c["op"] == "cross_entropy" and p["family"] == "cluster_rows":
                return "cross_entropy_ring" + ("_peeled" if p["peel"] else "")
        if c["op"] == "row_stats_grad":  # (contiguous rows of at least a pack)
            x, y = (o * ELEM[c["dtype"]] for o in c["offset"])
            flat = (x - y) % 16 == 0 and c["shape"][1] * ELEM[c["dtype"]] >= 16 and c.get("tokens", 2) <= 1
            return c["op"] + ("" if flat else "_rows")
        return c["op"]
    elem = ELEM[c["dtype"]]
    shape, d = c["shape"], c["dim"]
    outer = 1
    for n in shape[:d]:
        outer *= n
    inner = 1
    for n in shape[d + 1:]:
        inner *= n
    if c["op"] == "forward" and inner == 1:
        flags = _rows_flags(c, elem)
        p = gpu_util.plan(outer, shape[d], elem, flags.pop("aligned16"), **flags, **dev, **c["force"])
        fam = p["family"]
        if fam == "register_clusters":
            return "register_clusters" + ("_peeled" if p["peel"] else "")
        if fam == "register_rows":  # rows in packs, or warp_rows_kernel's vectors of 8 bytes or an element
            return ("register_rows" + ("_peeled" if p["peel"] else "")) if p["vec"] * elem == 16 else "warp_rows"
        if fam == "cluster_rows":
            return "cluster_rows" + ("_peeled" if p["peel"] else "")
        if fam == "grid_rows":
            return "grid_rows" + ("_spill" if p["spill_chunks"] > 0 else "")
        return fam
    rows = inner == 1
    aligned = shape[d] * elem % 16 == 0 if rows else False
    tiles = not rows and c["op"] == "forward" and inner * elem % 16 == 0
    dev = {k: v for k, v in dev.items() if k != "cc_minor"}
    p = gpu_util.plan_axis_args(outer, shape[d], inner, elem, rows, aligned, c["op"] == "backward",
                                tiles_aligned=tiles, **dev, **c["force"])
    fam = p["family"]
    if c["op"] == "backward":
        if fam == "register_rows":
            return "cta_rows_backward" if p["group"] > 32 else "warp_rows_backward"
        return fam + "_backward"
    return fam


KERNELS = sorted(CASES)

CHILD = textwrap.dedent(r"""
    import json, sys
    import numpy as np
    import torch
    from cuda.bindings import driver as cu
    import softlight

    cases = json.loads(sys.argv[1])
    try:
        from softlight._planner import force
    except ImportError:
        force = None

    def ok(r):
        e, *rest = r if isinstance(r, tuple) else (r,)
        assert e == cu.CUresult.CUDA_SUCCESS, e
        return rest[0] if len(rest) == 1 else rest

    class Raw:
        # An array in an allocation of exactly its size (plus its offset): `offset` elements in.
        def __init__(self, host, offset):
            self.host = host
            self.nbytes = host.nbytes + offset * host.itemsize
            self.base = ok(cu.cuMemAlloc(max(self.nbytes, 1)))
            self.ptr = int(self.base) + offset * host.itemsize
            ok(cu.cuMemcpyHtoD(self.ptr, host.ctypes.data, host.nbytes))
        def get(self):
            out = np.empty_like(self.host)
            ok(cu.cuCtxSynchronize())
            ok(cu.cuMemcpyDtoH(out.ctypes.data, self.ptr, out.nbytes))
            return out
        def free(self):
            ok(cu.cuMemFree(self.base))

    def consumer(name, c, xt, as_dev, code):
        # The GPU entry on exact-size allocations against the CPU entry on the same host values.
        rows, cols = c["shape"]
        dtype = c["dtype"]
        acc = np.float64 if dtype == "float64" else np.float32
        xh = (xt.view(torch.int16) if dtype == "bfloat16" else xt).numpy()
        xr = as_dev(xt, c["offset"][0])
        idx = rng.integers(0, cols, (rows, 2)).astype(np.int64)
        small = lambda n: np.full(n, np.nan, acc)
        live = [xr]
        def dev(a, off=0):
            r = Raw(np.ascontiguousarray(a), off)
            live.append(r)
            return r
        def same(got, want, what):
            rtol = 1e-12 if acc is np.float64 else 2e-5
            fine = np.isclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=rtol, equal_nan=True)
            assert fine.all(), (name, what, np.argwhere(~fine)[:5].tolist())
        if c["op"] == "row_stats":
            host = [small(rows), small(rows), small(2 * rows), small(2 * rows)] + [small(rows) for _ in range(4)]
            outs = [dev(h, c["offset"][1]) for h in host]
            ir = dev(idx)
            # lse, entropy, logprobs, picked, sum, max, sumexp, moment: all, those of the max and sum, or
            # all but the sum
            asked = {"max_sum": [True, False, True, True, False, True, True, False],
                     "no_sum": [True, True, True, True, False, True, True, True]}.get(c.get("stats"), [True] * 8)
            assert softlight._C.row_stats(xr.ptr, cols, rows, cols, code, 1.3, ir.ptr, 2, 2, 0, False,
                                          [o.ptr if a else 0 for o, a in zip(outs, asked)], 0, True, 0) == 0
            assert softlight._C.row_stats(xh.ctypes.data, cols, rows, cols, code, 1.3, idx.ctypes.data, 2, 2, 0,
                                          False, [h.ctypes.data if a else 0 for h, a in zip(host, asked)], 0) == 0
            for i, (o, h, a) in enumerate(zip(outs, host, asked)):
                if a:
                    same(o.get(), h, i)
        elif c["op"] == "row_stats_grad":
            host = [small(rows), small(rows)] + [small(rows) for _ in range(8)]
            assert softlight._C.row_stats(xh.ctypes.data, cols, rows, cols, code, 0.7, 0, 0, 0, 0, False,
                                          [host[0].ctypes.data, host[1].ctypes.data] + [0] * 6, 0) == 0
            k = c.get("tokens", 2)
            tok = np.ascontiguousarray(idx[:, :k])
            d = [rng.standard_normal(rows).astype(acc) for _ in range(3)] + [rng.standard_normal(k * rows).astype(acc)
                                                                           for _ in range(2)]
            # lse, entropy, d_lse, d_entropy, d_logprobs, d_picked, d_sum
            ins_h = [host[0], host[1], d[0], d[1], d[3], d[4], d[2]]
            ins = [dev(a) for a in ins_h]
            ir = dev(tok)
            want = np.full_like(xh, 0)
            out = dev(np.zeros_like(xh), c["offset"][1])
            assert softlight._C.row_stats_backward(xr.ptr, cols, out.ptr, cols, rows, cols, code, 0.7, ir.ptr, k, k, 0,
                                                   False, [a.ptr for a in ins], 0, True, 0) == 0
            assert softlight._C.row_stats_backward(xh.ctypes.data, cols, want.ctypes.data, cols, rows, cols, code, 0.7,
                                                   tok.ctypes.data, k, k, 0, False, [a.ctypes.data for a in ins_h],
                                                   0) == 0
            same(out.get(), want, "dx")
        elif c["op"] == "cross_entropy":
            tgt = idx[:, 0].copy()
            tgt[1] = -100
            tr = dev(tgt)
            loss, lse = dev(small(1)), dev(small(rows))
            alone = c.get("loss_only", False)
            grad = None if alone else dev(np.zeros_like(xh), c["offset"][1])
            hl, hs, hg = small(1), small(rows), np.zeros_like(xh)
            eps = c.get("smoothing", 0.1)
            assert softlight._C.cross_entropy(xr.ptr, cols, tr.ptr, rows, cols, code, 1.0, eps, 1e-3, True, -100, 2,
                                              loss.ptr, lse.ptr, 0 if alone else grad.ptr, cols, 0, True, 0) == 0
            assert softlight._C.cross_entropy(xh.ctypes.data, cols, tgt.ctypes.data, rows, cols, code, 1.0, eps, 1e-3,
                                              True, -100, 2, hl.ctypes.data, hs.ctypes.data,
                                              0 if alone else hg.ctypes.data, cols, 0) == 0
            same(loss.get(), hl, "loss")
            same(lse.get(), hs, "lse")
            if alone:
                pass
            elif dtype in ("float16", "bfloat16"):  # (compared as values)
                a, b = torch.from_numpy(grad.get()), torch.from_numpy(hg)
                a, b = ((a.view(torch.bfloat16), b.view(torch.bfloat16)) if dtype == "bfloat16" else (a, b))
                assert torch.allclose(a.double(), b.double(), rtol=1e-2, atol=1e-4), (name, "grad")
            else:
                same(grad.get(), hg, "grad")
        else:
            f = rng.standard_normal(rows).astype(acc)
            f[::3] = 1.0
            fr = dev(f)
            want = xh.copy()
            assert softlight._C.cross_entropy_grad_scale(xr.ptr, cols, rows, cols, code, fr.ptr, rows, 0, True, 0) == 0
            assert softlight._C.cross_entropy_grad_scale(want.ctypes.data, cols, rows, cols, code, f.ctypes.data, rows,
                                                         0) == 0
            same(xr.get(), want, "grad")
        for r in live:
            r.free()

    torch.empty(1, device="cuda")  # the device's primary context, current on this thread for cuMemAlloc
    torch.cuda.synchronize()
    rng = np.random.default_rng(0)
    for name, c in cases:
        if c["force"]:
            if force is None:
                print("skipped (no tuning interface):", name)
                continue
            assert force(c["force"]) == 0
        shape, dim, dtype = tuple(c["shape"]), c["dim"], c["dtype"]
        tdt = getattr(torch, dtype)
        def rounded(a):
            # a (float64) in the case's dtype: the torch tensor, and its values as float64
            t = torch.from_numpy(np.ascontiguousarray(a)).to(tdt)
            return t, t.double().numpy()
        def as_dev(t, off):
            return Raw((t.view(torch.int16) if dtype == "bfloat16" else t).numpy(), off)
        def back(r):
            h = torch.from_numpy(r.get())
            return (h.view(tdt) if dtype == "bfloat16" else h).double().numpy()
        xt, xd = rounded(rng.standard_normal(shape) * 3)
        if c["op"] in ("row_stats", "row_stats_grad", "cross_entropy", "grad_scale"):
            consumer(name, c, xt, as_dev, code=softlight._dtypes.BY_NAME[dtype])
            if c["force"]:
                force({})
            print("ran", name)
            continue
        ref = xd - xd.max(dim, keepdims=True)
        ref = ref - np.log(np.exp(ref).sum(dim, keepdims=True))
        strides = [s // 8 for s in np.ones(shape).strides]
        code = softlight._dtypes.BY_NAME[dtype]
        xr = as_dev(xt, c["offset"][0])
        out = as_dev(torch.full(shape, float("nan"), dtype=tdt), c["offset"][1])  # poisoned
        if c["op"] == "forward":
            st = softlight._C.forward(xr.ptr, shape, strides, out.ptr, strides, dim, code, True, 0, 1.0, 0)
            want = ref
        else:
            yt, yq = rounded(ref)
            gt, dq = rounded(rng.standard_normal(shape))
            yr, g = as_dev(yt, 0), as_dev(gt, 0)
            st = softlight._C.backward(g.ptr, shape, strides, yr.ptr, strides, out.ptr, strides, dim, code, True, 0)
            want = dq - np.exp(yq) * dq.sum(dim, keepdims=True)
        assert st == 0, (name, st)
        got = back(out)
        atol, rtol = c["tol"]
        if c["op"] == "backward":  # the row's sum of dy, accumulated, scales the absolute error
            atol *= 1 + float(np.abs(dq.sum(dim)).max())
        bad = ~(np.abs(got - want) <= atol + rtol * np.abs(want))  # NaN fails too
        assert not bad.any(), (name, np.argwhere(bad)[:5].tolist(), float(np.nanmax(np.abs(got - want))))
        for r in [xr, out] + ([yr, g] if c["op"] == "backward" else []):
            r.free()
        if c["force"]:
            force({})
        print("ran", name)
    print("done")
""")


# Accesses the ring kernels order by means racecheck does not model, each a class of its reports:
#   a bulk copy (TMA) into a ring slot, after the slot's readers have arrived on its empty barrier;
#   single-copy atomic messages between CTAs (ld/st.relaxed, hopper.cuh), morally strong in PTX;
#   the volatile progress counters and hand-off words of one CTA's roles (volatile accesses are
#   relaxed, morally strong, in PTX), each published after what it guards by a fence.
_BULK = ("bulk_load(", "bulk_load_policy")
_RELAXED = ("load_relaxed_", "store_relaxed_")
_VOLATILE = re.compile(r"\b(rows_started|rows_done|tiles_started|meta|queue|queued|merged|row_tag|row_word)\b")
_SITE = re.compile(r"(?:between|and) (Read|Write) access at (.*?)\+0x[0-9a-f]+ in ([\w.]+):(\d+)")
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "src")


def _source_path(name):
    """A device source named in a report (its base name; the device sources' names are unique in src/)."""
    base = os.path.basename(name)
    for root, _, files in os.walk(SRC):
        if base in files:
            return os.path.join(root, base)
    return None


def _source_line(name, line):
    path = _source_path(name)
    if path is None:
        return ""
    with open(path) as f:
        lines = f.read().splitlines()
    return lines[line - 1] if 0 < line <= len(lines) else ""


def race_pairs(out):
    """The (site, site) pairs of racecheck's analysis report: site = (access, function, file, line)."""
    pairs, first = [], None
    for line in out.splitlines():
        m = _SITE.search(line)
        if not m:
            continue
        site = (m.group(1), m.group(2), m.group(3), int(m.group(4)))
        if "Race reported between" in line:
            first = site
        elif first is not None:
            pairs.append((first, site))
    return pairs


def modelled_elsewhere(pair):
    """Whether racecheck reports the pair only because it does not model its ordering (above)."""
    (_, f1, file1, l1), (_, f2, file2, l2) = pair
    if any(b in f for f in (f1, f2) for b in _BULK):
        return True
    if all(any(r in f for r in _RELAXED) for f in (f1, f2)):
        return True
    return all(_VOLATILE.search(_source_line(f, n)) for f, n in ((file1, l1), (file2, l2)))


def run_tool(tool, names):
    cases = [(n, dict(_case(n), tol=TOL[_case(n)["dtype"]])) for n in names]
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    args = [SANITIZER, "--tool", tool, "--error-exitcode", "97", "--print-limit", "1000"]
    if tool == "memcheck":
        # Errors the driver returns to its callers (cuda.bindings probes for entry points) are not
        # memory errors.
        args += ["--report-api-errors", "no"]
    if tool == "racecheck":
        args += ["--racecheck-report", "analysis"]
    return subprocess.run(args + [sys.executable, "-c", CHILD, json.dumps(cases)], capture_output=True, text=True,
                          timeout=900, env=env)


needs_sanitizer = pytest.mark.skipif(not HAVE_GPU or SANITIZER is None,
                                     reason=WHY if not HAVE_GPU else "compute-sanitizer is not on PATH")


def test_race_classes_are_told_apart():
    """The racecheck classifier (CPU): reports of the classes above pass, one between plain accesses
    (a reduction's scratch, here) does not."""
    report = "\n".join([
        "========= Error: Race reported between Write access at softlight::bulk_load(unsigned int, const void *, "
        "unsigned int, unsigned int)+0x3bd0 in hopper.cuh:97",
        "=========     and Read access at softlight::unpack_words(const unsigned int (&)[4], float (&)[4])+0x5630 "
        "in packs.cuh:22 [507904 hazards]",
        "========= Error: Race reported between Read access at softlight::load_relaxed_cluster(unsigned int)+0x1a80 "
        "in hopper.cuh:174",
        "=========     and Write access at softlight::store_relaxed_cluster(unsigned int, unsigned long)+0x3550 in "
        "hopper.cuh:162 [368 hazards]",
        "========= Error: Race reported between Write access at softlight::block_max_sum(float)+0x100 in "
        "reductions.cuh:1",
        "=========     and Read access at softlight::block_max_sum(float)+0x200 in reductions.cuh:2 [3 hazards]"])
    pairs = race_pairs(report)
    assert [modelled_elsewhere(p) for p in pairs] == [True, True, False]


def test_coverage():
    """Each case reaches the kernel it names, by the planner's answer for an H100 (the cases are
    chosen for Hopper's kernel families), with or without a GPU."""
    for name in KERNELS:
        assert kernel_of(name, paths.H100) == name, (name, kernel_of(name, paths.H100))


def _ran(r, names):
    out = r.stdout + r.stderr
    assert "done" in r.stdout, out[-6000:]
    ran = {line.split()[1] for line in r.stdout.splitlines() if line.startswith("ran ")}
    assert ran == set(names), sorted(set(names) - ran)
    return out


def _names():
    return [n for n in KERNELS if TUNING or not _case(n)["force"]]


@needs_sanitizer
@pytest.mark.parametrize("tool", ["memcheck", "synccheck", "initcheck"])
def test_sanitizer_clean(tool):
    names = _names()
    r = run_tool(tool, names)
    out = _ran(r, names)
    assert r.returncode == 0 and "ERROR SUMMARY: 0 errors" in out, out[-6000:]
    if not TUNING:
        pytest.skip(f"ran {len(names)} of {len(KERNELS)} kernels: the rest need a tuning build")


@needs_sanitizer
def test_racecheck_reports_only_orderings_it_does_not_model():
    """racecheck: no hazard between plain accesses. It reports the ring kernels' bulk copies into a
    slot, relaxed atomic messages and volatile hand-offs (see _BULK); each report must be one of
    those, by the functions and source lines it names."""
    names = _names()
    r = run_tool("racecheck", names)
    out = _ran(r, names)
    assert r.returncode in (0, 97) and "RACECHECK SUMMARY" in out, out[-6000:]
    if "Race reported between" in out and not _SITE.search(out):
        pytest.skip("racecheck's reports name no source lines, by which they are sorted: build with "
                    "-C cmake.define.SOFTLIGHT_LINEINFO=ON")
    pairs = race_pairs(out)
    assert (r.returncode == 0) == (not pairs), out[-6000:]  # every error is parsed
    unknown = [p for p in pairs if not modelled_elsewhere(p)]
    assert not unknown, unknown[:10]


if __name__ == "__main__":
    r = run_tool(sys.argv[1], sys.argv[2:] or KERNELS)
    print(r.stdout[-20000:], r.stderr[-20000:])
    sys.exit(r.returncode)
