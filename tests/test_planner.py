"""The planner (pure host code) without a GPU: invariants every plan keeps, over row lengths,
dtypes, alignments and device profiles, and the few decisions that matter by name."""
import itertools
import math

import pytest

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
