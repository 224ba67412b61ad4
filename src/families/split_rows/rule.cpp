#include "families/split_rows/rule.hpp"

#include <algorithm>

#include "planner/rules.hpp"

namespace softlight {

Plan split_rows_rule(const AxisProblem& p, const DeviceInfo& d, const Tuning& o) {
  Plan plan;
  plan.family = Family::split_rows;
  plan.vec = p.rows && p.aligned16 ? 16 / p.elem_bytes : 1;
  const int lanes = o.split_lanes > 0 ? o.split_lanes : kSplitLanes;
  plan.axis.lanes = p.rows ? 1 : static_cast<int>(std::min<int64_t>(lanes, pow2_ceil(p.inner)));
  const int64_t units = ceil_div(p.dim, plan.vec);
  const int64_t unit_bytes = int64_t{plan.vec} * p.elem_bytes * plan.axis.lanes;  // per unit of the axis
  // The smallest cluster whose segments fit the target, if any.
  const int64_t target = o.split_segment_bytes > 0 ? o.split_segment_bytes : kSplitSegmentBytes;
  const int max_cluster = std::min(d.max_cluster, kMaxCluster);
  int c = 1;
  while (c * 2 <= max_cluster && c * 2 <= units && ceil_div(units, c) * unit_bytes > target) c *= 2;
  plan.cluster = c;
  plan.segment = ceil_div(units, c);
  // Four units per thread and pass where the segment is long enough, a warp at the least.
  const int64_t along = std::clamp<int64_t>(pow2_ceil(ceil_div(plan.segment, 4)), 1, kSplitThreads / plan.axis.lanes);
  plan.threads = static_cast<int>(std::max<int64_t>(64, along * plan.axis.lanes));
  plan.axis.tiles = ceil_div(p.inner, plan.axis.lanes);
  plan.grid = std::min<int64_t>(p.outer * plan.axis.tiles, int64_t{1} << 24);  // positions' clusters
  return plan;
}

}  // namespace softlight
