// The planner: the forward of rows and the problems along any axis, each an ordered list of the
// families' rules (src/families/<family>/rule.cpp); the first rule that takes a problem plans it.
// The thresholds each rule reads are at the top of its family's rule.hpp; their measurements are in
// docs/decisions/planner.md.
#include "planner/plan.hpp"

#include "families/block_rows/rule.hpp"
#include "families/cluster_rows/rule.hpp"
#include "families/cluster_tiles/rule.hpp"
#include "families/consumer_rows/rule.hpp"
#include "families/flat_rows/rule.hpp"
#include "families/grid_rows/rule.hpp"
#include "families/register_clusters/rule.hpp"
#include "families/register_rows/rule.hpp"
#include "families/short_rows/rule.hpp"
#include "families/single_column/rule.hpp"
#include "families/split_rows/rule.hpp"
#include "planner/rules.hpp"

namespace softlight {

namespace {

using RowsRule = Plan (*)(const Problem&, const DeviceInfo&, const Tuning&);
using AxisRule = Plan (*)(const AxisProblem&, const DeviceInfo&, const Tuning&);

// The forward of rows, in order:
//   grid_rows          forced only: rows held in a grid's rings
//   single_column      rows of one element
//   flat_rows          contiguous rows up to 256 bytes off 16-byte packs
//   short_rows         rows in 16-byte packs up to 128 bytes: several rows a lane
//   register_clusters  Hopper, rows past one CTA's registers up to 512 KB (16-bit 256 KB), and
//                      peeled rows from 16 KB
//   register_rows      rows in 16-byte packs under 32 KB; other rows of up to 256 vectors; peeled
//                      rows under 16 KB
//   cluster_rows       Hopper, rows in 16-byte packs from 32 KB (grid_rows where its rings hold
//                      more), peeled rows from 32 KB
//   block_rows         everything else: a CTA a row
constexpr RowsRule kRowsRules[] = {grid_rows_rule,         single_column_rule, flat_rows_rule,
                                   short_rows_rule,        register_clusters_rule, register_rows_rule,
                                   cluster_rows_rule,      block_rows_rule};

// The backward of rows (contiguous axis) and any problem along a non-last axis, in order:
//   short_rows         backward rows in 16-byte packs up to 128 bytes
//   register_rows      backward rows of up to 256 vectors, or in 16-byte packs under 32 KB
//   cluster_rows       Hopper, backward rows in 16-byte packs from 32 KB
//   cluster_tiles      Hopper, the forward along a non-last axis, aligned, a tile's slice in a ring
//   split_rows         everything else, forward or backward
constexpr AxisRule kAxisRules[] = {short_rows_backward_rule, register_rows_backward_rule, cluster_rows_backward_rule,
                                   cluster_tiles_rule, split_rows_rule};

}  // namespace

Plan plan_rows(const Problem& p, const DeviceInfo& d, const Tuning& o) {
  if (p.rows <= 0 || p.cols <= 0) return Plan{};
  for (RowsRule rule : kRowsRules)
    if (Plan plan = rule(p, d, o); plan.family != Family::none) return plan;
  return Plan{};
}

Plan plan_axis(const AxisProblem& p, const DeviceInfo& d, const Tuning& o) {
  if (p.outer <= 0 || p.dim <= 0 || p.inner <= 0) return Plan{};
  for (AxisRule rule : kAxisRules)
    if (Plan plan = rule(p, d, o); plan.family != Family::none) return plan;
  return Plan{};
}

Plan plan_consumer(const ConsumerProblem& p, const DeviceInfo& d, const Tuning& o) {
  if (p.rows.rows <= 0 || p.rows.cols <= 0) return Plan{};
  return consumer_rows_rule(p, d, o);
}

const char* family_name(Family f) {
  switch (f) {
    case Family::none: return "none";
    case Family::single_column: return "single_column";
    case Family::flat_rows: return "flat_rows";
    case Family::short_rows: return "short_rows";
    case Family::register_rows: return "register_rows";
    case Family::register_clusters: return "register_clusters";
    case Family::block_rows: return "block_rows";
    case Family::cluster_rows: return "cluster_rows";
    case Family::grid_rows: return "grid_rows";
    case Family::split_rows: return "split_rows";
    case Family::cluster_tiles: return "cluster_tiles";
    case Family::consumer_rows: return "consumer_rows";
  }
  return "unknown";
}

bool tuning_valid(const Tuning& o) {
  const auto pow2 = [](int64_t v) { return v > 0 && (v & (v - 1)) == 0; };
  const auto flag = [](int v) { return v >= -1 && v <= 1; };  // -1: the planner's choice
  const auto count = [&](int v) { return v == 0 || per_thread_count(v); };
  // Grid groups (exchange 1) take any size of group; clusters are powers of two up to kMaxCluster.
  const bool cluster_ok = o.cluster == 0 || (o.exchange == 1 ? o.cluster > 0 && o.cluster <= 1024
                                                              : pow2(o.cluster) && o.cluster <= kMaxCluster);
  return cluster_ok && (o.chunk_bytes == 0 || (o.chunk_bytes % 16 == 0 && o.chunk_bytes >= 1024 && o.chunk_bytes <= 64 * 1024)) &&
         (o.threads == 0 || (o.threads >= 96 && o.threads <= kClusterMaxThreads && (o.threads - 32) % 64 == 0)) &&
         o.hints >= -1 && o.hints <= 7 && (o.tile_bytes == 0 || (pow2(o.tile_bytes) && o.tile_bytes >= 64 && o.tile_bytes <= 512)) &&
         flag(o.exchange) && o.groups >= 0 && flag(o.claim) && count(o.iters) &&
         o.register_rows_bytes >= 0 && o.register_rows_bytes <= int64_t{16} * kRegisterRowsMaxGroup * kWarpRowsMaxIters + 1 &&
         flag(o.flat) && (o.rows_per_lane == -1 || count(o.rows_per_lane)) && flag(o.peel_clusters) &&
         (o.register_cluster == -1 || o.register_cluster == 0 ||
          (o.register_cluster % 32 == 0 && o.register_cluster >= 32 && o.register_cluster <= kRegisterClusterMaxThreads)) &&
         flag(o.grid_rows) && o.item_chunks >= 0 && o.item_chunks <= 8 && o.spill_chunks >= -1 &&
         o.spill_chunks < (int64_t{1} << 40) && flag(o.stripe) &&
         (o.split_lanes == 0 || (pow2(o.split_lanes) && o.split_lanes <= 1024)) && o.split_segment_bytes >= 0 &&
         o.split_segment_bytes <= (int64_t{1} << 30) && o.cpu_kernels >= -1;
}

}  // namespace softlight
