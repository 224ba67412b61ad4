#include "families/register_clusters/rule.hpp"

#include <algorithm>

#include "families/register_rows/rule.hpp"
#include "planner/rules.hpp"

namespace softlight {
namespace {

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
  plan.family = Family::register_clusters;
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

}  // namespace

Plan register_clusters_rule(const Problem& p, const DeviceInfo& d, const Tuning& o) {
  const int64_t row_bytes = p.cols * p.elem_bytes;
  const int64_t register_bytes = register_rows_bound(p, o);
  // Rows past one CTA's registers, up to 512 KB (fp32) or 256 KB (16-bit), and peeled rows from
  // kPeeledRowsMaxBytes (the peeled rows one CTA's registers take, register_rows).
  const int64_t register_cluster_bytes = p.elem_bytes == 4 ? kRegisterClusterMaxRowBytes : kRegisterClusterMax16BitRowBytes;
  const bool packed_or_peeled = p.aligned16 || (p.peelable && o.peel_clusters != 0);
  const int64_t cluster_from = p.aligned16 ? register_bytes : register_rows_peeled_bound(p, o);
  if (!has_clusters(d) || !packed_or_peeled || p.elem_bytes > 4 || o.cluster > 0 || o.register_cluster == 0 ||
      !(o.register_cluster > 0 || (row_bytes >= cluster_from && row_bytes <= register_cluster_bytes)))
    return Plan{};
  const int threads = o.register_cluster > 0 ? o.register_cluster
                      : row_bytes <= kRegisterClusterSmallRowBytes ? kRegisterClusterMaxThreads / 2
                                                                   : kRegisterClusterMaxThreads;
  return plan_register_cluster(p, d, threads, per_thread_count(o.iters) && o.iters >= 4 ? o.iters : kWarpRowsMaxIters);
}

}  // namespace softlight
