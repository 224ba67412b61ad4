/*
 * The planner's knobs: every value a tuning build can force, written once. Each entry is
 * X(name, type, unset): `unset` leaves the choice to the planner's rules. From this list come the
 * planner's Tuning struct (plan.hpp), the C struct of the tuning interface (softlight_tuning.h, where
 * -1 stands for unset) and the Python dictionary of forced values (python/planner_queries.cpp).
 * What each knob forces:
 *   cluster              CTAs a row (cluster_rows), or a grid group's size where exchange is 1
 *   chunk_bytes          bytes a bulk copy / ring slot (cluster_rows, grid_rows, cluster_tiles)
 *   threads              cluster_rows: threads a CTA (two consumer groups and the producer warp)
 *   hints                cluster_rows: cache hints, bit 0 loads evict-first, bit 1 streaming stores,
 *                        bit 2 a streamed forward's chunks read twice held in L2
 *   tile_bytes           cluster_tiles: tile width in bytes (a power of two, 64 to 512)
 *   exchange             cluster_rows: 0 partials over DSMEM in clusters, 1 grid groups through memory
 *   groups               cluster_rows: at most this many clusters (or grid groups) at once
 *   claim                cluster_rows: 0 rows dealt to clusters in turn, 1 claimed from a counter
 *   iters                register_rows: the least packs a thread (1, 2, 4 or 8), then the group
 *   register_rows_bytes  rows in 16-byte packs shorter than this stay in one group's registers
 *   flat                 flat_rows: 0 never, 1 wherever the layout allows
 *   rows_per_lane        short_rows: 0 off, 1, 2, 4 or 8 rows a lane
 *   peel_clusters        cluster_rows and register_clusters for rows misaligned alike: 0 off
 *   register_cluster     register_clusters: threads a CTA (0 off)
 *   grid_rows            0 never grid_rows, 1 wherever it can run
 *   item_chunks          grid_rows: chunks an item (1 to 8)
 *   spill_chunks         grid_rows: a row's first chunks written a row later from L2 (0 none)
 *   stripe               cluster_rows: 0 each CTA a contiguous slice of a row, else chunks in turn
 *   split_lanes          split_rows: inner positions a CTA (a power of two)
 *   split_segment_bytes  split_rows: the bytes of a CTA's segment of the axis, at most
 *   cpu_kernels          the CPU backend's vector kernels: 0 generic, 1 AVX2 + FMA + F16C
 */
#ifndef SOFTLIGHT_KNOBS_H
#define SOFTLIGHT_KNOBS_H

#define SOFTLIGHT_KNOBS(X)            \
  X(cluster, int, 0)                  \
  X(chunk_bytes, int, 0)              \
  X(threads, int, 0)                  \
  X(hints, int, -1)                   \
  X(tile_bytes, int, 0)               \
  X(exchange, int, -1)                \
  X(groups, int, 0)                   \
  X(claim, int, -1)                   \
  X(iters, int, 0)                    \
  X(register_rows_bytes, int64_t, 0)  \
  X(flat, int, -1)                    \
  X(rows_per_lane, int, -1)           \
  X(peel_clusters, int, -1)           \
  X(register_cluster, int, -1)        \
  X(grid_rows, int, -1)               \
  X(item_chunks, int, 0)              \
  X(spill_chunks, int64_t, -1)        \
  X(stripe, int, -1)                  \
  X(split_lanes, int, 0)              \
  X(split_segment_bytes, int64_t, 0)  \
  X(cpu_kernels, int, -1)

#endif /* SOFTLIGHT_KNOBS_H */
