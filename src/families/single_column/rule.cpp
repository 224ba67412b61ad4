#include "families/single_column/rule.hpp"

#include <algorithm>

#include "planner/rules.hpp"

namespace softlight {

Plan single_column_rule(const Problem& p, const DeviceInfo&, const Tuning&) {
  if (p.cols != 1) return Plan{};
  Plan plan;
  plan.family = Family::single_column;
  plan.threads = kWarpRowsThreads;
  plan.warp.group = 1;
  plan.warp.iters = 1;
  plan.grid = std::min<int64_t>(ceil_div(p.rows, kWarpRowsThreads), int64_t{1} << 30);
  return plan;
}

}  // namespace softlight
