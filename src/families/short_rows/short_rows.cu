// short_rows: rows in 16-byte packs up to 128 bytes, a lane holding a pack of each of several rows:
// the forward (short_rows_kernel) and the backward (short_rows_backward_kernel). One DRAM read of
// each input, one write. The forward's kernel writes the consumers' outputs too (consumer_out.cuh):
// cross-entropy's loss and gradient, and the row statistics (launch_short_rows_ce, _stats).
#include <algorithm>
#include <type_traits>

#include "device/backward.cuh"
#include "device/common.cuh"
#include "device/consumer_out.cuh"
#include "device/hopper.cuh"
#include "device/launch.hpp"
#include "families/short_rows/rule.hpp"

namespace softlight {
namespace {

// Short rows in 16-byte packs, one pack per lane and several rows per lane: a group of `group`
// lanes (at least the row's packs, at most a warp) holds a row, a warp 32 / group rows per load, so
// that each of a lane's R loads covers 512 contiguous bytes of the warp's R * 32 / group rows.
// Same arithmetic as rows_in_registers_kernel, R rows reduced side by side.
// G > 0 (16-bit rows): the group known at compile time, so that
// its butterflies unroll to their levels; and where the group has a lane for each of the R rows
// (G >= R), each row's log is taken on one lane of the group and passed to the others, one log a
// lane instead of R. What is written of a row is `out`'s (consumer_out.cuh): the log-softmax
// (LogSoftmaxOut), cross-entropy's gradient (CrossEntropyOut), or nothing but the statistics
// (RowStatsOut; with the moment where its kMoment is set, the group at run time).
template <class T, int R, int G, class Out>
__global__ void __launch_bounds__(kWarpRowsThreads)
short_rows_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys, int64_t rows, int vectors,
                  int group_arg, acc_t<T> scale, Out out) {
  using A = acc_t<T>;
  const int group = G > 0 ? G : group_arg;
  const int lane = threadIdx.x & 31;
  const int sub = lane & (group - 1);
  const int step = 32 / group;  // rows per load of a warp
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  const int64_t warp = int64_t{blockIdx.x} * (blockDim.x / 32) + (threadIdx.x >> 5);
  for (int64_t base = warp * step * R; base < rows; base += warps * step * R) {
    uint4 p[R][1];
    bool live[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t row = base + i * step + lane / group;
      live[i] = row < rows && sub < vectors;
      p[i][0] = live[i] ? reinterpret_cast<const uint4*>(x + row * xs)[sub] : neg_inf_pack<T>();
    }
    A m[R], sum[R], log_sum[R];
    if constexpr (Out::kMoment) {  // the statistics with the moment (packs_sum_moment's), nothing written
#pragma unroll
      for (int i = 0; i < R; ++i) m[i] = group_max(packs_max<T, 1>(p[i]), group);
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const Shift<A> k = shift_of(m[i], scale);
        A w;
        packs_exp_moment<T, 1>(p[i], k.e, sum[i], w);
        sum[i] = group_sum(sum[i], group);
        w = group_sum(w, group);
        const A s = sum[i] * k.r;
        const int64_t row = base + i * step + lane / group;
        out.row(row < rows ? row : rows - 1, m[i], s, k.k * (w - k.e.lo * sum[i]), log_acc(s), row < rows ? sub : -1,
                group);
      }
      continue;
    }
    if constexpr (G > 0) {
#pragma unroll
      for (int i = 0; i < R; ++i) m[i] = group_max<G>(packs_max<T, 1>(p[i]));
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const ShiftedExp<A> ex = shifted_exp(m[i], scale);
        sum[i] = group_sum<G>(packs_exp_sum<T, 1>(p[i], ex)) * exp_base(-ex.lo);
      }
      if constexpr (G >= R) {
        // Row i's sum is the same on every lane of the group: lane i takes its log for all.
        A mine = sum[0];
#pragma unroll
        for (int i = 1; i < R; ++i) mine = (sub & (R - 1)) == i ? sum[i] : mine;
        const A log_mine = log_acc(mine);
#pragma unroll
        for (int i = 0; i < R; ++i) log_sum[i] = __shfl_sync(0xffffffffu, log_mine, i, G);
      } else {
#pragma unroll
        for (int i = 0; i < R; ++i) log_sum[i] = log_acc(sum[i]);
      }
    } else {  // the group at run time: kept apart, as one path with the above changes its code (fp32)
#pragma unroll
      for (int i = 0; i < R; ++i) m[i] = group_max(packs_max<T, 1>(p[i]), group);
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const ShiftedExp<A> ex = shifted_exp(m[i], scale);
        sum[i] = group_sum(packs_exp_sum<T, 1>(p[i], ex), group) * exp_base(-ex.lo);
        log_sum[i] = log_acc(sum[i]);
      }
    }
    if constexpr (!Out::kGather) {
#pragma unroll
      for (int i = 0; i < R; ++i) opaque(p[i][0]);
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t row = base + i * step + lane / group;  // (a row past the last: the last's, no lane)
      const auto w = out.row(row < rows ? row : rows - 1, m[i], sum[i], log_sum[i], row < rows ? sub : -1, group);
      if constexpr (!Out::kGather)
        if (live[i]) w.pack(y + row * ys + sub * (16 / sizeof(T)), p[i][0], int64_t{sub} * (16 / sizeof(T)));
    }
  }
}

// short_rows_kernel for the plan's rows a lane, with the output O: the log-softmax's 16-bit rows as
// planned (four a lane, groups up to 8) with the group at compile time (fp32 rows of 32 ran 1.5 %
// slower so, and keep the group as an argument). The consumers' outputs take the planned rows a
// lane only (kShortRowsPerLane: consumer_rows_rule asks no other), the group at run time (at compile
// time, two of the statistics' 16-bit kernels spilled).
template <class T, class O, class Kernel> cudaError_t choose_short_rows(const Plan& p, Kernel& k) {
  if constexpr (!std::is_same_v<O, LogSoftmaxOut<T>>) {
    if (p.warp.rows_per_lane != kShortRowsPerLane) return cudaErrorInvalidValue;
    k = short_rows_kernel<T, kShortRowsPerLane, 0, O>;
    return cudaSuccess;
  } else {
    if constexpr (sizeof(T) == 2) {
      if (p.warp.rows_per_lane == kShortRowsPerLane && p.warp.group <= 8)
        return with_count(p.warp.group, [&](auto g) {
          k = short_rows_kernel<T, kShortRowsPerLane, decltype(g)::value, O>;
          return cudaSuccess;
        });
    }
    return with_count(p.warp.rows_per_lane, [&](auto n) {
      k = short_rows_kernel<T, decltype(n)::value, 0, O>;
      return cudaSuccess;
    });
  }
}

// The same backward for rows of at most 32 packs, a pack of each of R rows a lane (as the forward's
// short rows), so that each load of a warp covers 512 contiguous bytes where groups of fewer than
// eight lanes, several packs each, read runs of 32 or 64 bytes.
template <class T, int V, int R>
__global__ void __launch_bounds__(kWarpRowsThreads)
short_rows_backward_kernel(const T* __restrict__ dy, int64_t dys, const T* __restrict__ y, int64_t ys,
                           T* __restrict__ dx, int64_t dxs, int64_t rows, int cols, int group) {
  using A = acc_t<T>;
  const int lane = threadIdx.x & 31;
  const int e = (lane & (group - 1)) * V;
  const int span = 32 / group;  // rows one load of a warp covers
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  const int64_t warp = int64_t{blockIdx.x} * (blockDim.x / 32) + (threadIdx.x >> 5);
  for (int64_t base = warp * span * R; base < rows; base += warps * span * R) {
    T g[R][V], p[R][V];  // dy and y as loaded, every load issued before any is summed
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = base + r * span + lane / group;
      load_raw<T, V>(dy + row * dys + e, row < rows && e < cols, g[r]);
      load_raw<T, V>(y + row * ys + e, row < rows && e < cols, p[r]);
    }
    A s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      s[r] = 0;
      add_raw(s[r], g[r]);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = group_sum(s[r], group);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = base + r * span + lane / group;
      if (row < rows && e < cols) {
        A d[V];
        grad_pack(d, g[r], p[r], s[r]);
        store_pack<T, V>(dx + row * dxs + e, d);
      }
    }
  }
}

template <class T, class O>
cudaError_t launch_short(const Plan& p, const Call& a, const O& out, cudaStream_t stream) {
  using Kernel = void (*)(const T*, int64_t, T*, int64_t, int64_t, int, int, acc_t<T>, O);
  Kernel k = nullptr;
  if (const cudaError_t e = choose_short_rows<T, O>(p, k); e != cudaSuccess) return e;
  constexpr int V = 16 / sizeof(T);
  if (p.vec != V) return cudaErrorInvalidValue;
  k<<<static_cast<unsigned>(p.grid), p.threads, 0, stream>>>(static_cast<const T*>(a.x()), a.x_stride(),
                                                             static_cast<T*>(a.y()), a.y_stride(), a.rows(),
                                                             static_cast<int>(a.cols() / V), p.warp.group,
                                                             static_cast<acc_t<T>>(a.scale), out);
  return cudaGetLastError();
}

template <class T, int V>
cudaError_t launch_short_backward(const Plan& p, const Call& a, cudaStream_t stream) {
  return with_count(p.warp.rows_per_lane, [&](auto per_lane) {
    short_rows_backward_kernel<T, V, decltype(per_lane)::value>
        <<<static_cast<unsigned>(p.grid), p.threads, 0, stream>>>(
            static_cast<const T*>(a.in0), a.in0_s[0], static_cast<const T*>(a.in1), a.in1_s[0],
            static_cast<T*>(a.out), a.out_s[0], a.n[0], static_cast<int>(a.n[1]), p.warp.group);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t launch_short_rows(const Plan& p, const Call& a, cudaStream_t stream) {
  if (a.backward)
    return with_element_type_and_vec(a.dtype, p.vec, [&](auto tag, auto vec) {
      return launch_short_backward<decltype(tag), decltype(vec)::value>(p, a, stream);
    });
  return with_element_type(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    return launch_short<T>(p, a, LogSoftmaxOut<T>{static_cast<acc_t<T>>(a.scale), static_cast<acc_t<T>*>(a.lse)},
                           stream);
  });
}

cudaError_t launch_short_rows_ce(const Plan& p, const Call& a, const int64_t* target,
                                 const CrossEntropyArgs<float>& args, bool loss_only, cudaStream_t stream) {
  return with_cross_entropy_out(a, target, args, loss_only, [&](auto tag, const auto& out) {
    return launch_short<decltype(tag)>(p, a, out, stream);
  });
}

cudaError_t launch_short_rows_stats(const Plan& p, const Call& a, const ConsumerArgs<float>& args,
                                    cudaStream_t stream) {
  return with_row_stats_out(
      a, args, [&](auto tag, const auto& out) { return launch_short<decltype(tag)>(p, a, out, stream); });
}

}  // namespace softlight
