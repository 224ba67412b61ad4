// split_rows: any axis, forward or backward, any layout: the axis split over a cluster of CTAs (one
// CTA off Hopper), two passes, the second re-reading the segment from the L2 cache. The rule every
// other leaves to it.
#pragma once

#include <cstdint>

#include "planner/plan.hpp"

namespace softlight {

// split_rows: the cluster is the smallest whose segment per CTA is at most this many bytes (the
// second pass hopes to find it in the L2 cache: two CTAs per SM hold 25 MB on 132 SMs); inner
// positions per CTA (a power of two) where the axis is not the last: 128 fp32 values are a 512-byte
// run of memory per step along the axis.
constexpr int64_t kSplitSegmentBytes = 96 * 1024;
constexpr int kSplitLanes = 128;
constexpr int kSplitThreads = 1024;

// Any axis problem (the last rule of plan_axis); forced split_lanes and split_segment_bytes.
Plan split_rows_rule(const AxisProblem& p, const DeviceInfo& d, const Tuning& o);

}  // namespace softlight
