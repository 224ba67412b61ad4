#include "families/block_rows/rule.hpp"

#include <algorithm>

#include "planner/rules.hpp"

namespace softlight {

Plan block_rows_rule(const Problem& p, const DeviceInfo& d, const Tuning&) {
  int vec = pack_elems(p.aligned16, p.elem_bytes);
  Plan plan;
  plan.family = Family::block_rows;
  plan.peel = vec == 1 && p.peelable && p.elem_bytes < 16;
  if (plan.peel) vec = 16 / p.elem_bytes;
  plan.vec = vec;
  const int64_t row_bytes = p.cols * p.elem_bytes;
  const int64_t vectors = ceil_div(p.cols, vec);
  plan.threads = static_cast<int>(std::clamp<int64_t>(pow2_ceil(ceil_div(vectors, 4)), 128, 1024));
  const int64_t padded = ceil_div(row_bytes, 16) * 16;
  plan.resident = padded <= d.smem_per_block_optin - kBlockRowsReserveBytes;
  plan.smem_bytes = plan.resident ? padded : 0;
  plan.grid = std::min<int64_t>(p.rows, (int64_t{1} << 31) - 1);
  return plan;
}

}  // namespace softlight
