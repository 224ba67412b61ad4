// grid_rows (Hopper): rows that no cluster holds, held once in the rings of a cooperative grid of
// one CTA an SM, in items of chunks that any CTA claims; a merger warp a CTA folds the items' partials
// of a row and hands the row to the writers. Rows past a quarter of the rings spill their first
// chunks, written a row later from L2.
#pragma once

#include "planner/plan.hpp"

namespace softlight {

// grid_rows: shared memory per ring slot besides its chunk (two mbarriers and the slot's chunk
// number), and the fixed rest (the merger's queue of posted items and its two counts, the
// statistics warps' scratch, the merged rows handed to the writers: a tag and a word each). The
// queue outnumbers the ring's slots (rule.cpp; grid_rows.cu, the deadlock argument). Spilled rows
// take another mbarrier a slot (kGridRowsSpillSlotBytes).
constexpr int kGridRowsSlotBytes = 24;
constexpr int kGridRowsMergeQueue = 64;
constexpr int kGridRowsSpillSlotBytes = 8;
// grid_rows: rows keep at least this share of the grid's rings before any chunk is spilled (rule.cpp).
constexpr int kGridRowsKeepShare = 5;
constexpr int kGridRowsReserveBytes = kGridRowsMergeQueue * 8 + 8 + 32 * 4 + kGridRowsMergeQueue * 16;
constexpr int kGridRowsItemChunks = 1;
// grid_rows' chunks, in every type: larger chunks, fewer items a row to merge.
constexpr int kGridRowsChunk = 32 * 1024;

// Forward rows in 16-byte packs held by a grid's rings where forced (grid_rows 1); tests and tuning.
Plan grid_rows_rule(const Problem& p, const DeviceInfo& d, const Tuning& o);
// grid_rows in place of the cluster_rows plan `clusters` where the grid's rings hold the row 2.5
// times (or half of it, spilled): 16-bit rows the widest clusters stream keeping under 3/4 of each
// slice, fp32 rows no cluster holds. That plan, or none.
Plan grid_rows_instead(const Problem& p, const DeviceInfo& d, const Tuning& o, const Plan& clusters);

}  // namespace softlight
