#include "families/flat_rows/rule.hpp"

#include <algorithm>

#include "planner/rules.hpp"

namespace softlight {
namespace {

Plan flat_plan(const Problem& p) {
  const int64_t row_bytes = p.cols * p.elem_bytes;
  Plan plan;
  plan.family = Family::flat_rows;
  plan.threads = kWarpRowsThreads;
  plan.warp.flat_rows = static_cast<int>(std::clamp<int64_t>(kFlatTileBytes / (kWarpRowsThreads * row_bytes), 1, 8));
  // Lanes whose rows lie an odd number of banks (4 bytes, or an element if larger) apart meet no
  // bank conflicts: rows of 7 bf16 (3.5 banks) take every other row. Where no spread up to 8 is
  // odd (rows of 100 bf16, 50 banks), the lanes take neighbouring rows.
  const int64_t bank = std::max<int64_t>(4, p.elem_bytes);
  for (int s = 1; s <= 8; s *= 2)
    if (s * row_bytes % bank == 0 && (s * row_bytes / bank) % 2 == 1) {
      plan.warp.flat_spread = s;
      break;
    }
  const int64_t tile_rows = int64_t{kWarpRowsThreads} * plan.warp.flat_rows;
  plan.smem_bytes = ceil_div(tile_rows * row_bytes, 16) * 16;
  plan.grid = std::min<int64_t>(ceil_div(p.rows, tile_rows), int64_t{1} << 30);
  return plan;
}

}  // namespace

Plan flat_rows_rule(const Problem& p, const DeviceInfo&, const Tuning& o) {
  const int64_t row_bytes = p.cols * p.elem_bytes;
  if (p.flat16 && p.cols > 1 && row_bytes <= kFlatMaxRowBytes && (o.flat >= 0 ? o.flat == 1 : !p.aligned16))
    return flat_plan(p);
  return Plan{};
}

}  // namespace softlight
