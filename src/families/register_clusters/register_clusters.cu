// register_clusters (Hopper): rows in registers over a cluster. Rows past
// one CTA's registers, up to 512 KB (256 KB in 16 bits), in 16-byte packs or off 16 bytes alike in x
// and y (peeled), one row to a cluster of CTAs. One DRAM read, one write.
#include <algorithm>

#include "device/common.cuh"
#include "device/consumer_out.cuh"
#include "device/hopper.cuh"
#include "device/launch.hpp"
#include "families/register_clusters/rule.hpp"

namespace softlight {
namespace {

// A partial of no elements: max -inf, sums 0.
template <class P> __device__ __forceinline__ P empty_partial() {
  using A = decltype(P::m);
  if constexpr (std::is_same_v<P, MaxSumMoment<A>>) return {neg_inf<A>(), A(0), A(0)};
  else return {neg_inf<A>(), A(0)};
}

// Rows in registers over a cluster (Hopper): rows too long for one CTA's registers, one row to a
// cluster of C CTAs (the grid is rows * C CTAs, not persistent), CTA k holding packs
// [k * span, (k + 1) * span) of the row, ITERS a thread. Each thread reduces its packs to a
// (max, sum) pair, the CTA merges its threads' pairs (shuffles, then the warps' pairs through
// shared memory) and sends its pair into every CTA's shared memory with st.async, completing on
// that CTA's mbarrier; each CTA waits there for the C pairs, merges them and writes its share of y
// from its registers. One read and one write. No cluster barrier per row (its release is a memory
// fence that waits for the CTA's outstanding accesses, and took 2.5 cycles of every issued
// instruction), only one at the start, so that
// no pair reaches a CTA before its mbarrier is initialised. The SM overlaps the loads, exchanges
// and stores of the several CTAs it holds and takes a new one as each ends.
// Peel: rows off 16 bytes, x and y off alike (rows of 50 257). The packs are the 16-byte blocks the
// row touches, block k holding row elements [k * V - lead, (k + 1) * V - lead), `lead` the elements
// before the row in its first block: the blocks that end in the row are the cluster's packs, block 0
// cut to the row by CTA 0's thread 0; the block the row ends inside (if any) is loaded with the
// packs by CTA 0's thread 1, which folds its part in. Each writes its block's part element by
// element. So no load waits after the reduction on CTA 0, whose pair the whole cluster waits for:
// the edges loaded one by one after it cost 4-6 % at rows of 50 257 16-bit. Where a block would
// leave the array (the first row's first
// block, the last row's last), its part of the row is loaded element by element.
// Bounded (Plan::bounded; register_cluster_bounded_kernel): 64 registers a thread, the packs
// unpacked again for y. CTAs of 256 threads, four to an SM: bf16 took 79 registers and three CTAs,
// 4-11 % slower than fp16 at the same bytes. CTAs of 128 threads, eight to an SM, for 16-bit rows in
// packs that do not start on 128 bytes (bf16 rows of 50 264: six CTAs of 80 registers, 8 % slower).
// Other CTAs of 128 threads keep the compiler's choice (register_cluster_kernel), which was 2 %
// faster in bf16 rows on 128 bytes than the bound.
// Out: what the row's elements become, given its max and log-sum (LogSoftmaxOut, CrossEntropyOut's
// gradient, or nothing: RowStatsOut): Out::row(row, m, s, log_sum, lane, lanes) writes the row's own
// values (CTA 0's threads, lane their index) and gives the writer of its elements, whose pack(dst,
// p, col) and part(dst, p, lo, hi, col) write one block (col: the row's column of the block's
// element 0). An Out whose kMoment is set (the entropy's statistics) takes the row's moment too,
// row(row, m, s, t, log_sum, lane, lanes): the pairs are then (max, sum, moment) partials
// (MaxSumMoment), 16 bytes each between CTAs, a warp's threads taking theirs against the warp's max
// so that they add. An Out whose kGather is set (RowStatsOut: no element written) has each CTA send
// its pair to CTA 0 alone, and the others end there.
template <class T, int ITERS, bool Peel, bool Bounded, class Out>
__device__ __forceinline__ void register_cluster_row(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys,
                                                     int cols, int span, acc_t<T> scale, const Out& out) {
#ifdef SOFTLIGHT_HOPPER
  using A = acc_t<T>;
  constexpr int V = 16 / sizeof(T);
  constexpr bool Moment = Out::kMoment;
  using P = std::conditional_t<Moment, MaxSumMoment<A>, MaxSum<A>>;  // a partial
  __shared__ P warp_pairs[kRegisterClusterMaxThreads / 32];
  __shared__ alignas(16) std::conditional_t<Moment, float4, MaxSum<A>> partials[kMaxCluster];
  __shared__ alignas(8) uint64_t arrived;
  const uint32_t rank = cluster_rank();
  uint32_t csize;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(csize));
  const int threads = static_cast<int>(blockDim.x);
  const int tid = static_cast<int>(threadIdx.x);
  const A f = exp_factor(scale);
  const uint32_t bar = smem_addr(&arrived);
  if (tid == 0) {
    mbar_init(bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  const int64_t row = blockIdx.x / csize;
  const T* xe = x + row * xs;
  // The row's blocks (Peel; otherwise lead and tail are 0 and the blocks are the row's packs).
  const int lead = Peel ? lead_elements(xe) : 0;
  const int full = (lead + cols) / V;                // blocks that end in the row
  const int tail = Peel ? (lead + cols) % V : 0;     // the row's elements in the block after them
  const T* xb = xe - lead;
  const uint4* xv = reinterpret_cast<const uint4*>(xb);
  const bool head_thread = Peel && rank == 0 && tid == 0 && lead > 0;
  const bool tail_thread = Peel && rank == 0 && tid == 1 && tail > 0;
  const bool head_out = Peel && row == 0;                              // block 0 would start before x
  const bool tail_out = Peel && row == gridDim.x / csize - 1;          // the last block would end after it
  const int begin = static_cast<int>(rank) * span, end = min(full, begin + span);
  uint4 p[ITERS];
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int e = begin + i * threads + tid;
    p[i] = e < end && (i > 0 || !(head_thread && head_out)) ? xv[e] : neg_inf_pack<T>();
  }
  uint4 last = tail_thread && !tail_out ? xv[full] : neg_inf_pack<T>();
  if (head_thread) p[0] = cut_block(xb, p[0], lead, V, head_out);
  // This thread's pair, then the warp's, then the CTA's.
  const auto merge = [&](const P& a, const P& b) {
    if constexpr (Moment) return merge_moment(a, b, scale);
    else return merge_max_sum(a, b, f);
  };
  P q;
  if constexpr (Moment) {
    // The warp's max first, each thread's sums against it, and the warp's sums added: merging the
    // threads' (max, sum, moment) partials took two exps and a score of instructions a step.
    if (tail_thread) last = cut_block(xb + full * V, last, 0, tail, tail_out);
    const uint4 t[1] = {last};  // (-inf but in the tail's thread)
    const A m = group_max<32>(max_acc(packs_max<T, ITERS>(p), packs_max<T, 1>(t)));
    q = packs_sum_moment<T, ITERS>(p, m, scale);
    if (tail_thread) {
      const P r = packs_sum_moment<T, 1>(t, m, scale);
      q.s += r.s;
      q.t += r.t;
    }
    q.s = group_sum<32>(q.s);
    q.t = group_sum<32>(q.t);
  } else {
    q = packs_max_sum<T, ITERS>(p, scale);
    if (tail_thread) {
      const uint4 t[1] = {cut_block(xb + full * V, last, 0, tail, tail_out)};
      last = t[0];
      q = merge(q, packs_max_sum<T, 1>(t, scale));
    }
    q = shfl_merge_max_sum(q, f);
  }
  if ((threadIdx.x & 31) == 0) warp_pairs[threadIdx.x >> 5] = q;
  __syncthreads();
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");  // every CTA's mbarrier is ready
  // Gather (an output that writes no element): the partials go to CTA 0 alone, and the others end.
  constexpr bool Gather = Out::kGather;
  if (tid == 0) {
    P c = empty_partial<P>();
    for (int w = 0; w < threads / 32; ++w) c = merge(c, warp_pairs[w]);
    if (!Gather || rank == 0) mbar_arrive_expect_tx(bar, csize * uint32_t{sizeof(partials[0])});
    const uint32_t to = Gather ? 1u : csize;
    if constexpr (Moment) broadcast_moment(smem_addr(&partials[rank]), c.m, c.s, c.t, bar, csize, to);
    else broadcast_pair(smem_addr(&partials[rank]), c.m, c.s, bar, csize, to);
  }
  if (Gather && rank != 0) return;
  mbar_wait(bar, 0);
  P r = empty_partial<P>();
  for (uint32_t k = 0; k < csize; ++k) {
    if constexpr (Moment) r = merge(r, P{partials[k].x, partials[k].y, partials[k].z});
    else r = merge(r, partials[k]);
  }
  const A log_sum = log_acc(r.s);
  const int lane = rank == 0 ? tid : -1;
  const auto w = [&] {
    if constexpr (Moment) return out.row(row, r.m, r.s, r.t, log_sum, lane, threads);
    else return out.row(row, r.m, r.s, log_sum, lane, threads);
  }();
  T* yb = y + row * ys - lead;  // y's blocks: y is off 16 bytes as x is
  if (tail_thread) w.part(yb + full * V, last, 0, tail, int64_t{full} * V - lead);
  if constexpr (Bounded) {
#pragma unroll
    for (int i = 0; i < ITERS; ++i) opaque(p[i]);  // unpacked again (see rows_in_registers_kernel)
  }
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int e = begin + i * threads + tid;
    if (i == 0 && head_thread)
      w.part(yb, p[0], lead, V, -lead);
    else if (e < end)
      w.pack(yb + e * V, p[i], int64_t{e} * V - lead);
  }
#endif
}

template <class T, int ITERS, bool Peel>
__global__ void __launch_bounds__(kRegisterClusterMaxThreads)
register_cluster_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys, int cols, int span,
                        acc_t<T> scale, acc_t<T>* __restrict__ lse) {
  register_cluster_row<T, ITERS, Peel, false>(x, xs, y, ys, cols, span, scale, LogSoftmaxOut<T>{scale, lse});
}

template <class T, bool Peel>
__global__ void __launch_bounds__(kRegisterClusterMaxThreads, kRegisterClusterMinBlocks)
register_cluster_bounded_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys, int cols,
                                int span, acc_t<T> scale, acc_t<T>* __restrict__ lse) {
  register_cluster_row<T, kWarpRowsMaxIters, Peel, true>(x, xs, y, ys, cols, span, scale,
                                                         LogSoftmaxOut<T>{scale, lse});
}

// Cross-entropy's gradient in place of y (CrossEntropyOut: each row's loss, lse, and the gradient
// for an upstream gradient of 1), the row held in registers between its read and the write.
template <class T, int ITERS, bool Peel>
__global__ void __launch_bounds__(kRegisterClusterMaxThreads)
register_cluster_ce_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ grad, int64_t gs, int cols, int span,
                           acc_t<T> scale, CrossEntropyOut<T> out) {
  register_cluster_row<T, ITERS, Peel, false>(x, xs, grad, gs, cols, span, scale, out);
}

template <class T, bool Peel>
__global__ void __launch_bounds__(kRegisterClusterMaxThreads, kRegisterClusterMinBlocks)
register_cluster_ce_bounded_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ grad, int64_t gs, int cols,
                                   int span, acc_t<T> scale, CrossEntropyOut<T> out) {
  register_cluster_row<T, kWarpRowsMaxIters, Peel, true>(x, xs, grad, gs, cols, span, scale, out);
}

// An output that writes none of the row's elements (Out::kGather: the row's statistics, with the
// moment where asked, or cross-entropy's loss alone): the row is read once and nothing of it is
// written (y is x, untouched). The packs die at the reduction: no kernel keeps them for a write.
template <class T, int ITERS, bool Peel, class Out>
__global__ void __launch_bounds__(kRegisterClusterMaxThreads)
register_cluster_gather_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys, int cols, int span,
                               acc_t<T> scale, Out out) {
  register_cluster_row<T, ITERS, Peel, false>(x, xs, y, ys, cols, span, scale, out);
}

template <class T, bool Peel, class Out>
__global__ void __launch_bounds__(kRegisterClusterMaxThreads, kRegisterClusterMinBlocks)
register_cluster_gather_bounded_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys, int cols,
                                       int span, acc_t<T> scale, Out out) {
  register_cluster_row<T, kWarpRowsMaxIters, Peel, false>(x, xs, y, ys, cols, span, scale, out);
}

// The kernels of each output: ITERS packs a thread (4 or 8), bounded or not, peeled or not.
// kBoundPeeled: peeled rows of eight packs a thread take the bounded kernel whatever the plan says
// (cross-entropy's gradient: the plain kernel's 76 registers held six CTAs of 128 threads an SM, the
// bound's 64 eight; docs/consumers.md, "Kernel choices").
template <class T> struct LogSoftmaxKernels {
  static constexpr bool kBoundPeeled = false;
  template <int I, bool P> static constexpr auto plain = register_cluster_kernel<T, I, P>;
  template <bool P> static constexpr auto bounded = register_cluster_bounded_kernel<T, P>;
};
template <class T, class Out> struct GatherKernels {
  static constexpr bool kBoundPeeled = false;
  template <int I, bool P> static constexpr auto plain = register_cluster_gather_kernel<T, I, P, Out>;
  template <bool P> static constexpr auto bounded = register_cluster_gather_bounded_kernel<T, P, Out>;
};
template <class T> struct CrossEntropyKernels {
  static constexpr bool kBoundPeeled = true;
  template <int I, bool P> static constexpr auto plain = register_cluster_ce_kernel<T, I, P>;
  template <bool P> static constexpr auto bounded = register_cluster_ce_bounded_kernel<T, P>;
};

// Rows in registers over clusters of plan.cluster CTAs (plan.threads threads, plan.warp.iters packs
// each, plan.segment packs a CTA), one row to a cluster: plan.grid clusters, one per row; plan.peel
// for rows off 16 bytes. K: the kernels of the output `out` (lse for the log-softmax).
template <class K, class T, class O>
cudaError_t launch_clusters(const Plan& p, const Call& a, O out, cudaStream_t stream) {
  // Built for 16-byte packs of 2- and 4-byte types, four or eight a thread (the planner's only).
  if constexpr (sizeof(T) == 8) {
    return cudaErrorInvalidValue;
  } else {
    if ((p.warp.iters != 4 && p.warp.iters != 8) || p.grid != a.rows()) return cudaErrorInvalidValue;
    auto kernel = p.peel ? K::template plain<4, true> : K::template plain<4, false>;
    if (p.warp.iters == 8 && (p.warp.bounded || (p.peel && K::kBoundPeeled)))
      kernel = p.peel ? K::template bounded<true> : K::template bounded<false>;
    else if (p.warp.iters == 8)
      kernel = p.peel ? K::template plain<8, true> : K::template plain<8, false>;
    ClusterLaunch l;
    cudaError_t e = prepare_cluster_launch(kernel, p, stream, &l);
    if (e != cudaSuccess) return e;
    l.cfg.gridDim = dim3(static_cast<unsigned>(p.grid * p.cluster));  // a cluster per row, not persistent
    e = cudaLaunchKernelEx(&l.cfg, kernel, static_cast<const T*>(a.x()), a.x_stride(), static_cast<T*>(a.y()), a.y_stride(),
                           static_cast<int>(a.cols()), static_cast<int>(p.segment), static_cast<acc_t<T>>(a.scale),
                           out);
    return e != cudaSuccess ? e : cudaGetLastError();
  }
}

}  // namespace

cudaError_t launch_register_clusters(const Plan& p, const Call& a, cudaStream_t stream) {
  return with_element_type(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    return launch_clusters<LogSoftmaxKernels<T>, T>(p, a, static_cast<acc_t<T>*>(a.lse), stream);
  });
}

cudaError_t launch_register_clusters_ce(const Plan& p, const Call& a, const int64_t* target,
                                        const CrossEntropyArgs<float>& args, bool loss_only, cudaStream_t stream) {
  return with_cross_entropy_out(a, target, args, loss_only, [&](auto tag, const auto& out) {
    using T = decltype(tag);
    using O = std::decay_t<decltype(out)>;
    if constexpr (O::kGather) return launch_clusters<GatherKernels<T, O>, T>(p, a, out, stream);
    else return launch_clusters<CrossEntropyKernels<T>, T>(p, a, out, stream);
  });
}

cudaError_t launch_register_clusters_stats(const Plan& p, const Call& a, const ConsumerArgs<float>& args,
                                           cudaStream_t stream) {
  return with_row_stats_out(a, args, [&](auto tag, const auto& out) {
    using T = decltype(tag);
    return launch_clusters<GatherKernels<T, std::decay_t<decltype(out)>>, T>(p, a, out, stream);
  });
}

}  // namespace softlight
