"""GPU tests of any axis, strided views and the backward: every layout the split_rows family and
the short_rows and register_rows backward take, all four dtypes, against float64; outputs poisoned first, special
values included. Skipped without a GPU."""

import pytest

import paths
import softlight
from gpu_util import (DTYPES, assert_lse_close, axis_plan, device_plan_args, needs_gpu, on_path, plan, plan_axis_args,
                      tdtype, torch)
from reference import POISON, TOL

pytestmark = needs_gpu

GRAD_TOL = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 8e-3}


def assert_close(y, ref, dtype, what=""):
    """y against a float64 reference of the same shape: NaN where it has NaN, the same
    infinities, finite values within TOL."""
    atol, rtol = TOL[dtype]
    y = y.double()
    nan_r = torch.isnan(ref)
    assert torch.equal(torch.isnan(y), nan_r), f"{what}: NaN mismatch"
    inf_r = torch.isinf(ref)
    assert torch.equal(y[inf_r], ref[inf_r]), f"{what}: infinities differ"
    fin = ~nan_r & ~inf_r
    err = (y[fin] - ref[fin]).abs()
    lim = atol + rtol * ref[fin].abs()
    if err.numel():
        assert bool((err <= lim).all()), f"{what}: max excess {float((err - lim).max()):.3e}"


def assert_grad_close(dx, dy, y, d, dtype, what=""):
    dyd = dy.double()
    ref = dyd - torch.exp(y.double()) * dyd.sum(d, keepdim=True)
    dxd = dx.double()
    assert torch.equal(torch.isnan(dxd), torch.isnan(ref)), f"{what}: NaN mismatch"
    fin = ~torch.isnan(ref)
    scale = (1 + dyd.abs().sum(d, keepdim=True)).expand_as(ref)
    err = ((dxd - ref).abs() / scale)[fin]
    if err.numel():
        assert float(err.max()) <= GRAD_TOL[dtype], f"{what}: {float(err.max()):.3e}"


def rand(shape, dtype, scale=3.0):
    return (torch.randn(shape, device="cuda") * scale).to(tdtype(dtype))


AXES = [((2, 7, 5, 3), None), ((64, 4096, 32), 1), ((4, 300, 33), 1), ((3, 100000, 2), 1),
        ((8, 12288), 0), ((1000, 3), 0), ((2, 5, 70000), 1), ((5, 1), 1), ((1, 50000, 1), 1)]


@pytest.mark.parametrize("shape,dims", AXES, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_every_axis(shape, dims, dtype):
    x = rand(shape, dtype)
    for d in range(len(shape)) if dims is None else [dims]:
        y = torch.full_like(x, POISON)
        softlight.log_softmax(x, dim=d, out=y)
        torch.cuda.synchronize()
        assert_close(y, torch.log_softmax(x.double(), d), dtype, f"{shape} dim={d}")


@pytest.mark.parametrize("view,d", [
    (lambda a: a.t(), 0), (lambda a: a.t(), 1), (lambda a: a[:, 1:-1], 1), (lambda a: a[:, ::3], 1),
    (lambda a: a.reshape(40, 50, 30)[:, 3:40, :], 1), (lambda a: a.reshape(40, 50, 30)[:, :, 5], 0),
], ids=["t-dim0", "t-dim1", "slice", "step3", "middle-slice", "select-inner"])
def test_forward_strided_views(view, d):
    x = view(rand((2000, 30), "float32"))
    y = softlight.log_softmax(x, dim=d)
    torch.cuda.synchronize()
    assert_close(y, torch.log_softmax(x.double(), d), "float32")


def test_forward_special_values_down_columns():
    x = rand((4096, 8), "float32")
    x[5, 0] = float("nan")
    x[9, 1] = float("inf")
    x[:, 2] = float("-inf")
    x[::2, 3] = float("-inf")
    x[0, 4] = x[-1, 4] = float("-inf")
    for dtype in ("float32", "bfloat16"):
        xx = x.to(tdtype(dtype))
        y = softlight.log_softmax(xx, dim=0)
        torch.cuda.synchronize()
        assert torch.equal(torch.isnan(y), torch.isnan(torch.log_softmax(xx.float(), 0)))
        assert_close(y, torch.log_softmax(xx.double(), 0), dtype)


def test_forward_lse_and_temperature_along_an_axis():
    x = rand((6, 20000, 5), "float32")
    y, lse = softlight.log_softmax(x, dim=1, temperature=2.0, return_lse=True)
    torch.cuda.synchronize()
    assert lse.shape == (6, 5)
    assert_close(y, torch.log_softmax(x.double() / 2, 1), "float32")
    assert_close(lse, torch.logsumexp(x.double() / 2, 1), "float32")


def test_forward_in_place_along_an_axis():
    x = rand((16, 3000, 40), "float32")
    ref = torch.log_softmax(x.double(), 1)
    softlight.log_softmax(x, dim=1, out=x)
    torch.cuda.synchronize()
    assert_close(x, ref, "float32")


# --- non-last axes through cluster_tiles (Hopper; split_rows elsewhere) ------------------------------

TILE_SHAPES = paths.TILE_SHAPES


def with_column_specials(x):
    x = x.clone()
    x[0, :, 0] = float("-inf")  # a whole column
    x[0, 5 % x.shape[1], 1] = float("nan")
    x[-1, 3 % x.shape[1], 2] = float("inf")
    x[0, ::2, 3] = float("-inf")
    return x


@pytest.mark.parametrize("shape,d", TILE_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_tiles_against_float64(shape, d, dtype):
    x = rand(shape, dtype)
    if len(shape) == 3 and shape[2] >= 4:
        x = with_column_specials(x)
    y = torch.full_like(x, POISON)
    softlight.log_softmax(x, dim=d, out=y)
    torch.cuda.synchronize()
    assert_close(y, torch.log_softmax(x.double(), d), dtype, f"{shape} dim={d} {axis_plan(x, d)}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("cluster", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("chunk", [4096, 16384])
def test_forward_tiles_forced_clusters(force, cluster, chunk, dtype):
    """Every cluster size and two chunk sizes, with temperature and LSE, on more tiles than
    clusters (each cluster goes round several times) and on an axis that leaves CTAs idle."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("clusters need sm_90")
    force(cluster=cluster)
    force(chunk_bytes=chunk)
    for shape in paths.TILES_FORCED_SHAPES:
        x = with_column_specials(rand(shape, dtype))
        p = axis_plan(x, 1, cluster=cluster)
        y, lse = softlight.log_softmax(x, dim=1, temperature=1.5, return_lse=True)
        torch.cuda.synchronize()
        what = f"{shape} {p}"
        assert_close(y, torch.log_softmax(x.double() / 1.5, 1), dtype, what)
        # The LSE of a column holding NaN or +inf is NaN (docs/semantics.md).
        ref = torch.logsumexp(x.double() / 1.5, 1)
        ref[torch.isnan(x).any(1) | torch.isposinf(x).any(1)] = float("nan")
        assert_close(lse, ref, "float32", what)


def test_forward_tiles_in_place_and_strided_outer():
    x = rand((16, 3000, 128), "float32")
    ref = torch.log_softmax(x.double(), 1)
    softlight.log_softmax(x, dim=1, out=x)
    torch.cuda.synchronize()
    assert_close(x, ref, "float32", "in place")
    big = rand((20, 700, 96), "float32")
    v = big[2:18:2, :, 16:80]  # outer stride 2 * 700 * 96, inner offset 64 bytes
    y = softlight.log_softmax(v, dim=1)
    torch.cuda.synchronize()
    assert_close(y, torch.log_softmax(v.double(), 1), "float32", "strided view")


# --- backward --------------------------------------------------------------------------------------

BACKWARD_COLS = [1, 7, 16, 32, 64, 100, 1000, 1024, 1025, 1028, 2048, 3000, 4096, 8188, 16384, 32768, 50257, 131072,
                 393216, 1048576]


@pytest.mark.parametrize("cols", BACKWARD_COLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_rows(cols, dtype):
    rows = max(1, min(300, (1 << 23) // cols))
    y = torch.log_softmax(rand((rows, cols), "float32"), -1).to(tdtype(dtype))
    dy = rand((rows, cols), dtype, 1.0)
    dx = torch.full_like(dy, POISON)
    assert softlight.log_softmax_backward(dy, y, grad_in=dx) is dx
    torch.cuda.synchronize()
    assert_grad_close(dx, dy, y, -1, dtype, f"{rows}x{cols}")


@pytest.mark.parametrize("per_lane", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_short_rows_a_pack_of_each_row_a_lane(force, per_lane, dtype):
    """Aligned rows up to 512 bytes with rows_per_lane forced: a lane holds a pack of each of
    per_lane rows; rows of one pack to 32, groups not filled, rows left over past the last warp's."""
    force(rows_per_lane=per_lane)
    per_pack = 16 // torch.tensor([], dtype=tdtype(dtype)).element_size()
    for packs in (1, 3, 9, 25, 32):
        cols = packs * per_pack
        y = torch.log_softmax(rand((1037, cols), "float32"), -1).to(tdtype(dtype))
        dy = rand((1037, cols), dtype, 1.0)
        dx = torch.full_like(dy, POISON)
        softlight.log_softmax_backward(dy, y, grad_in=dx)
        torch.cuda.synchronize()
        assert_grad_close(dx, dy, y, -1, dtype, f"{per_lane} rows a lane, 1037x{cols}")


@pytest.mark.parametrize("cols", [1000, 1003, 70000])
def test_backward_misaligned_and_strided_rows(cols):
    base = rand((9, cols + 5), "float32", 1.0)
    y = torch.log_softmax(rand((8, cols), "float32"), -1)
    dy = base[1:, 1:cols + 1]  # an odd offset and a padded row stride
    dx = torch.full((8, cols + 3), POISON, device="cuda")[:, 2:cols + 2]
    softlight.log_softmax_backward(dy, y, grad_in=dx)
    torch.cuda.synchronize()
    assert_grad_close(dx, dy, y, -1, "float32")


@pytest.mark.parametrize("shape,d", [((8, 512, 64), 1), ((3, 70000, 3), 1), ((2000, 30), 0), ((4, 5, 6), 2)],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_along_any_axis(shape, d, dtype):
    y = torch.log_softmax(rand(shape, "float32"), d).to(tdtype(dtype))
    dy = rand(shape, dtype, 1.0)
    dx = softlight.log_softmax_backward(dy, y, dim=d)
    torch.cuda.synchronize()
    assert_grad_close(dx, dy, y, d, dtype, f"{shape} dim={d}")


def test_backward_equals_torch_autograd():
    x = rand((64, 50000), "float32").requires_grad_()
    y = torch.log_softmax(x, -1)
    dy = torch.randn_like(y)
    y.backward(dy)
    dx = softlight.log_softmax_backward(dy, y.detach())
    torch.cuda.synchronize()
    # Both round sum(dy) (about 200 in size here) to float32 in their own order, and exp(y) carries
    # that rounding into dx: compare each with float64 and ask softlight to be no further off, over
    # the whole tensor (root mean square: the largest error alone is one row's luck in rounding,
    # and left softlight 2.1 x torch's in one run of many), every element within its row's bound.
    assert_grad_close(dx, dy, y.detach(), -1, "float32")
    yd, dyd = y.detach().double(), dy.double()
    exact = dyd - torch.exp(yd) * dyd.sum(-1, keepdim=True)
    ours = float((dx.double() - exact).pow(2).mean().sqrt())
    theirs = float((x.grad.double() - exact).pow(2).mean().sqrt())
    assert ours <= max(2 * theirs, 1e-7), (ours, theirs)
    torch.testing.assert_close(dx, x.grad, rtol=1e-4, atol=1e-4)


def test_backward_in_place_and_special_values():
    y = torch.log_softmax(rand((4, 5000), "float32"), -1)
    y[0, 7] = float("-inf")
    y[1, 3] = float("nan")
    dy = rand((4, 5000), "float32", 1.0)
    ref = dy.double() - torch.exp(y.double()) * dy.double().sum(-1, keepdim=True)
    g = dy.clone()
    softlight.log_softmax_backward(dy, y, grad_in=dy)  # over grad_out
    torch.cuda.synchronize()
    assert float(dy[0, 7]) == float(g[0, 7])  # exp(-inf) = 0
    assert torch.equal(torch.isnan(dy), torch.isnan(ref))
    yy = y.clone()
    softlight.log_softmax_backward(g, yy, grad_in=yy)  # over out
    torch.cuda.synchronize()
    assert torch.equal(torch.isnan(yy), torch.isnan(ref))


def backward_plan(rows, cols, dtype):
    """The plan the library makes for the backward of aligned rows on this GPU (no overrides)."""
    d = {k: v for k, v in device_plan_args().items() if k != "cc_minor"}
    e = torch.tensor([], dtype=tdtype(dtype)).element_size()
    return plan_axis_args(rows, cols, 1, e, True, cols * e % 16 == 0, True, **d)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("cluster", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("chunk,threads,hints", [(4096, 288, 0), (16384, 544, 3), (32768, 160, 1)])
def test_backward_cluster_shapes_forced(force, cluster, chunk, threads, hints, dtype):
    """The backward through cluster_rows' two rings, with every cluster size and chunk size the
    tuning knobs can pick: rows that leave CTAs without a chunk, rows that stream dy through the
    ring twice, and more rows than clusters so that each cluster goes round several times."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("clusters need sm_90")
    for k, v in (("CLUSTER", cluster), ("CHUNK_BYTES", chunk), ("THREADS", threads), ("HINTS", hints)):
        force(**{k.lower(): v})
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    e = torch.tensor([], dtype=tdtype(dtype)).element_size()
    for cols in (8192, 69632, 393216, 2_000_000):
        rows = min(3 * sms // cluster + 5, max(1, (1 << 25) // (cols * e)))
        y = torch.log_softmax(rand((rows, cols), "float32"), -1).to(tdtype(dtype))
        dy = rand((rows, cols), dtype, 1.0)
        dx = torch.full_like(dy, POISON)
        softlight.log_softmax_backward(dy, y, grad_in=dx)
        torch.cuda.synchronize()
        assert_grad_close(dx, dy, y, -1, dtype, f"cluster={cluster} chunk={chunk} threads={threads} {rows}x{cols}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("group", [3, 22, 40])
def test_backward_grid_groups_forced(force, group, dtype):
    """The backward through cluster_rows with each row's CTAs a group of a cooperative grid that
    trades partials through global memory (group sizes off the powers of two and wider than a warp)."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("grid groups use cluster_rows' bulk copies (sm_90)")
    force(exchange=1)
    force(cluster=group)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    e = torch.tensor([], dtype=tdtype(dtype)).element_size()
    for cols in (8192, 69632, 393216):
        rows = min(3 * (sms // group) + 5, max(1, (1 << 25) // (cols * e)))
        y = torch.log_softmax(rand((rows, cols), "float32"), -1).to(tdtype(dtype))
        y[0, 5] = float("-inf")
        dy = rand((rows, cols), dtype, 1.0)
        dx = torch.full_like(dy, POISON)
        softlight.log_softmax_backward(dy, y, grad_in=dx)
        torch.cuda.synchronize()
        assert_grad_close(dx, dy, y, -1, dtype, f"group={group} {rows}x{cols}")


@pytest.mark.parametrize("cols", [393216, 1048576])
def test_backward_cluster_rows_in_place_and_special_values(cols):
    hopper = torch.cuda.get_device_capability()[0] >= 9
    on_path(backward_plan(8, cols, "float32")["family"] == ("cluster_rows" if hopper else "split_rows"),
            f"the backward of 8x{cols} float32 in cluster_rows (split_rows before Hopper)")
    y = torch.log_softmax(rand((8, cols), "float32"), -1)
    y[0, 7] = float("-inf")
    y[1, cols - 3] = float("nan")
    dy = rand((8, cols), "float32", 1.0)
    dy[2, cols // 2] = float("inf")
    ref = dy.double() - torch.exp(y.double()) * dy.double().sum(-1, keepdim=True)
    for target in ("dy", "y"):
        g, yy = dy.clone(), y.clone()
        out = g if target == "dy" else yy
        softlight.log_softmax_backward(g, yy, grad_in=out)
        torch.cuda.synchronize()
        assert torch.equal(torch.isnan(out), torch.isnan(ref)), target
        inf = torch.isinf(ref)  # row 2: inf in dy makes the sum inf
        assert bool(inf[2].any()) and torch.equal(out.double()[inf], ref[inf]), target
        fin = torch.isfinite(ref)
        scale = (1 + dy.double().abs().sum(-1, keepdim=True)).expand_as(ref)
        assert float(((out.double() - ref).abs() / scale)[fin].max()) <= GRAD_TOL["float32"], target


# --- rows misaligned alike in x and y: peeled to vectors ---------------------------------------------

@pytest.mark.parametrize("mode", ["default", "ring", "off"])
@pytest.mark.parametrize("cols", paths.PEELED_COLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_peeled_rows(force, cols, dtype, mode):
    """Rows misaligned alike in x and y, peeled: under 16 KB (fp32 and 16-bit) in one CTA's
    registers; else in block_rows, and on Hopper, from 32 KB, in registers over a cluster (up to
    512 KB fp32, 256 KB 16-bit) or in cluster_rows (the ring carries each row's 16-byte interior).
    "ring": register_cluster=0 forced (the ring's peel); "off": peel_clusters=0 forced keeps
    the rows from 32 KB in block_rows."""
    if paths.PEELED_MODES[mode]:
        force(**paths.PEELED_MODES[mode])
    rows = 37
    e = torch.tensor([], dtype=tdtype(dtype)).element_size()
    p = plan(rows, cols, e, False, **device_plan_args(), peelable=True, **paths.PEELED_MODES[mode])
    family = paths.peeled_family(cols, dtype, mode, torch.cuda.get_device_capability()[0] >= 9)
    on_path((p["family"], p["peel"]) == (family, True), f"{rows}x{cols} {dtype} peeled in {family}")
    x = rand((rows, cols), dtype)
    # Special values on the peeled edges: the first and last elements of some rows.
    x[0, 0] = float("nan")
    x[1, -1] = float("inf")
    x[2, :3] = float("-inf")
    x[3, -3:] = float("-inf")
    x[4, 1:] = float("-inf")
    y = torch.full_like(x, POISON)
    softlight.log_softmax(x, out=y)
    # Offset views: x and y both start one element in (the same misalignment), and not alike.
    xo = torch.cat([torch.zeros(1, device="cuda", dtype=x.dtype), x.flatten()])[1:].view(rows, cols)
    yo = torch.full((rows * cols + 1,), POISON, device="cuda", dtype=x.dtype)[1:].view(rows, cols)
    softlight.log_softmax(xo, out=yo)
    torch.cuda.synchronize()
    ref = torch.log_softmax(x.double(), -1)
    assert_close(y, ref, dtype, f"{cols} {dtype}")
    assert_close(yo, ref, dtype, f"{cols} {dtype} offset")
    # The LSE and a temperature on the offset views.
    yo.fill_(POISON)
    _, lse = softlight.log_softmax(xo, out=yo, temperature=0.5, return_lse=True)
    torch.cuda.synchronize()
    assert_close(yo, torch.log_softmax(x.double() / 0.5, -1), dtype, f"{cols} {dtype} offset, T=0.5")
    assert_lse_close(lse, x, 0.5, dtype)
