// cluster_tiles (Hopper): the forward along a non-last axis, inner positions contiguous and aligned:
// a cluster a tile of kTileBytes of inner positions over the whole axis, the tile's slice held in a
// ring of chunks (one read), filled by bulk tensor copies.
#pragma once

#include "planner/plan.hpp"

namespace softlight {

// cluster_tiles: the tile width (bytes of inner positions; each position of the axis is one bulk
// copy of this size), the least inner extent worth a tile, and the buffers of cluster partials.
constexpr int kTileBytes = 256;
constexpr int kTileMinInnerBytes = 128;
constexpr int kTileStatsBuffers = 2;
// cluster_tiles' chunks, measured best at (64, 4096, 4096) along dim 1 (docs/decisions/planner.md).
constexpr int kTileChunk32 = 16 * 1024;
constexpr int kTileChunk16 = 32 * 1024;
constexpr int kTileMaxBoxRows = 256;  // positions of the axis per chunk, at most

// The forward along a non-last axis whose layout a tensor map describes (AxisProblem::tiles_aligned),
// where a tile's slice of the axis stays in a CTA's ring.
Plan cluster_tiles_rule(const AxisProblem& p, const DeviceInfo& d, const Tuning& o);

}  // namespace softlight
