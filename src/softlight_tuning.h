/*
 * The tuning interface of softlight's tuning builds (-DSOFTLIGHT_TUNING=ON); a default build has
 * none of it. Not installed: tests and tuning scripts only. Every field's -1 leaves the planner's
 * choice (src/plan.hpp, Overrides and SplitOverrides, says what each one forces).
 */
#ifndef SOFTLIGHT_TUNING_H
#define SOFTLIGHT_TUNING_H

#include <stdint.h>

#include "softlight/softlight.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct softlight_tuning {
  int64_t cluster, chunk_bytes, threads, hints, tile_bytes, exchange, groups, claim, iters,
      register_rows_bytes, flat, rows_per_lane, peel_clusters, register_cluster, grid_rows, item_chunks,
      spill_chunks, stripe, split_lanes, split_segment_bytes;
  /* The CPU backend's vector kernels: 0 generic, 1 AVX2 + FMA + F16C (refused where this build or this CPU
   * has none). */
  int64_t cpu_kernels;
} softlight_tuning;

/* Forces `t` on the calling thread's later calls (NULL: back to the planner's choices).
 * SOFTLIGHT_ERROR_INVALID_ARGUMENT, with nothing changed, where a value is out of its range. */
SOFTLIGHT_API softlight_status softlight_tuning_force(const softlight_tuning* t);

#ifdef __cplusplus
}
#endif

#endif /* SOFTLIGHT_TUNING_H */
