// The CPU backend's worker threads: started once, on the first call that wants them, and kept.
#pragma once

#include <cstdint>

namespace softlight {
namespace cpu {

// Runs fn(ctx, t) for every t in [0, tasks), on this thread and up to workers - 1 of the pool's,
// and returns once all have returned. False, having run nothing, where the pool is in use by
// another call (the caller then runs the tasks its own way) or has no thread to lend.
bool run_tasks(int64_t tasks, int64_t workers, void (*fn)(void*, int64_t), void* ctx);

}  // namespace cpu
}  // namespace softlight
