"""The planner (pure host code) without a GPU: invariants every plan keeps, over row lengths,
dtypes, alignments and device profiles, and the few decisions that matter by name."""
import itertools
import math

import pytest

import paths

_planner = pytest.importorskip("softlight._planner", reason="the planner queries are a module of tuning builds "
                                   "(-C cmake.define.SOFTLIGHT_TUNING=ON); CI runs them in its tuning build")

H200 = dict(cc_major=9, cc_minor=0, sm_count=132, smem_optin=232448, max_cluster=16)
A100 = dict(cc_major=8, cc_minor=0, sm_count=108, smem_optin=166912, max_cluster=0)
# A Hopper part that schedules clusters of 8 at most, with fewer SMs (a partitioned or smaller GPU).
HOPPER_SMALL = dict(cc_major=9, cc_minor=0, sm_count=66, smem_optin=232448, max_cluster=8)
DEVICES = {"H200": H200, "A100": A100, "hopper-small": HOPPER_SMALL}
CLUSTER_FAMILIES = {"cluster_rows", "grid_rows", "cluster_tiles", "register_clusters"}
# The families that hold rows in lanes without a cluster, on every GPU.
LANE_FAMILIES = ("single_column", "flat_rows", "short_rows", "register_rows")

COLS = sorted(set(range(1, 300)) | {2 ** k + d for k in range(9, 23) for d in (-1, 0, 1, 3)} |
              {999, 1000, 1001, 3000, 4100, 5000, 8188, 32000, 50257, 128256, 151936, 262144, 393216})
# Layouts of a rows forward: (aligned16, aligned8, rows128, peelable, flat16) as a contiguous array
# at a given element offset from a 512-byte base has them.
OFFSETS = (0, 1, 3)


def rows_problem(rows, cols, elem, offset):
    start = offset * elem
    return dict(rows=rows, cols=cols, elem_bytes=elem,
                aligned16=start % 16 == 0 and cols * elem % 16 == 0, aligned8=start % 8 == 0 and cols * elem % 8 == 0,
                rows128=start % 128 == 0 and cols * elem % 128 == 0, peelable=start % elem == 0,
                flat16=start % 16 == 0)


def check_plan(p, prob, dev, what):
    """What every plan must be: a family the device has, a launch shape it can take, shared memory
    that fits, and a layout that covers each element of the row once."""
    fam = p["family"]
    row_bytes = prob["cols"] * prob["elem_bytes"]
    assert fam != "none", what
    if fam in CLUSTER_FAMILIES or p["cluster"] > 1 and not p["grid_exchange"]:
        assert dev["cc_major"] >= 9 and dev["max_cluster"] >= 1, what
    if not p["grid_exchange"]:
        assert p["cluster"] <= max(1, dev["max_cluster"]), what
    assert 32 <= p["threads"] <= 1024 and p["threads"] % 32 == 0, what
    assert 0 <= p["smem_bytes"] <= dev["smem_optin"], what
    assert 1 <= p["grid"] < 2 ** 31, what
    vec = p["vec"]
    assert vec * prob["elem_bytes"] <= 16 and 16 % (vec * prob["elem_bytes"]) == 0 or vec == 1, what
    if vec * prob["elem_bytes"] == 16 and not p["peel"]:
        assert prob["aligned16"], what  # 16-byte packs only where every row allows them
    if p["peel"]:
        assert prob["peelable"], what
    # Each family's plans carry what its launcher reads, and nothing of another family's.
    assert (fam == "flat_rows") == (p["flat_rows"] > 0), what
    assert (fam == "short_rows") == (p["rows_per_lane"] > 0), what
    assert fam != "single_column" or prob["cols"] == 1, what
    assert fam != "register_rows" or p["cluster"] == 0, what
    if fam in ("flat_rows", "register_clusters", "register_rows", "short_rows"):
        if fam == "flat_rows":
            assert prob["flat16"] and p["smem_bytes"] >= p["threads"] * p["flat_rows"] * row_bytes, what
        elif fam == "register_clusters":
            assert p["cluster"] >= 2, what
            # rows in registers over a cluster: the CTAs' packs hold the row's 16-byte blocks
            assert p["cluster"] * p["segment"] >= math.ceil(row_bytes / 16), what
            assert p["segment"] <= p["threads"] * p["iters"], what
        elif prob["cols"] > 1:
            assert p["group"] * p["iters"] * vec >= prob["cols"] - (2 * vec if p["peel"] else 0), what
            assert p["threads"] % p["group"] == 0 or p["group"] > p["threads"], what
    elif fam in ("cluster_rows", "grid_rows"):
        assert p["chunks_per_row"] * p["chunk_bytes"] >= row_bytes - (32 if p["peel"] else 0), what
        assert p["ring_slots"] >= 2 and p["chunk_bytes"] % 16 == 0, what
        if p["resident"] and fam == "cluster_rows" and not p["grid_exchange"]:
            assert p["cluster"] * p["ring_slots"] >= p["chunks_per_row"], what
    elif fam == "block_rows":
        assert not p["resident"] or p["smem_bytes"] >= row_bytes, what


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("elem", [2, 4, 8])
def test_every_rows_plan_is_valid(device, elem):
    dev = DEVICES[device]
    for cols, offset in itertools.product(COLS, OFFSETS):
        for rows in (1, 37, 4096):
            prob = rows_problem(rows, cols, elem, offset)
            if prob["rows"] * cols * elem > 2 ** 36:
                continue
            check_plan(_planner.plan_rows(prob, dev), prob, dev, (device, rows, cols, elem, offset))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("elem", [2, 4, 8])
def test_every_backward_and_axis_plan_is_valid(device, elem):
    dev = DEVICES[device]
    for dim in COLS[::3]:
        for aligned in (False, True):
            aligned = aligned and dim * elem % 16 == 0
            prob = dict(outer=64, dim=dim, inner=1, elem_bytes=elem, rows=True, aligned16=aligned, backward=True)
            p = _planner.plan_axis(prob, dev)
            check_plan(p, dict(cols=dim, elem_bytes=elem, aligned16=aligned, peelable=False), dev, (device, dim))
        for inner in (1, 3, 64, 1000):
            prob = dict(outer=4, dim=dim, inner=inner, elem_bytes=elem, rows=False, backward=False,
                        tiles_aligned=inner * elem % 16 == 0)
            p = _planner.plan_axis(prob, dev)
            assert p["family"] in ("split_rows", "cluster_tiles"), (device, dim, inner)
            if p["family"] == "cluster_tiles":
                assert dev["cc_major"] >= 9 and p["smem_bytes"] <= dev["smem_optin"]
                assert p["tiles"] * p["lanes"] >= inner and p["cluster"] * p["chunks_per_cta"] >= p["chunks_per_row"]
            else:
                assert p["tiles"] * p["lanes"] >= inner and p["cluster"] * p["segment"] * p["vec"] >= dim


def test_nothing_to_do():
    assert _planner.plan_rows(dict(rows=0, cols=10, elem_bytes=4), H200)["family"] == "none"
    assert _planner.plan_rows(dict(rows=10, cols=0, elem_bytes=4), H200)["family"] == "none"
    assert _planner.plan_axis(dict(outer=1, dim=0, inner=1, elem_bytes=4), H200)["family"] == "none"


def test_founding_shape():
    """4096 x 393216 fp32 (1.5 MB rows): each row held twice in the ring of a cluster of 16 CTAs on
    an H200, one read of x; a CTA a row, streamed, on an A100."""
    prob = rows_problem(4096, 393216, 4, 0)
    p = _planner.plan_rows(prob, H200)
    assert (p["family"], p["cluster"], p["grid_exchange"], p["resident"]) == ("cluster_rows", 16, False, True)
    assert 2 * p["chunks_per_cta"] <= p["ring_slots"]
    assert _planner.plan_rows(prob, A100)["family"] == "block_rows"


def test_short_and_medium_rows_stay_in_registers():
    for cols in (32, 128, 1000, 4096, 8192):
        p = _planner.plan_rows(rows_problem(100000, cols, 4, 0), H200)
        assert p["family"] in ("short_rows", "register_rows") and p["cluster"] == 0 and p["smem_bytes"] == 0, cols


def test_a100_never_gets_a_cluster_family():
    for cols in COLS[::7]:
        for elem in (2, 4, 8):
            p = _planner.plan_rows(rows_problem(64, cols, elem, 0), A100)
            assert p["family"] in LANE_FAMILIES + ("block_rows",)


def test_forced_values_take_effect_and_are_checked():
    prob = rows_problem(512, 393216, 4, 0)
    p = _planner.plan_rows(prob, H200, dict(cluster=8, exchange=0, chunk_bytes=8192))
    assert (p["family"], p["cluster"], p["chunk_bytes"]) == ("cluster_rows", 8, 8192)
    # A chunk the ring cannot hold twice is not taken (a 64 KB chunk leaves the backward's first
    # ring no slot beside its second).
    back = _planner.plan_axis(dict(outer=64, dim=393216, elem_bytes=4, rows=True, aligned16=True, backward=True), H200,
                        dict(chunk_bytes=65536))
    assert back["family"] == "cluster_rows" and back["chunk_bytes"] != 65536 and back["ring_slots"] >= 2
    assert _planner.tuning_valid({}) and _planner.tuning_valid(dict(cluster=16, chunk_bytes=16384, rows_per_lane=4))
    for bad in (dict(chunk_bytes=262144), dict(chunk_bytes=1000), dict(cluster=3), dict(cluster=32),
                dict(threads=100), dict(rows_per_lane=3), dict(split_lanes=3), dict(hints=8), dict(iters=5),
                dict(register_cluster=48), dict(item_chunks=9), dict(exchange=2), dict(cpu_kernels=-2)):
        assert not _planner.tuning_valid(bad), bad
    assert _planner.tuning_valid(dict(exchange=1, cluster=33))  # grid groups take any size
    with pytest.raises(KeyError):
        _planner.tuning_valid(dict(no_such_value=1))


# --- The paths the GPU tests take on an H100 (tests/paths.py): which family each of their problems
# gets is pinned here; the GPU tests check what the kernels compute there. ----------------------------

def _rows(prob, forced=None):
    return _planner.plan_rows(prob, paths.H100, forced or {})


def _fields(p, *names):
    return tuple(p[n] for n in names)


@pytest.mark.parametrize("device,expected", [(paths.H100, paths.COLS_FAMILIES_HOPPER),
                                             (A100, paths.COLS_FAMILIES_AMPERE)], ids=["H100", "A100"])
def test_the_gpu_tests_cols_reach_every_family(device, expected):
    fams = set()
    for dtype in paths.DTYPES:
        for cols in paths.COLS:
            p = _planner.plan_rows(paths.rows_problem(paths.rows_for(cols, dtype), cols, paths.ELEM[dtype]), device)
            fams.add((p["family"], p["resident"] if p["family"] in ("block_rows", "cluster_rows") else None))
    assert expected <= fams, fams


def test_forced_cluster_shapes_stripe_as_forced():
    for (chunk, threads, hints, stripe), cluster, dtype in itertools.product(
            paths.CLUSTER_FORCED, paths.CLUSTER_SIZES, ("float32", "bfloat16")):
        forced = dict(exchange=0, cluster=cluster, chunk_bytes=chunk, threads=threads, hints=hints, stripe=stripe)
        e = paths.ELEM[dtype]
        for cols in paths.CLUSTER_FORCED_COLS:
            rows = paths.cluster_forced_rows(cols, e, cluster, paths.H100["sm_count"])
            p = _rows(paths.rows_problem(rows, cols, e), forced)
            assert p["family"] != "cluster_rows" or p["striped"] == (stripe != 0), (forced, cols, p)


@pytest.mark.parametrize("cols,dtype,cluster,per_cta", paths.RESIZED_CHUNKS)
def test_uneven_chunks_are_resized(cols, dtype, cluster, per_cta):
    rows = paths.resized_chunks_rows(cluster, paths.H100["sm_count"])
    p = _rows(paths.rows_problem(rows, cols, paths.ELEM[dtype]))
    assert _fields(p, "family", "cluster", "chunks_per_cta", "double_buffered") == \
        ("cluster_rows", cluster, per_cta, True), p
    assert p["chunk_bytes"] != 32768 and p["chunk_bytes"] % 16 == 0 and p["chunks_per_row"] <= cluster * per_cta, p


def test_claimed_rows_forced_and_not():
    for (cluster, chunk, groups, row_bytes, rows), dtype in itertools.product(
            paths.CLAIMED, ("float32", "bfloat16", "float64")):
        e = paths.ELEM[dtype]
        prob = paths.rows_problem(rows, row_bytes // e, e)
        forced = dict(exchange=0, cluster=cluster, chunk_bytes=chunk, groups=groups, claim=1)
        p = _rows(prob, forced)
        assert p["family"] == "cluster_rows" and p["claim_rows"] and p["cluster"] == cluster, p
        assert not _rows(prob, dict(forced, claim=0))["claim_rows"]
    for rows, cols, dtype in paths.CLAIMED_BACK_TO_BACK:
        prob = paths.rows_problem(rows, cols, paths.ELEM[dtype])
        assert _rows(prob, dict(register_cluster=0))["claim_rows"], (rows, cols, dtype)


def test_flat_tiles_and_flat_forced_off():
    for (rows, cols), dtype in itertools.product(paths.FLAT_TILES, paths.DTYPES):
        if not paths.is_flat_tile_row(cols, dtype):
            continue
        prob = paths.rows_problem(rows, cols, paths.ELEM[dtype])
        assert _rows(prob)["flat_rows"] > 0, (rows, cols, dtype)
        assert _rows(prob, dict(flat=0))["flat_rows"] == 0, (rows, cols, dtype)


def test_rows_in_registers_over_a_cluster_forced():
    for cols, (threads, iters), dtype in itertools.product(
            paths.REGISTER_CLUSTER_COLS, paths.REGISTER_CLUSTER_SHAPES, ("float32", "bfloat16", "float16")):
        p = _rows(paths.rows_problem(37, cols, paths.ELEM[dtype]), dict(register_cluster=threads, iters=iters))
        c = paths.register_cluster_ctas(cols, dtype, threads, iters)
        if c is None:
            assert p["family"] != "register_clusters", p
            continue
        assert _fields(p, "family", "cluster", "threads", "iters") == ("register_clusters", c, threads, iters), p
        assert p["bounded"] == paths.register_cluster_bounded(cols, dtype, threads, iters), p


@pytest.mark.parametrize("cols,dtype", paths.FITTED_PACKS)
def test_fitted_packs_in_registers(cols, dtype):
    p = _rows(paths.rows_problem(37, cols, paths.ELEM[dtype]))
    assert _fields(p, "family", "cluster", "rows_per_lane") == ("register_rows", 0, 0) and p["iters"] in (3, 5, 6, 7), p


@pytest.mark.parametrize("cols,dtype", paths.ODD_ROWS)
def test_odd_rows_peeled_in_registers(cols, dtype):
    p = _rows(paths.rows_problem(37, cols, paths.ELEM[dtype], aligned=False, peelable=True))
    assert _fields(p, "family", "peel", "cluster", "rows_per_lane") == ("register_rows", True, 0, 0), p
    assert p["iters"] in (4, 5), p


def test_16_bit_register_clusters_off_128_bytes_are_bounded():
    for cols, e in itertools.product(paths.OFF_128_COLS, (2,)):
        prob = dict(rows=37, cols=cols, elem_bytes=e, aligned16=True, rows128=False)
        p = _rows(prob)
        assert _fields(p, "family", "threads", "iters", "bounded") == ("register_clusters", 128, 8, True), p
        assert not _rows(dict(prob, rows128=True))["bounded"]


def test_peeled_rows_in_registers_over_a_cluster():
    for cols, threads, dtype in itertools.product(paths.PEELED_REGISTER_CLUSTER_COLS, (0, 128, 256),
                                                  ("float32", "bfloat16", "float16")):
        forced = dict(register_cluster=threads) if threads else {}
        p = _rows(paths.rows_problem(37, cols, paths.ELEM[dtype], aligned=False, peelable=True), forced)
        vec = 16 // paths.ELEM[dtype]
        if threads and not 2 <= -(-(cols // vec) // (threads * 8)) <= 16:  # eight packs a thread
            assert p["family"] != "register_clusters", p
            continue
        assert p["family"] == "register_clusters" and p["peel"] and (threads == 0 or p["threads"] == threads), \
            (cols, threads, dtype, p)


def test_fp32_rows_no_cluster_holds_go_to_grid_rows():
    for rows, cols in paths.GRID_ROWS_FP32:
        assert _rows(paths.rows_problem(rows, cols, 4))["family"] == "grid_rows", (rows, cols)


def test_grid_rows_forced_with_other_items_chunks_and_ctas():
    for knobs, (rows, cols), dtype in itertools.product(paths.GRID_ROWS_KNOBS, paths.GRID_ROWS_SHAPES,
                                                        ("float32", "bfloat16", "float16")):
        p = _rows(paths.rows_problem(rows, cols, paths.ELEM[dtype]), dict(grid_rows=1, **paths.knobs(knobs)))
        assert p["family"] == "grid_rows", (knobs, rows, cols, dtype, p)


def test_rows_per_lane_forced():
    for (rows, bytes_), per_lane, dtype in itertools.product(paths.ROWS_PER_LANE, (1, 2, 4, 8), paths.DTYPES):
        e = paths.ELEM[dtype]
        p = _rows(paths.rows_problem(rows, bytes_ // e, e), dict(rows_per_lane=per_lane))
        assert p["rows_per_lane"] == per_lane, (rows, bytes_, dtype, p)


def test_16_bit_short_rows_four_rows_a_lane():
    for bytes_ in paths.SHORT_16_BIT_BYTES:
        p = _rows(paths.rows_problem(1031, bytes_ // 2, 2))
        assert p["family"] == "short_rows" and p["rows_per_lane"] == 4 and p["group"] <= 8, (bytes_, p)


def test_the_families_of_rows_near_the_float_max_and_next_to_a_large_one():
    for (cols, family), dtype in itertools.product(paths.NEAR_THE_MAX, ("float32", "bfloat16")):
        assert _rows(paths.rows_problem(5, cols, paths.ELEM[dtype]))["family"] == family, (cols, dtype)
    for (case, cols, family), dtype in itertools.product(paths.NEXT_TO_A_LARGE_MAX,
                                                        ("float32", "float64", "bfloat16")):
        e, rows = paths.ELEM[dtype], paths.next_to_a_large_max_rows(case)
        if case == "unaligned":
            p = _rows(paths.rows_problem(rows, cols, e, aligned=False))
        elif case.startswith("axis"):
            p = _planner.plan_axis(paths.axis_problem((cols, rows), 0, e), paths.H100)
        else:
            continue
        assert p["family"] == family, (case, cols, dtype, p)


def test_grid_groups_forced():
    sms = paths.H100["sm_count"]
    for group, dtype in itertools.product(paths.GRID_GROUPS, ("float32", "bfloat16")):
        e = paths.ELEM[dtype]
        for cols in paths.CLUSTER_FORCED_COLS:
            rows = min(3 * max(1, sms // group) + 5, max(1, (1 << 26) // (cols * e)))
            p = _rows(paths.rows_problem(rows, cols, e), dict(exchange=1, cluster=group))
            assert p["family"] == "cluster_rows" and p["grid_exchange"] and p["cluster"] == min(group, sms), p


def test_workspaces_and_streamed_rows():
    for rows, cols, workspace in paths.WORKSPACES:
        assert _rows(paths.rows_problem(rows, cols, 4))[workspace], (rows, cols, workspace)
    for dtype in ("float32", "bfloat16"):
        p = _rows(paths.rows_problem(64, 4_194_304, paths.ELEM[dtype]), dict(exchange=0))
        assert p["family"] == "cluster_rows" and not p["resident"], p


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("extra", [1, 9])
@pytest.mark.parametrize("peeled", [False, True])
def test_streamed_slices_keep_a_ring_for_the_writers(dtype, extra, peeled):
    e = paths.ELEM[dtype]
    forced = dict(exchange=0, cluster=16)
    p0 = _rows(paths.rows_problem(8, 4_194_304, e), forced)
    cols = 16 * (p0["ring_slots"] + extra) * p0["chunk_bytes"] // e - (3 if peeled else 0)
    p = _rows(dict(rows=12, cols=cols, elem_bytes=e, aligned16=not peeled, peelable=peeled), forced)
    assert p["family"] == "cluster_rows" and p["cluster"] == 16 and not p["resident"], p
    assert p["chunks_per_cta"] == p0["ring_slots"] + extra and p["peel"] == peeled, p
    # One chunk read twice is held in L2 between its reads (the hint), nine are not.
    assert bool(p["hints"] & 4) == (4 * extra <= p0["ring_slots"]), p


def test_streamed_grid_groups_and_misaligned_rows_peeled_into_clusters():
    for rows, cols in paths.STREAMED_GRID_GROUPS:
        p = _rows(dict(rows=rows, cols=cols, elem_bytes=4, aligned16=True), dict(grid_rows=0))
        assert p["family"] == "cluster_rows" and p["grid_exchange"] and not p["resident"], p
        assert p["chunks_per_cta"] > p["ring_slots"] and 2 * p["cluster"] <= paths.H100["sm_count"], p
    p = _rows(dict(rows=13, cols=2_097_151, elem_bytes=4, aligned16=False, peelable=True))
    assert p["family"] == "cluster_rows" and p["peel"] and not p["grid_exchange"] and not p["resident"], p


def test_the_gpu_axis_tests_reach_cluster_tiles():
    for dtype in paths.DTYPES:
        fams = {_planner.plan_axis(paths.axis_problem(s, d, paths.ELEM[dtype]), paths.H100)["family"]
                for s, d in paths.TILE_SHAPES}
        assert "cluster_tiles" in fams, (dtype, fams)
    p = _planner.plan_axis(paths.axis_problem((4, 10000, 64), 1, 4), paths.H100)
    assert p["family"] == "cluster_tiles" and not p["double_buffered"], p
    for cluster, chunk, dtype, shape in itertools.product(paths.CLUSTER_SIZES, (4096, 16384), ("float32", "bfloat16"),
                                                          paths.TILES_FORCED_SHAPES):
        p = _planner.plan_axis(paths.axis_problem(shape, 1, paths.ELEM[dtype]), paths.H100,
                               dict(cluster=cluster, chunk_bytes=chunk))
        assert p["family"] == "cluster_tiles" and p["cluster"] == cluster, (shape, cluster, chunk, p)


def test_backward_of_long_rows_in_cluster_rows():
    for cols in (393216, 1048576):
        assert _planner.plan_axis(paths.backward_problem(8, cols, 4), paths.H100)["family"] == "cluster_rows"
        assert _planner.plan_axis(paths.backward_problem(8, cols, 4), A100)["family"] == "split_rows"


@pytest.mark.parametrize("mode", list(paths.PEELED_MODES))
def test_peeled_rows_by_mode(mode):
    for cols, dtype in itertools.product(paths.PEELED_COLS, paths.DTYPES):
        e = paths.ELEM[dtype]
        prob = dict(rows=37, cols=cols, elem_bytes=e, aligned16=False, peelable=True)
        for device, hopper in ((paths.H100, True), (A100, False)):
            p = _planner.plan_rows(prob, device, paths.PEELED_MODES[mode])
            family = paths.peeled_family(cols, dtype, mode, hopper)
            one_cta = cols == 4099 and e <= 4
            assert (p["family"], p["peel"]) == (family, True), (cols, dtype, hopper, p)
            assert (p["cluster"] > 0) == (family != "block_rows" and not one_cta), (cols, dtype, hopper, p)


def _consumer(rows, cols, dtype, device=None, forced=None, **what):
    prob = dict(paths.rows_problem(rows, cols, paths.ELEM[dtype], peelable=True), **what)
    return _planner.plan_consumer(prob, device or paths.H100, forced or {})


def test_consumers_on_chip_where_the_log_softmax_holds_rows():
    """Cross-entropy's gradient and the statistics read the rows where the log-softmax holds them
    on chip: short_rows' (four rows a lane), flat_rows', register_rows' (rows in 16-byte packs), the
    register clusters' and cluster_rows' own plans (the ring's of CTAs of at most 544 threads), else
    consumer_rows."""
    ce = dict(cross_entropy=True, writes_grad=True)
    for rows, cols, where32, where16 in paths.CE_ON_CHIP:
        for dtype in ("float32", "float16", "bfloat16"):
            p = _consumer(rows, cols, dtype, **ce)
            e = paths.ELEM[dtype]
            assert paths.on_chip(p, e) == (where32 if dtype == "float32" else where16), (rows, cols, dtype, p)
            if p["family"] == "cluster_rows":
                assert p["threads"] == 544, p
            if p["family"] != "consumer_rows":
                forced = dict(threads=544) if p["family"] == "cluster_rows" else {}
                assert p == _rows(paths.rows_problem(rows, cols, paths.ELEM[dtype], peelable=True), forced)
    for (rows, cols), dtype in itertools.product(paths.CE_OVER_THE_LOGITS, ("float32", "float16", "bfloat16")):
        p = _consumer(rows, cols, dtype, **ce)
        assert paths.on_chip(p, paths.ELEM[dtype]) is not None, (rows, cols, dtype, p)
    # The statistics' rows: all held on chip by the log-softmax; the statistics read them there up
    # to 128 KiB (two cases are longer: consumer_rows).
    for dtype, (rows, cols) in paths.STATS_IN_REGISTERS:
        e = paths.ELEM[dtype]
        p = _rows(paths.rows_problem(rows, cols, e, peelable=True))
        assert paths.on_chip(p, e) in ("registers", "tiles"), (rows, cols)
        got = _consumer(rows, cols, dtype)
        assert got == p if cols * e <= 128 << 10 else got["family"] == "consumer_rows", (rows, cols, dtype, got)


def test_the_loss_alone_takes_the_statistics_plan():
    """Cross-entropy without its gradient writes none of the row's elements, as the statistics
    without the row's sum: the same plan for every row of the consumers' cases and around the
    128 KiB bound, each type (float64: consumer_rows), on a GPU with clusters and without; with
    label smoothing (the row's sum), consumer_rows."""
    cases = [(r, c) for r, c, _, _ in paths.CE_ON_CHIP] + [s for _, s in paths.STATS_IN_REGISTERS] + \
        [(64, 65536), (64, 65537), (64, 32768), (64, 32769), (1000, 1), (0, 100)]
    for (rows, cols), dtype in itertools.product(cases, ("float32", "float16", "bfloat16", "float64")):
        for dev in (None, A100):
            p = _consumer(rows, cols, dtype, dev, cross_entropy=True)
            assert p == _consumer(rows, cols, dtype, dev), (rows, cols, dtype, dev, p)
            if rows and cols > 1:
                smoothed = _consumer(rows, cols, dtype, dev, cross_entropy=True, label_smoothing=True)
                assert smoothed["family"] == "consumer_rows", (rows, cols, dtype)
    assert _consumer(64, 32000, "float32", cross_entropy=True)["family"] == "register_clusters"
    assert _consumer(1000, 10, "bfloat16", cross_entropy=True)["family"] == "flat_rows"
    assert _consumer(1000, 16, "float32", cross_entropy=True)["family"] == "short_rows"
    assert _consumer(64, 4096, "float32", cross_entropy=True)["family"] == "register_rows"


def test_cross_entropy_gradient_in_block_rows():
    """Cross-entropy's gradient of fp32 rows where the log-softmax plans block_rows with the row
    resident in shared memory: rows whose x and gradient are misaligned unlike (element by element),
    rows misaligned alike with the clusters' peeling off (peeled), and on a GPU without clusters
    aligned rows past one group's registers. 16-bit rows (faster in consumer_rows' two reads), rows
    past shared memory (read twice either way), the loss alone and the statistics (one read either
    way): consumer_rows."""
    ce = dict(cross_entropy=True, writes_grad=True)

    def consumer(rows, cols, dtype, device=paths.H100, forced=None, aligned=True, peelable=True, **what):
        prob = dict(paths.rows_problem(rows, cols, paths.ELEM[dtype], aligned=aligned, peelable=peelable), **what)
        return _planner.plan_consumer(prob, device, forced or {})

    for cols in (20000, 32000, 32777):
        p = consumer(40, cols, "float32", aligned=False, peelable=False, **ce)
        assert (p["family"], p["resident"], p["vec"], p["peel"]) == ("block_rows", True, 1, False), (cols, p)
        p = consumer(40, cols, "float32", aligned=False, forced=dict(peel_clusters=0), **ce)
        assert (p["family"], p["resident"], p["peel"], p["vec"]) == ("block_rows", True, True, 4), (cols, p)
        for dtype in ("float32", "bfloat16", "float16"):
            for what in (dict(cross_entropy=True), {}):
                assert consumer(40, cols, dtype, aligned=False, peelable=False, **what)["family"] == "consumer_rows"
        for dtype in ("bfloat16", "float16"):  # 16-bit rows: consumer_rows (faster there)
            assert consumer(40, cols, dtype, aligned=False, peelable=False, **ce)["family"] == "consumer_rows"
            p = consumer(40, cols, dtype, aligned=False, forced=dict(peel_clusters=0), **ce)
            assert p["family"] == "consumer_rows", (cols, dtype, p)
    p = consumer(40, 20000, "float32", A100, **ce)
    assert (p["family"], p["resident"], p["vec"]) == ("block_rows", True, 4), p
    assert consumer(40, 20000, "float32", A100)["family"] == "consumer_rows"
    for cols in (32000, 50257):
        assert consumer(40, cols, "bfloat16", A100, **ce)["family"] == "consumer_rows"
    assert consumer(40, 128256, "bfloat16", aligned=False, peelable=False, **ce)["family"] == "consumer_rows"
    assert consumer(40, 128256, "bfloat16", A100, **ce)["family"] == "consumer_rows"


def test_consumers_off_chip():
    """consumer_rows where no family holds the row for the consumer: float64; label smoothing (the
    row's sum); the statistics and the loss alone with the row's sum, or past 128 KiB rows (a ring
    takes them only for cross-entropy's gradient); a GPU without clusters, as the GPU entry's
    fallback plans with none; rows of one element; nothing to do; short rows at other than four rows
    a lane."""
    ce = dict(cross_entropy=True, writes_grad=True)
    assert _consumer(64, 32000, "float64", **ce)["family"] == "consumer_rows"
    assert _consumer(64, 151936, "bfloat16", cross_entropy=True)["family"] == "consumer_rows"
    assert _consumer(64, 32000, "float32", label_smoothing=True, **ce)["family"] == "consumer_rows"
    assert _consumer(64, 32000, "bfloat16", asks_sum=True)["family"] == "consumer_rows"
    assert _consumer(64, 151936, "bfloat16")["family"] == "consumer_rows"  # 297 KiB: no ring for the statistics
    assert _consumer(64, 65536, "bfloat16")["family"] == "register_clusters"  # 128 KiB
    assert _consumer(64, 65537, "bfloat16")["family"] == "consumer_rows"
    for dev in (A100, dict(paths.H100, max_cluster=0)):
        assert _consumer(64, 151936, "bfloat16", dev, **ce)["family"] == "consumer_rows"
        assert _consumer(64, 32000, "float32", dev)["family"] == "consumer_rows"
    assert _consumer(64, 1, "float32", **ce)["family"] == "consumer_rows"
    assert _consumer(0, 32000, "float32", **ce)["family"] == "none"
    # A forced CTA wider than the ring's writers take: consumer_rows' kernel, not the ring.
    assert _consumer(64, 151936, "bfloat16", forced=dict(threads=800), **ce)["family"] == "consumer_rows"
    # Short rows and flat tiles: float64, label smoothing and the row's sum off chip;
    # short rows at other than four rows a lane (forced) too, as their consumers' kernels take four.
    for cols in (16, 10):
        assert _consumer(1000, cols, "float64", **ce)["family"] == "consumer_rows"
        assert _consumer(1000, cols, "float32", cross_entropy=True, label_smoothing=True)["family"] == "consumer_rows"
        assert _consumer(1000, cols, "float32", label_smoothing=True, **ce)["family"] == "consumer_rows"
        assert _consumer(1000, cols, "float32", asks_sum=True)["family"] == "consumer_rows"
    for n in (1, 2, 8):
        assert _consumer(1000, 16, "float32", forced=dict(rows_per_lane=n), **ce)["family"] == "consumer_rows"
        assert _consumer(1000, 16, "bfloat16", forced=dict(rows_per_lane=n))["family"] == "consumer_rows"
    assert _consumer(1000, 16, "float32", forced=dict(rows_per_lane=4), **ce)["family"] == "short_rows"
