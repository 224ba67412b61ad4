"""GPU tests: every kernel family against float64 for all four dtypes, across each family's
boundaries, misaligned and strided memory, in place, many rows, tensors over 2^31 elements,
special values equal to torch's, and torch/CuPy/JAX arrays in and out. Skipped without a GPU."""
import threading

import numpy as np
import pytest

import softlight
from softlight import _C
import paths
from gpu_util import (DTYPES, FORCED, assert_close_to_float64, assert_lse_close, axis_plan, device_plan_args,
                      needs_gpu, on_path, plan, poisoned_like, random_rows, tdtype, torch)
from paths import COLS, ELEM, rows_for
from reference import POISON, SPECIAL_ROWS, TOL, special_matrix

pytestmark = needs_gpu


def planned(rows, cols, dtype, aligned=True, peelable=False):
    """The plan the library makes for this problem on this GPU (forced values included). peelable:
    x and y rows misaligned alike (the rows of contiguous arrays)."""
    e = ELEM[dtype]
    # aligned: a contiguous array from torch's allocator (its base on 16 bytes and more: 512).
    return plan(rows, cols, e, aligned and cols * e % 16 == 0, **device_plan_args(), **FORCED,
                aligned8=aligned and cols * e % 8 == 0, flat16=aligned, peelable=peelable,
                rows128=aligned and cols * e % 128 == 0)


def run_and_check(x, dtype, what, out=None):
    y = poisoned_like(x) if out is None else out
    r = softlight.log_softmax(x, out=y)
    assert r is y
    torch.cuda.synchronize()
    assert_close_to_float64(y, x, dtype, what)
    return y


def test_this_gpu_plans_as_the_h100_the_planner_tests_pin():
    """On an H100 or H200 (sm_90, 132 SMs) the library plans with the device test_planner pins the
    GPU tests' paths for (tests/paths.py): there, no test below skips for its path."""
    dev = device_plan_args()
    if (dev["cc_major"], dev["sm_count"]) != (9, 132):
        pytest.skip(f"not a GPU of the pinned profile: {dev}")
    assert dev == paths.H100


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", COLS)
def test_families_against_float64(cols, dtype):
    x = random_rows(rows_for(cols, dtype), cols, dtype)
    p = planned(*x.shape, dtype)
    run_and_check(x, dtype, f"{dtype} {tuple(x.shape)} {p['family']} cluster={p['cluster']}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [33, 1000, 4096, 8192, 50000, 393216])
def test_misaligned_pointers(cols, dtype):
    rows = rows_for(cols, dtype, 1 << 22)
    buf = random_rows(1, rows * cols + 1, dtype).reshape(-1)
    x = buf[1:].view(rows, cols)  # one element past an aligned start
    run_and_check(x, dtype, f"misaligned x {dtype} {rows}x{cols}")
    out_buf = torch.full((rows * cols + 1,), POISON, dtype=tdtype(dtype), device="cuda")
    run_and_check(random_rows(rows, cols, dtype), dtype, "misaligned y", out=out_buf[1:].view(rows, cols))
    assert float(out_buf[0]) == POISON  # the element before y is left alone


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols,pad", [(100, 3), (1000, 8), (8192, 64), (131072, 8), (131072, 5)])
def test_row_strided(cols, pad, dtype):
    rows = rows_for(cols, dtype, 1 << 22)
    big = random_rows(rows, cols + pad, dtype)
    x = big[:, :cols]
    out_big = torch.full_like(big, POISON)
    run_and_check(x, dtype, f"strided {dtype}", out=out_big[:, :cols])
    assert bool((out_big[:, cols:] == POISON).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [7, 1000, 4096, 65536, 393216, 1048576])
def test_in_place(cols, dtype):
    x = random_rows(rows_for(cols, dtype), cols, dtype)
    ref_in = x.clone()
    softlight.log_softmax(x, out=x)
    torch.cuda.synchronize()
    assert_close_to_float64(x, ref_in, dtype, "in place")


@pytest.mark.parametrize("shape", [(70_000, 33), (70_000, 1000), (70_000, 3000), (66_000, 8192)])
def test_more_than_65535_rows(shape):
    x = random_rows(*shape, "float32")
    run_and_check(x, "float32", f"{shape}")


def check_rows(y, x, dtype, idx, chunk=1 << 27):
    """Rows of y against a float64 reference built from reductions, chunk by chunk, so that rows
    longer than a framework's own softmax accepts can be checked too."""
    atol, rtol = TOL[dtype]
    for i in idx:
        xr, yr = x[i], y[i]
        m = float(xr.max())
        s = sum(float(torch.exp(xr[j:j + chunk].double() - m).sum()) for j in range(0, xr.numel(), chunk))
        log_s = float(np.log(s))
        for j in range(0, xr.numel(), chunk):
            ref = (xr[j:j + chunk].double() - m) - log_s
            err = (yr[j:j + chunk].double() - ref).abs()
            assert bool((err <= atol + rtol * ref.abs()).all()), f"row {i}, chunk at {j}: {float(err.max())}"


@pytest.mark.parametrize("shape,dtype", [((32_769, 65_536), "float16"), ((67_108_865, 32), "bfloat16"),
                                         ((1, 2**31 + 16), "bfloat16")],
                         ids=["cluster-f16", "warp-bf16", "one-row-bf16"])
def test_over_two_to_the_31_elements(shape, dtype):
    assert shape[0] * shape[1] > 2**31
    x = random_rows(*shape, dtype)
    y = poisoned_like(x)
    softlight.log_softmax(x, out=y)
    torch.cuda.synchronize()
    rows = shape[0]
    check_rows(y, x, dtype, [0, 1, rows // 2, rows - 2, rows - 1] if rows > 2 else [0])
    assert not bool((y == POISON).any()), "every element written"
    del x, y
    torch.cuda.empty_cache()


def test_special_values_table_matches_torch():
    for dtype in ("float32", "bfloat16", "float16", "float64"):
        for row, expected in SPECIAL_ROWS:
            x = torch.tensor([row], dtype=tdtype(dtype), device="cuda")
            t = torch.log_softmax(x, -1).double().cpu().numpy()
            y = softlight.log_softmax(x).double().cpu().numpy()
            # torch's behaviour, established here, and softlight's equal to it
            np.testing.assert_array_equal(np.isnan(t), np.isnan(np.array([expected])))
            np.testing.assert_array_equal(np.isnan(y), np.isnan(t))
            fin = np.isfinite(t)
            np.testing.assert_array_equal(y[~fin & ~np.isnan(t)], t[~fin & ~np.isnan(t)])
            np.testing.assert_allclose(y[fin], t[fin], rtol=TOL[dtype][1], atol=TOL[dtype][0])
    x = torch.tensor([[3e38, -3e38, 0.0]], device="cuda")
    t = torch.log_softmax(x, -1).tolist()
    assert t[0][:2] == [0.0, -float("inf")]  # x - max overflows to -inf in float32
    assert softlight.log_softmax(x).tolist() == t
    x = torch.tensor([[5.0]], device="cuda")
    assert softlight.log_softmax(x).tolist() == [[0.0]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [1, 3, 32, 1000, 4097, 8192, 65536, 393216, 1048576, 4194304])
def test_special_values_match_torch(cols, dtype):
    rng = np.random.default_rng()
    x = torch.from_numpy(special_matrix(rng, cols, np.float64)).to(device="cuda", dtype=tdtype(dtype))
    y = softlight.log_softmax(x)
    t = torch.log_softmax(x, -1)
    assert torch.equal(torch.isnan(y), torch.isnan(t)), "NaN where torch has NaN, nowhere else"
    inf = torch.isinf(t)
    assert torch.equal(y[inf], t[inf]), "the same infinities as torch"
    assert_close_to_float64(y, x, dtype, f"special {dtype} {cols}")


def test_founding_shape_float32_within_1e_5():
    x = torch.rand(4096, 393216, device="cuda")
    y = poisoned_like(x)
    softlight.log_softmax(x, out=y)
    torch.cuda.synchronize()
    worst = 0.0
    for r0 in range(0, 4096, 256):
        ref = torch.log_softmax(x[r0:r0 + 256].double(), -1)
        worst = max(worst, float((y[r0:r0 + 256].double() - ref).abs().max()))
    assert worst <= 1e-5, worst


def test_fresh_inputs_poisoned_outputs_repeatedly():
    # Same shapes, new data and new poison each time: a stale or unwritten output cannot pass.
    for _ in range(3):
        for cols, dtype in [(4096, "float32"), (393216, "float32"), (131072, "bfloat16")]:
            x = random_rows(64, cols, dtype)
            y = torch.full_like(x, float("nan"))
            softlight.log_softmax(x, out=y)
            torch.cuda.synchronize()
            assert_close_to_float64(y, x, dtype)


def test_torch_in_torch_out_and_framework_stream():
    x = random_rows(64, 5000, "float32")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x2 = x * 1.0
        y = softlight.log_softmax(x2)  # follows torch's current stream
    s.synchronize()
    assert isinstance(y, torch.Tensor) and y.device == x.device
    assert_close_to_float64(y, x, "float32")


def test_torch_tensors_read_from_their_attributes_as_dlpack_reads_them():
    """torch tensors are read from their attributes, not through __dlpack__: the two readings agree
    in every field, and the layout taken along each axis (or its refusal) is the same."""
    from softlight._arrays import read_dlpack, read_torch
    base = torch.randn(6, 5, 8, device="cuda")
    cases = [base, base[:, 1:4], base.transpose(0, 2), base[::2, :, 3:], base[:, :1], base[0, 0, 0],
             base[:0], torch.randn(3, 1, 4, device="cuda").expand(3, 2, 4),
             torch.randn(100, device="cuda", dtype=torch.bfloat16)[1:],
             torch.randn(4, 7, dtype=torch.float16, device="cuda"), torch.randn(4, 7, dtype=torch.float64),
             torch.randn(3, 9)[:, ::2], torch.nn.Parameter(base, requires_grad=False)]
    stream = torch.cuda.current_stream().cuda_stream
    for t in cases:
        fast, s1 = read_torch(t, None)
        slow, s2 = read_dlpack(t, stream if t.is_cuda else None, "torch")
        assert tuple(fast[:1]) + (tuple(fast[1]), tuple(fast[2])) + tuple(fast[3:7]) == \
            tuple(slow[:1]) + (tuple(slow[1]), tuple(slow[2])) + tuple(slow[3:7]), (t.shape, t.stride())
        assert s1 == (stream if t.is_cuda else None)
        for d in range(t.dim()):
            assert _C.layout(fast[1], fast[2], d)[0] == _C.layout(slow[1], slow[2], d)[0]
    with pytest.raises(softlight.UnsupportedDTypeError):
        softlight.log_softmax(base.to(torch.int32))
    with pytest.raises(softlight.InvalidArgumentError, match="sparse"):
        softlight.log_softmax(base.to_sparse())
    grad = base.detach().requires_grad_(True)
    with pytest.raises(softlight.InvalidArgumentError, match="softlight.torch"):  # no graph is recorded
        softlight.log_softmax(grad)
    with torch.no_grad():
        assert_close_to_float64(softlight.log_softmax(grad), base, "float32")


def test_explicit_stream_waits_for_the_framework_stream():
    """stream= other than torch's current stream: the inputs, still being written on the current
    stream (behind a kernel that spins for ~50 ms), are read only once they are ready there."""
    old = random_rows(16, 70000, "float32")
    fresh = random_rows(16, 70000, "float32")
    y = poisoned_like(old)
    torch.cuda.synchronize()
    other = torch.cuda.Stream()
    torch.cuda._sleep(100_000_000)  # on the current stream
    x = old.clone()
    x.copy_(fresh)
    softlight.log_softmax(x, out=y, stream=other)
    other.synchronize()
    torch.cuda.synchronize()
    assert_close_to_float64(y, fresh, "float32", "read after the current stream's writes")


def test_explicit_cuda_core_stream():
    from softlight._streams import _cuda_core
    cc = _cuda_core()
    dev = cc.Device(0)
    dev.set_current()
    stream = dev.create_stream()
    x = random_rows(32, 70000, "float32")
    torch.cuda.synchronize()
    y = poisoned_like(x)
    torch.cuda.synchronize()
    softlight.log_softmax(x, out=y, stream=stream)
    stream.sync()
    assert_close_to_float64(y, x, "float32")


def test_raw_device_pointers():
    x = random_rows(10, 3000, "bfloat16")
    y = poisoned_like(x)
    softlight.log_softmax_raw(x.data_ptr(), y.data_ptr(), 10, 3000, dtype=torch.bfloat16,
                              stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert_close_to_float64(y, x, "bfloat16")


def test_cupy_in_cupy_out():
    cupy = pytest.importorskip("cupy")
    x = cupy.random.standard_normal((100, 4096), dtype=cupy.float32) * 3
    y = softlight.log_softmax(x)
    assert isinstance(y, cupy.ndarray) and y.shape == x.shape
    cupy.cuda.get_current_stream().synchronize()
    assert_close_to_float64(torch.from_dlpack(y), torch.from_dlpack(x), "float32")


# Spins for `cycles` clocks, then fills x with v * (i % 977) / 977 (a kernel that holds its stream).
_SPIN_FILL = r"""
extern "C" __global__ void spin_fill(float* x, long long n, long long cycles, float v) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    x[i] = v * (float)(i % 977) / 977.0f;
}
"""


@pytest.mark.parametrize("shape", [(64, 32000), (4, 393216), (3000, 1000)], ids=str)
def test_cupy_current_stream_and_graph_capture(shape):
    """With CuPy arrays softlight launches on CuPy's current stream: under a non-blocking stream whose
    previous kernel spins for about 10 ms before it writes x, log_softmax reads what it wrote (on any
    other stream it would read the zeros before). A log_softmax captured into a CuPy graph on that
    stream replays on new values of x into the same output."""
    cupy = pytest.importorskip("cupy")
    spin = cupy.RawKernel(_SPIN_FILL, "spin_fill")
    x = cupy.zeros(shape, cupy.float32)
    y = cupy.full(shape, POISON, cupy.float32)
    s = cupy.cuda.Stream(non_blocking=True)

    def fill(v, cycles=0):
        spin((264,), (256,), (x, cupy.int64(x.size), cupy.int64(cycles), cupy.float32(v)))

    with s:
        fill(7.0, cycles=20_000_000)
        assert softlight.log_softmax(x, out=y) is y
    s.synchronize()
    assert float(x[0, 976]) == pytest.approx(7.0 * 976 / 977)
    assert_close_to_float64(torch.from_dlpack(y), torch.from_dlpack(x), "float32", "current stream")
    with s:
        s.begin_capture()
        softlight.log_softmax(x, out=y)
        graph = s.end_capture()
        for v in (1.0, -30.0):
            fill(v)
            y.fill(POISON)
            graph.launch(s)
            s.synchronize()
            assert_close_to_float64(torch.from_dlpack(y), torch.from_dlpack(x), "float32", f"graph replay, v={v}")


def test_jax_in_jax_out():
    jax = pytest.importorskip("jax")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX has no GPU backend here")
    x = jax.device_put(jax.random.normal(jax.random.PRNGKey(0), (64, 3000), dtype="float32"), gpu)
    y = softlight.log_softmax(x)
    assert type(y) is type(x)
    ref = jax.nn.log_softmax(x.astype("float32"), axis=-1)
    np.testing.assert_allclose(np.asarray(y), np.asarray(ref), atol=1e-5, rtol=1e-5)


def test_bad_gpu_inputs_write_nothing():
    x = random_rows(4, 100, "float32")
    host_out = np.full((4, 100), POISON, np.float32)
    with pytest.raises(softlight.InvalidArgumentError, match="out is on cpu"):
        softlight.log_softmax(x, out=host_out)
    assert (host_out == POISON).all()
    out = torch.full((4, 100), POISON, dtype=torch.float16, device="cuda")
    with pytest.raises(softlight.InvalidArgumentError, match="dtype"):
        softlight.log_softmax(x, out=out)
    with pytest.raises(softlight.UnsupportedDTypeError):
        softlight.log_softmax(torch.ones(3, 3, dtype=torch.int32, device="cuda"))
    whole = torch.full((4, 6, 10), POISON, device="cuda")
    gapped = whole[:, :5, :]  # rows 10 apart, slices 60
    z = torch.zeros(4, 5, 10, device="cuda")
    assert softlight.log_softmax(z, out=gapped) is gapped  # a layout that does not merge: through a copy
    assert torch.equal(gapped, torch.log_softmax(z, -1)) and bool((whole[:, 5:, :] == POISON).all())
    assert torch.allclose(softlight.log_softmax(z.permute(2, 0, 1), dim=1), torch.log_softmax(z.permute(2, 0, 1), 1))
    # raw pointers: misplaced overlap on the device
    with pytest.raises(softlight.InvalidArgumentError, match="overlap"):
        softlight.log_softmax_raw(x.data_ptr(), x.data_ptr() + 4, 3, 99, dtype="float32", x_stride=100,
                                  y_stride=100)
    torch.cuda.synchronize()
    assert bool((out == POISON).all())


def test_many_host_threads_many_streams():
    shapes = [(64, 1000), (32, 8192), (8, 393216), (16, 50001)]
    xs = [random_rows(*s, "float32") for s in shapes * 3]
    ys = [poisoned_like(x) for x in xs]
    torch.cuda.synchronize()
    errors = []

    def work(i):
        try:
            s = torch.cuda.Stream()
            for _ in range(5):
                softlight.log_softmax(xs[i], out=ys[i], stream=s.cuda_stream)
            s.synchronize()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for x, y in zip(xs, ys):
        assert_close_to_float64(y, x, "float32")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("cluster", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("chunk,threads,hints,stripe", paths.CLUSTER_FORCED)
def test_cluster_shapes_forced(force, cluster, chunk, threads, hints, stripe, dtype):
    """Every cluster size, chunk size, warp count and cache hint the tuning knobs can pick, chunks
    dealt in turn or in contiguous slices (STRIPE=0), on rows that leave some CTAs of a cluster with
    no chunk at all, and rows that stream through the ring; always more rows than clusters, so that
    every cluster goes round several times."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("clusters need sm_90")
    force(exchange=0)  # clusters (grid groups: test_grid_groups_forced)
    force(cluster=cluster)
    force(chunk_bytes=chunk)
    force(threads=threads)
    force(hints=hints)
    force(stripe=stripe)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for cols in paths.CLUSTER_FORCED_COLS:
        x = random_rows(paths.cluster_forced_rows(cols, ELEM[dtype], cluster, sms), cols, dtype)
        p = planned(*x.shape, dtype)
        run_and_check(x, dtype, f"cluster={cluster} chunk={chunk} threads={threads} cols={cols} {p}")
    y, lse = softlight.log_softmax(x, temperature=1.5, return_lse=True)  # the last, streamed shape
    torch.cuda.synchronize()
    assert_close_to_float64(y, x, dtype, "temperature", transform=lambda v: v / 1.5)
    ref = torch.logsumexp(x.double() / 1.5, -1)
    assert bool(((lse.double() - ref).abs() <= 1e-5 + 1e-5 * ref.abs()).all())


@pytest.mark.parametrize("cols,dtype,cluster,per_cta", paths.RESIZED_CHUNKS)
def test_chunks_resized_for_uneven_slices(cols, dtype, cluster, per_cta):
    """16-bit rows whose 32 KB chunks split unevenly over a cluster, in the chunks the planner
    resizes them to (not a multiple of 512 bytes): two larger ones a CTA where CTAs would take three,
    four a CTA over half the cluster where CTAs would take two and some one. The planner's shape,
    against float64 with special values planted (in rows that straddle every chunk boundary),
    temperature and LSE, more rows than clusters."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("clusters need sm_90")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = paths.resized_chunks_rows(cluster, sms)
    p = planned(rows, cols, dtype)
    on_path((p["family"], p["cluster"], p["chunks_per_cta"]) == ("cluster_rows", cluster, per_cta) and
            p["chunk_bytes"] != 32768, f"{rows}x{cols} {dtype} in resized chunks: {p}")
    x = random_rows(rows, cols, dtype)
    rng = np.random.default_rng()
    special = torch.from_numpy(special_matrix(rng, cols, np.float64)).to(device="cuda", dtype=tdtype(dtype))
    x[1:1 + special.shape[0]] = special
    chunk = p["chunk_bytes"] // 2  # elements of a chunk: NaN and +inf just either side of each boundary
    for k in range(1, p["chunks_per_row"]):
        x[rows - 1, k * chunk - 1] = float("nan") if k % 2 else float("inf")
        x[rows - 2, k * chunk] = float("-inf")
    run_and_check(x, dtype, f"resized chunks {dtype} {cols} {p}")
    y, lse = softlight.log_softmax(x, temperature=0.8, return_lse=True)
    torch.cuda.synchronize()
    assert_close_to_float64(y, x, dtype, "resized chunks, temperature", transform=lambda v: v / 0.8)
    assert_lse_close(lse, x, 0.8, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("cluster,chunk,groups,row_bytes,rows", paths.CLAIMED)
def test_claimed_rows(force, cluster, chunk, groups, row_bytes, rows, dtype):
    """Clusters that claim their rows from a counter: few clusters, each through dozens to hundreds
    of rows; the same bits as rows dealt in turn, and right against float64 with temperature and LSE."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("clusters need sm_90")
    force(exchange=0)
    force(cluster=cluster)
    force(chunk_bytes=chunk)
    force(groups=groups)
    force(claim=1)  # the default
    x = random_rows(rows, row_bytes // ELEM[dtype], dtype)
    p = planned(*x.shape, dtype)
    y = run_and_check(x, dtype, f"claimed {p}")
    y2, lse = softlight.log_softmax(x, temperature=0.75, return_lse=True)
    torch.cuda.synchronize()
    assert_close_to_float64(y2, x, dtype, "claimed, temperature", transform=lambda v: v / 0.75)
    ref = torch.logsumexp(x.double() / 0.75, -1)
    assert bool(((lse.double() - ref).abs() <= 1e-5 + 1e-5 * ref.abs()).all())
    force(claim=0)
    dealt = run_and_check(x, dtype, "rows dealt in turn")
    assert torch.equal(y.view(torch.uint8), dealt.view(torch.uint8)), "a row's result depends on its cluster"


def test_claimed_rows_back_to_back(force):
    """A stream's launches share its claimed rows' counter, which each launch's last cluster puts
    back: launches of different cluster counts and types queued back to back on one stream, in
    two rounds with the outputs poisoned between them, each right in both (the ring for every row:
    rows in registers over a cluster would take some of them)."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("claimed rows are cluster_rows' (sm_90)")
    force(register_cluster=0)
    shapes = paths.CLAIMED_BACK_TO_BACK
    xs = [random_rows(*s) for s in shapes]
    ys = [poisoned_like(x) for x in xs]
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for round_ in range(2):
            for x, y in zip(xs, ys):
                y.fill_(POISON)
                softlight.log_softmax(x, out=y)
            s.synchronize()
            for x, y, (_, _, dtype) in zip(xs, ys, shapes):
                assert_close_to_float64(y, x, dtype, f"round {round_}, {tuple(x.shape)} {dtype}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", paths.FLAT_TILES)
def test_flat_tiles(force, rows, cols, dtype):
    """Short rows not in 16-byte packs, in one contiguous run: tiles staged through shared memory
    as packs of the flat array (tails of a tile that are not a whole pack included), against float64;
    and the same rows the other way (flat=0 forced)."""
    if not paths.is_flat_tile_row(cols, dtype):
        pytest.skip("not a flat-tile row")
    x = random_rows(rows, cols, dtype)
    x[0, 1] = float("nan")
    if rows > 2:
        x[1, :] = float("-inf")
        x[2, 0] = float("inf")
    on_path(planned(rows, cols, dtype)["flat_rows"] > 0, f"{rows}x{cols} {dtype} in flat tiles")
    flat = run_and_check(x, dtype, f"flat tiles {dtype} {rows}x{cols}")
    force(flat=0)
    other = run_and_check(x, dtype, f"rows {dtype} {rows}x{cols}")
    assert torch.equal(torch.isnan(flat), torch.isnan(other))
    force(flat=-1)
    y2, lse2 = softlight.log_softmax(x, temperature=0.5, return_lse=True)
    torch.cuda.synchronize()
    assert_close_to_float64(y2, x, dtype, "flat tiles, T=0.5", transform=lambda v: v / 0.5)
    assert_lse_close(lse2, x, 0.5, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("threads,iters", paths.REGISTER_CLUSTER_SHAPES)
@pytest.mark.parametrize("cols", paths.REGISTER_CLUSTER_COLS)
def test_rows_in_registers_over_a_cluster(force, cols, threads, iters, dtype):
    """Rows in registers over a cluster (register_cluster=threads, iters=iters forced):
    clusters of 2 to 16 CTAs, slices ending mid-warp (lanes past the row's end), special values,
    temperature and LSE, strided rows, against float64; a row's result equal to its result from the
    rows beside it."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("clusters need Hopper")
    force(register_cluster=threads)
    force(iters=iters)
    vec = 16 // ELEM[dtype]
    if paths.register_cluster_ctas(cols, dtype, threads, iters) is None:
        pytest.skip(f"{cols} columns are not held in CTAs of {threads} x {iters} packs")
    # (The strided rows below may run the other kernel of the two, held to 64 registers or not:
    # their results must agree bit for bit.)
    x = random_rows(37, cols, dtype)
    x[0, 1] = float("nan")
    x[1, :] = float("-inf")
    x[2, -1] = float("inf")
    x[3, : cols // 2] = float("-inf")
    x[4, -3:] = 3e4 if dtype == "float16" else 1e30  # a large max at the row's end
    y = run_and_check(x, dtype, f"register clusters {dtype} {cols} {threads}x{iters}")
    y2, lse = softlight.log_softmax(x, temperature=0.75, return_lse=True)
    torch.cuda.synchronize()
    assert_close_to_float64(y2, x, dtype, "register clusters, T=0.75", transform=lambda v: v / 0.75)
    assert_lse_close(lse, x, 0.75, dtype)
    wide = poisoned_like(torch.empty(37, cols + 2 * vec, device="cuda", dtype=x.dtype))
    xs = torch.empty_like(wide)
    xs[:, :cols] = x
    softlight.log_softmax(xs[:, :cols], out=wide[:, :cols])  # row strides past the row
    torch.cuda.synchronize()
    assert torch.equal(torch.isnan(wide[:, :cols]), torch.isnan(y))
    assert bool((wide[:, cols:] == POISON).all()), "nothing written past a row"
    ok = ~torch.isnan(y)
    assert torch.equal(wide[:, :cols][ok], y[ok]), "a row's result depends on its neighbours"


@pytest.mark.parametrize("cols,dtype", paths.FITTED_PACKS)
def test_rows_in_registers_fitted_packs(cols, dtype):
    """Rows in 16-byte packs just past a power of two of packs, held in three, five, six or seven
    packs a thread (the group's last packs on its first threads only): special values, temperature
    and LSE, strided rows, against float64; nothing written past a row."""
    p = planned(37, cols, dtype)
    on_path(p["family"] == "register_rows" and p["iters"] in (3, 5, 6, 7), f"37x{cols} {dtype} in fitted packs")
    x = random_rows(37, cols, dtype)
    x[0, 1] = float("nan")
    x[1, :] = float("-inf")
    x[2, -1] = float("inf")
    x[3, : cols // 2] = float("-inf")
    x[4, -1] = 3e4 if dtype == "float16" else 1e30  # a large max in the last pack
    run_and_check(x, dtype, f"rows in registers {dtype} {cols}, {p['iters']} packs a thread")
    y2, lse = softlight.log_softmax(x, temperature=0.75, return_lse=True)
    torch.cuda.synchronize()
    assert_close_to_float64(y2, x, dtype, "fitted packs, T=0.75", transform=lambda v: v / 0.75)
    assert_lse_close(lse, x, 0.75, dtype)
    vec = 16 // ELEM[dtype]
    wide = poisoned_like(torch.empty(37, cols + vec, device="cuda", dtype=x.dtype))
    softlight.log_softmax(x, out=wide[:, :cols])
    torch.cuda.synchronize()
    assert_close_to_float64(wide[:, :cols], x, dtype, "fitted packs, y strided")
    assert bool((wide[:, cols:] == POISON).all()), "nothing written past a row"


def peeled_views(rows, cols, dtype):
    """(off, base, x): views x of rows x cols starting 0, 1, 3 and a pack less one elements into
    an allocation `base` (each row of a contiguous array off 16 bytes by its own offset), with
    special values on the rows' edges."""
    vec = 16 // ELEM[dtype]
    big = 3e4 if dtype == "float16" else 1e30
    for off in (0, 1, 3, vec - 1):
        base = random_rows(1, rows * cols + off + vec, dtype).flatten()
        x = base[off:off + rows * cols].view(rows, cols)
        x[0, 0] = float("nan")  # on a head (or the first pack)
        x[1, -1] = float("inf")  # on a tail
        x[2, :3] = float("-inf")
        x[3, -3:] = float("-inf")
        x[4, 1:] = float("-inf")  # the max alone on the edge
        x[5, :] = float("-inf")
        x[6, -2] = big  # a large max on a tail
        x[7, 0] = big  # and on a head
        yield off, base, x


def check_peeled_view(base, x, off, dtype, what):
    """softlight on a view x of base into the same view of a poisoned copy (x and y off alike), with
    temperature and LSE, against float64, nothing written outside the rows; then into a new array
    (on 16 bytes) at T=1."""
    n = x.numel()
    out = poisoned_like(base)
    y = out[off:off + n].view(x.shape)
    _, lse = softlight.log_softmax(x, out=y, temperature=0.75, return_lse=True)
    torch.cuda.synchronize()
    assert_close_to_float64(y, x, dtype, what, transform=lambda v: (v - v.amax(-1, keepdim=True)) / 0.75)
    assert_lse_close(lse, x, 0.75, dtype)
    assert bool((out[:off] == POISON).all()) and bool((out[off + n:] == POISON).all()), \
        f"{what}: written outside the rows"
    run_and_check(x, dtype, what + ", T=1, y on 16 bytes")


@pytest.mark.parametrize("cols,dtype", paths.ODD_ROWS)
def test_odd_rows_in_registers(cols, dtype):
    """Rows off 16 bytes, x and y off alike (odd lengths: each row of a contiguous array starts at
    another offset), under 16 KB, in registers: the 16-byte blocks that end in each row in packs; the
    row's elements in the blocks it starts and ends inside an element each on the group's first
    2 x vec threads at four packs a thread, and at five those two blocks cut to the row on two
    threads (element by element in the first row's first block and the last row's last). Special
    values on the edges, views offset by one to seven elements, temperature and LSE, in place (a
    row's outer blocks hold its neighbours' elements while they are written), against float64;
    nothing written outside the rows."""
    p = planned(37, cols, dtype, aligned=False, peelable=True)
    on_path(p["family"] == "register_rows" and p["peel"], f"37x{cols} {dtype} peeled in registers: {p}")
    rows = 37
    for off, base, x in peeled_views(rows, cols, dtype):
        what = f"odd rows in registers {dtype} {cols} off={off}"
        check_peeled_view(base, x, off, dtype, what)
        out1 = poisoned_like(base)
        y1 = out1[off:off + rows * cols].view(rows, cols)  # y off as x: the same plan as in place
        softlight.log_softmax(x, out=y1)
        xi = base.clone()[off:off + rows * cols].view(rows, cols)
        softlight.log_softmax(xi, out=xi)  # in place
        torch.cuda.synchronize()
        assert_close_to_float64(y1, x, dtype, what + ", T=1")
        num = ~torch.isnan(y1)
        assert torch.equal(torch.isnan(xi), torch.isnan(y1)) and torch.equal(xi[num], y1[num]), \
            f"{what}: in place differs"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("off", [16, 48, 64, 112])
@pytest.mark.parametrize("cols", paths.OFF_128_COLS)
def test_register_clusters_rows_off_128_bytes(cols, off, dtype):
    """16-bit rows in 16-byte packs whose rows do not start on 128 bytes (views `off` bytes into an
    allocation, rows of 32 000 that would start on 128 bytes, and rows of 50 264 that never do) run
    the kernel held to 64 registers: special values, temperature and LSE against float64, nothing
    written outside the rows, and each row's result equal to the same row's from a view on 128
    bytes where there is one."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("clusters need Hopper")
    rows, e = 37, ELEM[dtype]
    p = plan(rows, cols, e, True, **device_plan_args(), rows128=False)
    on_path(p["family"] == "register_clusters" and p["bounded"], f"{cols} {dtype} off 128 bytes, held to 64 registers")
    base = random_rows(1, rows * cols + off // e, dtype).flatten()
    x = base[off // e:].view(rows, cols)
    x[0, 0] = float("nan")
    x[1, :] = float("-inf")
    x[2, -1] = float("inf")
    x[3, : cols // 2] = float("-inf")
    x[4, -3:] = 3e4 if dtype == "float16" else 1e30
    out = poisoned_like(base)
    y = out[off // e:].view(rows, cols)
    _, lse = softlight.log_softmax(x, out=y, temperature=0.75, return_lse=True)
    torch.cuda.synchronize()
    what = f"register clusters {dtype} {cols}, rows {off} bytes off 128"
    assert_close_to_float64(y, x, dtype, what, transform=lambda v: (v - v.amax(-1, keepdim=True)) / 0.75)
    assert_lse_close(lse, x, 0.75, dtype)
    assert bool((out[:off // e] == POISON).all()), f"{what}: written before the rows"
    y1 = run_and_check(x, dtype, what + ", T=1")
    if cols * e % 128 == 0:
        on = run_and_check(x.clone(), dtype, f"register clusters {dtype} {cols}, rows on 128 bytes")
        ok = ~torch.isnan(y1)
        assert torch.equal(on[ok], y1[ok]), "the bounded kernel's result differs from the compiler's choice"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("threads", [0, 128, 256])
@pytest.mark.parametrize("cols", paths.PEELED_REGISTER_CLUSTER_COLS)
def test_peeled_rows_in_registers_over_a_cluster(force, cols, threads, dtype):
    """Rows off 16 bytes, x and y off alike (odd lengths: each row of a contiguous array starts at
    another offset), in registers over a cluster: the 16-byte blocks each row touches in packs, the
    first and last cut to the row (element by element in the first row's first block and the last
    row's last, which would leave the array). The planner's choice (0) and CTAs of 128 and 256
    threads forced; special values on the edges, views offset by one to seven elements,
    temperature and LSE, against float64; nothing written outside the rows; y strided; in place,
    where a row's outer blocks hold its neighbours' elements while they are written."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("clusters need Hopper")
    if threads:
        force(register_cluster=threads)
    vec = 16 // ELEM[dtype]
    p = planned(37, cols, dtype, aligned=False, peelable=True)
    if p["family"] != "register_clusters":
        pytest.skip(f"{cols} {dtype} columns are not held in registers over a cluster here: {p['family']}")
    rows = 37
    for off, base, x in peeled_views(rows, cols, dtype):
        check_peeled_view(base, x, off, dtype, f"peeled register clusters {dtype} {cols} threads={threads} off={off}")
    # y's rows a pack further apart than x's: off alike in both arrays still (x and y differ by a
    # multiple of 16 bytes in every row).
    x = random_rows(rows, cols, dtype)
    x[0, -1] = float("nan")
    wide = poisoned_like(torch.empty(rows, cols + vec, device="cuda", dtype=x.dtype))
    y = wide[:, :cols]
    softlight.log_softmax(x, out=y)
    torch.cuda.synchronize()
    assert_close_to_float64(y, x, dtype, f"peeled register clusters {dtype} {cols}, y strided")
    assert bool((wide[:, cols:] == POISON).all()), "nothing written past a row"
    xi = x.clone()
    softlight.log_softmax(xi, out=xi)
    torch.cuda.synchronize()
    assert_close_to_float64(xi, x, dtype, f"peeled register clusters {dtype} {cols}, in place")


@pytest.mark.parametrize("rows,cols", paths.GRID_ROWS_FP32)
def test_fp32_rows_no_cluster_holds_go_to_grid_rows(rows, cols):
    """fp32 rows of 2 MB to 23 MB as the planner sends them on a Hopper GPU of 132 SMs: held in the
    grid's rings (grid_rows), those past a fifth of the rings partly spilled (read again from L2), no
    knob set, rows of 11.5 and 23 MB with a partial last chunk; special values, temperature and LSE
    against float64."""
    p = planned(rows, cols, "float32")
    on_path(p["family"] == "grid_rows", f"{rows}x{cols} float32 in grid_rows")
    x = random_rows(rows, cols, "float32")
    x[0, 1] = float("nan")
    x[1, -1] = float("inf")
    x[2, :] = float("-inf")
    run_and_check(x, "float32", f"{p}")
    y, lse = softlight.log_softmax(x, temperature=1.5, return_lse=True)
    torch.cuda.synchronize()
    assert_close_to_float64(y, x, "float32", f"temperature {p}", transform=lambda v: v / 1.5)
    assert_lse_close(lse, x, 1.5, "float32")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("knobs", paths.GRID_ROWS_KNOBS)
@pytest.mark.parametrize("rows,cols", paths.GRID_ROWS_SHAPES)
def test_grid_rows(force, rows, cols, knobs, dtype):
    """Rows held once in a cooperative grid's rings, items claimed by any CTA (grid_rows=1 forced):
    rows whose last chunk and item are partial (100 000), rows of many items, rows of one item and
    of one partial chunk (3000 rows: a ring holds rows far apart, whose numbers differ by multiples of
    its table of merged rows); other item, chunk and CTA sizes. Special values, temperature and LSE
    against float64; y strided, nothing written past a row."""
    force(grid_rows=1, **paths.knobs(knobs))
    x = random_rows(rows, cols, dtype)
    x[0, 0] = float("nan")
    x[1, :] = float("-inf")
    if rows > 2:
        x[2, -1] = float("inf")
    if rows > 4:
        x[3, cols // 2] = 3e4 if dtype == "float16" else 1e30  # a large max mid-row
        x[4, :-1] = float("-inf")                                # the max alone, last
    what = f"grid_rows {dtype} {rows}x{cols} {knobs}"
    y = poisoned_like(x)
    _, lse = softlight.log_softmax(x, out=y, temperature=0.75, return_lse=True)
    torch.cuda.synchronize()
    assert_close_to_float64(y, x, dtype, what, transform=lambda v: (v - v.amax(-1, keepdim=True)) / 0.75)
    assert_lse_close(lse, x, 0.75, dtype)
    vec = 16 // ELEM[dtype]
    wide = poisoned_like(torch.empty(rows, cols + vec, device="cuda", dtype=x.dtype))
    run_and_check(x, dtype, what + ", T=1, y strided", out=wide[:, :cols])
    assert bool((wide[:, cols:] == POISON).all()), f"{what}: written past a row"
    for _ in range(3):  # back to back on the stream: each launch's workspace starts afresh
        run_and_check(random_rows(rows, cols, dtype), dtype, what + ", again")
    z = x.clone()  # in place: spilled chunks are read again after other chunks of y are written
    softlight.log_softmax(z, out=z)
    torch.cuda.synchronize()
    assert_close_to_float64(z, x, dtype, what + ", in place")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_lane", [1, 2, 4, 8])
@pytest.mark.parametrize("rows,bytes_", paths.ROWS_PER_LANE)
def test_rows_per_lane(force, rows, bytes_, per_lane, dtype):
    """Short rows in 16-byte packs, a lane holding one pack of each of several rows (rows of 3 packs
    leave a lane of each group idle), against float64, with the LSE and a temperature."""
    cols = bytes_ // ELEM[dtype]
    force(rows_per_lane=per_lane)
    x = random_rows(rows, cols, dtype)
    x[0, 1] = float("nan")
    if rows > 2:
        x[1, :] = float("-inf")
        x[2, 0] = float("inf")
        x[-1, -1] = float("-inf")
    run_and_check(x, dtype, f"{per_lane} rows a lane, {dtype} {rows}x{cols}")
    y2, lse2 = softlight.log_softmax(x, temperature=0.75, return_lse=True)
    torch.cuda.synchronize()
    assert_close_to_float64(y2, x, dtype, "rows a lane, T=0.75", transform=lambda v: v / 0.75)
    assert_lse_close(lse2, x, 0.75, dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("bytes_", paths.SHORT_16_BIT_BYTES)
def test_16_bit_short_rows_special_values_at_every_place(bytes_, dtype):
    """16-bit short rows as planned (a lane holds a pack of each of four rows, the group of 1 to 8
    lanes known at compile time; from groups of four, each row's log is taken on one lane of the
    group and passed to the rest): NaN, +inf, rows of -inf and rows of one finite element at every
    place of a lane's four rows and of a group's lanes, against float64, with the LSE and a
    temperature."""
    cols, rows = bytes_ // 2, 1031
    p = planned(rows, cols, dtype)
    on_path(p["family"] == "short_rows" and p["rows_per_lane"] == 4, f"{rows}x{cols} {dtype} four rows a lane")
    x = random_rows(rows, cols, dtype)
    for r in range(0, 160, 3):  # a warp takes 32 / group rows a load: every place for groups of 1 to 8
        kind, c = (r // 3) % 4, r % cols
        if kind == 0:
            x[r, c] = float("nan")
        elif kind == 1:
            x[r, :] = float("-inf")
        elif kind == 2:
            x[r, c] = float("inf")
        else:
            x[r, :] = float("-inf")
            x[r, c] = 1.5
    run_and_check(x, dtype, f"16-bit short rows {dtype} {rows}x{cols}")
    y2, lse2 = softlight.log_softmax(x, temperature=0.75, return_lse=True)
    torch.cuda.synchronize()
    assert_close_to_float64(y2, x, dtype, "16-bit short rows, T=0.75", transform=lambda v: v / 0.75)
    assert_lse_close(lse2, x, 0.75, dtype)


@pytest.mark.parametrize("temperature", [1.0, 0.75])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("cols,family", paths.NEAR_THE_MAX)
def test_rows_near_the_float_max(dtype, temperature, cols, family):
    """Rows whose max, times log2(e) / temperature, overflows float: every term of the row's sum is
    then exactly 0 or 1, which the statistics of rows in 16-byte packs take on a path of their own
    (shifted_exp): in cluster_rows and in register_rows, a group past a warp (4096) and within one."""
    if family == "cluster_rows" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("clusters need sm_90")
    x = random_rows(5, cols, dtype)
    on_path(planned(*x.shape, dtype)["family"] == family, f"{tuple(x.shape)} {dtype} in {family}")
    # (x / temperature stays within float's range, as it must for a finite reference)
    x[0, 7] = x[0, cols - 3] = 2.5e38   # two at the max: -log 2 there
    x[1, 5] = 2.4e38
    x[2, :] = 2.5e38                    # all at the max: -log(cols)
    x[3, 100] = -2e38                   # a plain row with a huge negative
    x[4, 9] = 2e38
    x[4, 10] = float("nan")             # NaN wins
    y, lse = softlight.log_softmax(x, temperature=temperature, return_lse=True)
    torch.cuda.synchronize()
    assert_close_to_float64(y, x, dtype, f"near the max, T={temperature}", transform=lambda v: v / temperature)
    ref = torch.logsumexp(x.double() / temperature, -1)
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isnan(lse), torch.isnan(ref))
    assert bool(((lse.double() - ref).abs()[fin] <= 1e-5 * ref.abs()[fin] + 1e-5).all())


@pytest.mark.parametrize("temperature", [1.0, 0.75])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [7, 32, 128, 4096, 50257, 393216, 1048576])
def test_rows_of_large_finite_max(dtype, temperature, cols):
    """Rows whose max is large but finite (1e10 to 1e30, either sign; float16 up to 3e4): the
    statistics of rows in 16-byte packs split max * log2(e) / temperature into a float and a
    remainder of up to half its ulp (shifted_exp), which must stay small enough to exponentiate
    (a max of 1e10 gave NaN rows before). Every family those statistics run in: flat tiles (7),
    short rows (32), rows in registers within a warp (128) and past it (4096), clusters peeled
    (50 257), resident (393 216) and streamed (1 M fp32); LSE alongside."""
    if cols > 4096 and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("clusters need sm_90")
    # (float16: (x - max) / temperature stays within its range, as a finite reference needs)
    big = [2e4, 3e4, 1e4, 2.5e4] if dtype == "float16" else [1e10, 1e20, 1e30, 3e9]
    rows = 8
    x = random_rows(rows, cols, dtype)
    x[0, 3 % cols] = big[0]
    x[1, 1 % cols] = x[1, cols - 2] = big[1]                 # two at the max: -log 2 there
    x[2] = -big[2] * (1 + 0.05 * torch.rand(cols, device="cuda")).to(x.dtype)  # a large negative max
    x[3, cols - 1] = big[2]
    x[4, cols // 2] = big[3]
    x[4, 0] = float("nan")                                    # NaN still wins
    x[5, :] = big[1]                                          # all at the max: -log(cols)
    y, lse = softlight.log_softmax(x, temperature=temperature, return_lse=True)
    torch.cuda.synchronize()
    what = f"large max, {planned(rows, cols, dtype, peelable=True)['family']}, T={temperature}"
    # The reference shifts by the row's max before dividing: x / T alone rounds 1e30 by 1e14 in
    # float64, more than its tolerance on the differences of (x - max) / T (shifting changes nothing
    # in exact arithmetic, and x - max is exact where x is near the max).
    assert_close_to_float64(y, x, dtype, what,
                            transform=lambda v: (v - v.amax(-1, keepdim=True)) / temperature)
    assert_lse_close(torch.as_tensor(lse), x, temperature, dtype)


@pytest.mark.parametrize("temperature", [1.0, 0.75])
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("case,cols,family", paths.NEXT_TO_A_LARGE_MAX)
def test_elements_next_to_a_large_max(dtype, temperature, case, cols, family):
    """Rows whose elements lie a few ulps below a large max, with and without a temperature, through
    the families that read element by element: rows off 16 bytes (register_rows' element path,
    block_rows) and a non-last axis (cluster_tiles on Hopper, split_rows for a narrow inner extent);
    and rows of 50 257, peeled into cluster_rows on Hopper (block_rows elsewhere). Every family takes
    x - max before the scale: x / T - max / T would round the differences away."""
    rows = paths.next_to_a_large_max_rows(case)
    x = (torch.randn(rows, cols, device="cuda", dtype=torch.float64) * 3)
    r = torch.rand(cols, device="cuda", dtype=torch.float64)
    x[0] = 1e20 * (1 + 0.01 * r)      # many elements a few ulps below the max
    x[1] = -1e20 * (1 + 0.01 * r)     # a large negative max
    x[2, 5] = 1e30
    x = x.to(tdtype(dtype))
    if case == "unaligned":
        base = torch.empty(rows, cols + 1, device="cuda", dtype=x.dtype)
        base[:, 1:] = x
        on_path(planned(rows, cols, dtype, aligned=False)["family"] == family, f"{rows}x{cols} unaligned in {family}")
        y, lse = softlight.log_softmax(base[:, 1:], temperature=temperature, return_lse=True)
    elif case == "contiguous":
        y, lse = softlight.log_softmax(x, temperature=temperature, return_lse=True)
        family = planned(rows, cols, dtype, peelable=True)["family"]
    else:
        xt = x.t().contiguous()  # the rows of x along axis 0: inner = rows
        if torch.cuda.get_device_capability()[0] >= 9 or family == "split_rows":
            on_path(axis_plan(xt, 0)["family"] == family, f"{tuple(xt.shape)} along 0 in {family}")
        yt, lse = softlight.log_softmax(xt, dim=0, temperature=temperature, return_lse=True)
        y = yt.t()
    torch.cuda.synchronize()
    what = f"next to a large max, {case} ({family}), {dtype}, T={temperature}"
    assert_close_to_float64(y, x, dtype, what, transform=lambda v: (v - v.amax(-1, keepdim=True)) / temperature)
    assert_lse_close(torch.as_tensor(lse).reshape(-1), x, temperature, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("group", paths.GRID_GROUPS)
def test_grid_groups_forced(force, group, dtype):
    """cluster_rows with each row's CTAs a group of a cooperative grid, trading partials through
    global memory: group sizes off the powers of two, wider than a cluster and than a warp (each
    writer lane merges several partials); rows that leave CTAs without a chunk, rows held once and
    twice, rows streamed (slices longer than the ring), more rows than groups; special values,
    temperature and LSE."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("grid groups use cluster_rows' bulk copies (sm_90)")
    force(exchange=1)
    force(cluster=group)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for cols in paths.CLUSTER_FORCED_COLS:
        rows = min(3 * max(1, sms // group) + 5, max(1, (1 << 26) // (cols * ELEM[dtype])))
        x = random_rows(rows, cols, dtype)
        p = planned(*x.shape, dtype)
        run_and_check(x, dtype, f"group={group} {rows}x{cols} {p}")
    x = torch.from_numpy(special_matrix(np.random.default_rng(), 393216, np.float64)).to(device="cuda",
                                                                                       dtype=tdtype(dtype))
    y, lse = softlight.log_softmax(x, temperature=1.5, return_lse=True)
    torch.cuda.synchronize()
    t = torch.log_softmax(x / 1.5, -1)
    assert torch.equal(torch.isnan(y), torch.isnan(t)), "NaN where torch has NaN, nowhere else"
    assert torch.equal(y[torch.isinf(t)], t[torch.isinf(t)]), "the same infinities as torch"
    assert_close_to_float64(y, x, dtype, f"group={group} specials", transform=lambda v: v / 1.5)
    ref = torch.logsumexp(x.double() / 1.5, -1)
    ref[torch.isnan(x).any(-1) | torch.isposinf(x).any(-1)] = float("nan")
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isnan(lse), torch.isnan(ref)) and bool(
        ((lse.double() - ref).abs()[finite] <= 1e-5 + 1e-5 * ref.abs()[finite]).all())


@pytest.mark.parametrize("rows,cols,workspace", paths.WORKSPACES)
def test_cluster_workspace_in_a_cuda_graph(rows, cols, workspace):
    """A launch with a workspace (grid groups' table, claimed rows' counter) captured into a CUDA
    graph (its allocation, fill and release become graph nodes) gives the right answer on every
    replay, with fresh inputs each time."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("grid groups and claimed rows are cluster_rows' (sm_90)")
    x = random_rows(rows, cols, "float32")
    on_path(planned(*x.shape, "float32")[workspace], f"{rows}x{cols} float32 with a workspace ({workspace})")
    y = poisoned_like(x)
    softlight.log_softmax(x, out=y)  # outside the capture first, as torch asks of captured work
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        softlight.log_softmax(x, out=y)
    for _ in range(3):
        x.copy_(random_rows(*x.shape, "float32"))
        y.fill_(POISON)
        g.replay()
        torch.cuda.synchronize()
        assert_close_to_float64(y, x, "float32", "graph replay")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_many_streamed_rows_per_cluster(force, dtype):
    force(exchange=0)  # grid groups would hold these rows
    x = random_rows(64, 4_194_304, dtype)  # 16 MB rows: each cluster streams several of them
    p = planned(*x.shape, dtype)
    run_and_check(x, dtype, f"{p}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("extra", [1, 9])
@pytest.mark.parametrize("peeled", [False, True])
def test_streamed_slices_keep_a_ring_for_the_writers(force, dtype, extra, peeled):
    """Streamed rows: the statistics pass leaves its last ring's worth of chunks for the writers,
    and the slice's other chunks are sent again. Slices of one chunk more than the ring (held in
    L2 between its two reads), and of several more, in 16-CTA clusters; rows on 16 bytes and rows
    whose edges are peeled."""
    force(exchange=0)
    force(cluster=16)
    e = ELEM[dtype]
    p0 = planned(8, 4_194_304, dtype)
    cols = 16 * (p0["ring_slots"] + extra) * p0["chunk_bytes"] // e - (3 if peeled else 0)
    x = random_rows(12, cols, dtype)
    x[0, 5] = float("nan")
    x[1, -2] = float("inf")
    x[2, :] = float("-inf")
    # (x and y from torch's allocator: rows off 16 bytes are off alike, so the library peels them)
    p = plan(12, cols, e, not peeled, **device_plan_args(), cluster=16, exchange=0, peelable=peeled)
    on_path(p["family"] == "cluster_rows" and not p["resident"], f"12x{cols} {dtype} streamed: {p}")
    run_and_check(x, dtype, f"{p}")


@pytest.mark.parametrize("rows,cols", paths.STREAMED_GRID_GROUPS)
def test_streamed_grid_groups(force, rows, cols):
    """Rows of 2 M and 4 M fp32 as the planner sends them on a Hopper GPU of 132 SMs with grid_rows
    left out (rows of 2 M go there otherwise: test_fp32_rows_no_cluster_holds_go_to_grid_rows): grid
    groups whose slices stream through the ring, keeping 7/8 of each, more rows than groups; special
    values; temperature and LSE. (Rows off 16 bytes never go to grid groups: plan_rows.)"""
    force(grid_rows=0)
    p = plan(rows, cols, 4, True, **device_plan_args(), grid_rows=0)
    on_path(p["family"] == "cluster_rows" and p["grid_exchange"] and not p["resident"],
            f"{rows}x{cols} float32 in streamed grid groups")
    x = random_rows(rows, cols, "float32")
    x[0, 5] = float("nan")
    x[1, -2] = float("inf")
    x[2, :] = float("-inf")
    x[3, 7] = float("-inf")
    run_and_check(x, "float32", f"{p}")
    y, lse = softlight.log_softmax(x, temperature=0.7, return_lse=True)
    torch.cuda.synchronize()
    assert_close_to_float64(y, x, "float32", f"temperature {p}", transform=lambda v: v / 0.7)
    assert_lse_close(lse, x, 0.7, "float32")


def test_misaligned_rows_grid_groups_would_take_go_to_clusters_peeled():
    """Rows of 2 M fp32 less 1 (torch's allocator leaves x and y off 16 bytes alike): grid groups
    peel nothing, so 16-CTA clusters carry them, streamed; special values."""
    cols = 2_097_151
    x = random_rows(13, cols, "float32")
    x[0, 3] = float("nan")
    x[1, :] = float("-inf")
    p = plan(13, cols, 4, False, **device_plan_args(), peelable=True)
    on_path(p["family"] == "cluster_rows" and p["peel"], f"13x{cols} float32 peeled into clusters")
    run_and_check(x, "float32", f"{p}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [1, 7, 1000, 4096, 8192, 50257, 393216, 1048576, 4194304])
def test_temperature_and_lse(cols, dtype):
    x = random_rows(rows_for(cols, dtype), cols, dtype)
    y = poisoned_like(x)
    t = 0.7
    r, lse = softlight.log_softmax(x, out=y, temperature=t, return_lse=True)
    torch.cuda.synchronize()
    assert r is y and lse.shape == x.shape[:-1]
    assert lse.dtype == (torch.float64 if dtype == "float64" else torch.float32)
    xs = x.double() / t
    assert_close_to_float64(y, x, dtype, f"temperature {dtype} {cols}", transform=lambda v: v / t)
    ref = torch.logsumexp(xs, -1)
    atol, rtol = TOL["float64" if dtype == "float64" else "float32"]
    assert bool(((lse.double() - ref).abs() <= atol + rtol * ref.abs()).all()), float((lse.double() - ref).abs().max())


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_element_rows_flat_and_strided(dtype):
    """Rows of one element: contiguous and aligned (16-byte packs, with a tail of rows that is not
    a whole pack), shifted by one element (element by element) and strided; special values
    everywhere (log_softmax of a lone x is 0, NaN for NaN and +-inf), temperature and LSE."""
    base = random_rows(100_003 * 3 + 1, 1, dtype)
    base[::97] = float("nan")
    base[1::89] = float("inf")
    base[2::83] = float("-inf")
    for x in (base[: 100_003 * 3], base[1:], base[::3]):
        y = poisoned_like(x)
        _, lse = softlight.log_softmax(x, out=y, temperature=0.5, return_lse=True)
        torch.cuda.synchronize()
        t = torch.log_softmax(x.double() / 0.5, -1)
        assert torch.equal(torch.isnan(y), torch.isnan(t)) and bool((y[~torch.isnan(t)] == 0).all())
        ref = x.double()[:, 0] / 0.5
        ref[torch.isposinf(ref)] = float("nan")  # the LSE of a row holding +inf (docs/semantics.md)
        assert torch.equal(torch.isnan(lse), torch.isnan(ref))
        inf, fin = torch.isinf(ref), torch.isfinite(ref)
        assert torch.equal(lse.double()[inf], ref[inf])
        assert bool(((lse.double()[fin] - ref[fin]).abs() <= 1e-5 + 1e-5 * ref[fin].abs()).all())


def test_lse_special_values_on_gpu():
    rng = np.random.default_rng()
    from reference import logsumexp_ref
    for cols in (3, 1000, 8192, 393216):
        xn = special_matrix(rng, cols, np.float32)
        x = torch.from_numpy(xn).cuda()
        _, lse = softlight.log_softmax(x, return_lse=True)
        ref = logsumexp_ref(xn)
        got = lse.cpu().numpy().astype(np.float64)
        assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(got[np.isinf(ref)], ref[np.isinf(ref)])
        fin = np.isfinite(ref)
        np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-5, atol=1e-5)
