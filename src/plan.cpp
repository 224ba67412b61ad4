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

// Thread-block clusters can be launched (Hopper and later).
bool has_clusters(const DeviceInfo& d) { return d.cc_major >= 9 && d.max_cluster >= 1; }

// Threads per CTA of the cluster families: the override where it is a valid shape (two consumer
// groups of whole warp pairs and the producer warp, within the register budget), else the default.
int cluster_threads(const Overrides& o) {
  return o.threads >= 96 && o.threads <= kClusterMaxThreads && (o.threads - 32) % 64 == 0 ? o.threads
                                                                                          : kClusterDefaultThreads;
}

// Packs (or rows) per thread that the row kernels are built for.
bool per_thread_count(int v) { return v == 1 || v == 2 || v == 4 || v == 8; }

// The ring slots of a CTA of cluster_rows with chunks of `chunk` bytes: each slot costs its chunk
// and two mbarriers; a fixed area holds the rest.
int ring_slots_for(const DeviceInfo& d, int chunk) {
  return static_cast<int>((d.smem_per_block_optin - kClusterReserveBytes) / (chunk + 16));
}

// Cluster families: whether a row (tile) may be held once in the rings, where none holds it twice
// (no overlap of one row's load with the last one's writing): only if asked, or where the rows are
// too few for the clusters to cover the SMs.
bool may_hold_once(int64_t rows, const Overrides& o, const DeviceInfo& d, int max_cluster) {
  return o.exchange == 1 || rows * max_cluster < d.sm_count;
}

// A warp_rows plan's CTA and grid for its group: past a warp, the CTA is the group; else
// warp_threads, several rows a CTA.
void size_warp_rows_grid(Plan& plan, int64_t rows, int warp_threads) {
  plan.threads = plan.warp.group > 32 ? plan.warp.group : warp_threads;
  plan.grid = std::min<int64_t>(ceil_div(rows, plan.threads / plan.warp.group), int64_t{1} << 30);
}

// max_group: 32, or kRegisterRowsMaxGroup where the row is read in 16-byte packs (the forward).
// warp_threads: the CTA's threads where a group is at most a warp.
Plan plan_warp_rows(const Problem& p, int vec, int max_group = 32, int min_iters = kWarpRowsMinIters,
                    int warp_threads = kWarpRowsThreads) {
  Plan plan;
  plan.family = Family::warp_rows;
  plan.vec = vec;
  // Four accesses per lane where the row allows (more rows per warp, each lane with four loads in
  // flight): a lane per row-vector left warps latency-bound on rows of 128 fp32 and less.
  const int64_t vectors = ceil_div(p.cols, vec);
  plan.warp.group = static_cast<int>(std::min<int64_t>(max_group, pow2_ceil(ceil_div(vectors, min_iters))));
  plan.warp.iters = static_cast<int>(pow2_ceil(ceil_div(vectors, plan.warp.group)));
  size_warp_rows_grid(plan, p.rows, warp_threads);
  return plan;
}

// Flat tiles: short rows not in 16-byte packs that lie in one contiguous run (rows of 7 or 100
// bf16): element loads would leave the load units the limit. Rows of one element have their own
// path (a flat array of packs without exp or log).
Plan plan_flat_rows(const Problem& p) {
  const int64_t row_bytes = p.cols * p.elem_bytes;
  Plan plan;
  plan.family = Family::warp_rows;
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

// Rows of at most kShortRowsMaxBytes in 16-byte packs (forced rows_per_lane: up to 512 bytes, 0
// off), forward and backward: a lane holds a pack of each of kShortRowsPerLane rows, so that every
// load of a warp covers 512 contiguous bytes. None for other rows.
Plan plan_short_rows(const Problem& p, int vec, const Overrides& o) {
  const int64_t row_bytes = p.cols * p.elem_bytes;
  const int rows_per_lane = o.rows_per_lane >= 0 ? o.rows_per_lane : row_bytes <= kShortRowsMaxBytes ? kShortRowsPerLane : 0;
  if (!p.aligned16 || p.cols <= 1 || row_bytes > 16 * 32 || !per_thread_count(rows_per_lane)) return Plan{};
  Plan plan;
  plan.family = Family::warp_rows;
  plan.vec = vec;
  plan.threads = kWarpRowsThreads;
  plan.warp.group = static_cast<int>(pow2_ceil(ceil_div(p.cols, vec)));
  plan.warp.iters = 1;  // a pack of each row
  plan.warp.rows_per_lane = rows_per_lane;
  const int64_t rows_per_cta = int64_t{kWarpRowsThreads} / plan.warp.group * rows_per_lane;
  plan.grid = std::min<int64_t>(ceil_div(p.rows, rows_per_cta), int64_t{1} << 30);
  return plan;
}

// Rows in 16-byte packs in registers, 1 to 8 packs a thread; a CTA group that would leave a quarter
// of its packs empty holds the row in half the threads (or in as many packs as it needs).
Plan plan_register_rows(const Problem& p, int vec, int min_iters) {
  Plan plan = plan_warp_rows(p, vec, kRegisterRowsMaxGroup, min_iters, kRegisterRowsWarpThreads);
  const int64_t vectors = ceil_div(p.cols, vec);
  if (plan.warp.group <= 32 || vectors * 4 >= int64_t{3} * plan.warp.group * plan.warp.iters) return plan;
  if (ceil_div(vectors, plan.warp.group / 2) <= kWarpRowsMaxIters) plan.warp.group /= 2;
  plan.warp.iters = static_cast<int>(ceil_div(vectors, plan.warp.group));
  size_warp_rows_grid(plan, p.rows, kRegisterRowsWarpThreads);
  return plan;
}

// Rows in registers over a cluster (Hopper): one row to a cluster of CTAs of `threads` threads
// holding `iters` packs each, as few CTAs as hold the row (at least two, at most the device's
// cluster), the row's packs spread evenly over them in runs of whole warps' packs; a cluster per
// row (plan.grid clusters). None where no such cluster holds the row or the grid would not fit.
Plan plan_register_cluster(const Problem& p, const DeviceInfo& d, int threads, int iters) {
  // A peeled row's packs are the 16-byte blocks that end in it: at most ceil(bytes / 16).
  const int64_t vectors = ceil_div(p.cols * p.elem_bytes, 16);
  const int64_t per_cta = int64_t{threads} * iters;
  const int64_t c = ceil_div(vectors, per_cta);
  if (threads < 32 || threads > kRegisterClusterMaxThreads || threads % 32 != 0 || c < 2 ||
      c > std::min(d.max_cluster, kMaxCluster) || p.rows > (int64_t{1} << 31) / c - 1)
    return Plan{};
  Plan plan;
  plan.family = Family::warp_rows;
  plan.vec = 16 / p.elem_bytes;
  plan.threads = threads;
  plan.warp.group = threads;
  plan.warp.iters = iters;
  plan.cluster = static_cast<int>(c);
  plan.segment = ceil_div(ceil_div(vectors, c), 32) * 32;
  plan.grid = p.rows;
  plan.peel = !p.aligned16;  // the packs are the blocks each row touches (see register_cluster_row)
  // Eight packs a thread held to 64 registers where that lifts the CTAs an SM holds.
  plan.warp.bounded = iters == 8 && (threads > kRegisterClusterMaxThreads / 2 ||
                                (p.elem_bytes == 2 && p.aligned16 && !p.rows128));
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
  plan.ring.hints = o.hints >= 0 ? o.hints & 7 : kClusterDefaultHints;  // 3 bits, see Overrides
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

// grid_rows: the bytes all of a grid's rings hold (one CTA per SM).
int64_t grid_rings_bytes(const Plan& plan, const DeviceInfo& d) {
  return int64_t{d.sm_count} * plan.ring.ring_slots * plan.ring.chunk_bytes;
}

// grid_rows: a cooperative grid of one CTA per SM, each with a ring of chunks; items of
// `item_chunks` chunks. None where every ring full of one row could leave it unfinished (chunks a
// row >= SMs x (slots - item chunks + 1)) or the ring has as many slots as the merger's queue has
// entries (the kernel's deadlock argument, grid_rows.cu).
Plan plan_grid_rows(const Problem& p, const DeviceInfo& d, const Overrides& o) {
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

// grid_rows in place of cluster_rows where the grid's rings hold the row 2.5 times (or half of it,
// spilled): 16-bit rows the widest clusters stream keeping under 3/4 of each slice, fp32 rows no
// cluster holds. Returns that plan, or none.
Plan grid_rows_wanted(const Problem& p, const DeviceInfo& d, const Overrides& o, const Plan& clusters) {
  const bool streamed16 = p.elem_bytes == 2 && !clusters.resident && !clusters.ring.grid_exchange &&
                          4 * int64_t{clusters.ring.ring_slots} < 3 * clusters.ring.chunks_per_cta;
  const bool unheld32 = p.elem_bytes == 4 && (!clusters.resident || clusters.ring.grid_exchange);
  if (!(streamed16 || unheld32) || d.sm_count <= 0) return Plan{};
  const Plan grid = plan_grid_rows(p, d, o);
  const int64_t held_bytes = p.cols * p.elem_bytes - grid.ring.spill_chunks * grid.ring.chunk_bytes;
  const bool held = 5 * held_bytes <= 2 * grid_rings_bytes(grid, d);
  return grid.family == Family::grid_rows && held ? grid : Plan{};
}

// Shared memory of cluster_tiles besides the ring's chunks and barriers (cluster_tiles.cu):
// stats barriers, partials from every CTA, the statistics warps' per-column partials, the
// writers' per-column results, a counter.
int64_t tile_reserve_bytes(int cluster, int w, int elem_bytes, int threads) {
  const int64_t pair = elem_bytes == 8 ? 16 : 8;
  const int64_t group_warps = (threads - 32) / 64;
  return 8 * kTileStatsBuffers + (kTileStatsBuffers * (cluster + 1) + group_warps) * w * pair + 16;
}

// The cluster_tiles plan, or none where a tile's slice of the axis cannot stay in a CTA's ring.
Plan plan_cluster_tiles(const AxisProblem& p, const DeviceInfo& d, const Overrides& o) {
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
  const bool once = may_hold_once(p.rows, o, d, max_cluster);
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

Plan plan_split_rows(const AxisProblem& p, const DeviceInfo& d, const SplitOverrides& o) {
  Plan plan;
  plan.family = Family::split_rows;
  plan.vec = p.rows && p.aligned16 ? 16 / p.elem_bytes : 1;
  const int lanes = o.lanes > 0 ? o.lanes : kSplitLanes;
  plan.axis.lanes = p.rows ? 1 : static_cast<int>(std::min<int64_t>(lanes, pow2_ceil(p.inner)));
  const int64_t units = ceil_div(p.dim, plan.vec);
  const int64_t unit_bytes = int64_t{plan.vec} * p.elem_bytes * plan.axis.lanes;  // per unit of the axis
  // The smallest cluster whose segments fit the target, if any.
  const int64_t target = o.segment_bytes > 0 ? o.segment_bytes : kSplitSegmentBytes;
  const int max_cluster = std::min(d.max_cluster, kMaxCluster);
  int c = 1;
  while (c * 2 <= max_cluster && c * 2 <= units && ceil_div(units, c) * unit_bytes > target) c *= 2;
  plan.cluster = c;
  plan.segment = ceil_div(units, c);
  // Four units per thread and pass where the segment is long enough, a warp at the least.
  const int64_t along = std::clamp<int64_t>(pow2_ceil(ceil_div(plan.segment, 4)), 1, kSplitThreads / plan.axis.lanes);
  plan.threads = static_cast<int>(std::max<int64_t>(64, along * plan.axis.lanes));
  plan.axis.tiles = ceil_div(p.inner, plan.axis.lanes);
  plan.grid = std::min<int64_t>(p.outer * plan.axis.tiles, int64_t{1} << 24);  // positions' clusters
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
    const Plan short_rows = plan_short_rows(rows, vec, co);  // a pack of each of four rows a lane
    if (short_rows.family != Family::none) return short_rows;
    const int64_t vectors = ceil_div(p.dim, vec);
    if (vectors <= int64_t{32} * kWarpRowsMaxIters) return plan_warp_rows(rows, vec);
    // Longer rows under the clusters' least, in 16-byte packs: a CTA a row (cta_rows_backward_kernel)
    // of the fewest warps that hold it in four packs a thread, unless a cluster is asked for.
    if (p.aligned16 && co.cluster <= 0 && p.dim * p.elem_bytes < kClusterMinRowBytes &&
        vectors <= int64_t{kBackwardCtaThreads} * kWarpRowsMinIters) {
      Plan plan;
      plan.family = Family::warp_rows;
      plan.vec = vec;
      plan.warp.group = static_cast<int>(ceil_div(ceil_div(vectors, kWarpRowsMinIters), 32) * 32);
      plan.warp.iters = kWarpRowsMinIters;
      size_warp_rows_grid(plan, rows.rows, kWarpRowsThreads);
      return plan;
    }
    if (has_clusters(d) && p.aligned16 && (p.dim * p.elem_bytes >= kClusterMinRowBytes || co.cluster > 0))
      return plan_cluster_rows(rows, d, co, true);
  }
  if (!p.backward && !p.rows && p.tiles_aligned && has_clusters(d) && p.inner * p.elem_bytes >= kTileMinInnerBytes) {
    const Plan tiles = plan_cluster_tiles(p, d, co);
    if (tiles.family != Family::none) return tiles;
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
    case Family::cluster_tiles: return "cluster_tiles";
    case Family::grid_rows: return "grid_rows";
  }
  return "unknown";
}

// The forward of rows: the first of these that takes the row (thresholds in plan.hpp, their
// measurements in docs/decisions/planner.md).
//   grid_rows forced           rows held in a grid's rings (tests and tuning only)
//   flat tiles                 contiguous rows up to 256 bytes off 16 bytes
//   short rows                 rows in 16-byte packs up to 128 bytes: several rows a lane
//   register clusters          Hopper, rows past one CTA's registers up to 512 KB (16-bit 256 KB)
//   rows in registers          rows in 16-byte packs under 32 KB, a group up to a CTA
//   warp rows                  other rows of up to 256 vectors, a group of up to a warp
//   peeled rows in registers   rows off 16 bytes alike in x and y, under 16 KB
//   cluster_rows (grid_rows)   Hopper, aligned rows from 32 KB (grid_rows where its rings hold more)
//   peeled cluster_rows        Hopper, rows off 16 bytes alike in x and y, from 32 KB
//   block_rows                 everything else: a CTA a row
Plan plan_rows(const Problem& p, const DeviceInfo& d, const Overrides& o) {
  if (p.rows <= 0 || p.cols <= 0) return Plan{};
  const int vec = p.aligned16 ? 16 / p.elem_bytes : 1;
  // Short rows aligned to 8 bytes only (rows of 100 bf16, say) are read in 8-byte packs.
  const int short_vec = !p.aligned16 && p.aligned8 && p.elem_bytes <= 4 ? 8 / p.elem_bytes : vec;
  const int64_t row_bytes = p.cols * p.elem_bytes;
  // Overrides (experiments): the least packs per thread (1, 2, 4 or 8), and the bound on the row,
  // at most what a group of 1024 threads holds at 8 packs each (128 KB).
  // Long rows in registers take eight packs a thread (see kRegisterRowsWideBytes).
  const bool wide = p.elem_bytes <= 4 && (p.elem_bytes == 2 ? row_bytes >= kRegisterRowsWideBytes
                                                             : row_bytes > kRegisterRowsWideBytes);
  const int min_iters = per_thread_count(o.iters) ? o.iters : wide ? kWarpRowsMaxIters : kWarpRowsMinIters;
  const int64_t register_bytes = o.register_rows_bytes > 0
                                     ? std::min<int64_t>(o.register_rows_bytes, int64_t{16} * kRegisterRowsMaxGroup * kWarpRowsMaxIters + 1)
                                     : kRegisterRowsMaxBytes + (wide ? 1 : 0);
  if (has_clusters(d) && p.aligned16 && p.elem_bytes <= 4 && o.grid_rows == 1 && d.sm_count > 0) {
    const Plan plan = plan_grid_rows(p, d, o);
    if (plan.family != Family::none) return plan;
  }
  if (p.flat16 && p.cols > 1 && row_bytes <= kFlatMaxRowBytes && (o.flat >= 0 ? o.flat == 1 : !p.aligned16))
    return plan_flat_rows(p);
  const Plan short_rows = plan_short_rows(p, vec, o);
  if (short_rows.family != Family::none) return short_rows;
  // Rows past one CTA's registers, up to 512 KB (fp32) or 256 KB (16-bit), and peeled rows from
  // kPeeledRowsMaxBytes: in registers over a cluster (forced register_cluster: that many threads a CTA, 0 off).
  const int64_t register_cluster_bytes = p.elem_bytes == 4 ? kRegisterClusterMaxRowBytes : kRegisterClusterMax16BitRowBytes;
  const bool packed_or_peeled = p.aligned16 || (p.peelable && o.peel_clusters != 0);
  // peeled_one_cta: the peeled rows one CTA's registers take (below it).
  const int64_t peeled_one_cta = std::min(register_bytes, kPeeledRowsMaxBytes + 16);
  const int64_t cluster_from = p.aligned16 ? register_bytes : peeled_one_cta;
  if (has_clusters(d) && packed_or_peeled && p.elem_bytes <= 4 && o.cluster <= 0 && o.register_cluster != 0 &&
      (o.register_cluster > 0 || (row_bytes >= cluster_from && row_bytes <= register_cluster_bytes))) {
    const int threads = o.register_cluster > 0 ? o.register_cluster
                        : row_bytes <= kRegisterClusterSmallRowBytes ? kRegisterClusterMaxThreads / 2
                                                                     : kRegisterClusterMaxThreads;
    const Plan plan = plan_register_cluster(p, d, threads, per_thread_count(o.iters) && o.iters >= 4 ? o.iters
                                                                                                     : kWarpRowsMaxIters);
    if (plan.family != Family::none) return plan;
  }
  if (p.aligned16 && row_bytes < register_bytes && o.cluster <= 0)
    return per_thread_count(o.iters) ? plan_warp_rows(p, vec, kRegisterRowsMaxGroup, min_iters, kRegisterRowsWarpThreads)
                                     : plan_register_rows(p, vec, min_iters);
  if (ceil_div(p.cols, short_vec) <= int64_t{32} * kWarpRowsMaxIters) return plan_warp_rows(p, short_vec);
  // Rows off 16 bytes, off alike in x and y, up to 16 KB: in registers, peeled.
  const int peel_vec = 16 / p.elem_bytes;
  if (!p.aligned16 && p.peelable && p.elem_bytes <= 4 && row_bytes < peeled_one_cta &&
      o.cluster <= 0 && p.cols >= 2 * peel_vec) {
    // Four or five packs a thread (more spilled under the 64-register bound). At four, a group of
    // at least 2 x vec threads, which hold the elements of the blocks the row starts and ends
    // inside; at five, the edge takes a pack more on threads 0 and 1 (register_rows.cu).
    Plan plan = plan_register_rows(p, peel_vec, kWarpRowsMinIters);
    if (plan.warp.iters > 5) plan = plan_warp_rows(p, peel_vec, kRegisterRowsMaxGroup, kWarpRowsMinIters, kRegisterRowsWarpThreads);
    if ((plan.warp.iters == 4 && plan.warp.group >= 2 * peel_vec) || plan.warp.iters == 5) {
      plan.peel = true;
      return plan;
    }
  }
  if (has_clusters(d) && p.aligned16 && (row_bytes >= kClusterMinRowBytes || o.cluster > 0)) {
    const Plan clusters = plan_cluster_rows(p, d, o);
    if (o.grid_rows != 0 && o.cluster <= 0 && o.exchange < 0)
      if (const Plan grid = grid_rows_wanted(p, d, o, clusters); grid.family != Family::none) return grid;
    return clusters;
  }
  // Rows off 16 bytes but misaligned alike in x and y (rows of 50 257): clusters carry each row's
  // interior, from its first 16-byte boundary to its last, where every CTA's share of every row
  // keeps at least one pack (the row's last chunk holds more than the up to 30 bytes peeled).
  if (has_clusters(d) && !p.aligned16 && p.peelable && p.elem_bytes < 16 && o.peel_clusters != 0 &&
      (row_bytes >= kClusterMinRowBytes || o.cluster > 0)) {
    Plan plan = plan_cluster_rows(p, d, o);
    const int64_t last = row_bytes % plan.ring.chunk_bytes;
    if (!plan.ring.grid_exchange && (last == 0 || last > 32)) {
      plan.peel = true;
      return plan;
    }
  }
  return plan_block_rows(p, d, vec);
}

bool tuning_valid(const Tuning& t) {
  const Overrides& o = t.rows;
  const auto pow2 = [](int64_t v) { return v > 0 && (v & (v - 1)) == 0; };
  const auto flag = [](int v) { return v >= -1 && v <= 1; };  // -1: the planner's choice
  const auto count = [&](int v) { return v == 0 || per_thread_count(v); };
  // Grid groups (exchange 1) take any size of group; clusters are powers of two up to kMaxCluster.
  const bool cluster_ok = o.cluster == 0 || (o.exchange == 1 ? o.cluster > 0 && o.cluster <= 1024
                                                              : pow2(o.cluster) && o.cluster <= kMaxCluster);
  return cluster_ok && (o.chunk_bytes == 0 || (o.chunk_bytes % 16 == 0 && o.chunk_bytes >= 1024 && o.chunk_bytes <= 64 * 1024)) &&
         (o.threads == 0 || (o.threads >= 96 && o.threads <= kClusterMaxThreads && (o.threads - 32) % 64 == 0)) &&
         o.hints >= -1 && o.hints <= 7 && (o.tile_bytes == 0 || (pow2(o.tile_bytes) && o.tile_bytes >= 64 && o.tile_bytes <= 512)) &&
         flag(o.exchange) && o.groups >= 0 && flag(o.claim) && count(o.iters) &&
         o.register_rows_bytes >= 0 && o.register_rows_bytes <= int64_t{16} * kRegisterRowsMaxGroup * kWarpRowsMaxIters + 1 &&
         flag(o.flat) && (o.rows_per_lane == -1 || count(o.rows_per_lane)) && flag(o.peel_clusters) &&
         (o.register_cluster == -1 || o.register_cluster == 0 ||
          (o.register_cluster % 32 == 0 && o.register_cluster >= 32 && o.register_cluster <= kRegisterClusterMaxThreads)) &&
         flag(o.grid_rows) && o.item_chunks >= 0 && o.item_chunks <= 8 && o.spill_chunks >= -1 &&
         o.spill_chunks < (int64_t{1} << 40) && flag(o.stripe) &&
         (t.split.lanes == 0 || (pow2(t.split.lanes) && t.split.lanes <= 1024)) && t.split.segment_bytes >= 0 &&
         t.split.segment_bytes <= (int64_t{1} << 30) && t.cpu_kernels >= -1;
}

}  // namespace softlight
