// short_rows: rows in 16-byte packs of at most kShortRowsMaxBytes (forward and backward), a lane
// holding a pack of each of kShortRowsPerLane rows, so that every load of a warp covers 512
// contiguous bytes.
#pragma once

#include <cstdint>

#include "planner/plan.hpp"

namespace softlight {

constexpr int64_t kShortRowsMaxBytes = 128;
constexpr int kShortRowsPerLane = 4;

// Forward rows in 16-byte packs up to kShortRowsMaxBytes (forced rows_per_lane: up to 512 bytes, 0 off).
Plan short_rows_rule(const Problem& p, const DeviceInfo& d, const Tuning& o);
// The backward of the same rows.
Plan short_rows_backward_rule(const AxisProblem& p, const DeviceInfo& d, const Tuning& o);

}  // namespace softlight
