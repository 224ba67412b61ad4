"""The planner's choices (pure host code), for an H200 and an A100, without a GPU."""
import math

import pytest

from softlight import _C

H200 = dict(cc_major=9, cc_minor=0, sm_count=132, smem_optin=232448, max_cluster=16)
A100 = dict(cc_major=8, cc_minor=0, sm_count=108, smem_optin=166912, max_cluster=0)
ELEM = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def plan(rows, cols, dtype="float32", aligned=None, dev=H200, **over):
    e = ELEM[dtype]
    if aligned is None:
        aligned = cols * e % 16 == 0
    return _C.plan(rows, cols, e, aligned, **dev, **over)


def cluster_plan(*args, **over):
    """The plan with grid_rows left out (fp32 rows from 2 MB to a third of the grid's rings, and
    16-bit rows of 4 M, go to grid_rows otherwise: test_grid_rows)."""
    over.setdefault("grid_rows", 0)
    return plan(*args, **over)


def test_nothing_to_do():
    assert plan(0, 10)["family"] == "none"
    assert plan(10, 0)["family"] == "none"


@pytest.mark.parametrize("cols,group,iters,vec", [
    (1, 1, 1, 1), (3, 1, 4, 1), (36, 4, 4, 4), (100, 8, 4, 4), (128, 8, 4, 4),
    (1000, 64, 4, 4), (1024, 64, 4, 4), (7, 2, 4, 1), (33, 16, 4, 1), (256, 16, 4, 4),
    (4096, 256, 4, 4), (4100, 256, 5, 4), (8188, 256, 8, 4), (8192, 256, 8, 4),
])
def test_short_rows_go_to_warps(cols, group, iters, vec):
    p = plan(1000, cols)
    assert (p["family"], p["group"], p["iters"], p["vec"]) == ("warp_rows", group, iters, vec)
    assert p["group"] * p["iters"] * p["vec"] >= cols  # the row fits the group's registers
    assert p["iters"] >= min(4, math.ceil(cols / p["vec"]))  # and each lane has loads in flight
    # Up to a warp, CTAs of several rows: two warps for rows in 16-byte packs (rows in registers),
    # four for the others; past a warp, the CTA is the group.
    assert p["threads"] == (p["group"] if p["group"] > 32 else 64 if p["vec"] == 4 else 128)
    assert p["grid"] == math.ceil(1000 / (p["threads"] // p["group"]))


@pytest.mark.parametrize("cols,group", [(4, 1), (8, 2), (12, 4), (32, 8)])
def test_short_packed_rows_take_several_rows_a_lane(cols, group):
    """Rows of 16-byte packs up to 128 bytes: a group of lanes of a pack each per row, four rows a
    lane, so that each load of a warp is 512 contiguous bytes; longer rows stay a row a group."""
    p = plan(1000, cols)
    assert (p["family"], p["group"], p["iters"], p["vec"], p["rows_per_lane"]) == ("warp_rows", group, 1, 4, 4)
    assert p["threads"] == 128 and p["grid"] == math.ceil(1000 / (128 // group * 4))
    assert plan(1000, 36)["rows_per_lane"] == 0  # 144 bytes
    assert plan(1000, 64, "bfloat16")["rows_per_lane"] == 4 and plan(1000, 72, "bfloat16")["rows_per_lane"] == 0
    assert plan(1000, 31)["rows_per_lane"] == 0  # not in packs
    assert _C.plan(1000, 32, 4, True, **H200, rows_per_lane=0)["rows_per_lane"] == 0
    assert _C.plan(1000, 128, 4, True, **H200, rows_per_lane=2)["rows_per_lane"] == 2  # up to 512 bytes
    assert _C.plan(1000, 129, 4, True, **H200, rows_per_lane=2)["rows_per_lane"] == 0


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_rows_in_16_byte_packs_under_32_kb_stay_in_registers(dtype):
    e = ELEM[dtype]
    below = 32768 // e - 16 // e  # the longest row under 32 KB
    p = plan(100, below, dtype)
    wide = e <= 4  # fp32 and 16-bit rows past 16 KB: eight packs a thread, and up to 32 KB
    assert (p["family"], p["group"], p["iters"], p["vec"]) == ("warp_rows", 256 if wide else 512, 8 if wide else 4, 16 // e)
    assert plan(100, below, dtype, iters=8)["group"] == 256  # more packs per thread, fewer threads
    assert plan(100, below, dtype, iters=4)["group"] == 512
    assert plan(100, 32768 // e, dtype)["family"] == ("warp_rows" if wide else "cluster_rows")  # 32 KB
    past = plan(100, 32768 // e + 16 // e, dtype)  # past it: rows over a cluster's registers (3 CTAs of 16 KB)
    assert (past["family"], past["cluster"]) == ("warp_rows", 3) if wide else past["family"] == "cluster_rows"
    assert plan(100, 32768 // e + 16 // e, dtype, register_cluster=0)["family"] == "cluster_rows"  # else the ring
    assert plan(100, 16384 // e, dtype)["iters"] == (8 if e == 2 else 4)  # 16 KB: 16-bit rows only
    assert plan(100, 32768 // e + 16 // e, dtype, dev=A100)["family"] == "block_rows"
    assert plan(100, below, dtype, dev=A100)["family"] == "warp_rows"  # no clusters needed
    assert plan(100, below + 1, dtype)["family"] == "block_rows"  # not in 16-byte packs
    assert plan(100, 4096, dtype, cluster=2)["family"] == "cluster_rows"  # a cluster override wins
    assert plan(100, below, dtype, iters=3)["group"] == (256 if wide else 512)  # not 1, 2, 4 or 8: ignored


@pytest.mark.parametrize("cols,dtype,threads", [(32000, "bfloat16", 128), (50264, "float16", 128), (36008, "bfloat16", 128),
                                                (131072, "bfloat16", 256), (32768, "float32", 128), (131072, "float32", 256)])
def test_register_clusters_bounded_where_eight_ctas_an_sm_pay(cols, dtype, threads):
    """Register clusters of eight packs a thread are held to 64 registers in CTAs past 128 threads,
    and in CTAs of 128 threads for 16-bit rows in packs that do not start on 128 bytes; rows on 128
    bytes, fp32 rows and peeled rows keep the compiler's choice in CTAs of 128 threads."""
    e = ELEM[dtype]
    for rows128 in (False, True):
        p = plan(1000, cols, dtype, rows128=rows128)
        assert (p["family"], p["threads"], p["iters"]) == ("warp_rows", threads, 8) and p["cluster"] > 1, p
        assert p["bounded"] == (threads > 128 or (e == 2 and not rows128)), (rows128, p)
    assert not plan(1000, cols, dtype, rows128=True, iters=4)["bounded"]  # four packs a thread: never
    assert not plan(1000, 50257, "bfloat16", peelable=True)["bounded"]  # peeled: off 16 bytes
    assert plan(1000, 50257, "bfloat16", peelable=True)["peel"]


@pytest.mark.parametrize("cols,dtype,group,iters", [
    (4104, "bfloat16", 128, 5), (2052, "float32", 128, 5), (1032, "bfloat16", 32, 5), (5120, "bfloat16", 128, 5),
    (3000, "bfloat16", 64, 6), (8200, "bfloat16", 256, 5), (6000, "float32", 256, 6), (4100, "float32", 256, 5),
    (4096, "bfloat16", 128, 4), (1024, "bfloat16", 32, 4), (8192, "bfloat16", 128, 8), (1000, "float32", 64, 4),
    (1000, "bfloat16", 32, 4), (6144, "bfloat16", 256, 4), (36, "float32", 4, 4), (72, "bfloat16", 4, 4)])
def test_rows_in_registers_fit_the_packs_a_thread(cols, dtype, group, iters):
    """Rows in 16-byte packs in registers: where a power of two of packs a thread would leave more
    than a quarter of the group's packs empty (a row just past a power of two), half the group
    holds the row in five to eight packs a thread, or past eight the group takes as many as it
    needs; rows that fill three quarters, and groups of a warp or less, keep the power of two. The
    ITERS override keeps it."""
    vectors = cols * ELEM[dtype] // 16
    p = plan(1000, cols, dtype)
    assert (p["family"], p["group"], p["iters"], p["rows_per_lane"]) == ("warp_rows", group, iters, 0), p
    assert group * iters >= vectors and 1 <= iters <= 8
    assert 4 * vectors >= 3 * group * iters or group <= 32
    assert p["threads"] == max(group, 64) and p["grid"] == math.ceil(1000 / (p["threads"] // group))
    forced = plan(1000, cols, dtype, iters=4)
    assert forced["iters"] in (4, 8) and forced["group"] * forced["iters"] >= vectors


def test_register_rows_bound_override():
    """An experiment's knob: longer rows held in registers, up to 1024 threads of 8 packs (128 KB)."""
    p = plan(100, 32768, "bfloat16", register_rows_bytes=128 * 1024)  # 64 KB rows, eight packs a thread
    assert (p["family"], p["group"], p["iters"], p["threads"]) == ("warp_rows", 512, 8, 512)
    p = plan(100, 65536, "bfloat16", register_rows_bytes=1 << 40)  # capped: the most that fits
    assert (p["family"], p["group"], p["iters"]) == ("warp_rows", 1024, 8)
    assert plan(100, 65536 + 8, "bfloat16", register_rows_bytes=1 << 40, register_cluster=0)["family"] == "cluster_rows"
    assert plan(100, 4096, "float32", register_rows_bytes=8192)["family"] == "block_rows"  # a lower bound


@pytest.mark.parametrize("cols,dtype,vec", [(50257, "bfloat16", 8), (50257, "float32", 4), (4099, "float16", 8)])
def test_equally_misaligned_rows_are_peeled_to_vectors(cols, dtype, vec):
    # Up to 16 KB, rows in registers, peeled (test_odd_rows_in_registers); past it, block_rows.
    family = "warp_rows" if cols * ELEM[dtype] < 16384 + 16 else "block_rows"
    p = _C.plan(100, cols, ELEM[dtype], False, **A100, peelable=True)
    assert (p["family"], p["peel"], p["vec"]) == (family, True, vec)
    p = _C.plan(100, cols, ELEM[dtype], False, **H200, peelable=True, peel_clusters=0)
    assert (p["family"], p["peel"], p["vec"]) == (family, True, vec)
    q = _C.plan(100, cols, ELEM[dtype], False, **H200)  # x and y misaligned differently
    assert (q["family"], q["peel"], q["vec"]) == ("block_rows", False, 1)
    assert _C.plan(100, cols, 8, False, **H200, peelable=True)["vec"] == 2  # float64 as well


@pytest.mark.parametrize("cols,dtype,group,iters", [
    (257, "float32", 32, 4), (263, "float32", 32, 4), (999, "float32", 64, 4), (2049, "float32", 128, 5),
    (4095, "float32", 256, 4), (257, "bfloat16", 16, 4), (511, "bfloat16", 16, 4), (1025, "bfloat16", 32, 5),
    (3001, "bfloat16", 128, 4), (4097, "float16", 128, 5), (8191, "bfloat16", 256, 4)])
def test_odd_rows_in_registers(cols, dtype, group, iters):
    """Rows off 16 bytes but off alike in x and y, past 256 elements and up to 16 KB, are held in
    registers, peeled: the 16-byte blocks that end in each row, four or five a thread (at four in
    groups of at least 2 x vec threads, an element each of the blocks the row starts and ends
    inside), on any GPU. Rows misaligned differently, float64 rows, and rows past 16 KB are not."""
    vec = 16 // ELEM[dtype]
    for dev in (H200, A100):
        p = _C.plan(1000, cols, ELEM[dtype], False, **dev, peelable=True)
        assert (p["family"], p["peel"], p["vec"], p["group"], p["iters"], p["cluster"]) == \
            ("warp_rows", True, vec, group, iters, 0), p
        assert p["threads"] == max(group, 64) and p["grid"] == math.ceil(1000 / (p["threads"] // group))
        assert group * iters * vec >= cols and (iters == 5 or group >= 2 * vec)
    assert _C.plan(1000, cols, ELEM[dtype], False, **H200)["family"] == "block_rows"  # not peelable
    assert _C.plan(1000, cols, ELEM[dtype], False, **A100, peelable=True, register_rows_bytes=1)["family"] == "block_rows"
    assert _C.plan(1000, 1001, 8, False, **A100, peelable=True)["family"] == "block_rows"  # float64
    past = (16384 + 16) // ELEM[dtype] + 1  # past 1024 packs: register clusters on Hopper (two CTAs)
    assert _C.plan(1000, past, ELEM[dtype], False, **A100, peelable=True)["family"] == "block_rows"
    q = _C.plan(1000, past, ELEM[dtype], False, **H200, peelable=True)
    assert (q["family"], q["cluster"], q["peel"]) == ("warp_rows", 2, True), q


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_odd_rows_at_four_packs_have_a_thread_for_each_edge_element(dtype):
    """At four packs a thread, a peeled row's elements in the blocks it starts and ends inside go an
    element each to the group's threads 0 to 2 x vec - 1 (warp_rows.cu): every such plan, at every
    length from 2 x vec elements to 16 KB, has a group that large."""
    e = ELEM[dtype]
    vec = 16 // e
    seen = 0
    for dev in (H200, A100):
        for cols in range(2 * vec, 16384 // e + 2):
            p = _C.plan(1000, cols, e, False, **dev, peelable=True)
            if p["family"] == "warp_rows" and p["peel"] and p["cluster"] == 0 and p["iters"] == 4:
                seen += 1
                assert p["group"] >= 2 * vec, (cols, p)
    assert seen > 1000


@pytest.mark.parametrize("cols,dtype,vec,group", [(100, "bfloat16", 4, 8), (100, "float16", 4, 8), (2, "float32", 2, 1),
                                                 (1000, "bfloat16", 4, 32), (50, "float32", 2, 8)])
def test_short_rows_aligned_to_8_bytes_read_in_half_packs(cols, dtype, vec, group):
    p = _C.plan(1000, cols, ELEM[dtype], False, **H200, aligned8=True)
    assert (p["family"], p["vec"], p["group"]) == ("warp_rows", vec, group)
    assert _C.plan(1000, cols, ELEM[dtype], False, **H200)["vec"] == 1  # not aligned: elements
    assert _C.plan(1000, 2052, 2, False, **H200, aligned8=True)["family"] == "block_rows"  # over 256 packs
    assert _C.plan(1000, 101, 8, False, **H200, aligned8=True)["vec"] == 1  # float64: a pack of one


def test_warp_rows_limits_by_dtype():
    assert plan(10, 2048, "bfloat16")["family"] == "warp_rows"     # 16-byte packs: rows under 32 KB
    assert plan(10, 16376, "bfloat16")["family"] == "warp_rows"
    assert plan(10, 512, "float64")["family"] == "warp_rows"
    assert plan(10, 256, aligned=False)["family"] == "warp_rows"   # elements: 32 lanes x 8
    assert plan(10, 257, aligned=False)["family"] == "block_rows"
    assert plan(10, 1025)["family"] == "block_rows"                # odd: scalar access, 1025 > 256


def test_block_rows_resident_and_streamed():
    p = plan(100, 10001, dev=A100, aligned=False, peelable=True)  # past 32 KB: not in registers
    assert p["family"] == "block_rows" and p["resident"] and p["smem_bytes"] == -(-10001 * 4 // 16) * 16
    assert p["vec"] == 4 and p["peel"] and 128 <= p["threads"] <= 1024
    # unaligned long rows: one CTA per row, two passes when the row outgrows shared memory
    p = plan(4, 1_000_003)
    assert p["family"] == "block_rows" and not p["resident"] and p["vec"] == 1 and p["smem_bytes"] == 0
    p = plan(4, 50_001)  # 200 KB, unaligned: still fits
    assert p["family"] == "block_rows" and p["resident"]


def test_founding_shape_on_h200():
    p = plan(4096, 393216)
    assert p["family"] == "cluster_rows" and p["resident"] and not p["grid_exchange"]
    assert p["cluster"] == 16 and p["chunk_bytes"] == 16384 and p["claim_rows"]
    assert p["chunks_per_row"] == 96 and p["chunks_per_cta"] == 6
    assert 2 * p["chunks_per_cta"] <= p["ring_slots"]  # the next row streams in behind this one
    assert p["smem_bytes"] <= H200["smem_optin"] and p["threads"] == 544 and p["double_buffered"]
    # As grid groups (a knob): 22 CTAs, 6 rows at once on all 132 SMs, each slice held twice.
    q = plan(4096, 393216, exchange=1)
    assert q["grid_exchange"] and q["cluster"] == 22 and q["chunks_per_cta"] == 5 and q["double_buffered"]


@pytest.mark.parametrize("rows,cols,group,per_cta,twice", [(4096, 1572864, 66, 6, True), (4096, 1245184, 44, 7, True),
                                                      (4, 4194304, 132, 8, False)])
def test_grid_groups_for_fp32_rows_no_cluster_holds_twice(rows, cols, group, per_cta, twice):
    p = cluster_plan(rows, cols)
    assert (p["grid_exchange"], p["cluster"], p["chunks_per_cta"], p["double_buffered"]) == (True, group, per_cta, twice)
    assert p["resident"] and group * per_cta >= p["chunks_per_row"]
    assert (132 // group) * group == 132  # every SM busy
    # Fewer rows than groups: the group widens so that the rows still cover the SMs.
    assert cluster_plan(2, 1048576)["cluster"] == 66


def test_streamed_clusters_where_they_keep_most_of_each_slice():
    # Rows whose 16-CTA slices outgrow the ring by at most a third: the clusters keep 3/4 of each
    # slice in the ring and read the rest twice, which beat grid groups (fp32, 1 M columns: 16
    # chunks a CTA, 14 kept). One chunk more a CTA (under 3/4 kept) and the groups take them again.
    p = cluster_plan(4096, 1048576)
    assert p["family"] == "cluster_rows" and not p["grid_exchange"] and p["cluster"] == 16
    assert not p["resident"] and p["chunks_per_cta"] == 16 and p["ring_slots"] == 14 and p["claim_rows"]
    assert cluster_plan(4096, 16 * 18 * 4096)["chunks_per_cta"] == 18 and not cluster_plan(4096, 16 * 18 * 4096)["grid_exchange"]
    assert cluster_plan(4096, 16 * 19 * 4096)["grid_exchange"]
    assert cluster_plan(2, 1048576)["grid_exchange"]  # too few rows for the clusters to cover the SMs


def test_streamed_grid_groups():
    # Rows that no group holds twice in slices of 5 chunks, with rows enough: two groups or more
    # that stream their slices through the ring keeping 7/8 of each (14 of 16 chunks), every SM busy.
    for rows, cols, group in [(64, 4194304, 66), (9, 4194304, 66), (128, 2097152, 33)]:
        p = cluster_plan(rows, cols)
        assert p["grid_exchange"] and p["cluster"] == group and not p["resident"], (rows, cols, p)
        assert p["ring_slots"] == 14 and p["chunks_per_cta"] == 16 and not p["claim_rows"]
        assert (132 // group) * group == 132
    # A slice of 4 chunks held twice (one group of 132) gives way to them; one of 5 does not.
    assert cluster_plan(4, 2097152)["chunks_per_cta"] == 4 and cluster_plan(4, 2097152)["resident"]  # few rows: held
    p = cluster_plan(200, 1310720)
    assert p["grid_exchange"] and p["resident"] and p["double_buffered"] and p["chunks_per_cta"] == 5
    # Never one streamed group of every SM (rows of 8 M): 16-CTA clusters stream those, as they do
    # 16-bit rows and rows past any group's 7/8 (test_grid_groups_elsewhere).
    p = cluster_plan(32, 8388608)
    assert not p["grid_exchange"] and p["cluster"] == 16 and not p["resident"]
    assert cluster_plan(1024, 3145728)["cluster"] == 132 and cluster_plan(1024, 3145728)["chunks_per_cta"] == 6  # held twice
    assert not cluster_plan(128, 4194304, "bfloat16")["grid_exchange"]
    # The knobs force a group of any size, the slice streamed however much of it the ring keeps.
    p = cluster_plan(64, 4194304, exchange=1, cluster=33)
    assert p["grid_exchange"] and p["cluster"] == 33 and p["chunks_per_cta"] == 32
    assert not cluster_plan(64, 4194304, exchange=0)["grid_exchange"]


def test_fp32_slices_of_4_chunks_halve_into_wider_clusters():
    # fp32 forward rows whose smallest twice-holding cluster (2 or 4 CTAs) gives 4 chunks a CTA:
    # twice the CTAs, 2 chunks (32 KB) each. Only where every CTA gets 2 (not rows of 15 chunks);
    # not past clusters of 8, nor for other types, the backward, or a chunk size asked for.
    for cols, cluster in [(32000, 4), (32768, 4), (65536, 8)]:
        p = plan(8192, cols, register_cluster=0)
        assert (p["cluster"], p["chunks_per_cta"], p["double_buffered"]) == (cluster, 2, True), (cols, p)
    assert (plan(4096, 61440, register_cluster=0)["cluster"], plan(4096, 61440, register_cluster=0)["chunks_per_cta"]) == (4, 4)
    assert (plan(4096, 131072, register_cluster=0)["cluster"], plan(4096, 131072, register_cluster=0)["chunks_per_cta"]) == (8, 4)
    assert plan(4096, 16384, register_cluster=0)["cluster"] == 1 and plan(4096, 24576, register_cluster=0)["cluster"] == 1
    assert plan(8192, 65536, "bfloat16", register_cluster=0)["cluster"] == 2
    assert plan(8192, 32768, chunk_bytes=16384, register_cluster=0)["cluster"] == 2
    assert plan_axis(8192, 32768, backward=True)["cluster"] != 4


def test_16bit_rows_of_two_chunks_go_to_two_ctas():
    # 16-bit forward rows of two 32 KB chunks, which one CTA would hold twice: two CTAs of a chunk
    # each. Not rows of 4 chunks (two CTAs of two stay), nor rows of 3 (one CTA), 16 KB chunks
    # (rows of 50 257), the backward, or a chunk size asked for.
    for cols in (32000, 32768):
        for dtype in ("bfloat16", "float16"):
            p = plan(15625, cols, dtype, register_cluster=0)
            assert (p["cluster"], p["chunks_per_cta"], p["double_buffered"]) == (2, 1, True), (cols, dtype, p)
    assert (plan(7629, 65536, "bfloat16", register_cluster=0)["cluster"], plan(7629, 65536, "bfloat16", register_cluster=0)["chunks_per_cta"]) == (2, 2)
    assert plan(8192, 49152, "bfloat16", register_cluster=0)["cluster"] == 1
    assert plan(9950, 50257, "bfloat16", peelable=True, register_cluster=0)["cluster"] == 1
    assert plan(15625, 32768, "bfloat16", chunk_bytes=32768, register_cluster=0)["cluster"] == 1
    assert plan_axis(15625, 32768, dtype="bfloat16", backward=True)["cluster"] == 1


def test_16bit_rows_held_by_clusters_of_8_take_groups_of_128():
    # 16-bit forward rows held twice in 32 KB chunks by clusters of 8 (384 to 768 KB), every CTA as
    # many whole chunks: CTAs of 288 threads. Not uneven slices (a short last chunk, or some CTAs a
    # chunk more), clusters of 4 or 16, fp32, the backward, peeled rows, or threads or chunks asked for.
    for cols in (262144, 393216):
        for dtype in ("bfloat16", "float16"):
            p = plan(1907, cols, dtype)
            assert (p["family"], p["cluster"], p["double_buffered"], p["threads"]) == ("cluster_rows", 8, True, 288), (cols, dtype, p)
    # 230 000: 15 chunks; 360 000: 22 chunks, six CTAs with three and two with two. (262 152 to
    # 300 000, 17 to 19 chunks, take two larger chunks a CTA instead, and rows of 13 chunks 16 over
    # clusters of 4: the next tests.)
    for cols in (230000, 262152, 270000, 300000, 330000, 360000):
        for dtype in ("bfloat16", "float16"):
            p = plan(1907, cols, dtype)
            assert (p["family"], p["cluster"], p["double_buffered"], p["threads"]) == ("cluster_rows", 8, True, 544), (cols, dtype, p)
    for cols in (196616, 200000):  # 13 chunks: 16 over clusters of 4 (below), 544 threads too
        assert plan(1907, cols, "bfloat16")["threads"] == 544
    assert plan(1907, 196608, "bfloat16")["cluster"] == 4 and plan(1907, 196608, "bfloat16")["threads"] == 544
    assert plan(477, 1048576, "bfloat16")["cluster"] == 16 and plan(477, 1048576, "bfloat16")["threads"] == 544
    assert plan(954, 262144)["threads"] == 544 and plan(636, 393216)["threads"] == 544
    assert plan(1907, 262144, "bfloat16", threads=544)["threads"] == 544
    assert plan(1907, 262144, "bfloat16", chunk_bytes=32768)["threads"] == 544
    assert plan_axis(1907, 262144, dtype="bfloat16", backward=True)["threads"] == 544
    peeled = plan(1907, 262143, "bfloat16", peelable=True)
    assert (peeled["family"], peeled["peel"], peeled["cluster"], peeled["threads"]) == ("cluster_rows", True, 8, 544)


def test_16bit_rows_of_three_chunks_a_cta_take_two_larger_ones():
    # 16-bit forward rows held twice whose CTAs would take three 32 KB chunks of a row: two chunks
    # a CTA of the row's bytes / (2 x cluster), rounded up to 16 bytes, where that is at most 38 KB.
    for cols, cluster in [(140000, 4), (150000, 4), (262152, 8), (280000, 8), (310000, 8), (600000, 16)]:
        for dtype in ("bfloat16", "float16"):
            p = plan(1000, cols, dtype)
            chunk = -(-2 * cols // (2 * cluster) // 16) * 16
            assert (p["family"], p["cluster"], p["chunk_bytes"], p["chunks_per_cta"], p["double_buffered"]) == \
                ("cluster_rows", cluster, chunk, 2, True), (cols, dtype, p)
            assert p["chunks_per_row"] <= 2 * cluster and p["threads"] == 544, p
            assert p["ring_slots"] == (232448 - (p["smem_bytes"] - p["ring_slots"] * (chunk + 16))) // (chunk + 16), p
    assert plan(1000, 280000, "float16")["ring_slots"] == 6 and plan(1000, 310000, "bfloat16")["ring_slots"] == 5
    # Not where two chunks would pass 38 KB (360 000: 45 008 bytes; 393 216: 48 KB), nor rows of two
    # chunks a CTA or held once, fp32, the backward, peeled rows, or chunks or clusters asked for.
    for cols, dtype in [(360000, "float16"), (393216, "bfloat16"), (327680, "bfloat16"), (262144, "bfloat16"),
                        (230000, "float16"), (1048576, "bfloat16"), (170000, "bfloat16")]:
        assert plan(1000, cols, dtype)["chunk_bytes"] == 32768, (cols, dtype)
    assert plan(1000, 280000, "float32")["chunk_bytes"] == 16384
    assert plan_axis(1000, 280000, dtype="bfloat16", backward=True)["chunk_bytes"] == 16384
    assert plan(1000, 280001, "bfloat16", peelable=True)["chunk_bytes"] == 32768
    assert plan(1000, 280000, "bfloat16", chunk_bytes=32768)["chunks_per_cta"] == 3
    assert plan(1000, 280000, "bfloat16", cluster=8)["chunk_bytes"] == 32768


def test_16bit_rows_of_two_uneven_chunks_a_cta_take_four_over_half_the_cluster():
    # 16-bit forward rows whose CTAs take two 32 KB chunks, some one: 4 C chunks of the row's bytes /
    # 4 C (rounded up to 16 bytes) over clusters of C / 2, four a CTA, held twice. Clusters of 8:
    # rows of 13 chunks (384 to 416 KB); clusters of 16: rows of 25 to 28 chunks (768 to 896 KB).
    for cols, cluster in ((196616, 4), (200000, 4), (205000, 4), (212992, 4),
                          (393224, 8), (395000, 8), (410000, 8), (455000, 8), (458752, 8)):
        for dtype in ("bfloat16", "float16"):
            p = plan(1000, cols, dtype)
            chunk = -(-2 * cols // (4 * cluster) // 16) * 16
            assert (p["family"], p["cluster"], p["chunk_bytes"], p["chunks_per_row"], p["chunks_per_cta"],
                    p["double_buffered"], p["threads"]) == ("cluster_rows", cluster, chunk, 4 * cluster, 4, True,
                                                            544), (cols, p)
            assert p["ring_slots"] >= 8
    # Not rows of 14 chunks or more over 8 (216 000, 230 000), nor rows of 12 (196 608: clusters of 4
    # already); over 16, not rows of 29 chunks or more (458 760, 460 000, 470 000), nor rows of 32
    # (524 288, even already) or 24 (393 216, clusters of 8 already).
    for cols, cluster in ((216000, 8), (230000, 8), (196608, 4), (393216, 8), (458760, 16), (460000, 16),
                          (470000, 16), (524288, 16)):
        p = plan(1000, cols, "bfloat16")
        assert (p["cluster"], p["chunk_bytes"]) == (cluster, 32768), (cols, p)
    # Nor fp32, the backward, peeled rows, or chunks or clusters asked for.
    for cols, cluster in ((200000, 8), (410000, 16)):
        assert plan(1000, cols, "float32")["chunk_bytes"] == 16384
        assert plan_axis(1000, cols, dtype="bfloat16", backward=True)["chunk_bytes"] == 16384
        assert plan(1000, cols + 1, "bfloat16", peelable=True)["chunk_bytes"] == 32768
        assert plan(1000, cols, "bfloat16", chunk_bytes=32768)["cluster"] == cluster
        assert plan(1000, cols, "bfloat16", cluster=cluster)["chunk_bytes"] == 32768


def test_chunks_read_twice_are_held_in_l2_where_few():
    # Streamed forward slices: the chunks the ring does not keep are loaded evict-last (hint bit 2)
    # where they are at most a quarter of the kept ones; not for held slices, the backward, many
    # chunks read twice, or where the hints are asked for.
    read_twice_in_l2 = 4
    for rows, cols in [(256, 1048576), (128, 2097152), (64, 4194304)]:  # 2 of 16 chunks read twice
        p = cluster_plan(rows, cols)
        assert not p["resident"] and p["chunks_per_cta"] - min(p["chunks_per_cta"], p["ring_slots"]) == 2, p
        assert p["hints"] & read_twice_in_l2, (rows, cols, p)
    p = cluster_plan(128, 4194304, "bfloat16")  # 9 of 16 (else grid_rows: test_grid_rows)
    assert not p["resident"] and not p["hints"] & read_twice_in_l2
    p = cluster_plan(128, 2097151, peelable=True)  # peeled clusters, 18 of 32
    assert p["peel"] and not p["resident"] and not p["hints"] & read_twice_in_l2
    assert cluster_plan(4096, 393216)["hints"] == 0  # held
    assert cluster_plan(256, 1048576, hints=0)["hints"] == 0
    b = plan_axis(256, 1048576, backward=True)
    assert not b["resident"] and not b["hints"] & read_twice_in_l2


def test_clusters_claim_their_rows():
    # Clusters take their next row from a counter (faster SMs take more rows); grid groups, whose
    # CTAs share no shared memory to pass a claimed row on, keep rows dealt in turn.
    for cols, dtype in [(393216, "float32"), (32768, "float32"), (8192, "float64"), (393216, "bfloat16"),
                        (131072, "float16")]:
        p = plan(4096, cols, dtype, register_cluster=0)
        assert p["family"] == "cluster_rows" and not p["grid_exchange"] and p["claim_rows"]
        assert not plan(4096, cols, dtype, claim=0, register_cluster=0)["claim_rows"]  # the knob turns it off
    assert not plan(4096, 1572864, register_cluster=0)["claim_rows"]  # grid groups
    assert plan_axis(4096, 393216, backward=True)["claim_rows"]
    assert not plan(4096, 1000, register_cluster=0)["claim_rows"]  # other families


def test_clusters_deal_chunks_in_turn():
    # A row's chunks go to its CTAs in turn (each cluster sweeps the row front to back), in clusters
    # and grid groups, forward and backward; STRIPE=0 gives each CTA a contiguous slice.
    for cols, dtype in [(393216, "float32"), (262144, "bfloat16"), (1048576, "float16"), (1572864, "float32")]:
        p = cluster_plan(4096, cols, dtype, register_cluster=0)
        assert p["family"] == "cluster_rows" and p["striped"], p
        assert not cluster_plan(4096, cols, dtype, register_cluster=0, stripe=0)["striped"]
    assert cluster_plan(4096, 1572864, register_cluster=0)["grid_exchange"]  # the last above: grid groups
    assert plan_axis(4096, 393216, backward=True)["striped"]


def test_grid_groups_elsewhere():
    # Rows a group of every SM holds only once: held once only where the rows are too few for the
    # clusters to cover the SMs (7 of 16 CTAs on 132 SMs), or grid groups are asked for; else
    # streamed (test_streamed_grid_groups).
    p = cluster_plan(6, 4194304)
    assert p["grid_exchange"] and p["cluster"] == 132 and p["resident"] and p["chunks_per_cta"] == 8
    assert not cluster_plan(9, 4194304)["resident"]  # (else grid_rows, rows spilled: test_grid_rows)
    assert plan(64, 4194304, exchange=1)["cluster"] == 132
    assert not plan(4096, 262144)["grid_exchange"]  # 16-CTA clusters hold it twice
    assert not plan(4096, 393216, "bfloat16")["grid_exchange"]  # measured slower in 16 bits
    assert not plan(4096, 393216, "float64")["grid_exchange"]  # partials are traded as fp32
    assert not plan(4096, 393216, "float64", exchange=1)["grid_exchange"]
    p = plan(4096, 393216, "bfloat16", exchange=1)  # the knob forces them
    assert p["grid_exchange"] and p["cluster"] == 11 and p["double_buffered"]
    p = plan(4096, 393216, exchange=1, cluster=40)  # any size the ring holds, past a warp
    assert p["grid_exchange"] and p["cluster"] == 40 and p["chunks_per_cta"] == 3
    p = plan(64, 16 * 4194304)  # 64 MB rows: no grid holds them; clusters stream them
    assert not p["grid_exchange"] and not p["resident"] and p["cluster"] == 16
    assert plan(4096, 393216, dev=A100)["family"] == "block_rows"
    assert not plan_axis(4096, 393216, backward=True)["grid_exchange"]  # measured equal: clusters


def test_grid_rows():
    """16-bit rows that the widest clusters stream keeping less than 3/4 of each slice, and fp32 rows
    that no cluster holds, where the grid's rings hold them two and a half times over (rows of 4 M
    16-bit: 7 of 16 chunks kept; 8 MB against 132 rings of 7 x 32 KB), are held once in a
    cooperative grid's rings, items of one chunk claimed by any CTA. Not 16-bit rows the clusters
    keep most of (2 M), fp32 rows the clusters hold, rows the rings hold less than 2.5 times (16-bit
    past 6 055 520, fp32 past 3 027 760: 3 M, 4 M), rows off 16 bytes (peeled clusters), with the
    knob at 0 or a cluster or exchange asked for, nor off Hopper."""
    for dtype in ("bfloat16", "float16"):
        for rows in (1, 119, 4096):
            p = plan(rows, 4194304, dtype)
            assert p["family"] == "grid_rows" and p["cluster"] == 1 and p["grid_exchange"], (dtype, rows, p)
            assert (p["chunk_bytes"], p["ring_slots"], p["chunks_per_row"], p["chunks_per_cta"]) == (32768, 7, 256, 1), p
            assert p["threads"] == 576 and p["grid"] == min(132, rows * 256) and p["smem_bytes"] <= H200["smem_optin"]
    assert plan(64, 3 * 1048576, "bfloat16")["family"] == "grid_rows"  # 6 MB: 12 chunks a CTA, 7 kept
    assert plan(64, 2 * 1048576, "bfloat16")["family"] == "cluster_rows"  # 8 chunks a CTA, 7 kept
    assert plan(64, 5 * 1048576 + 262144, "bfloat16")["family"] == "grid_rows"  # 10.5 MB
    assert plan(64, 6055520, "bfloat16")["family"] == "grid_rows"  # 12 111 040 bytes: 2/5 of 132 rings of 7 x 32 KB
    assert plan(64, 12117600, "bfloat16")["family"] == "grid_rows"  # spilled, half kept: 2/5 of the rings
    assert plan(64, 12117608, "bfloat16")["family"] == "cluster_rows"
    # fp32 rows that no cluster holds (streamed clusters, grid groups), up to 2/5 of the rings kept:
    # 2 MB (grid groups of 22) to 23 MB, in the same 32 KB chunks.
    for rows, cols in [(512, 524288), (238, 1048576), (4096, 1441792), (119, 2097152), (4, 2490368), (91, 2752512),
                       (64, 3027760), (64, 3027764), (80, 3145728), (60, 4194304), (6, 4194304), (64, 6058800)]:
        p = plan(rows, cols)
        assert p["family"] == "grid_rows" and (p["chunk_bytes"], p["ring_slots"], p["chunks_per_cta"]) == (32768, 7, 1), p
        assert p["chunks_per_row"] == -(-cols * 4 // 32768) and p["grid"] == min(132, rows * p["chunks_per_row"])
    assert plan(4096, 458752)["family"] == "cluster_rows"  # 1.75 MB: held twice by clusters of 16
    assert plan(4096, 393216)["family"] == "cluster_rows"
    assert plan(64, 6058808)["family"] == "cluster_rows"  # past 2/5 of the rings, half kept
    assert plan(64, 4194304 - 8, "bfloat16", aligned=False, peelable=True)["family"] == "cluster_rows"
    for over in (dict(grid_rows=0), dict(cluster=16), dict(exchange=0), dict(exchange=1)):
        assert plan(64, 4194304, "bfloat16", **over)["family"] == "cluster_rows", over
    assert plan(64, 4194304, "bfloat16", dev=A100)["family"] == "block_rows"
    # The knob at 1 takes any aligned rows of up to 4 bytes, where no ring can be left full of one
    # row (chunks a row < SMs x (slots - item chunks + 1)); items of 1 to 8 chunks.
    p = plan(7, 16, grid_rows=1)
    assert p["family"] == "grid_rows" and p["chunks_per_row"] == 1 and p["grid"] == 7
    assert plan(7, 4194304, grid_rows=1, item_chunks=4)["chunks_per_cta"] == 4
    assert plan(7, 8 * 4194304, grid_rows=1)["family"] == "cluster_rows"  # 128 MB: half of it past 132 x 7 chunks
    small = dict(H200, sm_count=8)
    whole = dict(grid_rows=1, spill_chunks=0)  # nothing spilled
    assert plan(7, 4194304, "bfloat16", dev=small, **whole)["family"] == "cluster_rows"
    assert plan(7, 8 * 6 * 16384, "bfloat16", dev=small, item_chunks=2, **whole)["family"] == "cluster_rows"  # 48 chunks: 8 x 6
    assert plan(7, 8 * 6 * 16384 - 16384, "bfloat16", dev=small, item_chunks=2, **whole)["family"] == "grid_rows"
    assert plan(7, 8 * 7 * 16384, "bfloat16", dev=small, **whole)["family"] == "cluster_rows"  # items of one: 8 x 7
    assert plan(7, 8 * 7 * 16384 - 16384, "bfloat16", dev=small, **whole)["family"] == "grid_rows"
    # Spilled chunks do not count: the kept ones must leave the row unfinished.
    assert plan(7, 8 * 7 * 16384, "bfloat16", dev=small, grid_rows=1, spill_chunks=1)["family"] == "grid_rows"
    assert plan(7, 1024, "float64", grid_rows=1)["family"] != "grid_rows"
    # Fewer ring slots than the merger's queue has entries (64): 56 slots of 4 KB, not 111 of 2 KB.
    p = plan(7, 1048576, grid_rows=1, chunk_bytes=4096)
    assert p["family"] == "grid_rows" and p["ring_slots"] == 56
    assert plan(7, 1048576, grid_rows=1, chunk_bytes=2048)["family"] != "grid_rows"


def test_grid_rows_spill():
    """Rows past a quarter of the grid's rings (7.2 MiB on an H200) keep the larger of half the row
    and a fifth of the rings (5.8 MiB) in them; the chunks before are spilled (folded, released, and
    read again from L2 a row later), up to rows whose half is 2/5 of the rings. The knob sets the
    count (0: none), at most all but the last chunk, in whole items."""
    spill = lambda *a, **o: plan(*a, **o)["spill_chunks"]  # noqa: E731
    assert spill(238, 1048576) == 0  # 4 MB: held whole
    assert spill(159, 3145728, "bfloat16") == 0 and spill(159, 1572864) == 0  # 6 MB: held whole
    assert spill(64, 1892352) == 0 and spill(64, 1892356) == 232 - 185  # a quarter of 132 rings of 7 x 32 KB
    assert spill(119, 2097152) == 256 - 185 and spill(119, 4194304, "bfloat16") == 256 - 185  # 8 MB: 185 kept
    assert spill(64, 3027760) == 370 - 185  # 2/5 of the rings
    assert spill(64, 3027764) == 370 - 185 and spill(80, 3145728) == 384 - 192 and spill(60, 4194304) == 512 - 256
    assert spill(60, 8388608, "bfloat16") == 256 and spill(64, 6058800) == 740 - 370
    assert plan(60, 4194304, spill_chunks=100)["family"] == "cluster_rows"  # 412 chunks kept: past 2/5 (369)
    forced = dict(grid_rows=1)
    assert spill(60, 4194304, spill_chunks=0, **forced) == 0 and spill(60, 4194304, spill_chunks=100, **forced) == 100
    assert spill(60, 4194304, spill_chunks=10 ** 6, **forced) == 511
    assert spill(60, 4194304, spill_chunks=101, item_chunks=2, **forced) == 100
    assert spill(4096, 393216, grid_rows=1) == 0  # 1.5 MB
    assert spill(60, 4194304, grid_rows=0) == 0  # not grid_rows


def test_grid_rows_wait_last():
    """The merger polls a row's last item with one lane first where a row spills less than a third
    of its chunks; rows that spill more have all 32 lanes poll the row's partials."""
    wait = lambda *a, **o: plan(*a, **o)["wait_last"]  # noqa: E731
    assert plan(238, 1048576)["family"] == "grid_rows" and wait(238, 1048576)  # held whole
    assert wait(119, 4194304, "bfloat16") and wait(119, 2097152)  # 71 of 256 chunks spilled
    assert not wait(91, 2752512) and not wait(80, 3145728) and not wait(60, 4194304)  # 151 of 336, half, half
    assert wait(60, 4194304, grid_rows=1, spill_chunks=170) and not wait(60, 4194304, grid_rows=1, spill_chunks=171)
    assert not wait(4096, 393216)  # not grid_rows


def test_founding_shape_bfloat16_on_h200():
    p = plan(4096, 393216, "bfloat16")
    assert p["family"] == "cluster_rows" and p["resident"] and p["cluster"] == 8
    assert p["chunk_bytes"] == 32768 and p["chunks_per_cta"] == 3 and p["double_buffered"]


def test_very_long_rows_stream_through_the_cluster():
    p = plan(64, 4_194_304, exchange=0)
    assert p["family"] == "cluster_rows" and not p["resident"] and p["cluster"] == 16
    assert p["chunks_per_cta"] * p["cluster"] >= p["chunks_per_row"]


def test_rows_of_32_to_512_kb_go_to_register_clusters():
    """Rows in 16-byte packs past one CTA's registers (32 KB) up to 512 KB in fp32 and 256 KB in 16
    bits: a row to a cluster of CTAs holding it in registers, 128 threads of 16 KB each up to rows of
    128 KB, 256 threads of 32 KB above, a cluster per row; rows off 16 bytes but off alike in x and
    y peeled. Not float64, rows off 16 bytes otherwise, longer rows, without clusters, with a
    cluster asked for, with the knob at 0, or where the grid would pass 2^31 CTAs."""
    for cols, dtype, threads, cluster in [(32000, "bfloat16", 128, 4), (32768, "float16", 128, 4),
                                          (65536, "bfloat16", 128, 8), (8200, "float32", 128, 3),
                                          (32768, "float32", 128, 8), (65536, "float32", 256, 8),
                                          (128256, "float32", 256, 16), (131072, "float32", 256, 16),
                                          (128256, "bfloat16", 256, 8), (131072, "float16", 256, 8)]:
        p = plan(1000, cols, dtype)
        assert (p["family"], p["threads"], p["iters"], p["cluster"], p["grid"]) == \
            ("warp_rows", threads, 8, cluster, 1000), (cols, dtype, p)
    assert plan(1000, 131072 + 8, "float32")["family"] == "cluster_rows"  # past 512 KB
    assert plan(1000, 131072 + 8, "float16")["family"] == "cluster_rows"  # 16 bits: past 256 KB
    assert plan(1000, 262144, "bfloat16")["family"] == "cluster_rows"
    assert plan(1000, 32768, "float64")["family"] == "cluster_rows"
    for cols, dtype, threads, cluster in [(50257, "bfloat16", 128, 7), (50257, "float32", 256, 7),
                                          (8201, "float32", 128, 3), (131071, "float32", 256, 16)]:
        p = plan(1000, cols, dtype, peelable=True)  # rows off 16 bytes, off alike in x and y: peeled
        assert (p["family"], p["peel"], p["threads"], p["cluster"]) == ("warp_rows", True, threads, cluster), p
    assert plan(1000, 50257, "bfloat16", peelable=True, peel_clusters=0)["family"] == "block_rows"
    assert plan(1000, 50257, "bfloat16")["family"] == "block_rows"  # x and y off differently
    assert plan(1000, 140001, "bfloat16", peelable=True)["family"] == "cluster_rows"  # past 256 KB
    assert plan(1000, 65536, "bfloat16", register_cluster=0)["family"] == "cluster_rows"
    assert plan(1000, 65536, "bfloat16", cluster=4)["family"] == "cluster_rows"
    assert plan(1000, 65536, "bfloat16", dev=A100)["family"] == "block_rows"
    assert plan(2**28, 65536, "bfloat16")["family"] == "cluster_rows"  # 2^31 CTAs
    p = plan(1000, 4096, "bfloat16", register_cluster=64, iters=4)  # the knob: any row two CTAs or more hold
    assert (p["family"], p["threads"], p["iters"], p["cluster"]) == ("warp_rows", 64, 4, 2)


def test_mid_rows_use_one_cta_clusters():
    p = plan(1000, 8196, register_cluster=0)  # past 32 KB
    assert p["family"] == "cluster_rows" and p["cluster"] == 1 and p["resident"]


def test_overrides():
    p = plan(4096, 393216, cluster=8, chunk_bytes=8192, threads=288)
    assert p["cluster"] == 8 and p["chunk_bytes"] == 8192 and p["threads"] == 288
    assert plan(4096, 393216, threads=1056)["threads"] == 544  # beyond the register budget: ignored
    assert plan(4096, 393216, threads=320)["threads"] == 544   # not two equal groups of warps
    assert p["resident"] == (p["chunks_per_cta"] <= p["ring_slots"])


def test_a100_has_no_clusters():
    p = plan(4096, 393216, dev=A100)
    assert p["family"] == "block_rows" and not p["resident"]
    p = plan(4096, 32768, dev=A100)
    assert p["family"] == "block_rows" and p["resident"]


@pytest.mark.parametrize("dtype", list(ELEM))
def test_every_plan_covers_its_row(dtype):
    e = ELEM[dtype]
    for cols in [1, 2, 5, 31, 64, 255, 257, 999, 1024, 2047, 4097, 8192, 12345, 32768, 65536, 100003,
                 131072, 262144, 393216, 1048576, 4194304, 16777216]:
        for dev in (H200, A100):
            for aligned in (False, cols * e % 16 == 0):
                p = plan(7, cols, dtype, aligned, dev)
                fam = p["family"]
                if fam == "warp_rows" and p["cluster"] > 0:  # rows in registers over a cluster
                    assert aligned and dev["max_cluster"] > 0 and 2 <= p["cluster"] <= 16 and p["grid"] == 7
                    assert p["segment"] <= p["group"] * p["iters"] and p["segment"] % 32 == 0
                    assert p["cluster"] * p["segment"] * p["vec"] >= cols
                elif fam == "warp_rows":
                    assert p["group"] * p["iters"] * p["vec"] >= cols
                elif fam == "block_rows":
                    assert not p["resident"] or p["smem_bytes"] >= cols * e
                    assert p["smem_bytes"] <= dev["smem_optin"]
                elif fam == "grid_rows":  # items of chunks_per_cta chunks, any CTA of the grid
                    assert aligned and dev["max_cluster"] > 0 and e in (2, 4) and p["resident"]
                    assert p["chunks_per_row"] == math.ceil(cols * e / p["chunk_bytes"])
                    assert p["chunks_per_row"] < dev["sm_count"] * (p["ring_slots"] - p["chunks_per_cta"] + 1)
                    assert p["smem_bytes"] <= dev["smem_optin"] and p["grid"] <= dev["sm_count"]
                else:
                    assert aligned and dev["max_cluster"] > 0
                    assert p["cluster"] * p["chunks_per_cta"] * p["chunk_bytes"] >= cols * e
                    assert p["chunks_per_row"] == math.ceil(cols * e / p["chunk_bytes"])
                    assert p["resident"] == (p["chunks_per_cta"] <= p["ring_slots"])
                    assert p["double_buffered"] == (2 * p["chunks_per_cta"] <= p["ring_slots"])
                    assert p["smem_bytes"] <= dev["smem_optin"]
                    assert p["cluster"] in (1, 2, 4, 8, 16) or p["grid_exchange"]
                    assert p["cluster"] <= dev["sm_count"]
                if not aligned:
                    assert p["vec"] == 1


# --- any axis, and the backward ------------------------------------------------------------------

def plan_axis(outer, dim, inner=1, dtype="float32", backward=False, rows=None, aligned=None, dev=H200, **kw):
    e = ELEM[dtype]
    rows = inner == 1 if rows is None else rows
    aligned = rows and dim * e % 16 == 0 if aligned is None else aligned
    d = {k: dev[k] for k in ("cc_major", "sm_count", "smem_optin", "max_cluster")}
    return _C.plan_axis(outer, dim, inner, e, rows, aligned, backward, **d, **kw)


def test_axis_nothing_to_do():
    assert plan_axis(0, 5)["family"] == "none"
    assert plan_axis(5, 0, backward=True)["family"] == "none"
    assert plan_axis(5, 5, 0)["family"] == "none"


def test_backward_of_short_rows_stays_in_registers():
    p = plan_axis(1000, 1000, backward=True)
    assert (p["family"], p["vec"], p["group"], p["iters"]) == ("warp_rows", 4, 32, 8)
    assert plan_axis(1000, 1025, backward=True, aligned=False)["family"] == "split_rows"


@pytest.mark.parametrize("dim,dtype,group", [(32, "float32", 8), (4, "float32", 1), (12, "float32", 4),
                                               (64, "bfloat16", 8), (16, "float64", 8), (24, "float16", 4)])
def test_backward_of_rows_to_128_bytes_takes_a_pack_of_four_rows_a_lane(dim, dtype, group):
    """Aligned rows of at most 128 bytes: a lane holds a pack of each of four rows (as the forward's
    short rows), the group the row's packs to a power of two; SOFTLIGHT_ROWS_PER_LANE picks another
    count, or 0 the groups of several packs a lane, and reaches rows of 512 bytes."""
    p = plan_axis(1000, dim, dtype=dtype, backward=True)
    assert (p["family"], p["group"], p["iters"], p["rows_per_lane"], p["threads"]) == ("warp_rows", group, 1, 4, 128)
    assert p["grid"] == -(-1000 // (128 // group * 4))
    assert plan_axis(1000, dim, dtype=dtype, backward=True, rows_per_lane=0)["rows_per_lane"] == 0
    assert plan_axis(1000, dim, dtype=dtype, backward=True, rows_per_lane=2)["rows_per_lane"] == 2
    assert plan_axis(1000, 36, backward=True)["rows_per_lane"] == 0  # 144 bytes
    assert plan_axis(1000, 33, backward=True, aligned=False)["rows_per_lane"] == 0
    wide = plan_axis(1000, 128, backward=True, rows_per_lane=8)
    assert (wide["rows_per_lane"], wide["group"], wide["grid"]) == (8, 32, -(-1000 // 32))
    assert plan_axis(1000, 129 * 4, backward=True, rows_per_lane=8)["rows_per_lane"] == 0  # past 512 bytes


@pytest.mark.parametrize("dim,dtype,group,iters", [
    (1028, "float32", 96, 4), (3000, "float32", 192, 4), (4096, "float32", 256, 4), (8188, "float32", 512, 4),
    (2056, "bfloat16", 96, 4), (8192, "bfloat16", 256, 4), (16376, "bfloat16", 512, 4), (1500, "float64", 192, 4)])
def test_backward_of_rows_under_32_kb_takes_a_cta_a_row(dim, dtype, group, iters):
    """Aligned rows past a warp's eight packs a thread and under 32 KB: dy and y held by one CTA
    (group = threads) of the fewest warps that hold the row in four packs of each a thread."""
    for dev in (H200, A100):
        p = plan_axis(1000, dim, dtype=dtype, backward=True, dev=dev)
        vectors = -(-dim * ELEM[dtype] // 16)
        assert (p["family"], p["group"], p["threads"], p["iters"]) == ("warp_rows", group, group, iters)
        assert p["group"] % 32 == 0 and p["group"] * 4 >= vectors > (p["group"] - 32) * 4
        assert p["grid"] == 1000
    assert plan_axis(1000, 3000, backward=True, aligned=False)["family"] == "split_rows"
    assert plan_axis(1000, 4096, backward=True, cluster=2)["family"] == "cluster_rows"  # asked for


@pytest.mark.parametrize("dim,dtype,cluster,aux_bytes", [
    (393216, "float32", 16, 4 * 8192), (393216, "bfloat16", 16, 4 * 16384), (8192, "float32", 1, 4 * 8192)])
def test_backward_of_long_aligned_rows_keeps_dy_in_a_cluster_ring(dim, dtype, cluster, aux_bytes):
    p = plan_axis(4096, dim, dtype=dtype, backward=True)
    assert (p["family"], p["cluster"], p["aux_slots"]) == ("cluster_rows", cluster, 4)
    assert p["resident"] and p["double_buffered"]  # dy read once, the next row's loading meanwhile
    assert p["chunks_per_cta"] * p["chunk_bytes"] * cluster >= dim * ELEM[dtype]
    # Both rings and their barriers fit the CTA's shared memory.
    assert (p["ring_slots"] + p["aux_slots"]) * (p["chunk_bytes"] + 16) + 2048 == p["smem_bytes"] <= 232448
    assert p["aux_slots"] * p["chunk_bytes"] == aux_bytes
    forward = plan(4096, dim, dtype, chunk_bytes=p["chunk_bytes"], cluster=cluster)  # the same chunks, one ring
    assert forward["aux_slots"] == 0 and forward["ring_slots"] == p["ring_slots"] + p["aux_slots"]


def test_backward_cluster_ring_limits():
    assert plan_axis(64, 4 << 20, backward=True)["resident"] is False  # 16 MB rows stream dy twice
    assert plan_axis(64, 8191, backward=True, aligned=False)["family"] == "split_rows"
    assert plan_axis(64, 8192, backward=True)["family"] == "cluster_rows"  # 32 KB
    assert plan_axis(64, 8188, backward=True, dev=A100)["family"] == "warp_rows"  # under 32 KB: a CTA a row
    assert plan_axis(64, 393216, backward=True, dev=A100)["family"] == "split_rows"


@pytest.mark.parametrize("dim,dtype,cluster", [
    (393216, "float32", 16), (32768, "float32", 2), (16384, "float32", 1), (4194304, "float32", 16),
    (393216, "bfloat16", 8), (131072, "bfloat16", 4)])
def test_long_rows_split_over_clusters_into_l2_sized_segments(dim, dtype, cluster):
    # Rows whose arrays are not 16-byte aligned alike: the backward reads them element by element.
    p = plan_axis(64, dim, dtype=dtype, backward=True, aligned=False)
    assert (p["family"], p["cluster"], p["lanes"], p["vec"]) == ("split_rows", cluster, 1, 1)
    seg_bytes = p["segment"] * ELEM[dtype]
    assert seg_bytes * cluster >= dim * ELEM[dtype]  # the segments cover the row
    if cluster < 16:
        assert seg_bytes <= 96 * 1024
    assert p["threads"] <= 1024 and p["threads"] % 32 == 0


def test_no_clusters_off_hopper():
    p = plan_axis(64, 393216, backward=True, dev=A100)
    assert (p["family"], p["cluster"], p["segment"]) == ("split_rows", 1, 393216 // 4)


@pytest.mark.parametrize("inner,lanes", [(2, 2), (3, 4), (32, 32), (4096, 128), (100, 128)])
def test_non_last_axis_covers_inner_in_coalesced_tiles(inner, lanes):
    p = plan_axis(64, 4096, inner)
    assert (p["family"], p["lanes"], p["vec"]) == ("split_rows", lanes, 1)
    assert p["tiles"] == math.ceil(inner / lanes) and p["grid"] == 64 * p["tiles"]
    # A tile of the axis is 4096 * lanes * 4 bytes; segments stay within 96 KB.
    assert p["segment"] * lanes * 4 <= 96 * 1024 or p["cluster"] == 16


def test_a_cluster_never_has_idle_ctas():
    p = plan_axis(10, 3, 5000)  # 3 elements along the axis: at most 2 CTAs can share them
    assert p["cluster"] <= 2 and p["segment"] >= 1


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_non_last_axis_on_hopper_goes_to_cluster_tiles(dtype):
    e = ELEM[dtype]
    p = plan_axis(64, 4096, 4096, dtype, tiles_aligned=True)
    assert (p["family"], p["cluster"], p["vec"]) == ("cluster_tiles", 8, 16 // e)
    assert p["lanes"] * e == 256 and p["tiles"] == 4096 // p["lanes"] and p["grid"] == 64 * p["tiles"]
    assert p["chunk_bytes"] == (32768 if e == 2 else 16384)
    # The slice of the axis (128 KB) stays in the ring, read once; it fits once, and the ring's
    # other slots load the next tile.
    rows_per_chunk = p["chunk_bytes"] // 256
    assert p["chunks_per_cta"] * 8 * rows_per_chunk >= 4096 and p["resident"]
    assert p["chunks_per_cta"] < p["ring_slots"] < 2 * p["chunks_per_cta"] and not p["double_buffered"]
    assert p["ring_slots"] * (p["chunk_bytes"] + 16) < p["smem_bytes"] <= 232448
    # Clusters of 16 only where 8 cannot hold the slice.
    assert plan_axis(64, 8192, 4096, dtype, tiles_aligned=True)["cluster"] == 16


def test_cluster_tiles_limits():
    assert plan_axis(64, 4096, 4096)["family"] == "split_rows"  # not aligned for bulk copies
    assert plan_axis(64, 4096, 16, tiles_aligned=True)["family"] == "split_rows"  # 64-byte tiles
    assert plan_axis(64, 4096, 4096, backward=True, tiles_aligned=True)["family"] == "split_rows"
    assert plan_axis(64, 4096, 4096, tiles_aligned=True, dev=A100)["family"] == "split_rows"
    assert plan_axis(8, 100000, 64, tiles_aligned=True)["family"] == "split_rows"  # 1.6 MB slices at 16
    once = plan_axis(4, 10000, 64, tiles_aligned=True)  # 160 KB slices: fit once
    assert (once["family"], once["cluster"], once["double_buffered"]) == ("cluster_tiles", 16, False)
    assert plan_axis(1000, 64, 256, tiles_aligned=True)["cluster"] == 1  # 4000 tiles fill the GPU
    narrow = plan_axis(16, 3000, 40, tiles_aligned=True)  # 160-byte rows in 256-byte tiles
    assert (narrow["family"], narrow["lanes"], narrow["tiles"]) == ("cluster_tiles", 64, 1)
    forced = plan_axis(64, 4096, 4096, tiles_aligned=True, cluster=16)
    assert (forced["cluster"], forced["double_buffered"]) == (16, True)


@pytest.mark.parametrize("cols,dtype,k", [(7, "bfloat16", 8), (7, "float32", 4), (100, "bfloat16", 1),
                                          (50, "float16", 1), (3, "float64", 5), (64, "float32", 1)])
def test_short_contiguous_rows_go_to_flat_tiles(cols, dtype, k):
    e = ELEM[dtype]
    p = _C.plan(70_001, cols, e, cols * e % 16 == 0, **H200, aligned8=cols * e % 8 == 0, flat16=True)
    if cols * e % 16 == 0:  # rows in 16-byte packs stay in registers
        assert p["family"] == "warp_rows" and p["flat_rows"] == 0
        return
    assert (p["family"], p["flat_rows"], p["threads"]) == ("warp_rows", k, 128)
    tile_rows = 128 * k
    assert p["smem_bytes"] == math.ceil(tile_rows * cols * e / 16) * 16 <= 16 * 1024 + 16 or k == 1
    assert p["grid"] == math.ceil(70_001 / tile_rows)
    # Not one contiguous run from 16 bytes, or switched off: the rows' own path.
    assert _C.plan(70_001, cols, e, False, **H200, flat16=False)["flat_rows"] == 0
    assert _C.plan(70_001, cols, e, False, **H200, flat16=True, flat=0)["flat_rows"] == 0


def test_flat_tiles_limits():
    assert _C.plan(100, 129, 2, False, **H200, flat16=True)["flat_rows"] == 0  # 258 bytes: too long
    assert _C.plan(100, 127, 2, False, **H200, flat16=True)["flat_rows"] == 1
    assert _C.plan(100, 1, 2, False, **H200, flat16=True)["flat_rows"] == 0  # one element: its own path
    assert _C.plan(100, 1, 2, False, **H200, flat16=True, flat=1)["flat_rows"] == 0
    assert _C.plan(100, 32, 4, True, **H200, flat16=True, flat=1)["flat_rows"] == 1  # forced on packs


@pytest.mark.parametrize("cols,elem,spread", [(7, 2, 2), (3, 2, 2), (127, 2, 2), (7, 4, 1), (50, 2, 1), (100, 2, 1),
                                              (7, 8, 1), (6, 2, 1), (12, 2, 1), (5, 2, 2), (4, 2, 1)])
def test_flat_tiles_spread_lanes_over_banks(cols, elem, spread):
    """Neighbouring lanes take rows `spread` apart, the least power of two that puts their rows an odd
    number of 4-byte banks (8 for float64) apart; 1 where none up to 8 does (rows of 100 bf16)."""
    p = _C.plan(70_001, cols, elem, False, **H200, flat16=True, flat=1)
    assert p["flat_rows"] > 0 and p["flat_spread"] == spread
    if spread > 1:
        assert (spread * cols * elem) % max(4, elem) == 0 and (spread * cols * elem // max(4, elem)) % 2 == 1


@pytest.mark.parametrize("cols,dtype", [(50257, "bfloat16"), (50257, "float32"), (50257, "float16"), (393215, "float32"),
                                        (20001, "float64")])
def test_equally_misaligned_long_rows_go_to_clusters_peeled(cols, dtype):
    """Rows off 16 bytes, misaligned alike in x and y, of 32 KB and more: clusters carry the rows'
    16-byte interiors (up to 30 bytes shorter than the row), so every CTA's share must keep a pack."""
    e = ELEM[dtype]
    p = _C.plan(100, cols, e, False, **H200, peelable=True, register_cluster=0)  # else held in registers
    assert (p["family"], p["peel"]) == ("cluster_rows", True)
    last = cols * e % p["chunk_bytes"]
    assert last == 0 or last > 32
    assert math.ceil(cols * e / p["chunk_bytes"]) == p["chunks_per_row"]
    assert _C.plan(100, cols, e, False, **H200)["family"] == "block_rows"  # x and y misaligned differently
    assert _C.plan(100, cols, e, False, **A100, peelable=True)["family"] == "block_rows"  # no clusters


@pytest.mark.parametrize("rows,cols", [(64, 4194301), (100, 1572863), (4, 2097151)])
def test_equally_misaligned_rows_grid_groups_would_take_go_to_clusters_peeled(rows, cols):
    # Grid groups peel nothing: such rows (which aligned would go to groups) go to the clusters,
    # streamed or held, not to block_rows; unless grid groups are asked for.
    assert plan(rows, cols + -cols % 4)["grid_exchange"]  # the aligned rows
    p = _C.plan(rows, cols, 4, False, **H200, peelable=True)
    assert (p["family"], p["peel"], p["grid_exchange"], p["cluster"]) == ("cluster_rows", True, False, 16), p
    assert _C.plan(rows, cols, 4, False, **H200, peelable=True, exchange=1)["family"] == "block_rows"


def test_peeled_clusters_leave_rows_whose_last_chunk_is_the_peel():
    # 16 KB chunks, rows of two chunks and 20 bytes: a row whose interior is 16 bytes shorter would
    # have an empty last chunk, so such rows stay with block_rows (peeled there).
    q = _C.plan(100, 8192 + 5, 4, False, **H200, peelable=True, chunk_bytes=16384, register_cluster=0)
    assert q["family"] == "block_rows" and q["peel"]
    q = _C.plan(100, 8192 + 9, 4, False, **H200, peelable=True, chunk_bytes=16384, register_cluster=0)  # 36 bytes: kept
    assert q["family"] == "cluster_rows" and q["peel"]


@pytest.mark.parametrize("cols,peelable,cluster,chunk", [(50257, True, 1, 16384), (56000, False, 1, 16384),
                                                         (40000, False, 1, 32768), (65536, False, 2, 32768),
                                                         (70001, True, 2, 32768)])
def test_16_bit_rows_one_cta_holds_twice_take_16_kb_chunks(cols, peelable, cluster, chunk):
    """16-bit rows of 64-112 KB: 32 KB chunks would split them over two CTAs unevenly; 16 KB chunks
    let one CTA hold the row twice. Rows that 32 KB chunks already fit, or that neither fits, keep 32 KB."""
    p = _C.plan(9949, cols, 2, cols * 2 % 16 == 0, **H200, peelable=peelable, register_cluster=0)
    assert (p["family"], p["cluster"], p["chunk_bytes"], p["peel"]) == ("cluster_rows", cluster, chunk, peelable)
    assert 2 * p["chunks_per_cta"] <= p["ring_slots"]
    assert _C.plan(9949, cols, 2, cols * 2 % 16 == 0, **H200, peelable=peelable, chunk_bytes=32768, register_cluster=0)["chunk_bytes"] == 32768
    assert _C.plan(9949, cols, 4, cols * 4 % 16 == 0, **H200, peelable=peelable, register_cluster=0)["chunk_bytes"] == 16384  # fp32: its own


KNOB_DEFAULTS = dict(cluster=0, chunk_bytes=0, threads=0, hints=-1, tile_bytes=0, exchange=-1, groups=0, claim=-1,
                     iters=0, register_rows_bytes=0, flat=-1, rows_per_lane=-1, peel_clusters=-1,
                     register_cluster=-1, grid_rows=-1, item_chunks=0, spill_chunks=-1, stripe=-1,
                     split_lanes=0, split_segment_bytes=0)


@pytest.fixture
def clean_env(monkeypatch):
    import os
    for k in list(os.environ):
        if k.startswith("SOFTLIGHT_"):
            monkeypatch.delenv(k)
    return monkeypatch


def test_knobs_unset_are_the_planners_defaults(clean_env):
    clean_env.setenv("SOFTLIGHT", "1")  # not a knob: no name after the prefix
    clean_env.setenv("SOFTLIGHT_CLUSTERS", "4")  # nor a name that only starts like one
    clean_env.setenv("SOFTLIGHT_CLUSTE", "4")
    clean_env.setenv("XSOFTLIGHT_CLUSTER", "4")
    assert _C.env_knobs() == KNOB_DEFAULTS


@pytest.mark.parametrize("name", sorted(KNOB_DEFAULTS))
def test_each_knob_is_read_into_its_own_field(clean_env, name):
    value = 4096 + 16 * len(name)  # a multiple of 16 (chunk bytes) and of no knob's default
    if name == "split_lanes":
        value = 256  # a power of two up to 1024
    clean_env.setenv("SOFTLIGHT_" + name.upper(), str(value))
    assert _C.env_knobs() == {**KNOB_DEFAULTS, name: value}


def test_knobs_read_together_and_64_bit_values(clean_env):
    clean_env.setenv("SOFTLIGHT_SPILL_CHUNKS", str(1 << 40))
    clean_env.setenv("SOFTLIGHT_REGISTER_ROWS_BYTES", str(3 << 33))
    clean_env.setenv("SOFTLIGHT_THREADS", "288")
    clean_env.setenv("SOFTLIGHT_GRID_ROWS", "0")
    assert _C.env_knobs() == {**KNOB_DEFAULTS, "spill_chunks": 1 << 40, "register_rows_bytes": 3 << 33,
                              "threads": 288, "grid_rows": 0}


@pytest.mark.parametrize("name, value", [("chunk_bytes", "1000"), ("chunk_bytes", "-16"), ("split_lanes", "48"),
                                         ("split_lanes", "2048"), ("split_lanes", "-4")])
def test_knob_values_the_kernels_cannot_take_count_as_unset(clean_env, name, value):
    clean_env.setenv("SOFTLIGHT_" + name.upper(), value)
    assert _C.env_knobs() == KNOB_DEFAULTS
