"""The paths the GPU tests send problems down, written once for the CPU and the GPU.

A GPU test that exercises one family's kernel takes its problems from here. test_planner pins on
the CPU the plan an H100 (SXM, 132 SMs) makes for each of them, so which family a problem gets is
tested without a GPU; the GPU test runs the problems and checks what the kernel computes, and on a
GPU whose planner sends a problem elsewhere it skips saying so (gpu_util.on_path). Importable
without torch or a GPU."""
import math

H100 = dict(cc_major=9, cc_minor=0, sm_count=132, smem_optin=232448, max_cluster=16)
ELEM = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
DTYPES = ["float32", "float16", "bfloat16", "float64"]


def rows_problem(rows, cols, elem, aligned=True, peelable=False):
    """A rows problem as the library sees contiguous arrays from torch's allocator (bases on 512
    bytes): aligned=False for rows read from a view one element in; peelable: x and y off alike."""
    return dict(rows=rows, cols=cols, elem_bytes=elem, aligned16=aligned and cols * elem % 16 == 0,
                aligned8=aligned and cols * elem % 8 == 0, rows128=aligned and cols * elem % 128 == 0,
                flat16=aligned, peelable=peelable)


def axis_problem(shape, d, elem, backward=False):
    """A contiguous array of `shape` from torch's allocator along axis d (plan_axis's problem)."""
    inner = math.prod(shape[d + 1:])
    return dict(outer=math.prod(shape[:d]), dim=shape[d], inner=inner, elem_bytes=elem, rows=inner == 1,
                aligned16=False, backward=backward, tiles_aligned=inner > 1 and inner * elem % 16 == 0)


def backward_problem(rows, cols, elem):
    """The backward of contiguous rows (plan_axis's problem along the last axis)."""
    return dict(outer=rows, dim=cols, inner=1, elem_bytes=elem, rows=True, aligned16=cols * elem % 16 == 0,
                backward=True, tiles_aligned=False)


# --- test_gpu.py: every family against float64 ---------------------------------------------------------
# Boundaries of each family for each element size (register rows: 256 packs; block: up to 32 KB rows on
# Hopper; cluster: resident up to a 16-CTA cluster's ring, streamed beyond).
COLS = [1, 2, 3, 4, 7, 8, 31, 32, 33, 100, 127, 128, 255, 256, 257, 512, 1000, 1023, 1024, 1025, 2048,
        2049, 4096, 4100, 8191, 8192, 16384, 16392, 32768, 50257, 65536, 131072, 262144, 393216,
        1048576, 4194304]


def rows_for(cols, dtype, budget=1 << 24):
    return int(max(1, min(129, budget // (cols * ELEM[dtype]))))


# (family, resident) that COLS reaches over the four dtypes, on Hopper and before it.
COLS_FAMILIES_HOPPER = {("register_rows", None), ("short_rows", None), ("block_rows", True),
                        ("cluster_rows", True), ("cluster_rows", False)}
COLS_FAMILIES_AMPERE = {("register_rows", None), ("short_rows", None), ("block_rows", True), ("block_rows", False)}

# Forced cluster shapes (exchange=0 and these), each over CLUSTER_FORCED_COLS.
CLUSTER_FORCED = [(4096, 288, 0, 0), (16384, 544, 3, 1), (32768, 160, 1, -1)]  # chunk, threads, hints, stripe
CLUSTER_SIZES = [1, 2, 4, 8, 16]
CLUSTER_FORCED_COLS = (8192, 69632, 393216, 2_000_000)


def cluster_forced_rows(cols, elem, cluster, sms, budget=1 << 26):
    return min(3 * sms // cluster + 5, max(1, budget // (cols * elem)))


# 16-bit rows whose 32 KB chunks split unevenly over a cluster: (cols, dtype, cluster, chunks a CTA).
RESIZED_CHUNKS = [
    (140000, "bfloat16", 4, 2), (150000, "float16", 4, 2), (262152, "bfloat16", 8, 2), (280000, "float16", 8, 2),
    (310000, "bfloat16", 8, 2), (600000, "float16", 16, 2),  # two larger chunks for three
    (196616, "float16", 4, 4), (212992, "bfloat16", 4, 4),  # 13 chunks over 8 CTAs: 16 over 4
    (395000, "bfloat16", 8, 4), (458752, "float16", 8, 4)]  # 25 and 28 chunks over 16: 32 over 8


def resized_chunks_rows(cluster, sms):
    return 3 * sms // cluster + 7


# Claimed rows, forced: (cluster, chunk_bytes, groups, row_bytes, rows).
CLAIMED = [
    (4, 8192, 1, 32768, 300),     # slices of one chunk: the producer runs up to the queue's bound ahead
    (1, 8192, 2, 32768, 301),     # each cluster claims ~150 rows: the row queue wraps many times
    (16, 0, 3, 1572864, 40),      # the founding shape's rows, the planner's chunks
    (2, 4096, 5, 400000, 57),     # rows not a whole number of chunks
]
# Launches back to back on one stream, all claiming rows (register_cluster=0 forced).
CLAIMED_BACK_TO_BACK = [(300, 32768, "float32"), (40, 393216, "float32"), (700, 32768, "bfloat16"),
                        (300, 32768, "float32"), (64, 131072, "float16")]

FLAT_TILES = [(1, 7), (3, 7), (70_001, 7), (5_003, 3), (2_051, 50), (4_099, 100), (1_025, 127), (300, 9)]


def is_flat_tile_row(cols, dtype):
    return cols * ELEM[dtype] <= 256 and cols * ELEM[dtype] % 16 != 0


# Rows in registers over a cluster, forced register_cluster=threads and iters=iters.
REGISTER_CLUSTER_COLS = [8200, 12000, 32000, 50000, 65536, 131072, 262144]
REGISTER_CLUSTER_SHAPES = [(128, 8), (256, 8), (64, 4), (256, 4)]


def register_cluster_ctas(cols, dtype, threads, iters):
    """The CTAs a row of `cols` takes at threads x iters packs a CTA; None where it is not held."""
    vec = 16 // ELEM[dtype]
    c = -(-(cols // vec) // (threads * iters))
    return c if 2 <= c <= 16 and cols % vec == 0 else None


def register_cluster_bounded(cols, dtype, threads, iters):
    """Held to 64 registers: CTAs past 128 threads, and 16-bit rows off 128 bytes."""
    vec = 16 // ELEM[dtype]
    return iters == 8 and (threads > 128 or (vec == 8 and cols * 2 % 128 != 0))


FITTED_PACKS = [(1032, "bfloat16"), (2052, "float32"), (3000, "float16"), (4104, "bfloat16"), (6000, "float32"),
                (8200, "float16"), (4100, "float32"), (1500, "float64")]
ODD_ROWS = [(257, "float32"), (999, "float32"), (2049, "float32"), (4095, "float32"), (511, "bfloat16"),
            (1025, "bfloat16"), (3001, "float16"), (4097, "bfloat16"), (8191, "float16")]
OFF_128_COLS = [32000, 50264]
PEELED_REGISTER_CLUSTER_COLS = [8203, 32001, 50257, 65531, 131069]
# fp32 rows that no cluster holds, sent to grid_rows.
GRID_ROWS_FP32 = [(5, 2_097_152), (7, 524_288), (3, 3_027_760), (4, 4_194_304), (3, 6_058_800)]
GRID_ROWS_KNOBS = ["", "ITEM_CHUNKS=2", "ITEM_CHUNKS=4 THREADS=288", "ITEM_CHUNKS=8 CHUNK_BYTES=8192",
                   "SPILL_CHUNKS=1", "SPILL_CHUNKS=4 ITEM_CHUNKS=2", "SPILL_CHUNKS=1000000"]
GRID_ROWS_SHAPES = [(37, 100_000), (9, 1_048_576), (3, 4_194_304), (700, 8192), (3000, 1000), (2, 16)]


def knobs(text):
    """'ITEM_CHUNKS=2 THREADS=288' as forced values."""
    return {k.lower(): int(v) for k, v in (kv.split("=") for kv in text.split())}


ROWS_PER_LANE = [(1, 32), (37, 64), (10_001, 48), (4_097, 256), (999, 512)]  # rows, bytes a row
SHORT_16_BIT_BYTES = [16, 32, 64, 96, 128]
NEAR_THE_MAX = [(393216, "cluster_rows"), (4096, "register_rows"), (128, "register_rows")]  # cols, family
# Families that read element by element: (case, cols, family).
NEXT_TO_A_LARGE_MAX = [("unaligned", 100, "register_rows"), ("unaligned", 5000, "block_rows"),
                       ("contiguous", 50257, None), ("axis", 4096, "cluster_tiles"),
                       ("axis-narrow", 4096, "split_rows")]


def next_to_a_large_max_rows(case):
    return 64 if case == "axis" else 6


GRID_GROUPS = [1, 3, 22, 40, 132]
# A launch with a workspace captured in a CUDA graph: (rows, cols, the plan's field that says so).
WORKSPACES = [(8, 1_048_576, "grid_exchange"), (300, 393216, "claim_rows")]
STREAMED_GRID_GROUPS = [(11, 4_194_304), (13, 2_097_152)]

# --- test_gpu_axis.py ----------------------------------------------------------------------------------
TILE_SHAPES = [((64, 2048, 256), 1), ((3, 1000, 100), 1), ((5, 777, 48), 1), ((4, 10000, 64), 1),
               ((2, 300, 32), 1), ((1000, 64, 256), 1), ((8, 12288), 0), ((2, 5, 70000), 1)]
TILES_FORCED_SHAPES = ((16, 600, 384), (40, 40, 128))
PEELED_COLS = [50257, 4099, 70001, 32777]


def peeled_family(cols, dtype, mode, hopper=True):
    """The family rows of `cols` misaligned alike in x and y take, peeled, with mode's knobs: in one
    CTA's registers under 16 KB (fp32 and 16-bit); on Hopper in registers over a cluster (32 KB to
    512 KB fp32, 256 KB 16-bit) or in cluster_rows; else block_rows."""
    e = ELEM[dtype]
    if hopper and mode == "default" and e <= 4 and 32768 <= cols * e <= (524288 if e == 4 else 262144):
        return "register_clusters"
    if cols == 4099 and e <= 4:
        return "register_rows"
    # 32777 fp32 (16 KB chunks): the row's last chunk holds 36 bytes, an interior's 16 or 32; fp64
    # (8 KB chunks) 72 bytes; 16-bit (32 KB chunks) 18 bytes, too few: block_rows.
    long_enough = cols in (50257, 70001) or (cols == 32777 and dtype in ("float32", "float64"))
    return "cluster_rows" if hopper and long_enough and mode != "off" else "block_rows"


PEELED_MODES = {"default": {}, "ring": {"register_cluster": 0}, "off": {"peel_clusters": 0}}

# --- test_gpu_consumers.py -----------------------------------------------------------------------------
# Rows cross-entropy and the statistics hold on chip, where the log-softmax holds them: (rows, cols,
# where for fp32, where for 16-bit), "registers" (a group of lanes, short rows, register clusters),
# "tiles" (flat_rows' tiles in shared memory) or "ring" (cluster_rows).
# Rows of 5000 and 12000 (16-bit: eight packs a thread) in one group's registers, 5001 there peeled
# in 16 bits (fp32: register clusters); short rows of 16 (and 16-bit rows of 40 and 64) four a lane;
# rows of 10 and 7 (and 16-bit rows of 100) in flat tiles.
CE_ON_CHIP = [(64, 32000, "registers", "registers"), (33, 50257, "registers", "registers"),
              (16, 128256, "registers", "registers"), (64, 151936, "ring", "ring"),
              (40, 262144, "ring", "ring"), (16, 200003, "ring", "ring"), (16, 5000, "registers", "registers"),
              (33, 5001, "registers", "registers"), (32, 12000, "registers", "registers"),
              (64, 40, "registers", "registers"), (1000, 16, "registers", "registers"),
              (300, 64, "registers", "registers"), (257, 10, "tiles", "tiles"), (129, 7, "tiles", "tiles"),
              (300, 100, "registers", "tiles")]
# The gradient written over the logits: on chip where a fresh one is (every case).
CE_OVER_THE_LOGITS = [(64, 32000), (40, 50257), (40, 128256), (64, 151936), (40, 262144), (40, 200003), (40, 5000),
                      (40, 5001), (40, 12000), (40, 40), (40, 16), (40, 10), (40, 100)]
# The statistics' rows that the log-softmax holds on chip: a cluster's (32000 and longer), a group's
# of lanes (5001 16-bit peeled), short rows' (16, 40, 64) and flat tiles' (7, 10, 100 16-bit).
STATS_IN_REGISTERS = ([(d, (64, 32000)) for d in ("float32", "float16", "bfloat16")] +
                      [("bfloat16", (33, 32001)), ("float32", (33, 16001))] +
                      [(d, (33, 50257)) for d in ("float16", "bfloat16")] +
                      [("float32", (33, 50257)), ("bfloat16", (16, 128256))] +
                      [(d, (64, 4096)) for d in ("float32", "float16", "bfloat16")] +
                      [("bfloat16", (33, 5001)), ("float16", (33, 12000)), ("float32", (65, 1000))] +
                      [("float32", (1000, 16)), ("float16", (64, 40)), ("bfloat16", (1000, 64)),
                       ("float32", (129, 7)), ("float16", (257, 10)), ("bfloat16", (300, 100))])


def on_chip(p, elem_bytes):
    """Where a rows plan of elements of elem_bytes holds the row for a consumer: "registers" (a group
    of lanes' registers in 16-byte packs, short rows', or a cluster's), "tiles" (flat_rows' shared
    memory), "ring" or None."""
    if p["family"] == "register_rows":
        return "registers" if p["vec"] * elem_bytes == 16 else None
    if p["family"] == "short_rows":
        return "registers" if p["rows_per_lane"] == 4 else None
    return {"register_clusters": "registers", "flat_rows": "tiles", "cluster_rows": "ring"}.get(p["family"])
