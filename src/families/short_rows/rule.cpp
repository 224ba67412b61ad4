#include "families/short_rows/rule.hpp"

#include <algorithm>

#include "planner/rules.hpp"

namespace softlight {
namespace {

Plan short_plan(const Problem& p, int vec, const Tuning& o) {
  const int64_t row_bytes = p.cols * p.elem_bytes;
  const int rows_per_lane = o.rows_per_lane >= 0 ? o.rows_per_lane : row_bytes <= kShortRowsMaxBytes ? kShortRowsPerLane : 0;
  if (!p.aligned16 || p.cols <= 1 || row_bytes > 16 * 32 || !per_thread_count(rows_per_lane)) return Plan{};
  Plan plan;
  plan.family = Family::short_rows;
  plan.vec = vec;
  plan.threads = kWarpRowsThreads;
  plan.warp.group = static_cast<int>(pow2_ceil(ceil_div(p.cols, vec)));
  plan.warp.iters = 1;  // a pack of each row
  plan.warp.rows_per_lane = rows_per_lane;
  const int64_t rows_per_cta = int64_t{kWarpRowsThreads} / plan.warp.group * rows_per_lane;
  plan.grid = std::min<int64_t>(ceil_div(p.rows, rows_per_cta), int64_t{1} << 30);
  return plan;
}

}  // namespace

Plan short_rows_rule(const Problem& p, const DeviceInfo&, const Tuning& o) {
  return short_plan(p, pack_elems(p.aligned16, p.elem_bytes), o);
}

Plan short_rows_backward_rule(const AxisProblem& p, const DeviceInfo&, const Tuning& o) {
  if (!p.backward || !p.rows) return Plan{};
  return short_plan(rows_of(p), pack_elems(p.aligned16, p.elem_bytes), o);
}

}  // namespace softlight
