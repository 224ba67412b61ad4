// consumer_rows: the consumers of a row's log-sum-exp (cross-entropy, the row statistics, their
// gradients), a CTA a row, one read of the row for the statistics and a second for cross-entropy's
// gradient. Where the log-softmax would hold the row on chip, the consumers take it there instead,
// the statistics, cross-entropy's loss alone and its gradient written from there (consumer_out.cuh):
// short_rows (a pack of each of four rows a lane), flat_rows (tiles in shared memory, a row a
// thread), register_rows (rows in 16-byte packs, a group of lanes a row) and register_clusters for
// all three, block_rows' shared memory (resident rows of 4-byte elements) and cluster_rows' ring for
// cross-entropy's gradient. Measurements: docs/consumers.md, "Kernel choices".
#pragma once

#include <cstdint>

#include "planner/plan.hpp"

namespace softlight {

// The longest row (bytes) whose statistics come from the register clusters: longer ones ran faster
// in consumer_rows' kernel on an H200.
constexpr int64_t kStatsClusterRowBytes = 128 << 10;
// cluster_rows writes cross-entropy's gradient from CTAs of at most kClusterDefaultThreads (where the
// 16-bit log-softmax takes CTAs of 288, the gradient's arithmetic wants the writers of 544).

// The log-softmax's plan of the rows where it holds them on chip for the consumer (the statistics
// without the row's sum and cross-entropy's loss alone, rows up to kStatsClusterRowBytes;
// cross-entropy's gradient without label smoothing): short_rows at kShortRowsPerLane rows a lane,
// flat_rows, register_rows in 16-byte packs or register_clusters (all three), or block_rows' fp32 rows
// resident in shared memory or cluster_rows' ring (that gradient); never float64. Else consumer_rows.
Plan consumer_rows_rule(const ConsumerProblem& p, const DeviceInfo& d, const Tuning& o);

}  // namespace softlight
