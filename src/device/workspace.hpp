// The GPU backend's only process-wide state, shared by the families that need device memory of their
// own for a launch (cluster_rows, grid_rows, consumer_rows): a memory pool on each device, and the
// counters of claimed rows by stream. Both are created on first use, guarded by a mutex, and kept
// for the life of the process; nothing else in the library outlives a call.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace softlight {

// Workspaces (tables, counters) come from a memory pool of softlight's own on the current device,
// which keeps what it has allocated.
cudaError_t workspace_pool(cudaMemPool_t* pool);

// A pair of counter words (all ones between launches) for claimed rows on `stream`, or null where
// the stream is being captured or too many streams have one: the launch then takes kCounterBytes
// of its own from the pool.
constexpr size_t kCounterBytes = 2 * sizeof(unsigned long long);
cudaError_t stream_counter(cudaStream_t stream, unsigned long long** counter);

}  // namespace softlight
