// What the families' rules share: integer helpers, the device's clusters, the knobs' common readings.
// Pure host code.
#pragma once

#include <cstdint>

#include "planner/plan.hpp"

namespace softlight {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Rows of at least this many bytes go to the ring families on Hopper: below it, a row is too small
// for a ring of bulk copies to pay for its barriers.
constexpr int64_t kClusterMinRowBytes = 32 * 1024;

// Thread-block clusters can be launched (Hopper and later).
inline bool has_clusters(const DeviceInfo& d) { return d.cc_major >= 9 && d.max_cluster >= 1; }

// Elements a memory access moves: a 16-byte pack where every row allows one, else one element.
inline int pack_elems(bool aligned16, int elem_bytes) { return aligned16 ? 16 / elem_bytes : 1; }

// Packs (or rows) per thread that the row kernels are built for.
inline bool per_thread_count(int v) { return v == 1 || v == 2 || v == 4 || v == 8; }

// Threads per CTA of the ring families: the forced value where it is a valid shape (two consumer
// groups of whole warp pairs and the producer warp, within the register budget), else the default.
inline int cluster_threads(const Tuning& o) {
  return o.threads >= 96 && o.threads <= kClusterMaxThreads && (o.threads - 32) % 64 == 0 ? o.threads
                                                                                          : kClusterDefaultThreads;
}

// Ring families: whether a row (tile) may be held once in the rings, where none holds it twice (no
// overlap of one row's load with the last one's writing): only if asked, or where the rows are too
// few for the clusters to cover the SMs.
inline bool may_hold_once(int64_t rows, const Tuning& o, const DeviceInfo& d, int max_cluster) {
  return o.exchange == 1 || rows * max_cluster < d.sm_count;
}

// The rows of an axis problem whose axis is contiguous (inner 1), as a rows problem.
inline Problem rows_of(const AxisProblem& p) {
  Problem rows;
  rows.rows = p.outer;
  rows.cols = p.dim;
  rows.elem_bytes = p.elem_bytes;
  rows.aligned16 = p.aligned16;
  return rows;
}

}  // namespace softlight
