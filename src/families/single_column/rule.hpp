// single_column: rows of one element. Each value's log-softmax is 0 (NaN where it is NaN or
// infinite), its log-sum-exp the value scaled: a flat array of packs, no exp or log.
#pragma once

#include "planner/plan.hpp"

namespace softlight {

// Forward rows of one element.
Plan single_column_rule(const Problem& p, const DeviceInfo& d, const Tuning& o);

}  // namespace softlight
