// cluster_rows (Hopper): a cluster of CTAs a row, each CTA's slice of the row carried by bulk copies
// into a ring of chunks in shared memory; statistics warps fold row r + 1 while writer warps write
// row r. Where the slice fits the ring the row is read once; else it streams through twice. Its
// grid-group form trades the partials through global memory instead of a cluster (any group size).
// The backward holds dy in the ring and streams y through a second one.
#pragma once

#include "planner/plan.hpp"

namespace softlight {

// cluster_rows, 16-bit forward rows held twice by clusters of this size in 32 KB chunks, every CTA
// as many whole chunks: CTAs of kNarrowGroupsThreads (two consumer groups of 128 threads, rule.cpp).
constexpr int kNarrowGroupsCluster = 8;
constexpr int kNarrowGroupsThreads = 2 * 128 + 32;
// cluster_rows' chunk by element size and direction (16-bit 32 KB, fp32 forward 16 KB, else 8 KB).
constexpr int kClusterChunk32 = 16 * 1024;
constexpr int kClusterChunk16 = 32 * 1024;
// cluster_rows, 16-bit forward rows held twice in three 32 KB chunks a CTA: two chunks up to this
// size instead (rule.cpp).
constexpr int64_t kTwoChunksMaxBytes = 38 * 1024;
// cluster_rows, 16-bit forward rows of up to this many 32 KB chunks over clusters of 16, two a CTA
// and some one: four even chunks a CTA over clusters of 8 (rule.cpp).
constexpr int kFourChunksMaxRow16 = 28;
constexpr int kClusterChunk64 = 8 * 1024;
// The backward's second ring holds kClusterAuxSlots chunks: 16 KB keeps room for dy's ring.
constexpr int kClusterBackwardChunk16 = 16 * 1024;
constexpr int kClusterDefaultHints = 0;
// cluster_rows hint: where a streamed forward slice's chunks are read twice, the first read loads
// them evict-last in L2 and the second evict-first, so that the second finds them there (rule.cpp).
constexpr int kHintReadTwiceInL2 = 4;
constexpr int kClusterReserveBytes = 2048;  // stats barriers, cluster partials, scratch
// Backward: chunks in flight of y, which only the writers read (32 KB of fp32 per CTA).
constexpr int kClusterAuxSlots = 4;
// Grid groups: a slice held twice of fewer chunks gives way to a streamed one (rule.cpp).
constexpr int kGroupMinHeldChunks = 5;
// cluster_rows, fp32 forward: the widest cluster that slices of 4 chunks are halved into (rule.cpp).
constexpr int kHalfSliceMaxCluster = 8;

// The plan of a cluster_rows launch for rows of `p` (backward: dy in the ring, y in a second).
Plan cluster_rows_plan(const Problem& p, const DeviceInfo& d, const Tuning& o, bool backward = false);
// Forward rows in 16-byte packs from kClusterMinRowBytes (or forced cluster), grid_rows where its
// rings hold more; rows off 16 bytes but misaligned alike in x and y, peeled.
Plan cluster_rows_rule(const Problem& p, const DeviceInfo& d, const Tuning& o);
// The backward of rows in 16-byte packs from kClusterMinRowBytes (or forced cluster).
Plan cluster_rows_backward_rule(const AxisProblem& p, const DeviceInfo& d, const Tuning& o);

}  // namespace softlight
