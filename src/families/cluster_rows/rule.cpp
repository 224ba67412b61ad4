#include "families/cluster_rows/rule.hpp"

#include <algorithm>

#include "families/grid_rows/rule.hpp"
#include "planner/rules.hpp"

namespace softlight {
namespace {

// The ring slots of a CTA of cluster_rows with chunks of `chunk` bytes: each slot costs its chunk
// and two mbarriers; a fixed area holds the rest.
int ring_slots_for(const DeviceInfo& d, int chunk) {
  return static_cast<int>((d.smem_per_block_optin - kClusterReserveBytes) / (chunk + 16));
}

}  // namespace

// backward: a second ring of kClusterAuxSlots chunks carries y, and the first holds dy.
Plan cluster_rows_plan(const Problem& p, const DeviceInfo& d, const Tuning& o, bool backward) {
  Plan plan;
  plan.family = Family::cluster_rows;
  plan.vec = 16 / p.elem_bytes;
  plan.threads = cluster_threads(o);
  int chunk = p.elem_bytes == 2 ? (backward ? kClusterBackwardChunk16 : kClusterChunk16)
              : p.elem_bytes == 4 && !backward ? kClusterChunk32
                                               : kClusterChunk64;
  const int64_t row_bytes = p.cols * p.elem_bytes;
  // 16-bit rows one CTA holds twice in 16 KB chunks but not in 32 KB ones: 16 KB chunks, one CTA a row.
  const auto twice_in_one = [&](int c) { return 2 * ceil_div(row_bytes, c) <= ring_slots_for(d, c); };
  if (p.elem_bytes == 2 && !backward && !twice_in_one(chunk) && twice_in_one(kClusterChunk32)) chunk = kClusterChunk32;
  plan.ring.aux_slots = backward ? kClusterAuxSlots : 0;
  // The ring for chunks of c bytes: its slots, the CTA's shared memory, a row's chunks.
  const auto size_ring = [&](int c) {
    plan.ring.chunk_bytes = c;
    plan.ring.ring_slots = ring_slots_for(d, c) - plan.ring.aux_slots;
    plan.smem_bytes = int64_t{plan.ring.ring_slots + plan.ring.aux_slots} * (c + 16) + kClusterReserveBytes;
    plan.ring.chunks_per_row = ceil_div(row_bytes, c);
  };
  // A forced chunk size counts only where its ring keeps two slots besides the backward's second ring.
  const bool forced_chunk = o.chunk_bytes > 0 && ring_slots_for(d, o.chunk_bytes) - plan.ring.aux_slots >= 2;
  size_ring(forced_chunk ? o.chunk_bytes : chunk);
  plan.ring.hints = o.hints >= 0 ? o.hints & 7 : kClusterDefaultHints;  // 3 bits, see knobs.h
  const int max_cluster = std::min(d.max_cluster, kMaxCluster);

  auto slice = [&](int c) { return ceil_div(plan.ring.chunks_per_row, c); };
  // The smallest cluster whose slice fits the ring `times` over, or 0.
  auto smallest_cluster = [&](int times) {
    for (int c = 1; c <= max_cluster; c *= 2)
      if (times * slice(c) <= plan.ring.ring_slots) return c;
    return 0;
  };
  int cluster_twice = smallest_cluster(2);
  // fp32 forward, four chunks a CTA: twice the CTAs with two each, up to clusters of kHalfSliceMaxCluster.
  if (p.elem_bytes == 4 && !backward && o.chunk_bytes <= 0 && cluster_twice >= 2 &&
      2 * cluster_twice <= kHalfSliceMaxCluster && plan.ring.chunks_per_row == 4 * cluster_twice)
    cluster_twice *= 2;
  // 16-bit forward rows of two 32 KB chunks: two CTAs of one chunk each.
  if (p.elem_bytes == 2 && !backward && o.chunk_bytes <= 0 && plan.ring.chunk_bytes == kClusterChunk16 &&
      cluster_twice == 1 && plan.ring.chunks_per_row == 2)
    cluster_twice = 2;
  int chosen = 0;
  // Grid groups for fp32 forward rows no cluster holds twice, unless the widest clusters stream them
  // keeping 3/4 of each slice and rows are many enough. Never float64 (fp32 pairs), never peeled.
  const int64_t widest = slice(max_cluster);
  const bool streamed_keeps_most = widest > plan.ring.ring_slots && 4 * int64_t{plan.ring.ring_slots} >= 3 * widest;
  const bool grid_default = p.elem_bytes == 4 && !backward && p.aligned16 && cluster_twice == 0 &&
                            (!streamed_keeps_most || may_hold_once(p.rows, o, d, max_cluster));
  plan.ring.grid_exchange = (o.exchange >= 0 ? o.exchange == 1 : grid_default) && d.sm_count > 0 && p.elem_bytes <= 4;
  if (plan.ring.grid_exchange) {
    // Groups of a cooperative grid, one CTA per SM. Of the sizes whose slice fits as wanted, the
    // one that keeps the most SMs busy (the least CTAs per row where it ties).
    const int limit = o.cluster > 0 ? std::min(o.cluster, d.sm_count) : d.sm_count;
    auto group_where = [&](auto fits) {
      int best_c = 0;
      int64_t best = 0;
      for (int c = o.cluster > 0 ? limit : 1; c <= limit; ++c) {
        const int64_t busy = std::min<int64_t>(p.rows, d.sm_count / c) * c;
        if (fits(c, slice(c)) && busy > best) best = busy, best_c = c;
      }
      return best_c;
    };
    // Groups: a slice held twice; else, with rows enough, streamed keeping 7/8 of it; else held once.
    const bool once = may_hold_once(p.rows, o, d, max_cluster);
    const int twice = group_where([&](int, int64_t s) { return 2 * s <= plan.ring.ring_slots; });
    const int streamed = group_where([&](int c, int64_t s) {
      return 2 * c <= d.sm_count && s > plan.ring.ring_slots && 8 * plan.ring.ring_slots >= 7 * s;
    });
    if (twice && (once || !streamed || slice(twice) >= kGroupMinHeldChunks)) {
      chosen = twice;
    } else if (once) {
      chosen = group_where([&](int, int64_t s) { return s <= plan.ring.ring_slots; });
    } else {
      chosen = streamed;
    }
    // Both knobs set: that group size even where its slice keeps less of itself in the ring.
    if (!chosen && o.exchange == 1 && o.cluster > 0) chosen = limit;
    plan.ring.grid_exchange = chosen > 0;
  }
  if (!chosen && o.cluster > 0) {
    chosen = std::min(o.cluster, max_cluster);
  } else if (!chosen) {
    // Prefer a slice that fits twice, so the next row streams in while this one is written out;
    // else one that fits once; else stream the row through the ring twice with the widest cluster.
    chosen = cluster_twice ? cluster_twice : smallest_cluster(1);
    if (!chosen) {
      chosen = 1;
      while (chosen * 2 <= max_cluster) chosen *= 2;
    }
  }
  plan.cluster = chosen;
  plan.ring.chunks_per_cta = slice(chosen);
  plan.resident = plan.ring.chunks_per_cta <= plan.ring.ring_slots;
  plan.ring.double_buffered = 2 * plan.ring.chunks_per_cta <= plan.ring.ring_slots;
  // 16-bit forward rows whose CTAs take two 32 KB chunks, some one: 4 C even chunks over clusters of
  // C / 2. even_chunk(n): the row's bytes over n chunks, rounded up to 16 bytes.
  const auto resizable = [&] {
    return p.elem_bytes == 2 && !backward && p.aligned16 && o.chunk_bytes <= 0 && o.cluster <= 0 &&
           !plan.ring.grid_exchange && plan.ring.double_buffered && plan.ring.chunk_bytes == kClusterChunk16;
  };
  const auto even_chunk = [&](int64_t n) { return static_cast<int>(ceil_div(ceil_div(row_bytes, n), 16) * 16); };
  const bool four_from_8 = plan.cluster == 8 && plan.ring.chunks_per_row == 13;
  const bool four_from_16 = plan.cluster == 16 && plan.ring.chunks_per_cta == 2 && plan.ring.chunks_per_row <= kFourChunksMaxRow16;
  if (resizable() && (four_from_8 || four_from_16)) {
    const int chunk = even_chunk(2 * int64_t{plan.cluster});
    if (8 <= ring_slots_for(d, chunk)) {
      plan.cluster /= 2;
      size_ring(chunk);
      plan.ring.chunks_per_cta = 4;
    }
  }
  // 16-bit forward rows held twice, three 32 KB chunks a CTA: two larger ones (up to kTwoChunksMaxBytes).
  const int two_chunks = even_chunk(2 * int64_t{plan.cluster});
  if (resizable() && plan.ring.chunks_per_cta == 3 && two_chunks <= kTwoChunksMaxBytes &&
      4 <= ring_slots_for(d, two_chunks)) {
    size_ring(two_chunks);
    plan.ring.chunks_per_cta = 2;
  }
  // 16-bit rows held twice in even slices by clusters of 8: consumer groups of 128 threads, not 256.
  const bool even_slices = plan.ring.chunks_per_cta * plan.cluster * plan.ring.chunk_bytes == row_bytes;
  if (p.elem_bytes == 2 && !backward && p.aligned16 && o.threads <= 0 && o.chunk_bytes <= 0 && !plan.ring.grid_exchange &&
      plan.cluster == kNarrowGroupsCluster && plan.ring.double_buffered && plan.ring.chunk_bytes == kClusterChunk16 &&
      even_slices)
    plan.threads = kNarrowGroupsThreads;
  // Streamed forward slices that read at most a quarter as many chunks twice as they keep: those from L2.
  const int64_t kept = std::min<int64_t>(plan.ring.chunks_per_cta, plan.ring.ring_slots);
  if (!backward && !plan.resident && o.hints < 0 && 4 * (plan.ring.chunks_per_cta - kept) <= kept)
    plan.ring.hints |= kHintReadTwiceInL2;
  // Clusters claim their rows from a counter (grid groups keep the fixed deal).
  plan.ring.claim_rows = !plan.ring.grid_exchange && o.claim != 0;
  // A row's chunks dealt to its CTAs in turn, so the cluster reads and writes the row front to back.
  plan.ring.striped = o.stripe != 0;
  plan.grid = std::min<int64_t>(p.rows, int64_t{1} << 24);  // clusters wanted; occupancy caps it
  if (o.groups > 0) plan.grid = std::min<int64_t>(plan.grid, o.groups);
  return plan;
}

Plan cluster_rows_rule(const Problem& p, const DeviceInfo& d, const Tuning& o) {
  if (!has_clusters(d)) return Plan{};
  const int64_t row_bytes = p.cols * p.elem_bytes;
  if (p.aligned16 && (row_bytes >= kClusterMinRowBytes || o.cluster > 0)) {
    const Plan clusters = cluster_rows_plan(p, d, o);
    if (o.grid_rows != 0 && o.cluster <= 0 && o.exchange < 0)
      if (const Plan grid = grid_rows_instead(p, d, o, clusters); grid.family != Family::none) return grid;
    return clusters;
  }
  // Rows off 16 bytes but misaligned alike in x and y (rows of 50 257): clusters carry each row's
  // interior, from its first 16-byte boundary to its last, where every CTA's share of every row
  // keeps at least one pack (the row's last chunk holds more than the up to 30 bytes peeled).
  if (!p.aligned16 && p.peelable && p.elem_bytes < 16 && o.peel_clusters != 0 &&
      (row_bytes >= kClusterMinRowBytes || o.cluster > 0)) {
    Plan plan = cluster_rows_plan(p, d, o);
    const int64_t last = row_bytes % plan.ring.chunk_bytes;
    if (!plan.ring.grid_exchange && (last == 0 || last > 32)) {
      plan.peel = true;
      return plan;
    }
  }
  return Plan{};
}

Plan cluster_rows_backward_rule(const AxisProblem& p, const DeviceInfo& d, const Tuning& o) {
  if (p.backward && p.rows && has_clusters(d) && p.aligned16 &&
      (p.dim * p.elem_bytes >= kClusterMinRowBytes || o.cluster > 0))
    return cluster_rows_plan(rows_of(p), d, o, true);
  return Plan{};
}

}  // namespace softlight
