// The kernel families' launchers, one a family (src/families/<family>/), and what launching on a
// device takes. Host-side interface; no device code.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "entry/validate.hpp"
#include "planner/plan.hpp"
#include "softlight/softlight.h"

namespace softlight {

// The device's attributes as the planner takes them (five runtime calls; the library asks once per
// device, entry/gpu_entry.cpp).
inline cudaError_t query_device_info(int device, DeviceInfo* d) {
  int v = 0;
  cudaError_t e;
  if ((e = cudaDeviceGetAttribute(&d->cc_major, cudaDevAttrComputeCapabilityMajor, device))) return e;
  if ((e = cudaDeviceGetAttribute(&d->cc_minor, cudaDevAttrComputeCapabilityMinor, device))) return e;
  if ((e = cudaDeviceGetAttribute(&d->sm_count, cudaDevAttrMultiProcessorCount, device))) return e;
  if ((e = cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device))) return e;
  d->smem_per_block_optin = v;
  if ((e = cudaDeviceGetAttribute(&v, cudaDevAttrClusterLaunch, device))) return e;
  // Hopper schedules clusters of up to 16 CTAs (8 portably); the launcher steps down if the
  // chosen size cannot be placed.
  d->max_cluster = v ? kMaxCluster : 0;
  return cudaSuccess;
}

// Makes `cfg` launch clusters of `cluster` CTAs along x (attr: storage for one attribute).
inline void set_cluster_dim(cudaLaunchConfig_t* cfg, cudaLaunchAttribute* attr, int cluster) {
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = static_cast<unsigned>(cluster);
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cfg->attrs = attr;
  cfg->numAttrs = 1;
}

// A persistent launch of clusters of plan.cluster CTAs (plan.threads threads, plan.smem_bytes of
// dynamic shared memory each): as many clusters as fit at once, at most plan.grid. Not copyable:
// cfg points at attr.
struct ClusterLaunch {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1] = {};
  int active = 0;        // clusters that fit at once
  int64_t clusters = 0;  // clusters launched
  ClusterLaunch() = default;
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// Fills `l` for `kernel` (a cluster kernel of the cluster_rows / cluster_tiles families, or rows in
// registers over a cluster, whose launcher then sets a grid of a cluster per row);
// cudaErrorInvalidClusterSize when no cluster of plan.cluster CTAs fits. Where the plan's groups
// trade through global memory (plan.grid_exchange), a cooperative launch of groups of plan.cluster
// consecutive CTAs instead, as many as are resident at once.
template <class Kernel>
cudaError_t prepare_cluster_launch(Kernel kernel, const Plan& p, cudaStream_t stream, ClusterLaunch* l) {
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(p.smem_bytes));
  if (e == cudaSuccess && p.cluster > 8 && !p.ring.grid_exchange)
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (e != cudaSuccess) return e;
  l->cfg.blockDim = dim3(p.threads);
  l->cfg.dynamicSmemBytes = static_cast<size_t>(p.smem_bytes);
  l->cfg.stream = stream;
  if (p.ring.grid_exchange) {
    int device = 0, sms = 0, per_sm = 0;
    if ((e = cudaGetDevice(&device)) || (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) ||
        (e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, p.threads, l->cfg.dynamicSmemBytes)))
      return e;
    l->attr[0].id = cudaLaunchAttributeCooperative;
    l->attr[0].val.cooperative = 1;
    l->cfg.attrs = l->attr;
    l->cfg.numAttrs = 1;
    l->active = per_sm * sms / p.cluster;
  } else {
    set_cluster_dim(&l->cfg, l->attr, p.cluster);
    l->cfg.gridDim = dim3(static_cast<unsigned>(p.cluster));
    e = cudaOccupancyMaxActiveClusters(&l->active, kernel, &l->cfg);
    if (e != cudaSuccess) return e;
  }
  if (l->active < 1) return cudaErrorInvalidClusterSize;
  l->clusters = std::min<int64_t>(p.grid, l->active);
  l->cfg.gridDim = dim3(static_cast<unsigned>(l->clusters * p.cluster));
  return cudaSuccess;
}

// Each family's launcher: a checked call (validate.hpp) planned for that family, forward or backward
// where the family has both (Call::backward). Launchers plan nothing; where a launch cannot run as
// planned they return the error, and the GPU entry (gpu_entry.cpp) owns every fallback.
cudaError_t launch_single_column(const Plan& plan, const Call& a, cudaStream_t stream);
cudaError_t launch_flat_rows(const Plan& plan, const Call& a, cudaStream_t stream);
cudaError_t launch_short_rows(const Plan& plan, const Call& a, cudaStream_t stream);         // and backward
cudaError_t launch_register_rows(const Plan& plan, const Call& a, cudaStream_t stream);      // and backward
cudaError_t launch_register_clusters(const Plan& plan, const Call& a, cudaStream_t stream);  // errors as cluster_rows
cudaError_t launch_block_rows(const Plan& plan, const Call& a, cudaStream_t stream);
// cudaErrorInvalidClusterSize when no cluster of plan.cluster CTAs can be scheduled. And backward.
cudaError_t launch_cluster_rows(const Plan& plan, const Call& a, cudaStream_t stream);
// cudaErrorInvalidClusterSize where the grid cannot be resident or holds too little.
cudaError_t launch_grid_rows(const Plan& plan, const Call& a, cudaStream_t stream);
// Errors as cluster_rows, and cudaErrorNotSupported (nothing queued) where the driver cannot describe
// x as a tensor map.
cudaError_t launch_cluster_tiles(const Plan& plan, const Call& a, cudaStream_t stream);
// Any Call, forward or backward (strides normalized). Errors as cluster_rows.
cudaError_t launch_split_rows(const Plan& plan, const Call& a, cudaStream_t stream);

// The consumers of a row's log-sum-exp (consumer_rows.cu), on checked calls (validate.hpp): the
// statistics of softlight_row_stats, then the gradient of softlight_row_stats_backward. Pointers are
// of the accumulation type A (float, or double for float64), null where not asked.
template <class A> struct ConsumerArgs {
  const int64_t* index;
  int64_t count, index_stride, offset;
  bool shard;
  A *lse, *entropy, *logprobs, *picked, *sum, *max, *sumexp, *moment;
};
template <class A> struct GradArgs {
  const int64_t* index;
  int64_t count, index_stride, offset;
  bool shard;
  const A *lse, *entropy, *d_lse, *d_entropy, *d_logprobs, *d_picked, *d_sum;
};
// (af for float, float16 and bfloat16 calls, ad for float64 ones.) The gradient keeps each row's
// tokens in shared memory: at most kMaxGpuTokens a row.
constexpr int64_t kMaxGpuTokens = 8192;
cudaError_t launch_row_stats(const ConsumerCall& c, const ConsumerArgs<float>& af, const ConsumerArgs<double>& ad,
                             cudaStream_t stream);
cudaError_t launch_row_stats_grad(const ConsumerCall& c, const GradArgs<float>& gf, const GradArgs<double>& gd,
                                  cudaStream_t stream);
// Cross-entropy (c.index: the targets, one a row), its gradient in the same pass where o.grad is set.
template <class A> struct CrossEntropyArgs {
  double eps, z_loss;
  bool ignore;
  int64_t ignore_index;
  bool mean, reduce;
  const int64_t* count;  // the kept rows (a workspace the launcher fills first)
  double* losses;        // each row's loss, where reduced (workspace)
  A* loss;               // the result: rows values (no reduction) or one
  A* lse;
};
// plan and call (both null, or neither): a plan of short_rows, flat_rows, register_rows, register
// clusters, block_rows or cluster_rows for the rows of x and o.grad (fp32, fp16 and bf16, no label
// smoothing; the gradient may be x), which then writes the gradient (launch_short_rows_ce,
// launch_flat_rows_ce, launch_register_rows_ce, launch_register_clusters_ce, launch_block_rows_ce,
// launch_cluster_rows_ce), or where o.grad is null the loss alone (the first four).
cudaError_t launch_cross_entropy(const ConsumerCall& c, const softlight_cross_entropy_options& o, cudaStream_t stream,
                                 const Plan* plan, const Call* call);
// row_stats's lse, max, sumexp, picked, logprobs, entropy and moment (not the sum) by the register
// clusters of plan, for the rows of call.x (call.y is x, not written; fp32, fp16, bf16).
cudaError_t launch_register_clusters_stats(const Plan& plan, const Call& call, const ConsumerArgs<float>& args,
                                           cudaStream_t stream);
// The same by the register_rows plan `plan` of rows in 16-byte packs (register_rows_packed).
cudaError_t launch_register_rows_stats(const Plan& plan, const Call& call, const ConsumerArgs<float>& args,
                                       cudaStream_t stream);
// The same by the short_rows plan `plan` (kShortRowsPerLane rows a lane) or the flat_rows plan `plan`.
cudaError_t launch_short_rows_stats(const Plan& plan, const Call& call, const ConsumerArgs<float>& args,
                                    cudaStream_t stream);
cudaError_t launch_flat_rows_stats(const Plan& plan, const Call& call, const ConsumerArgs<float>& args,
                                   cudaStream_t stream);
// Cross-entropy's loss, lse and gradient (into call.y) by the register clusters of plan.
cudaError_t launch_register_clusters_ce(const Plan& plan, const Call& call, const int64_t* target,
                                        const CrossEntropyArgs<float>& args, bool loss_only,
                                        cudaStream_t stream);
// The same by the register_rows plan `plan` of rows in 16-byte packs, a group of lanes a row.
cudaError_t launch_register_rows_ce(const Plan& plan, const Call& call, const int64_t* target,
                                    const CrossEntropyArgs<float>& args, bool loss_only,
                                    cudaStream_t stream);
// The same by the short_rows plan `plan` (kShortRowsPerLane rows a lane) or the flat_rows plan `plan`.
cudaError_t launch_short_rows_ce(const Plan& plan, const Call& call, const int64_t* target,
                                 const CrossEntropyArgs<float>& args, bool loss_only,
                                 cudaStream_t stream);
cudaError_t launch_flat_rows_ce(const Plan& plan, const Call& call, const int64_t* target,
                                const CrossEntropyArgs<float>& args, bool loss_only,
                                cudaStream_t stream);
// The same by the block_rows plan `plan` (a resident row: shared memory in between).
cudaError_t launch_block_rows_ce(const Plan& plan, const Call& call, const int64_t* target,
                                 const CrossEntropyArgs<float>& args, cudaStream_t stream);
// The same by the cluster_rows plan `plan`, the row in the ring in between.
cudaError_t launch_cluster_rows_ce(const Plan& plan, const Call& call, const int64_t* target,
                                   const CrossEntropyArgs<float>& args, cudaStream_t stream);
// grad (c.dx, rows x cols) times d_loss (count 1 or rows, the accumulation type, device memory), in
// place; a row whose factor is 1 is not touched.
cudaError_t launch_grad_scale(const ConsumerCall& c, const void* d_loss, int64_t count, cudaStream_t stream);

}  // namespace softlight
