// flat_rows: short rows not in 16-byte packs (rows of 7 or 100 bf16) that lie in one contiguous run
// from a 16-byte boundary, staged through shared memory a tile at a time: element loads would
// leave the load units the limit.
#pragma once

#include <cstdint>

#include "planner/plan.hpp"

namespace softlight {

// Rows of at most this many bytes, tiles of about kFlatTileBytes.
constexpr int64_t kFlatMaxRowBytes = 256;
constexpr int64_t kFlatTileBytes = 16 * 1024;

// Forward rows up to kFlatMaxRowBytes in one contiguous run, not in 16-byte packs (forced flat: 1
// wherever the layout allows, 0 never).
Plan flat_rows_rule(const Problem& p, const DeviceInfo& d, const Tuning& o);

}  // namespace softlight
