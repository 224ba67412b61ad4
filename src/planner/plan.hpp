// The planner: which kernel family runs a problem, and with what launch shape.
// Pure host code (no CUDA headers), tested on the CPU through softlight._planner (tuning builds).
#pragma once

#include <cstdint>

#include "planner/knobs.h"

// The planner's entry points are exported by tuning builds alone, for softlight._planner's queries
// (python/planner_queries.cpp: the CPU tests of every plan); they are not part of the C ABI, and a
// default build keeps them hidden.
#if defined(SOFTLIGHT_TUNING) && !defined(_WIN32)
#define SOFTLIGHT_INTERNAL __attribute__((visibility("default")))
#else
#define SOFTLIGHT_INTERNAL
#endif

namespace softlight {

// The kernel families, one launcher each (src/families/<family>/); plan_rows and plan_axis (plan.cpp)
// say which takes a problem.
enum class Family : int {
  none = 0,           // nothing to do (rows or cols is zero)
  single_column,      // rows of one element: a flat array, no exp or log
  flat_rows,          // short contiguous rows off 16-byte packs: tiles staged through shared memory
  short_rows,         // rows in 16-byte packs up to 128 bytes: a pack of each of several rows a lane
  register_rows,      // rows held in the registers of a group of lanes, up to a CTA of 1024 threads
  register_clusters,  // Hopper: rows past one CTA's registers, in the registers of a cluster's CTAs
  block_rows,         // one CTA per row: the row in shared memory, or streamed twice if too long
  cluster_rows,       // Hopper: a cluster of CTAs per row, bulk copies into a ring of chunks
  grid_rows,          // Hopper, rows that no cluster holds: held once in the rings of a
                      // cooperative grid, in items of chunks that any CTA claims
  split_rows,         // any axis, forward or backward: the axis split over a cluster of CTAs (one
                      // CTA off Hopper), two passes, the second re-reading from the L2 cache
  cluster_tiles,      // Hopper, forward along a non-last axis: a cluster per tile of 256 bytes of
                      // inner positions over the whole axis, held in a ring of chunks (one read)
  consumer_rows,      // the consumers of a row's log-sum-exp (cross-entropy, the row statistics and
                      // their gradients): a CTA a row; plan_consumer's answer where no family holds
                      // the row on chip for them
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

// A consumer of a row's log-sum-exp (docs/consumers.md) over the rows of x: `rows` is the problem of
// the log-softmax of x into the consumer's output (cross-entropy's gradient; x itself for the
// statistics), and the rest is what the call asks.
struct ConsumerProblem {
  Problem rows;
  bool cross_entropy = false;    // cross-entropy, else the row statistics
  bool writes_grad = false;      // cross-entropy: its gradient is written
  bool label_smoothing = false;  // cross-entropy: with label smoothing (which needs the row's sum)
  bool asks_sum = false;         // the statistics: the row's sum is asked
};

// Values forced for tests and tuning (knobs.h says what each forces; tuning.hpp how a build takes
// them). A default build always plans with Tuning{}: every knob unset.
struct Tuning {
#define SOFTLIGHT_TUNING_MEMBER(name, type, unset) type name = unset;
  SOFTLIGHT_KNOBS(SOFTLIGHT_TUNING_MEMBER)
#undef SOFTLIGHT_TUNING_MEMBER
};
// Every forced value within what the kernels are built for (a value the planner may still find
// does not fit a given problem or device, and then plans as if it were unset).
SOFTLIGHT_INTERNAL bool tuning_valid(const Tuning& t);

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
    int hints = 0;                 // cache hints (knobs.h, hints)
  } ring;

  // split_rows and cluster_tiles: positions along the inner axis.
  struct Axis {
    int lanes = 0;          // positions along inner per CTA (1 for rows); cluster_tiles: tile width
    int64_t tiles = 0;      // ceil(inner / lanes)
  } axis;
};

// Constants that several families share (each family's own are in its header, families/<family>/).
// CTAs of the families that hold rows in lanes (single_column, flat_rows, short_rows, register_rows),
// and the packs a lane holds of a row, least and most.
constexpr int kWarpRowsThreads = 128;
constexpr int kWarpRowsMinIters = 4;
constexpr int kWarpRowsMaxIters = 8;
// The ring families (cluster_rows, grid_rows, cluster_tiles): threads a CTA, two consumer groups and a
// producer warp, by default and at most (80 registers a thread).
constexpr int kClusterDefaultThreads = 2 * 256 + 32;
constexpr int kClusterMaxThreads = 800;
// The largest cluster Hopper schedules (8 portably).
constexpr int kMaxCluster = 16;

// The forward of rows: the first family whose rule takes the problem (plan.cpp).
SOFTLIGHT_INTERNAL Plan plan_rows(const Problem& p, const DeviceInfo& d, const Tuning& o = Tuning{});
// The backward, and the forward along a non-last axis (plan.cpp).
SOFTLIGHT_INTERNAL Plan plan_axis(const AxisProblem& p, const DeviceInfo& d, const Tuning& o = Tuning{});
// A consumer of the log-sum-exp: the plan of the family that holds the rows on chip for it
// (register_clusters, cluster_rows), or consumer_rows (plan.cpp, families/consumer_rows/rule.hpp).
SOFTLIGHT_INTERNAL Plan plan_consumer(const ConsumerProblem& p, const DeviceInfo& d, const Tuning& o = Tuning{});

}  // namespace softlight
