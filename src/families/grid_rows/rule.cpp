#include "families/grid_rows/rule.hpp"

#include <algorithm>

#include "planner/rules.hpp"

namespace softlight {
namespace {

// grid_rows: the bytes all of a grid's rings hold (one CTA per SM).
int64_t grid_rings_bytes(const Plan& plan, const DeviceInfo& d) {
  return int64_t{d.sm_count} * plan.ring.ring_slots * plan.ring.chunk_bytes;
}

// grid_rows: a cooperative grid of one CTA per SM, each with a ring of chunks; items of
// `item_chunks` chunks. None where every ring full of one row could leave it unfinished (chunks a
// row >= SMs x (slots - item chunks + 1)) or the ring has as many slots as the merger's queue has
// entries (the kernel's deadlock argument, grid_rows.cu).
Plan grid_plan(const Problem& p, const DeviceInfo& d, const Tuning& o) {
  Plan plan;
  plan.family = Family::grid_rows;
  plan.vec = 16 / p.elem_bytes;
  plan.threads = std::min(cluster_threads(o), kClusterMaxThreads - 64) + 32;  // and the merger warp
  plan.ring.chunk_bytes = o.chunk_bytes > 0 ? o.chunk_bytes : kGridRowsChunk;
  // As many slots of `slot_bytes` (a chunk and its barriers and number) as fit beside the rest.
  const auto fit_ring = [&](int64_t slot_bytes) {
    plan.ring.ring_slots = static_cast<int>((d.smem_per_block_optin - kGridRowsReserveBytes) / slot_bytes);
    plan.smem_bytes = int64_t{plan.ring.ring_slots} * slot_bytes + kGridRowsReserveBytes;
  };
  fit_ring(plan.ring.chunk_bytes + kGridRowsSlotBytes);
  plan.ring.chunks_per_row = ceil_div(p.cols * p.elem_bytes, plan.ring.chunk_bytes);
  plan.ring.chunks_per_cta = o.item_chunks >= 1 && o.item_chunks <= 8 ? o.item_chunks : kGridRowsItemChunks;
  plan.cluster = 1;
  plan.ring.grid_exchange = true;  // a cooperative launch
  plan.resident = true;
  plan.grid = std::min<int64_t>(p.rows * ceil_div(plan.ring.chunks_per_row, plan.ring.chunks_per_cta), d.sm_count);
  // Rows past a quarter of the grid's rings keep max(half the row, a fifth of the rings); the chunks
  // before are spilled: folded, released, read again from L2 when the next row's same chunk passes.
  const int64_t row_bytes = p.cols * p.elem_bytes;
  const int64_t rings = grid_rings_bytes(plan, d);
  const int64_t keep = std::max(row_bytes / 2, rings / kGridRowsKeepShare);
  const int64_t spill = o.spill_chunks >= 0 ? o.spill_chunks
                        : 4 * row_bytes > rings ? plan.ring.chunks_per_row - ceil_div(keep, plan.ring.chunk_bytes) : 0;
  plan.ring.spill_chunks = std::clamp<int64_t>(spill, 0, plan.ring.chunks_per_row - 1) / plan.ring.chunks_per_cta * plan.ring.chunks_per_cta;
  if (plan.ring.spill_chunks > 0) fit_ring(plan.ring.chunk_bytes + kGridRowsSlotBytes + kGridRowsSpillSlotBytes);  // a refill barrier
  // Rows that spill under a third of their chunks: the merger waits on a row's last item with one lane.
  plan.ring.wait_last = 3 * plan.ring.spill_chunks < plan.ring.chunks_per_row;
  if (plan.ring.ring_slots < plan.ring.chunks_per_cta || plan.ring.ring_slots >= kGridRowsMergeQueue ||
      plan.ring.chunks_per_row - plan.ring.spill_chunks >= int64_t{d.sm_count} * (plan.ring.ring_slots - plan.ring.chunks_per_cta + 1))
    return Plan{};
  return plan;
}

}  // namespace

Plan grid_rows_rule(const Problem& p, const DeviceInfo& d, const Tuning& o) {
  if (has_clusters(d) && p.aligned16 && p.elem_bytes <= 4 && o.grid_rows == 1 && d.sm_count > 0) return grid_plan(p, d, o);
  return Plan{};
}

Plan grid_rows_instead(const Problem& p, const DeviceInfo& d, const Tuning& o, const Plan& clusters) {
  const bool streamed16 = p.elem_bytes == 2 && !clusters.resident && !clusters.ring.grid_exchange &&
                          4 * int64_t{clusters.ring.ring_slots} < 3 * clusters.ring.chunks_per_cta;
  const bool unheld32 = p.elem_bytes == 4 && (!clusters.resident || clusters.ring.grid_exchange);
  if (!(streamed16 || unheld32) || d.sm_count <= 0) return Plan{};
  const Plan grid = grid_plan(p, d, o);
  const int64_t held_bytes = p.cols * p.elem_bytes - grid.ring.spill_chunks * grid.ring.chunk_bytes;
  const bool held = 5 * held_bytes <= 2 * grid_rings_bytes(grid, d);
  return grid.family == Family::grid_rows && held ? grid : Plan{};
}

}  // namespace softlight
