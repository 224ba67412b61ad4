// The tuning builds' forced values (tuning.hpp): a thread's own, checked when they are set.
#include "tuning.hpp"

#include <climits>

#include "cpu_parallel.hpp"
#include "softlight_tuning.h"

namespace softlight {
namespace {

thread_local Tuning forced;

// -1 (the planner's choice) maps to each field's own unset value; anything else must fit an int.
bool to_int(int64_t v, int unset, int* out) {
  if (v == -1) {
    *out = unset;
    return true;
  }
  if (v < 0 || v > INT_MAX) return false;
  *out = static_cast<int>(v);
  return true;
}

bool to_int64(int64_t v, int64_t unset, int64_t* out) {
  if (v < -1) return false;
  *out = v == -1 ? unset : v;
  return true;
}

}  // namespace

Tuning forced_tuning() { return forced; }

}  // namespace softlight

extern "C" softlight_status softlight_tuning_force(const softlight_tuning* t) {
  using namespace softlight;
  if (t == nullptr) {
    forced = Tuning{};
    return SOFTLIGHT_SUCCESS;
  }
  Tuning k;
  Overrides& o = k.rows;
  const Overrides unset;
  int lanes = 0;
  const bool ok =
      to_int(t->cluster, unset.cluster, &o.cluster) && to_int(t->chunk_bytes, unset.chunk_bytes, &o.chunk_bytes) &&
      to_int(t->threads, unset.threads, &o.threads) && to_int(t->hints, unset.hints, &o.hints) &&
      to_int(t->tile_bytes, unset.tile_bytes, &o.tile_bytes) && to_int(t->exchange, unset.exchange, &o.exchange) &&
      to_int(t->groups, unset.groups, &o.groups) && to_int(t->claim, unset.claim, &o.claim) &&
      to_int(t->iters, unset.iters, &o.iters) &&
      to_int64(t->register_rows_bytes, unset.register_rows_bytes, &o.register_rows_bytes) &&
      to_int(t->flat, unset.flat, &o.flat) && to_int(t->rows_per_lane, unset.rows_per_lane, &o.rows_per_lane) &&
      to_int(t->peel_clusters, unset.peel_clusters, &o.peel_clusters) &&
      to_int(t->register_cluster, unset.register_cluster, &o.register_cluster) &&
      to_int(t->grid_rows, unset.grid_rows, &o.grid_rows) &&
      to_int(t->item_chunks, unset.item_chunks, &o.item_chunks) &&
      to_int64(t->spill_chunks, unset.spill_chunks, &o.spill_chunks) && to_int(t->stripe, unset.stripe, &o.stripe) &&
      to_int(t->split_lanes, 0, &lanes) && to_int64(t->split_segment_bytes, 0, &k.split.segment_bytes) &&
      to_int(t->cpu_kernels, -1, &k.cpu_kernels);
  k.split.lanes = lanes;
  if (!ok || !tuning_valid(k) || (k.cpu_kernels >= 0 && !cpu::cpu_runs(k.cpu_kernels)))
    return SOFTLIGHT_ERROR_INVALID_ARGUMENT;
  forced = k;
  return SOFTLIGHT_SUCCESS;
}
