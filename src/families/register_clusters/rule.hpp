// register_clusters (Hopper): rows past one CTA's registers, up to kRegisterClusterMaxRowBytes
// (16-bit kRegisterClusterMax16BitRowBytes), and peeled rows past kPeeledRowsMaxBytes, held in the
// registers of a cluster's CTAs: one row a cluster, its packs spread evenly over as few CTAs as
// hold it, the partials traded over distributed shared memory. One DRAM read, one write.
#pragma once

#include <cstdint>

#include "planner/plan.hpp"

namespace softlight {

// Threads per CTA at most, and the rows taken (fp32, 16-bit); CTAs of half the threads up to
// kRegisterClusterSmallRowBytes.
constexpr int kRegisterClusterMaxThreads = 256;
constexpr int64_t kRegisterClusterMaxRowBytes = 512 * 1024;
constexpr int64_t kRegisterClusterMax16BitRowBytes = 256 * 1024;
constexpr int64_t kRegisterClusterSmallRowBytes = 128 * 1024;
// CTAs of 256 threads an SM holds at once (at most 64 registers a thread): bf16 took 79, three.
constexpr int kRegisterClusterMinBlocks = 4;

// Forward rows in 16-byte packs (or peelable) past one CTA's registers (forced register_cluster:
// that many threads a CTA, 0 off).
Plan register_clusters_rule(const Problem& p, const DeviceInfo& d, const Tuning& o);

}  // namespace softlight
