// The process-wide state of the GPU backend: a workspace pool a device and claimed rows' counters a
// stream (workspace.hpp).
#include "device/workspace.hpp"

#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace softlight {

// Workspaces (grid groups' tables, claimed rows' counters) come from a memory pool of softlight's
// own on each device, which keeps what it has allocated (8 bytes to a few MB) instead of handing
// it back at every synchronization as the default pool does (mapping it again would cost more than
// the workspace is worth).
cudaError_t workspace_pool(cudaMemPool_t* pool) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  static std::mutex mu;
  static std::unordered_map<int, cudaMemPool_t> pools;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = pools.find(device); it != pools.end()) {
    *pool = it->second;
    return cudaSuccess;
  }
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  if ((e = cudaMemPoolCreate(pool, &props))) return e;
  uint64_t keep = UINT64_MAX;
  if ((e = cudaMemPoolSetAttribute(*pool, cudaMemPoolAttrReleaseThreshold, &keep))) return e;
  pools.emplace(device, *pool);
  return cudaSuccess;
}

// Claimed rows' counters by stream: a pair of words each, all ones between launches (the last
// cluster to finish claiming puts them back, see retire), so that all launches on a stream share
// one pair, set on the stream at its first launch, and no memset goes ahead of each kernel (an
// operation more on the stream costs GPU time at every call). A stream's id is unique for the life
// of the process and a stream runs its work in order, so no two launches use a pair at once. Not
// for a stream being captured (a graph may be launched on any stream, so its launches take a pair
// of their own from the pool, as grid groups' tables do), nor past kMaxStreamCounters streams.
namespace {
constexpr size_t kMaxStreamCounters = 4096;
}  // namespace

cudaError_t stream_counter(cudaStream_t stream, unsigned long long** counter) {
  *counter = nullptr;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing(stream, &capture);
  if (e != cudaSuccess || capture != cudaStreamCaptureStatusNone) return e;
  int device = 0;
  unsigned long long id = 0;
  if ((e = cudaGetDevice(&device)) || (e = cudaStreamGetId(stream, &id))) return e;
  static std::mutex mu;
  static std::map<std::pair<int, unsigned long long>, unsigned long long*> counters;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = counters.find({device, id}); it != counters.end()) {
    *counter = it->second;
    return cudaSuccess;
  }
  if (counters.size() >= kMaxStreamCounters) return cudaSuccess;
  cudaMemPool_t pool;
  void* words = nullptr;
  if ((e = workspace_pool(&pool)) || (e = cudaMallocFromPoolAsync(&words, kCounterBytes, pool, stream))) return e;
  if ((e = cudaMemsetAsync(words, 0xff, kCounterBytes, stream))) {
    cudaFreeAsync(words, stream);
    return e;
  }
  *counter = static_cast<unsigned long long*>(words);
  counters.emplace(std::make_pair(device, id), *counter);
  return cudaSuccess;
}

}  // namespace softlight
