#include "families/cluster_tiles/rule.hpp"

#include <algorithm>

#include "planner/rules.hpp"

namespace softlight {
namespace {

// Shared memory of cluster_tiles besides the ring's chunks and barriers (cluster_tiles.cu):
// stats barriers, partials from every CTA, the statistics warps' per-column partials, the
// writers' per-column results, a counter.
int64_t tile_reserve_bytes(int cluster, int w, int elem_bytes, int threads) {
  const int64_t pair = elem_bytes == 8 ? 16 : 8;
  const int64_t group_warps = (threads - 32) / 64;
  return 8 * kTileStatsBuffers + (kTileStatsBuffers * (cluster + 1) + group_warps) * w * pair + 16;
}

Plan tiles_plan(const AxisProblem& p, const DeviceInfo& d, const Tuning& o) {
  Plan plan;
  const bool tile_ok = o.tile_bytes >= 64 && o.tile_bytes <= 512 && (o.tile_bytes & (o.tile_bytes - 1)) == 0;
  const int tile_bytes = tile_ok ? o.tile_bytes : kTileBytes;
  const int w = static_cast<int>(std::min<int64_t>(std::max(1, tile_bytes / p.elem_bytes), pow2_ceil(p.inner)));
  const int row_bytes = w * p.elem_bytes;
  plan.threads = cluster_threads(o);
  const int chunk = p.elem_bytes == 2 ? kTileChunk16 : kTileChunk32;
  plan.ring.chunk_bytes = o.chunk_bytes > 0 && o.chunk_bytes % row_bytes == 0 ? o.chunk_bytes : chunk;
  plan.ring.chunk_bytes = std::min(plan.ring.chunk_bytes, kTileMaxBoxRows * row_bytes);  // a tensor-map box
  const int64_t chunks_per_tile = ceil_div(p.dim, plan.ring.chunk_bytes / row_bytes);
  const int64_t slot_bytes = plan.ring.chunk_bytes + 16;
  auto slots = [&](int c) {
    return static_cast<int>((d.smem_per_block_optin - tile_reserve_bytes(c, w, p.elem_bytes, plan.threads)) / slot_bytes);
  };
  const int max_cluster = std::min(d.max_cluster, kMaxCluster);
  // Portable clusters (up to 8) first; a slice held twice, else once; the smallest that gives every
  // SM a CTA, else the largest.
  const int64_t tiles = p.outer * ceil_div(p.inner, w);
  int chosen = 0;
  // Any number of tiles may be held once (where the device reports its SMs), not only too few to
  // cover the SMs as for rows: the tiles of a non-last axis are many and short.
  const bool once = may_hold_once(0, o, d, max_cluster);
  for (int limit : {std::min(8, max_cluster), max_cluster}) {
    for (int times = 2; times >= (once ? 1 : 2) && !chosen; --times) {
      for (int c = 1; c <= limit; c *= 2) {
        if ((o.cluster > 0 && c != o.cluster) || times * ceil_div(chunks_per_tile, c) > slots(c)) continue;
        chosen = c;
        if (tiles * c >= d.sm_count) break;
      }
    }
    if (chosen) break;
  }
  if (!chosen) return Plan{};
  plan.family = Family::cluster_tiles;
  plan.ring.hints = o.hints >= 0 ? o.hints & 3 : 0;
  plan.vec = 16 / p.elem_bytes;
  plan.axis.lanes = w;
  plan.axis.tiles = ceil_div(p.inner, w);
  plan.grid = std::min<int64_t>(p.outer * plan.axis.tiles, int64_t{1} << 24);  // tiles' clusters; occupancy caps it
  plan.cluster = chosen;
  plan.ring.ring_slots = slots(chosen);
  plan.ring.chunks_per_row = chunks_per_tile;
  plan.ring.chunks_per_cta = ceil_div(chunks_per_tile, chosen);
  plan.resident = true;
  plan.ring.double_buffered = 2 * plan.ring.chunks_per_cta <= plan.ring.ring_slots;
  plan.smem_bytes = plan.ring.ring_slots * slot_bytes + tile_reserve_bytes(chosen, w, p.elem_bytes, plan.threads);
  return plan;
}

}  // namespace

Plan cluster_tiles_rule(const AxisProblem& p, const DeviceInfo& d, const Tuning& o) {
  if (p.backward || p.rows || !p.tiles_aligned || !has_clusters(d) || p.inner * p.elem_bytes < kTileMinInnerBytes)
    return Plan{};
  return tiles_plan(p, d, o);
}

}  // namespace softlight
