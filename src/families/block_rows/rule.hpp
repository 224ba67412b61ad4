// block_rows: one CTA a row, everything the other families leave: the row in shared memory (one
// DRAM read), or, past what a CTA holds, read twice. Rows off 16 bytes but misaligned alike in x
// and y are peeled: their interior in 16-byte packs, the edges apart.
#pragma once

#include "planner/plan.hpp"

namespace softlight {

constexpr int kBlockRowsReserveBytes = 1024;

// Any forward rows (the last rule of plan_rows).
Plan block_rows_rule(const Problem& p, const DeviceInfo& d, const Tuning& o);

}  // namespace softlight
