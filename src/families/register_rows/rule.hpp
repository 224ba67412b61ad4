// register_rows: rows held in the registers of a group of lanes. Rows in 16-byte packs under
// kRegisterRowsMaxBytes: a group of up to a CTA of 1024 threads a row, 1 to 8 packs a thread. Other
// rows of up to 256 vectors (8-byte packs where rows are aligned to 8 bytes only, or elements): a
// group of up to a warp. Rows off 16 bytes, off alike in x and y, under kPeeledRowsMaxBytes: in
// packs, their edges apart (peeled). The backward: rows of up to 256 vectors a group of up to a
// warp, longer ones under the clusters' least a CTA of up to kBackwardCtaThreads.
#pragma once

#include <cstdint>

#include "planner/plan.hpp"

namespace softlight {

// Rows in 16-byte packs under this stay in one group's registers (up to a CTA); longer go to the clusters.
constexpr int64_t kRegisterRowsMaxBytes = 32 * 1024;
// From here (16-bit) or past it (fp32), rows in registers take eight packs a thread, half the threads.
constexpr int64_t kRegisterRowsWideBytes = 16 * 1024;
constexpr int kRegisterRowsMaxGroup = 1024;
// Rows of up to a warp in registers: CTAs of two warps (more warps resident than CTAs of four).
constexpr int kRegisterRowsWarpThreads = 64;
// Peeled rows in one CTA's registers up to this many bytes.
constexpr int64_t kPeeledRowsMaxBytes = 16 * 1024;
// The backward's rows past a warp's eight packs a thread and under kClusterMinRowBytes: dy and y of
// a row held by one CTA of up to this many threads, four packs of each a thread.
constexpr int kBackwardCtaThreads = 512;

// Forward rows in 16-byte packs are long enough to take eight packs a thread (kRegisterRowsWideBytes).
bool register_rows_wide(const Problem& p);
// The bound under which forward rows in 16-byte packs stay in one group's registers (forced:
// register_rows_bytes, at most what 1024 threads hold at eight packs each).
int64_t register_rows_bound(const Problem& p, const Tuning& o);
// The bound under which peeled rows (off 16 bytes alike in x and y) stay in one CTA's registers; from
// it, register_clusters takes them.
int64_t register_rows_peeled_bound(const Problem& p, const Tuning& o);

// A plan of the kernels that hold rows in 16-byte packs (peeled or not), which also write the
// consumers' outputs (consumer_out.cuh): the plan the consumers take where the log-softmax's is one.
inline bool register_rows_packed(const Plan& plan, const Problem& p) {
  return plan.family == Family::register_rows && int64_t{plan.vec} * p.elem_bytes == 16;
}

// Forward rows: in 16-byte packs under the bound, of up to 256 vectors, or peeled under 16 KB.
Plan register_rows_rule(const Problem& p, const DeviceInfo& d, const Tuning& o);
// The backward of rows of up to 256 vectors, or in 16-byte packs under the clusters' least.
Plan register_rows_backward_rule(const AxisProblem& p, const DeviceInfo& d, const Tuning& o);

}  // namespace softlight
