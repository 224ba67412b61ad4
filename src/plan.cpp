#include "plan.hpp"

#include <algorithm>

namespace softlight {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Rows of at least this many bytes go to the cluster family on Hopper: below it, a row is too
// small for a ring of bulk copies to pay for its barriers.
constexpr int64_t kClusterMinRowBytes = 32 * 1024;

Plan plan_warp_rows(const Problem& p, int vec) {
  Plan plan;
  plan.family = Family::warp_rows;
  plan.vec = vec;
  // Four accesses per lane where the row allows (more rows per warp, each lane with four loads in
  // flight): a lane per row-vector left warps latency-bound on rows of 128 fp32 and less.
  const int64_t vectors = ceil_div(p.cols, vec);
  plan.group = static_cast<int>(std::min<int64_t>(32, pow2_ceil(ceil_div(vectors, kWarpRowsMinIters))));
  plan.iters = static_cast<int>(pow2_ceil(ceil_div(vectors, plan.group)));
  plan.threads = kWarpRowsThreads;
  const int64_t rows_per_cta = kWarpRowsThreads / plan.group;
  plan.grid = std::min<int64_t>(ceil_div(p.rows, rows_per_cta), int64_t{1} << 30);
  return plan;
}

Plan plan_block_rows(const Problem& p, const DeviceInfo& d, int vec) {
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

// backward: a second ring of kClusterAuxSlots chunks carries y, and the first holds dy.
Plan plan_cluster_rows(const Problem& p, const DeviceInfo& d, const Overrides& o, bool backward = false) {
  Plan plan;
  plan.family = Family::cluster_rows;
  plan.vec = 16 / p.elem_bytes;
  plan.threads = o.threads >= 96 && o.threads <= kClusterMaxThreads && (o.threads - 32) % 64 == 0 ? o.threads
                                                                            : kClusterDefaultThreads;
  plan.chunk_bytes = o.chunk_bytes > 0 ? o.chunk_bytes : p.elem_bytes == 2 ? kClusterChunk16 : kClusterChunk32;
  // Each slot costs its chunk and two mbarriers; a fixed area holds the rest.
  const int slot_bytes = plan.chunk_bytes + 16;
  plan.aux_slots = backward ? kClusterAuxSlots : 0;
  plan.ring_slots = static_cast<int>((d.smem_per_block_optin - kClusterReserveBytes) / slot_bytes) - plan.aux_slots;
  plan.smem_bytes = int64_t{plan.ring_slots + plan.aux_slots} * slot_bytes + kClusterReserveBytes;
  plan.chunks_per_row = ceil_div(p.cols * p.elem_bytes, plan.chunk_bytes);
  plan.hints = o.hints >= 0 ? o.hints & 3 : kClusterDefaultHints;
  const int max_cluster = std::min(d.max_cluster, kMaxCluster);

  auto slice = [&](int c) { return ceil_div(plan.chunks_per_row, c); };
  int chosen = 0;
  if (o.cluster > 0) {
    chosen = std::min(o.cluster, max_cluster);
  } else {
    // Prefer a slice that fits twice, so the next row streams in while this one is written out;
    // else one that fits once; else stream the row through the ring twice with the widest cluster.
    for (int c = 1; c <= max_cluster && !chosen; c *= 2)
      if (2 * slice(c) <= plan.ring_slots) chosen = c;
    for (int c = 1; c <= max_cluster && !chosen; c *= 2)
      if (slice(c) <= plan.ring_slots) chosen = c;
    if (!chosen) {
      chosen = 1;
      while (chosen * 2 <= max_cluster) chosen *= 2;
    }
  }
  plan.cluster = chosen;
  plan.chunks_per_cta = slice(chosen);
  plan.resident = plan.chunks_per_cta <= plan.ring_slots;
  plan.double_buffered = 2 * plan.chunks_per_cta <= plan.ring_slots;
  plan.grid = std::min<int64_t>(p.rows, int64_t{1} << 24);  // clusters wanted; occupancy caps it
  return plan;
}

Plan plan_split_rows(const AxisProblem& p, const DeviceInfo& d, const SplitOverrides& o) {
  Plan plan;
  plan.family = Family::split_rows;
  plan.vec = p.rows && p.aligned16 ? 16 / p.elem_bytes : 1;
  const int lanes = o.lanes > 0 ? o.lanes : kSplitLanes;
  plan.lanes = p.rows ? 1 : static_cast<int>(std::min<int64_t>(lanes, pow2_ceil(p.inner)));
  const int64_t units = ceil_div(p.dim, plan.vec);
  const int64_t unit_bytes = int64_t{plan.vec} * p.elem_bytes * plan.lanes;  // per unit of the axis
  // The smallest cluster whose segments fit the target, if any.
  const int64_t target = o.segment_bytes > 0 ? o.segment_bytes : kSplitSegmentBytes;
  const int max_cluster = std::min(d.max_cluster, kMaxCluster);
  int c = 1;
  while (c * 2 <= max_cluster && c * 2 <= units && ceil_div(units, c) * unit_bytes > target) c *= 2;
  plan.cluster = c;
  plan.segment = ceil_div(units, c);
  // Four units per thread and pass where the segment is long enough, a warp at the least.
  const int64_t along = std::clamp<int64_t>(pow2_ceil(ceil_div(plan.segment, 4)), 1, kSplitThreads / plan.lanes);
  plan.threads = static_cast<int>(std::max<int64_t>(64, along * plan.lanes));
  plan.tiles = ceil_div(p.inner, plan.lanes);
  plan.grid = std::min<int64_t>(p.outer * plan.tiles, int64_t{1} << 24);  // positions' clusters
  return plan;
}

}  // namespace

Plan plan_axis(const AxisProblem& p, const DeviceInfo& d, const SplitOverrides& o, const Overrides& co) {
  if (p.outer <= 0 || p.dim <= 0 || p.inner <= 0) return Plan{};
  const int vec = p.aligned16 ? 16 / p.elem_bytes : 1;
  if (p.backward && p.rows) {
    Problem rows;
    rows.rows = p.outer;
    rows.cols = p.dim;
    rows.elem_bytes = p.elem_bytes;
    rows.aligned16 = p.aligned16;
    if (ceil_div(p.dim, vec) <= int64_t{32} * kWarpRowsMaxIters) return plan_warp_rows(rows, vec);
    const bool hopper = d.cc_major >= 9 && d.max_cluster >= 1;
    if (hopper && p.aligned16 && (p.dim * p.elem_bytes >= kClusterMinRowBytes || co.cluster > 0))
      return plan_cluster_rows(rows, d, co, true);
  }
  return plan_split_rows(p, d, o);
}

const char* family_name(Family f) {
  switch (f) {
    case Family::none: return "none";
    case Family::warp_rows: return "warp_rows";
    case Family::block_rows: return "block_rows";
    case Family::cluster_rows: return "cluster_rows";
    case Family::split_rows: return "split_rows";
  }
  return "unknown";
}

Plan plan_rows(const Problem& p, const DeviceInfo& d, const Overrides& o) {
  if (p.rows <= 0 || p.cols <= 0) return Plan{};
  const int vec = p.aligned16 ? 16 / p.elem_bytes : 1;
  if (ceil_div(p.cols, vec) <= int64_t{32} * kWarpRowsMaxIters) return plan_warp_rows(p, vec);
  const int64_t row_bytes = p.cols * p.elem_bytes;
  const bool hopper = d.cc_major >= 9 && d.max_cluster >= 1;
  if (hopper && p.aligned16 && (row_bytes >= kClusterMinRowBytes || o.cluster > 0))
    return plan_cluster_rows(p, d, o);
  return plan_block_rows(p, d, vec);
}

}  // namespace softlight
