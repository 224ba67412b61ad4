#include "families/register_rows/rule.hpp"

#include <algorithm>

#include "planner/rules.hpp"

namespace softlight {
namespace {

// A register_rows plan's CTA and grid for its group: past a warp, the CTA is the group; else
// warp_threads, several rows a CTA.
void size_lanes_grid(Plan& plan, int64_t rows, int warp_threads) {
  plan.threads = plan.warp.group > 32 ? plan.warp.group : warp_threads;
  plan.grid = std::min<int64_t>(ceil_div(rows, plan.threads / plan.warp.group), int64_t{1} << 30);
}

// max_group: 32, or kRegisterRowsMaxGroup where the row is read in 16-byte packs (the forward).
// warp_threads: the CTA's threads where a group is at most a warp.
Plan lanes_plan(const Problem& p, int vec, int max_group = 32, int min_iters = kWarpRowsMinIters,
                int warp_threads = kWarpRowsThreads) {
  Plan plan;
  plan.family = Family::register_rows;
  plan.vec = vec;
  // Four accesses per lane where the row allows (more rows per warp, each lane with four loads in
  // flight): a lane per row-vector left warps latency-bound on rows of 128 fp32 and less.
  const int64_t vectors = ceil_div(p.cols, vec);
  plan.warp.group = static_cast<int>(std::min<int64_t>(max_group, pow2_ceil(ceil_div(vectors, min_iters))));
  plan.warp.iters = static_cast<int>(pow2_ceil(ceil_div(vectors, plan.warp.group)));
  size_lanes_grid(plan, p.rows, warp_threads);
  return plan;
}

// Rows in 16-byte packs in registers, 1 to 8 packs a thread; a CTA group that would leave a quarter
// of its packs empty holds the row in half the threads (or in as many packs as it needs).
Plan plan_register_rows(const Problem& p, int vec, int min_iters) {
  Plan plan = lanes_plan(p, vec, kRegisterRowsMaxGroup, min_iters, kRegisterRowsWarpThreads);
  const int64_t vectors = ceil_div(p.cols, vec);
  if (plan.warp.group <= 32 || vectors * 4 >= int64_t{3} * plan.warp.group * plan.warp.iters) return plan;
  if (ceil_div(vectors, plan.warp.group / 2) <= kWarpRowsMaxIters) plan.warp.group /= 2;
  plan.warp.iters = static_cast<int>(ceil_div(vectors, plan.warp.group));
  size_lanes_grid(plan, p.rows, kRegisterRowsWarpThreads);
  return plan;
}

}  // namespace

bool register_rows_wide(const Problem& p) {
  const int64_t row_bytes = p.cols * p.elem_bytes;
  return p.elem_bytes <= 4 && (p.elem_bytes == 2 ? row_bytes >= kRegisterRowsWideBytes : row_bytes > kRegisterRowsWideBytes);
}

int64_t register_rows_peeled_bound(const Problem& p, const Tuning& o) {
  return std::min(register_rows_bound(p, o), kPeeledRowsMaxBytes + 16);
}

int64_t register_rows_bound(const Problem& p, const Tuning& o) {
  return o.register_rows_bytes > 0
             ? std::min<int64_t>(o.register_rows_bytes, int64_t{16} * kRegisterRowsMaxGroup * kWarpRowsMaxIters + 1)
             : kRegisterRowsMaxBytes + (register_rows_wide(p) ? 1 : 0);
}

Plan register_rows_rule(const Problem& p, const DeviceInfo&, const Tuning& o) {
  const int vec = pack_elems(p.aligned16, p.elem_bytes);
  // Short rows aligned to 8 bytes only (rows of 100 bf16, say) are read in 8-byte packs.
  const int short_vec = !p.aligned16 && p.aligned8 && p.elem_bytes <= 4 ? 8 / p.elem_bytes : vec;
  const int64_t row_bytes = p.cols * p.elem_bytes;
  // Forced: the least packs per thread (1, 2, 4 or 8). Long rows take eight packs a thread.
  const int min_iters = per_thread_count(o.iters) ? o.iters : register_rows_wide(p) ? kWarpRowsMaxIters : kWarpRowsMinIters;
  const int64_t register_bytes = register_rows_bound(p, o);
  if (p.aligned16 && row_bytes < register_bytes && o.cluster <= 0)
    return per_thread_count(o.iters) ? lanes_plan(p, vec, kRegisterRowsMaxGroup, min_iters, kRegisterRowsWarpThreads)
                                     : plan_register_rows(p, vec, min_iters);
  if (ceil_div(p.cols, short_vec) <= int64_t{32} * kWarpRowsMaxIters) return lanes_plan(p, short_vec);
  // Rows off 16 bytes, off alike in x and y, up to 16 KB: in registers, peeled.
  const int peel_vec = 16 / p.elem_bytes;
  const int64_t peeled_one_cta = register_rows_peeled_bound(p, o);
  if (!p.aligned16 && p.peelable && p.elem_bytes <= 4 && row_bytes < peeled_one_cta && o.cluster <= 0 &&
      p.cols >= 2 * peel_vec) {
    // Four or five packs a thread (more spilled under the 64-register bound). At four, a group of
    // at least 2 x vec threads, which hold the elements of the blocks the row starts and ends
    // inside; at five, the edge takes a pack more on threads 0 and 1 (register_rows.cu).
    Plan plan = plan_register_rows(p, peel_vec, kWarpRowsMinIters);
    if (plan.warp.iters > 5) plan = lanes_plan(p, peel_vec, kRegisterRowsMaxGroup, kWarpRowsMinIters, kRegisterRowsWarpThreads);
    if ((plan.warp.iters == 4 && plan.warp.group >= 2 * peel_vec) || plan.warp.iters == 5) {
      plan.peel = true;
      return plan;
    }
  }
  return Plan{};
}

Plan register_rows_backward_rule(const AxisProblem& p, const DeviceInfo&, const Tuning& o) {
  if (!p.backward || !p.rows) return Plan{};
  const Problem rows = rows_of(p);
  const int vec = pack_elems(p.aligned16, p.elem_bytes);
  const int64_t vectors = ceil_div(p.dim, vec);
  if (vectors <= int64_t{32} * kWarpRowsMaxIters) return lanes_plan(rows, vec);
  // Longer rows under the clusters' least, in 16-byte packs: a CTA a row (cta_rows_backward_kernel)
  // of the fewest warps that hold it in four packs a thread, unless a cluster is asked for.
  if (p.aligned16 && o.cluster <= 0 && p.dim * p.elem_bytes < kClusterMinRowBytes &&
      vectors <= int64_t{kBackwardCtaThreads} * kWarpRowsMinIters) {
    Plan plan;
    plan.family = Family::register_rows;
    plan.vec = vec;
    plan.warp.group = static_cast<int>(ceil_div(ceil_div(vectors, kWarpRowsMinIters), 32) * 32);
    plan.warp.iters = kWarpRowsMinIters;
    size_lanes_grid(plan, rows.rows, kWarpRowsThreads);
    return plan;
  }
  return Plan{};
}

}  // namespace softlight
