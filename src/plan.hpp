// The planner: which kernel family runs a problem, and with what launch shape.
// Pure host code (no CUDA headers), tested on the CPU through the Python module's planner queries.
#pragma once

#include <cstdint>

// The planner's entry points are exported for the Python bindings' planner queries (the CPU tests
// of every plan); they are not part of the C ABI.
#if defined(_WIN32)
#define SOFTLIGHT_INTERNAL
#else
#define SOFTLIGHT_INTERNAL __attribute__((visibility("default")))
#endif

namespace softlight {

enum class Family : int {
  none = 0,          // nothing to do (rows or cols is zero)
  warp_rows = 1,     // short rows: a group of 1..32 lanes holds a row in registers; rows read in
                     // 16-byte packs, under 32 KB: a group of up to a CTA of 1024 threads
  block_rows = 2,    // one CTA per row: the row in shared memory, or streamed twice if too long
  cluster_rows = 3,  // Hopper: a cluster of CTAs per row, bulk copies into a ring of chunks
  split_rows = 4,    // any axis, forward or backward: the axis split over a cluster of CTAs (one
                     // CTA off Hopper), two passes, the second re-reading from the L2 cache
  cluster_tiles = 5, // Hopper, forward along a non-last axis: a cluster per tile of 256 bytes of
                     // inner positions over the whole axis, held in a ring of chunks (one read)
  grid_rows = 6,     // Hopper, rows that no cluster holds: held once in the rings of a
                     // cooperative grid, in items of chunks that any CTA claims
};

SOFTLIGHT_INTERNAL const char* family_name(Family f);

// What the planner needs to know about the device (read once per call by the launcher).
struct DeviceInfo {
  int cc_major = 0;
  int cc_minor = 0;
  int sm_count = 0;
  int64_t smem_per_block_optin = 0;  // largest dynamic shared memory one CTA may ask for
  int max_cluster = 0;               // largest cluster size that can be scheduled (0: no clusters)
};

// The problem as the kernels see it.
struct Problem {
  int64_t rows = 0;
  int64_t cols = 0;
  int elem_bytes = 4;
  // 16-byte vector access is valid for x and y: both base pointers and both row strides (in
  // bytes) are multiples of 16, and so is cols * elem_bytes.
  bool aligned16 = false;
  // The same with 8 bytes (warp_rows reads such rows in 8-byte packs).
  bool aligned8 = false;
  // Every row of x and y starts on 128 bytes (both base pointers and both row strides in bytes
  // are multiples of 128): a warp's 512 contiguous bytes of a row are then four L2 lines, not five.
  bool rows128 = false;
  // x and y rows are misaligned alike (bases and row strides agree modulo 16 bytes), so a row
  // can be peeled to 16-byte vectors (block_rows).
  bool peelable = false;
  // x and y are each one contiguous run of rows (row strides equal to cols, or one row) starting
  // on 16 bytes: the rows can be moved as a flat array of 16-byte packs.
  bool flat16 = false;
};

// A problem along any axis (docs: softlight_log_softmax_forward_3d), for the backward and for
// the forward over a non-contiguous axis.
struct AxisProblem {
  int64_t outer = 0, dim = 0, inner = 1;
  int elem_bytes = 4;
  bool rows = false;       // inner == 1 and the axis is contiguous in every array
  bool aligned16 = false;  // rows, and 16-byte vector access is valid for every array
  bool backward = false;
  // Not rows: x and y have inner stride 1, and their bases, outer and axis strides, and the inner
  // extent are multiples of 16 bytes (cluster_tiles' bulk copies).
  bool tiles_aligned = false;
};

// Forced values for tests and tuning (0 or -1: the planner's choice; see Tuning).
struct Overrides {
  int cluster = 0;
  int chunk_bytes = 0;
  int threads = 0;  // cluster_rows: threads per CTA (consumer warps plus the producer warp)
  int hints = -1;   // cluster_rows: cache hints, bit 0 loads evict-first, bit 1 streaming stores,
                   // bit 2 a streamed forward's chunks read twice held in L2 (kHintReadTwiceInL2)
  int tile_bytes = 0;  // cluster_tiles: tile width in bytes (a power of two, 64 to 512)
  int exchange = -1;   // cluster_rows: 0 partials over DSMEM in clusters, 1 through global memory
  int groups = 0;      // cluster_rows: at most this many clusters (or grid groups) at once
  int claim = -1;      // cluster_rows: 0 rows dealt to clusters in turn, 1 claimed from a counter
  int iters = 0;       // warp_rows, 16-byte packs: the least packs per thread (then the group)
  int64_t register_rows_bytes = 0;  // rows in 16-byte packs shorter than this stay in registers
  int flat = -1;       // warp_rows: 0 never flat tiles, 1 wherever the layout allows
  int rows_per_lane = -1;  // warp_rows, rows of at most 32 packs: 0 off, 1, 2, 4 or 8 rows a lane
  int peel_clusters = -1;  // cluster_rows for rows misaligned alike in x and y: 0 off
  int register_cluster = -1;  // warp_rows, Hopper: rows in registers over a cluster, threads per CTA (0 off)
  int grid_rows = -1;    // 0 never grid_rows, 1 wherever it can run
  int item_chunks = 0;   // grid_rows: chunks an item (1 to 8)
  int64_t spill_chunks = -1;  // grid_rows: a row's first chunks written a row later from L2 (0 none)
  int stripe = -1;       // cluster_rows: 0 each CTA a contiguous slice of a row, else chunks dealt in turn
};

// A plan: a common core that every family reads, and the parts of the families that need more.
struct Plan {
  Family family = Family::none;
  int vec = 1;             // elements per memory access (16 bytes' worth, or 1)
  int threads = 0;         // threads per CTA
  int64_t grid = 0;        // CTAs for warp_rows / block_rows; cluster_rows: rows' clusters cap
  int64_t smem_bytes = 0;  // dynamic shared memory per CTA
  int cluster = 0;         // CTAs per row (cluster_rows, warp_rows over a cluster), per position
                           // (split_rows) or per tile (cluster_tiles); 0 or 1: none
  bool resident = false;   // the row (or slice, or tile) stays in shared memory: one DRAM read
  bool peel = false;       // rows off 16 bytes, x and y off alike, read as the 16-byte blocks of
                           // their interior and their edges apart (block_rows, warp_rows,
                           // cluster_rows: the ring carries the interior, CTA 0 the edges)
  int64_t segment = 0;     // units of the row per CTA: packs (warp_rows over a cluster), vectors or
                           // elements (split_rows)

  // warp_rows: rows held in registers.
  struct Warp {
    int group = 0;          // threads per row (power of two, 1..32; 16-byte packs: up to 1024; over a
                            // cluster, the CTA's threads, segment packs a CTA)
    int iters = 0;          // vectors per lane per row (1, 2, 4 or 8; rows in 16-byte packs: 1 to 8)
    // Over a cluster, eight packs a thread: the kernel held to 64 registers a thread, so that a
    // 128-thread CTA's eight packs leave room for eight CTAs an SM.
    bool bounded = false;
    // Flat tiles: rows per thread (0: not flat). Short contiguous rows not in 16-byte packs, staged
    // through shared memory a tile of threads * flat_rows rows at a time.
    int flat_rows = 0;
    int flat_spread = 1;    // rows between the rows of neighbouring lanes (distinct banks)
    int rows_per_lane = 0;  // short rows in 16-byte packs: rows a lane, a pack of each (0: not used)
  } warp;

  // cluster_rows, grid_rows and cluster_tiles: rings of chunks in shared memory, filled by bulk copies.
  struct Ring {
    // cluster_rows: the CTAs of a row are a group of a cooperative grid, not a cluster, and trade
    // their partials through global memory (any group size, every SM in use).
    bool grid_exchange = false;
    bool claim_rows = false;       // each cluster claims its next row from a counter in global memory
    bool striped = false;          // a row's chunks dealt to its CTAs in turn, not in contiguous slices
    bool double_buffered = false;  // two slices fit: the next row (tile) loads while this one is written
    int chunk_bytes = 0;           // bytes per bulk copy / ring slot
    int ring_slots = 0;            // chunks the ring holds
    int aux_slots = 0;             // backward: chunks of the second ring, which streams y to the writers
    int64_t chunks_per_row = 0;
    int64_t chunks_per_cta = 0;    // grid_rows: chunks an item
    int64_t spill_chunks = 0;      // grid_rows: a row's first chunks folded and released, written when
                                   // the same chunk of the next row passes (x read again, from L2)
    bool wait_last = false;        // grid_rows: the merger polls a row's last item first
    int hints = 0;                 // cache hints (see Overrides)
  } ring;

  // split_rows and cluster_tiles: positions along the inner axis.
  struct Axis {
    int lanes = 0;          // positions along inner per CTA (1 for rows); cluster_tiles: tile width
    int64_t tiles = 0;      // ceil(inner / lanes)
  } axis;
};

// Constants shared by the planner and the kernels.
constexpr int kWarpRowsThreads = 128;
constexpr int kWarpRowsMaxIters = 8;
constexpr int kWarpRowsMinIters = 4;
// The backward's rows past a warp's eight packs a thread and under kClusterMinRowBytes: dy and y of
// a row held by one CTA of up to this many threads, four packs of each a thread.
constexpr int kBackwardCtaThreads = 512;
// Rows in 16-byte packs under this stay in one group's registers (up to a CTA); longer go to the clusters.
constexpr int64_t kRegisterRowsMaxBytes = 32 * 1024;
// From here (16-bit) or past it (fp32), rows in registers take eight packs a thread, half the threads.
constexpr int64_t kRegisterRowsWideBytes = 16 * 1024;
constexpr int kRegisterRowsMaxGroup = 1024;
// Register clusters: threads per CTA at most, and the rows they take (fp32, 16-bit; CTAs of half the
// threads up to kRegisterClusterSmallRowBytes); peeled rows in one CTA's registers up to kPeeledRowsMaxBytes.
constexpr int64_t kPeeledRowsMaxBytes = 16 * 1024;
constexpr int kRegisterClusterMaxThreads = 256;
constexpr int64_t kRegisterClusterMaxRowBytes = 512 * 1024;
constexpr int64_t kRegisterClusterMax16BitRowBytes = 256 * 1024;
constexpr int64_t kRegisterClusterSmallRowBytes = 128 * 1024;
// CTAs of 256 threads an SM holds at once (at most 64 registers a thread): bf16 took 79, three.
constexpr int kRegisterClusterMinBlocks = 4;
// Rows of up to a warp in registers: CTAs of two warps (more warps resident than CTAs of four).
constexpr int kRegisterRowsWarpThreads = 64;
// Rows in 16-byte packs up to this many bytes: kShortRowsPerLane rows a lane, a pack of each.
constexpr int64_t kShortRowsMaxBytes = 128;
constexpr int kShortRowsPerLane = 4;
// Flat tiles: rows of at most this many bytes, tiles of about kFlatTileBytes.
constexpr int64_t kFlatMaxRowBytes = 256;
constexpr int64_t kFlatTileBytes = 16 * 1024;
constexpr int kClusterDefaultThreads = 2 * 256 + 32;  // two consumer groups, a producer warp
constexpr int kClusterMaxThreads = 800;           // keeps 80 registers per thread
// cluster_rows, 16-bit forward rows held twice by clusters of this size in 32 KB chunks, every CTA
// as many whole chunks: CTAs of kNarrowGroupsThreads (two consumer groups of 128 threads, plan.cpp).
constexpr int kNarrowGroupsCluster = 8;
constexpr int kNarrowGroupsThreads = 2 * 128 + 32;
// cluster_rows' chunk by element size and direction (16-bit 32 KB, fp32 forward 16 KB, else 8 KB).
constexpr int kClusterChunk32 = 16 * 1024;
constexpr int kClusterChunk16 = 32 * 1024;
// cluster_rows, 16-bit forward rows held twice in three 32 KB chunks a CTA: two chunks up to this
// size instead (plan.cpp).
constexpr int64_t kTwoChunksMaxBytes = 38 * 1024;
// cluster_rows, 16-bit forward rows of up to this many 32 KB chunks over clusters of 16, two a CTA
// and some one: four even chunks a CTA over clusters of 8 (plan.cpp).
constexpr int kFourChunksMaxRow16 = 28;
constexpr int kClusterChunk64 = 8 * 1024;
// The backward's second ring holds kClusterAuxSlots chunks: 16 KB keeps room for dy's ring.
constexpr int kClusterBackwardChunk16 = 16 * 1024;
constexpr int kClusterDefaultHints = 0;
// cluster_rows hint: where a streamed forward slice's chunks are read twice, the first read loads
// them evict-last in L2 and the second evict-first, so that the second finds them there (plan.cpp).
constexpr int kHintReadTwiceInL2 = 4;
constexpr int kClusterReserveBytes = 2048;  // stats barriers, cluster partials, scratch
// Backward: chunks in flight of y, which only the writers read (32 KB of fp32 per CTA).
constexpr int kClusterAuxSlots = 4;
// Grid groups: a slice held twice of fewer chunks gives way to a streamed one (plan.cpp).
constexpr int kGroupMinHeldChunks = 5;
// cluster_rows, fp32 forward: the widest cluster that slices of 4 chunks are halved into (plan.cpp).
constexpr int kHalfSliceMaxCluster = 8;
constexpr int kBlockRowsReserveBytes = 1024;
// grid_rows: shared memory per ring slot besides its chunk (two mbarriers and the slot's chunk
// number), and the fixed rest (the merger's queue of posted items and its two counts, the
// statistics warps' scratch, the merged rows handed to the writers: a tag and a word each). The
// queue outnumbers the ring's slots (plan.cpp; grid_rows.cu, the deadlock argument). Spilled rows
// take another mbarrier a slot (kGridRowsSpillSlotBytes).
constexpr int kGridRowsSlotBytes = 24;
constexpr int kGridRowsMergeQueue = 64;
constexpr int kGridRowsSpillSlotBytes = 8;
// grid_rows: rows keep at least this share of the grid's rings before any chunk is spilled (plan.cpp).
constexpr int kGridRowsKeepShare = 5;
constexpr int kGridRowsReserveBytes = kGridRowsMergeQueue * 8 + 8 + 32 * 4 + kGridRowsMergeQueue * 16;
constexpr int kGridRowsItemChunks = 1;
// grid_rows' chunks, in every type: larger chunks, fewer items a row to merge.
constexpr int kGridRowsChunk = 32 * 1024;
constexpr int kMaxCluster = 16;

SOFTLIGHT_INTERNAL Plan plan_rows(const Problem& p, const DeviceInfo& d, const Overrides& o = Overrides{});

// split_rows: the cluster is the smallest whose segment per CTA is at most this many bytes (the
// second pass hopes to find it in the L2 cache: two CTAs per SM hold 25 MB on 132 SMs); inner
// positions per CTA (a power of two) where the axis is not the last: 128 fp32 values are a 512-byte
// run of memory per step along the axis.
constexpr int64_t kSplitSegmentBytes = 96 * 1024;
constexpr int kSplitLanes = 128;
constexpr int kSplitThreads = 1024;

// cluster_tiles: the tile width (bytes of inner positions; each position of the axis is one bulk
// copy of this size), the least inner extent worth a tile, and the buffers of cluster partials.
constexpr int kTileBytes = 256;
constexpr int kTileMinInnerBytes = 128;
constexpr int kTileStatsBuffers = 2;
// cluster_tiles' chunks, measured best at (64, 4096, 4096) along dim 1 (docs/decisions/planner.md).
constexpr int kTileChunk32 = 16 * 1024;
constexpr int kTileChunk16 = 32 * 1024;
constexpr int kTileMaxBoxRows = 256;  // positions of the axis per chunk, at most

// Tuning overrides of split_rows (0 = the planner's choice).
struct SplitOverrides {
  int lanes = 0;
  int64_t segment_bytes = 0;
};

// The plan for an axis problem: the backward of short rows goes to warp_rows, that of aligned rows
// of 32 KB and more on Hopper to cluster_rows; the forward along a non-last axis to cluster_tiles
// on Hopper where the layout is aligned and a tile's slice fits a CTA's ring; everything else to
// split_rows (the forward of rows takes plan_rows). cluster_overrides: cluster, chunk and threads
// of the cluster families.
SOFTLIGHT_INTERNAL Plan plan_axis(const AxisProblem& p, const DeviceInfo& d, const SplitOverrides& o = SplitOverrides{},
               const Overrides& cluster_overrides = Overrides{});

// Values forced for tests and tuning (tuning.hpp); a default build always plans with Tuning{}.
struct Tuning {
  Overrides rows;
  SplitOverrides split;
  int cpu_kernels = -1;  // the CPU backend's vector kernels (cpu_parallel.hpp, CpuKernels); -1: the widest
                         // the CPU runs (forcing refuses a set it cannot run)
};
// Every forced value within what the kernels are built for (a value the planner may still find
// does not fit a given problem or device, and then plans as if it were unset).
SOFTLIGHT_INTERNAL bool tuning_valid(const Tuning& t);

}  // namespace softlight
