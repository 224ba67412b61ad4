#include "families/consumer_rows/rule.hpp"

#include "families/register_rows/rule.hpp"
#include "families/short_rows/rule.hpp"

namespace softlight {

Plan consumer_rows_rule(const ConsumerProblem& p, const DeviceInfo& d, const Tuning& o) {
  Plan kernel;
  kernel.family = Family::consumer_rows;
  const Problem& r = p.rows;
  // What writes none of the row's elements: the statistics without the row's sum, and cross-entropy's
  // loss alone (CrossEntropyLossOut), in the same kernels.
  const bool gathers = p.cross_entropy ? !p.writes_grad && !p.label_smoothing : !p.asks_sum;
  const bool stats = gathers && r.cols * r.elem_bytes <= kStatsClusterRowBytes;
  const bool ring = p.cross_entropy && p.writes_grad && !p.label_smoothing;
  if (r.elem_bytes == 8 || r.cols <= 1 || !(stats || ring)) return kernel;
  const Plan own = plan_rows(r, d, o);  // rows a lane or a group of lanes holds: the log-softmax's own plan
  if (register_rows_packed(own, r) || own.family == Family::flat_rows ||
      (own.family == Family::short_rows && own.warp.rows_per_lane == kShortRowsPerLane))
    return own;
  // Rows of 4-byte elements that block_rows holds in a CTA's shared memory; 16-bit rows there were
  // slower than consumer_rows' two reads (docs/consumers.md, "Cross-entropy's gradient in block_rows").
  if (ring && r.elem_bytes == 4 && own.family == Family::block_rows && own.resident) return own;
  Tuning t = o;
  if (ring && t.threads <= 0) t.threads = kClusterDefaultThreads;
  const Plan held = t.threads == o.threads ? own : plan_rows(r, d, t);
  if (held.family == Family::register_clusters) return held;
  if (ring && held.family == Family::cluster_rows && held.threads <= kClusterDefaultThreads) return held;
  return kernel;
}

}  // namespace softlight
