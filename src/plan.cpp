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

// Rows of at most kShortRowsMaxBytes in 16-byte packs (SOFTLIGHT_ROWS_PER_LANE: up to 512 bytes, 0
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

// Rows in 16-byte packs in registers (rows_in_registers_kernel, built for 1 to 8 packs a thread).
// plan_warp_rows rounds a thread's packs up to a power of two, and a row just past a power of two
// of packs then leaves most threads half their loads: bf16 rows of 4104 (513 packs) in 256 threads
// of four packs' registers, two loads each, kept half the bytes in flight an SM of rows of 4096 and
// took 1.66 x copy against 1.03 x. Where fewer than 3/4 of the threads' packs hold the row and the
// group is a CTA, half the group holds it in five to eight packs a thread, or, past eight, the group
// holds it in as many as it needs. Groups of a warp or less stay: halved, each load of a warp spans
// more rows in shorter runs (rows of 36 fp32 in pairs of lanes: 1.29 x slower; docs/design.md,
// "Rows just past a power of two").
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
  // CTAs of more than 128 threads hold eight packs a thread in 64 registers (four CTAs an SM). So
  // do 16-bit rows in 16-byte packs that do not start on 128 bytes: each warp's load then waits on
  // five L2 lines instead of four, and eight CTAs an SM hide that where six did not (bf16 rows of
  // 50 264 1.098 -> 1.016 x copy); rows on 128 bytes keep the compiler's choice (bf16 rows of
  // 32 000 0.996 x against 1.019 x bounded). docs/design.md, "Measured at `4c2c8db`".
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
  // 16-bit rows that one CTA holds twice in 16 KB chunks but not in 32 KB ones (64-112 KB): one CTA
  // a row, where 32 KB chunks would split it over two CTAs unevenly (rows of 50 257 bf16: 64 and
  // 34 KB). Measured on an H200 at 50 257: 1.37 x -> 1.26 x copy (docs/design.md).
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
  // fp32 forward: where that cluster gives each CTA 4 chunks a row, twice as many CTAs with 2 each
  // (32 KB), up to clusters of 8 (16 would leave 20 SMs idle), and only where every CTA gets 2.
  // Measured on an H200 (docs/design.md, "Slices of 32 KB"): rows of 32 000 fp32 1.069 -> 1.050 x
  // copy, 65 536 1.078 -> 1.052 x; rows of 15 chunks (61 440), one CTA of 8 with a single chunk,
  // 1.064 -> 1.100 x; 1 chunk a CTA everywhere 1.5-1.6 x.
  if (p.elem_bytes == 4 && !backward && o.chunk_bytes <= 0 && cluster_twice >= 2 &&
      2 * cluster_twice <= kHalfSliceMaxCluster && plan.ring.chunks_per_row == 4 * cluster_twice)
    cluster_twice *= 2;
  // 16-bit forward: rows of two 32 KB chunks, which one CTA holds twice, go to two CTAs of one
  // chunk each (32 KB slices again). Measured on an H200 (docs/design.md, "Slices of 32 KB"), in
  // four runs: rows of 32 768 bf16 and fp16 0.7-3 % faster, 32 000 0.7-0.9 %; but rows of 4 chunks
  // (65 536) ran 6 % slower in four CTAs of one chunk than in two of two, so only from one CTA.
  if (p.elem_bytes == 2 && !backward && o.chunk_bytes <= 0 && plan.ring.chunk_bytes == kClusterChunk16 &&
      cluster_twice == 1 && plan.ring.chunks_per_row == 2)
    cluster_twice = 2;
  int chosen = 0;
  // Grid groups for the forward of fp32 rows that no cluster holds twice (which clusters would
  // stream, or hold once without overlapping rows), where a group holds them twice (or streams
  // them keeping most of each slice, below). Measured on an
  // H200 (docs/design.md): rows of 1 M fp32 1.68 x -> 1.17 x copy; but 2-3 % slower than 16-CTA
  // clusters where those hold the row twice (the founding shape), slower for 16-bit rows, whose
  // shorter rows expose the exchange through L2, equal for the backward, and slower than streamed
  // clusters where a group of every SM holds the row only once (4 M fp32, 64 rows: 1.77 x against
  // 1.62 x), unless the rows are too few for the clusters to keep every SM busy. Nor (rows enough)
  // where the widest clusters stream rows keeping at least 3/4 of each slice in the ring, so that
  // only the rest is read twice: rows of 1 M fp32 1.16 x copy there against 1.23 x in groups; at
  // 5/8 of the slice kept and below the groups were ahead (docs/design.md).
  // Partials are traded as fp32 pairs: never for float64. Grid groups peel nothing, so rows off 16
  // bytes stay in the clusters, peeled (plan_rows).
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
    // A slice held twice, so the next row loads while this one is written; else, with rows
    // enough, a slice streamed through the ring that keeps 7/8 of it there (the rest is read
    // twice), in two groups or more; else (few rows, or asked) one held once. Streamed groups also
    // take the place of held slices under kGroupMinHeldChunks, whose exchange each row (a barrier
    // through L2) outweighs their work. Measured on an H200 (docs/design.md): rows of 4 M fp32
    // 1.53-1.55 x -> 1.44-1.46 x copy (streamed clusters -> 2 streamed groups of 66, 14 of 16
    // chunks kept); 2 M 1.28-1.29 x -> 1.20-1.22 x (one group holding 4 chunks twice -> 4 streamed
    // groups of 33); but 1.31-1.38 x where held slices of 5-6 chunks ran 1.26-1.27 x (rows of
    // 1.3-1.6 M), and 1.84 x against streamed clusters' 1.70 x as one group of every SM (rows of
    // 8 M), whose exchange stalls every SM at once.
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
  // 16-bit forward rows whose CTAs take two 32 KB chunks of a row, some only one: 4 C even chunks over
  // clusters of C / 2 instead (four a CTA), where the ring still holds them twice. Measured on an
  // H200 (knobs, builds side by side; docs/design.md, "16-bit rows of 13 chunks" and "16-bit rows of
  // 25 to 28 chunks"):
  // - clusters of 8, rows of 13 chunks (384 to 416 KB): 3-11 % faster (196 616 bf16 1.205 ->
  //   1.073 x copy); rows of 14 chunks were mixed and of 15 slower (230 000 fp16 1.043 -> 1.080 x);
  // - clusters of 16 (7 of them use 112 SMs, 16 clusters of 8 use 128), rows of 25 to 28 chunks (768
  //   to 896 KB): 5-13 % faster (395 000 bf16 1.289 -> 1.118 x, 455 000 bf16 1.123 -> 1.071 x); rows
  //   of 29 chunks even (460 000 fp16 1.089 -> 1.098 x), and past them, where the ring holds a slice
  //   of four less than twice, even or slower (470 000 to 515 000).
  // The two rules below resize only the planner's own chunks for aligned 16-bit forward rows held
  // twice in 32 KB chunks (no chunk or cluster asked for, not grid groups). even_chunk(n): the row's
  // bytes over n chunks, rounded up to 16 bytes.
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
  // 16-bit forward rows held twice whose CTAs take up to three 32 KB chunks of a row: two larger
  // chunks a CTA instead, where they stay within kTwoChunksMaxBytes. Measured on an H200 (knobs and
  // builds side by side, docs/design.md, "Uneven 16-bit slices"): rows of 140 000 to
  // 310 000 and 600 000 elements 2-8 % faster in chunks of 33-38 KB (280 000 bf16 1.137 -> 1.046 x
  // copy; rows just past 512 KB even, 2 % slower in one run); chunks of 40-48 KB were even or
  // slower (360 000 fp16 1.058 -> 1.094 x).
  const int two_chunks = even_chunk(2 * int64_t{plan.cluster});
  if (resizable() && plan.ring.chunks_per_cta == 3 && two_chunks <= kTwoChunksMaxBytes &&
      4 <= ring_slots_for(d, two_chunks)) {
    size_ring(two_chunks);
    plan.ring.chunks_per_cta = 2;
  }
  // 16-bit forward rows held twice in 32 KB chunks by clusters of 8 (rows of 384 to 768 KB), where
  // every CTA holds as many whole chunks of each row: two consumer groups of 128 threads instead of
  // 256. Measured on an H200 in three runs of knobs (docs/design.md, "Consumer groups of 128
  // threads"): rows of 262 144 and 393 216 in bf16 and fp16 0.2-0.9 % faster; not rows of 1 M
  // (16-CTA clusters, 0.1-0.3 % slower), nor fp32. Where the slices are uneven (a short last chunk,
  // or CTAs with a chunk more than others), a row waits on the CTA with the most, and the narrow
  // groups fold it slower: rows of 200 000 to 330 000 ran 6-15 % slower in them ("Uneven 16-bit
  // slices"). Peeled rows (not measured) keep 256.
  const bool even_slices = plan.ring.chunks_per_cta * plan.cluster * plan.ring.chunk_bytes == row_bytes;
  if (p.elem_bytes == 2 && !backward && p.aligned16 && o.threads <= 0 && o.chunk_bytes <= 0 && !plan.ring.grid_exchange &&
      plan.cluster == kNarrowGroupsCluster && plan.ring.double_buffered && plan.ring.chunk_bytes == kClusterChunk16 &&
      even_slices)
    plan.threads = kNarrowGroupsThreads;
  // Streamed forward slices read the chunks the ring does not keep twice: from L2 the second time,
  // where the first read marks them evict-last (and the second evict-first), if they are few. Each
  // CTA then holds those of its slice in L2, about (read twice / kept) x all the rings' 30 MB on an
  // H200, and the L2 has 50 MB. Measured on an H200 (docs/design.md, "Chunks read twice, from L2"),
  // 2 of 16 chunks read twice: rows of 1 M fp32 1.157 -> 1.117 x copy (DRAM reads 1.20 -> 1.08 GB
  // for 1.07 GB of rows), 2 M 1.343 -> 1.318 x, 4 M 1.418 -> 1.408 x; 9 of 16 (4 M bf16) and 18 of
  // 32 (2 M fp32 peeled) 1.4-1.7 % slower. So where at most a quarter as many as kept.
  const int64_t kept = std::min<int64_t>(plan.ring.chunks_per_cta, plan.ring.ring_slots);
  if (!backward && !plan.resident && o.hints < 0 && 4 * (plan.ring.chunks_per_cta - kept) <= kept)
    plan.ring.hints |= kHintReadTwiceInL2;
  // Rows dealt in turn left the fastest SMs idle for up to a third of a copy-like kernel's time
  // (H200, docs/design.md); claimed rows keep every cluster busy to the end: fp32 rows 1.08-1.10 x
  // -> 1.04-1.05 x copy, 16-bit rows 1.10-1.13 x -> 1.04-1.06 x. Grid groups keep the fixed deal
  // (their CTAs share no shared memory to pass a claimed row on).
  plan.ring.claim_rows = !plan.ring.grid_exchange && o.claim != 0;
  // A row's chunks dealt to its CTAs in turn, so that the cluster reads and writes the row front to
  // back together instead of in C slices. Measured on an H200 against contiguous slices (knob
  // STRIPE, in one process, five rounds; docs/design.md, "Chunks dealt in turn"): faster at every
  // point, 0.3-2.2 % (fp32 rows of 393 216 1.048 -> 1.038 x copy, the founding shape 1.041 ->
  // 1.032 x, its backward 1.042 -> 1.031 x, bf16 rows of 1 M 1.103 -> 1.080 x), the bf16 backward
  // even.
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
  // Rows past a quarter of the grid's rings keep the larger of half the row and a fifth of the
  // rings; the chunks before are spilled: folded, released, and read again from L2 when the same
  // chunk of the next row passes (docs/design.md, "Rows spilled to L2": rows of 6 MB gained nothing).
  const int64_t row_bytes = p.cols * p.elem_bytes;
  const int64_t rings = grid_rings_bytes(plan, d);
  const int64_t keep = std::max(row_bytes / 2, rings / kGridRowsKeepShare);
  const int64_t spill = o.spill_chunks >= 0 ? o.spill_chunks
                        : 4 * row_bytes > rings ? plan.ring.chunks_per_row - ceil_div(keep, plan.ring.chunk_bytes) : 0;
  plan.ring.spill_chunks = std::clamp<int64_t>(spill, 0, plan.ring.chunks_per_row - 1) / plan.ring.chunks_per_cta * plan.ring.chunks_per_cta;
  if (plan.ring.spill_chunks > 0) fit_ring(plan.ring.chunk_bytes + kGridRowsSlotBytes + kGridRowsSpillSlotBytes);  // a refill barrier
  // Rows that spill less than a third of their chunks have the merger wait for a row's last item
  // with one lane before its 32 lanes read the row's partials: bf16 rows of 4 M 3-7 % faster. Rows
  // that spill half wait on each row's merge (their spilled slots need the row before's statistics)
  // and lose more to the extra round trip than they gain (docs/design.md, "The merger's wait").
  plan.ring.wait_last = 3 * plan.ring.spill_chunks < plan.ring.chunks_per_row;
  if (plan.ring.ring_slots < plan.ring.chunks_per_cta || plan.ring.ring_slots >= kGridRowsMergeQueue ||
      plan.ring.chunks_per_row - plan.ring.spill_chunks >= int64_t{d.sm_count} * (plan.ring.ring_slots - plan.ring.chunks_per_cta + 1))
    return Plan{};
  return plan;
}

// Where grid_rows takes the place of cluster_rows, if the grid's rings hold the row two and a half
// times over (while a row's items are merged, its CTAs' rings hold the rows after it), or, past
// that, half the row (the first half spilled, read again from L2: plan_grid_rows), up to 24 235 200
// bytes on an H200 (fp32 rows of 6 058 800, 16-bit of 12 117 600):
// * 16-bit rows that the widest clusters stream keeping less than 3/4 of each slice in the ring
//   (the rest read twice, from DRAM): on an H200, rows past 2 359 296 elements and up to 6 055 520;
// * fp32 rows that no cluster holds (streamed clusters, grid groups): on an H200, rows past 458 752
//   elements and up to 3 027 760.
// Measured there (docs/design.md, "Rows held once in a grid's rings" and "fp32 rows in the grid's
// rings"): rows of 4 M bf16 (8 MB) 1.40-1.44 x -> 1.28 x copy, 5 M bf16 (10 MB) 1.46 -> 1.35 x;
// fp32 rows of 512 K 1.20 -> 1.07 x, 1 M 1.12 -> 1.09 x, 1.4 M 1.29 -> 1.09 x, 2 M 1.34 -> 1.18 x,
// 2.3 M 1.46 -> 1.20 x, 2.6 M (10.5 MB) 1.40 -> 1.29 x. Spilled ("Rows spilled to L2"): fp32 rows of
// 3 M (12 MB) 1.34 -> 1.29 x, 4 M 1.45 -> 1.36 x, 5.25 M 1.61 -> 1.50 x, bf16 rows of 8 M 1.55 -> 1.40 x;
// held whole before, rows of 8 to 10.5 MB: 4 M bf16 1.29 -> 1.25 x, 2 M fp32 1.08 -> 1.06 x, 5 M bf16
// 1.36 -> 1.26 x, 2.6 M fp32 1.21 -> 1.14 x (not rows of 6 MB: even or slower). Not rows the clusters
// hold (262 144 fp32, 1 M bf16: slower).
// Returns that plan, or none.
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
  // Portable clusters (up to 8 CTAs) first: on an H200 only 7 clusters of 16 fit at once, which
  // leaves 20 SMs idle, and a slice that fits once on 128 SMs measured faster than one that fits
  // twice on 112 (docs/design.md). Within that, clusters whose slice fits the ring twice (the next
  // tile loads while this one is written), else once; of those, the smallest that still gives
  // every SM a CTA, else the largest.
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
  // Flat tiles: short rows not in 16-byte packs that lie in one contiguous run (rows of 7 or 100
  // bf16): element loads would leave the load units the limit. Rows of one element have their own
  // path (a flat array of packs without exp or log).
  if (p.flat16 && p.cols > 1 && row_bytes <= kFlatMaxRowBytes && (o.flat >= 0 ? o.flat == 1 : !p.aligned16)) {
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
  const Plan short_rows = plan_short_rows(p, vec, o);
  if (short_rows.family != Family::none) return short_rows;
  // Rows past one CTA's registers in registers over a cluster, up to 512 KB (fp32) or 256 KB (16
  // bits), a CTA of 128 threads holding 16 KB up to rows of 128 KB and of 256 threads holding 32 KB
  // above (docs/design.md, "Rows in registers over a cluster"); SOFTLIGHT_REGISTER_CLUSTER=N
  // forces CTAs of N threads, 0 turns them off. Rows off 16 bytes but off alike in x and y (rows of
  // 50 257) too, peeled: the 16-byte blocks each row touches, its first and last cut to the row.
  const int64_t register_cluster_bytes = p.elem_bytes == 4 ? kRegisterClusterMaxRowBytes : kRegisterClusterMax16BitRowBytes;
  const bool packed_or_peeled = p.aligned16 || (p.peelable && o.peel_clusters != 0);
  // Peeled rows from 16 KB: one CTA's registers held them slower than two CTAs' (16 383 fp16: 1.372
  // against 1.038 x copy; docs/design.md, "Odd rows in registers"). peeled_one_cta: the peeled rows
  // one CTA's registers take (below it).
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
  // Longer rows off 16 bytes but off alike in x and y (odd lengths such as 511 bf16 or 999 fp32 in
  // a contiguous array) up to 16 KB: rows in registers, peeled (each row the 16-byte blocks that end
  // in it, and the elements of the two it starts and ends inside), where block_rows' CTA a row took
  // 1.2-2.8 x copy and torch's warps were faster at rows of 511 and 999 (docs/design.md, "Odd rows
  // in registers", "Odd rows in one CTA's registers as blocks").
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
         t.split.segment_bytes <= (int64_t{1} << 30);
}

}  // namespace softlight
