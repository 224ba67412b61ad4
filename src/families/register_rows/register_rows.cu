// register_rows: rows held in registers by a group of lanes, up to a CTA. Rows in 16-byte packs under 32 KB:
// rows_in_registers_kernel, a group of up to a CTA of 1024 threads per row, the packs kept packed.
// Other rows of up to 256 vectors (8-byte packs where rows are aligned to 8 bytes only, or
// elements): warp_rows_kernel, a group of `group` lanes (a power of two, at most a warp) per row,
// ITERS vectors of V elements per lane, reducing with shuffles. One DRAM read, one write. Rows are
// walked warp by warp so that every lane of a warp stays in the shuffles even where the last rows
// run out. The kernels of rows in packs also write the consumers' outputs (consumer_out.cuh):
// cross-entropy's loss and gradient, and the row statistics (launch_register_rows_ce, _stats).
#include <algorithm>

#include "device/common.cuh"
#include "device/consumer_out.cuh"
#include "device/hopper.cuh"
#include "device/launch.hpp"
#include "families/register_rows/rule.hpp"

namespace softlight {
namespace {

template <class T, int V, int ITERS>
__global__ void __launch_bounds__(kWarpRowsThreads)
warp_rows_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys, int64_t rows,
                 int cols, int group, acc_t<T> scale, acc_t<T>* __restrict__ lse) {
  using A = acc_t<T>;
  const int lane = threadIdx.x & 31;
  const int sub = lane & (group - 1);
  const int rows_per_warp = 32 / group;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  const int64_t warp = int64_t{blockIdx.x} * (blockDim.x / 32) + (threadIdx.x >> 5);
  const A f = exp_factor(scale);  // the max is of x, the sum of exp((x - max) * scale)
  for (int64_t base = warp * rows_per_warp; base < rows; base += warps * rows_per_warp) {
    const int64_t row = base + lane / group;
    const bool live = row < rows;
    const T* xr = x + row * xs;
    A v[ITERS][V];
    A m = neg_inf<A>();
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int e = (i * group + sub) * V;
      if (live && e < cols) {
        load_pack<T, V>(xr + e, v[i]);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) v[i][j] = neg_inf<A>();
      }
#pragma unroll
      for (int j = 0; j < V; ++j) m = max_acc(m, v[i][j]);
    }
    m = group_max(m, group);
    A s = 0;
#pragma unroll
    for (int i = 0; i < ITERS; ++i)
#pragma unroll
      for (int j = 0; j < V; ++j) s += exp_shifted(v[i][j], m, f);
    s = group_sum(s, group);
    const A log_sum = log_acc(s);
    if (lse != nullptr && live && sub == 0) lse[row] = m * scale + log_sum;
    T* yr = y + row * ys;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int e = (i * group + sub) * V;
      if (live && e < cols) {
#pragma unroll
        for (int j = 0; j < V; ++j) v[i][j] = log_softmax_out_scaled(v[i][j], m, scale, log_sum);
        store_pack<T, V>(yr + e, v[i]);
      }
    }
  }
}

// Rows read in 16-byte packs, kept packed in registers (four registers per pack, where the
// unpacked values of 16-bit rows would take eight): the max of x over packed pairs, one fused
// multiply-add per exp, then what `out` makes of the row (consumer_out.cuh): y = (x - max) * scale -
// log(sum) (LogSoftmaxOut, see shifted_exp), cross-entropy's loss and gradient (CrossEntropyOut), or
// the statistics alone (RowStatsOut: nothing written; with the moment where its kMoment is set). A
// group of up to 1024 threads holds a row: up to a warp, as warp_rows_kernel; beyond, the CTA is the
// group and reduces through shared memory. Rows are walked unit by unit (a warp, or the CTA) so that
// every thread of a unit stays in its reductions even where the last rows run out.
// Peel: rows off 16 bytes, x and y off alike (odd lengths in a contiguous array); `length` is the
// row in elements, not packs. The packs are the 16-byte blocks that end in the row. The row's
// elements in the blocks it starts and ends inside (fewer than V each) take one of two forms, by
// what each measured fastest:
//   Lanes (four packs a thread): an element each on the group's threads 0 to 2V - 1, one warp-wide
//     load and store (the planner gives peeled rows groups of at least 2V threads). The kernels
//     take 6-9 registers fewer, which at four packs lifts the CTAs an SM holds;
//   Blocks (five packs, where the registers saved lift no CTA and the lanes measured slower): the
//     two blocks whole on threads 0 and 1, block 0 as its first pack and the last as an extra pack
//     (-inf elsewhere), cut to the row and written element by element.
template <class T, int ITERS, bool Peel, class Out>
__device__ __forceinline__ void rows_in_registers(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys,
                                                  int64_t rows, int length, int group, acc_t<T> scale,
                                                  const Out& out) {
  using A = acc_t<T>;
  constexpr int V = 16 / sizeof(T);
  constexpr bool Lanes = Peel && ITERS == 4;
  constexpr bool Blocks = Peel && !Lanes;
  constexpr int N = Blocks ? ITERS + 1 : ITERS;
  constexpr bool Moment = Out::kMoment;
  __shared__ A scratch[32];
  const int unit = group > 32 ? group : 32;
  const int sub = threadIdx.x & (group - 1);
  const int rows_per_unit = unit / group;
  const int64_t units = int64_t{gridDim.x} * (blockDim.x / unit);
  const int64_t first = int64_t{blockIdx.x} * (blockDim.x / unit) + threadIdx.x / unit;
  for (int64_t base = first * rows_per_unit; base < rows; base += units * rows_per_unit) {
    const int64_t row = base + (threadIdx.x & (unit - 1)) / group;
    const bool live = row < rows;
    const T* xe = x + row * xs;
    // A peeled row as the 16-byte blocks it touches: block k holds elements [k * V - lead,
    // (k + 1) * V - lead). Blocks: block 0 cut to the row by thread 0, the block the row ends inside
    // loaded by thread 1 as p[ITERS]; the first row's first block and the last row's last, which
    // could leave the array, loaded element by element. Lanes: block 0 and the block the row ends
    // inside as elements, thread sub < V holding element sub - lead of the first, thread V + j
    // element j of the last.
    const int lead = Peel ? lead_elements(xe) : 0;
    const int vectors = Peel ? (lead + length) / V : length;
    const int tail = Peel ? (lead + length) % V : 0;
    const T* xb = xe - lead;
    const uint4* xr = reinterpret_cast<const uint4*>(xb);
    const bool head_thread = Blocks && live && sub == 0 && lead > 0;
    const bool tail_thread = Blocks && live && sub == 1 && tail > 0;
    const int first_pack = Lanes && lead > 0 ? 1 : 0;  // Lanes: block 0 as elements
    int edge = -1;  // Lanes: this thread's edge element in the row, if any
    if (Lanes && live) {
      if (sub < V) {
        if (lead > 0 && sub >= lead) edge = sub - lead;
      } else if (sub < 2 * V && sub - V < tail) {
        edge = vectors * V - lead + sub - V;
      }
    }
    uint4 p[N];
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int e = i * group + sub;
      p[i] = live && e < vectors && (i > 0 || !(head_thread && row == 0)) && (!Lanes || e >= first_pack)
                 ? xr[e]
                 : neg_inf_pack<T>();
    }
    if constexpr (Blocks) {
      p[ITERS] = tail_thread && row < rows - 1 ? xr[vectors] : neg_inf_pack<T>();
      if (head_thread) p[0] = cut_block(xb, p[0], lead, V, row == 0);
      if (tail_thread) p[ITERS] = cut_block(xb + vectors * V, p[ITERS], 0, tail, row == rows - 1);
    }
    // The edge element's load after the packs' (the warp sync keeps ptxas from hoisting it above
    // them): hoisted, it was converted before the last packs' loads issued where registers were
    // short, and the warp waited a whole load before loading the rest.
    if constexpr (Lanes) __syncwarp();
    const A ev = edge >= 0 ? to_acc(xe[edge]) : neg_inf<A>();
    A m = packs_max<T, N>(p);
    if constexpr (Lanes) m = max_acc(m, ev);
    m = group > 32 ? block_max(m, scratch, group, 1) : group_max(m, group);
    A s, t;
    if constexpr (Moment) {  // the sums of e = exp_base(u) and e u (packs_sum_moment's), then the partial's
      const Shift<A> k = shift_of(m, scale);
      A w;
      packs_exp_moment<T, N>(p, k.e, s, w);
      if constexpr (Lanes) {
        const A d = fma(ev, k.e.f, -k.e.hi), e = exp_base(d);
        s += e;
        w = fma(e, max_acc(d, -std::numeric_limits<A>::max()), w);
      }
      s = group > 32 ? block_sum(s, scratch, group, 1) : group_sum(s, group);
      w = group > 32 ? block_sum(w, scratch, group, 1) : group_sum(w, group);
      t = k.k * (w - k.e.lo * s);
      s *= k.r;
    } else {
      const ShiftedExp<A> ex = shifted_exp(m, scale);
      s = packs_exp_sum<T, N>(p, ex);
      if constexpr (Lanes) s += exp_base(fma(ev, ex.f, -ex.hi));
      s = (group > 32 ? block_sum(s, scratch, group, 1) : group_sum(s, group)) * exp_base(-ex.lo);
    }
    const A log_sum = log_acc(s);
    // A row past the last one: the last row's, no lane of it, and nothing written.
    const int64_t r = live ? row : rows - 1;
    const int lane = live ? sub : -1;
    const auto w = [&] {
      if constexpr (Moment) return out.row(r, m, s, t, log_sum, lane, group);
      else return out.row(r, m, s, log_sum, lane, group);
    }();
    if constexpr (!Out::kGather) {
      T* ye = y + row * ys;
      T* yb = ye - lead;  // y's blocks: y is off 16 bytes as x is
      // Unpacked again below: kept from the sum instead, the values of 16-bit rows would double the
      // registers of the packs and halve the warps resident.
#pragma unroll
      for (int i = 0; i < ITERS; ++i) opaque(p[i]);
#pragma unroll
      for (int i = 0; i < ITERS; ++i) {
        const int e = i * group + sub;
        if (i == 0 && head_thread)
          w.part(yb, p[0], lead, V, -lead);
        else if (live && e < vectors && (!Lanes || e >= first_pack))
          w.pack(yb + e * V, p[i], int64_t{e} * V - lead);
      }
      if (tail_thread) w.part(yb + vectors * V, p[ITERS], 0, tail, int64_t{vectors} * V - lead);
      if (edge >= 0) ye[edge] = from_acc<T>(w.element(ev, edge));
    }
  }
}

template <class T, int ITERS, bool Peel = false>
__global__ void __launch_bounds__(1024)
rows_in_registers_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys, int64_t rows,
                         int length, int group, acc_t<T> scale, acc_t<T>* __restrict__ lse) {
  rows_in_registers<T, ITERS, Peel>(x, xs, y, ys, rows, length, group, scale, LogSoftmaxOut<T>{scale, lse});
}

// Cross-entropy's loss, lse and gradient in place of y (which may be x): the row held in registers
// between its read and the gradient's write.
template <class T, int ITERS, bool Peel>
__global__ void __launch_bounds__(1024)
rows_in_registers_ce_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ grad, int64_t gs, int64_t rows,
                            int length, int group, acc_t<T> scale, CrossEntropyOut<T> out) {
  rows_in_registers<T, ITERS, Peel>(x, xs, grad, gs, rows, length, group, scale, out);
}

// An output that writes none of the row's elements (Out::kGather: the row's statistics, or
// cross-entropy's loss alone; y is x, not written).
template <class T, int ITERS, bool Peel, class Out>
__global__ void __launch_bounds__(1024)
rows_in_registers_gather_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys, int64_t rows,
                                int length, int group, acc_t<T> scale, Out out) {
  rows_in_registers<T, ITERS, Peel>(x, xs, y, ys, rows, length, group, scale, out);
}

// The kernels of each output, by packs a thread and peel.
template <class T> struct LogSoftmaxKernels {
  template <int I, bool P> static auto kernel() { return rows_in_registers_kernel<T, I, P>; }
};
template <class T> struct CrossEntropyKernels {
  template <int I, bool P> static auto kernel() { return rows_in_registers_ce_kernel<T, I, P>; }
};
template <class T, class Out> struct GatherKernels {
  template <int I, bool P> static auto kernel() { return rows_in_registers_gather_kernel<T, I, P, Out>; }
};

// Rows in 16-byte packs in registers: plan.warp.iters packs a thread (4 or 5 where peeled), groups
// of plan.warp.group threads; K the kernels of the output `out` (lse for the log-softmax). A plan of
// other packs (warp_rows_kernel's) is refused.
template <class K, class T, class O>
cudaError_t launch_packed(const Plan& p, const Call& a, O out, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  if (p.vec != V) return cudaErrorInvalidValue;
  using Kernel = void (*)(const T*, int64_t, T*, int64_t, int64_t, int, int, acc_t<T>, O);
  Kernel k = nullptr;
  cudaError_t chosen;
  if (p.peel) {
    if constexpr (sizeof(T) <= 4)  // the planner peels fp32 and 16-bit rows only
      chosen = with_one_of<4, 5>(p.warp.iters, [&](auto n) {  // the edge's pack more: six spilled
        k = K::template kernel<decltype(n)::value, true>();
        return cudaSuccess;
      });
    else
      chosen = cudaErrorInvalidValue;
  } else
    chosen = with_one_of<1, 2, 3, 4, 5, 6, 7, 8>(p.warp.iters, [&](auto n) {  // fitted to the row
      k = K::template kernel<decltype(n)::value, false>();
      return cudaSuccess;
    });
  if (chosen != cudaSuccess) return chosen;
  const int length = static_cast<int>(p.peel ? a.cols() : a.cols() / V);
  k<<<static_cast<unsigned>(p.grid), p.threads, 0, stream>>>(static_cast<const T*>(a.x()), a.x_stride(),
                                                             static_cast<T*>(a.y()), a.y_stride(), a.rows(), length,
                                                             p.warp.group, static_cast<acc_t<T>>(a.scale), out);
  return cudaGetLastError();
}

template <class T, int V>
cudaError_t launch_iters(const Plan& p, const Call& a, cudaStream_t stream) {
  // Rows in 16-byte packs go to rows_in_registers_kernel, which takes the row length in packs (in
  // elements where peeled); the rest to warp_rows_kernel, in elements.
  if constexpr (sizeof(T) * V == 16) {
    return launch_packed<LogSoftmaxKernels<T>, T>(p, a, static_cast<acc_t<T>*>(a.lse), stream);
  } else {
    using Kernel = void (*)(const T*, int64_t, T*, int64_t, int64_t, int, int, acc_t<T>, acc_t<T>*);
    Kernel k = nullptr;
    const cudaError_t chosen = with_count(p.warp.iters, [&](auto n) {
      k = warp_rows_kernel<T, V, decltype(n)::value>;
      return cudaSuccess;
    });
    if (chosen != cudaSuccess) return chosen;
    k<<<static_cast<unsigned>(p.grid), p.threads, 0, stream>>>(
        static_cast<const T*>(a.x()), a.x_stride(), static_cast<T*>(a.y()), a.y_stride(), a.rows(),
        static_cast<int>(a.cols()), p.warp.group, static_cast<acc_t<T>>(a.scale), static_cast<acc_t<T>*>(a.lse));
    return cudaGetLastError();
  }
}

}  // namespace

// The backward (register_rows_backward.cu).
cudaError_t launch_register_rows_backward(const Plan& p, const Call& a, cudaStream_t stream);

cudaError_t launch_register_rows(const Plan& p, const Call& a, cudaStream_t stream) {
  if (a.backward) return launch_register_rows_backward(p, a, stream);
  return with_element_type_and_vec<true>(a.dtype, p.vec, [&](auto tag, auto vec) {
    return launch_iters<decltype(tag), decltype(vec)::value>(p, a, stream);
  });
}

cudaError_t launch_register_rows_ce(const Plan& p, const Call& a, const int64_t* target,
                                    const CrossEntropyArgs<float>& args, bool loss_only, cudaStream_t stream) {
  return with_cross_entropy_out(a, target, args, loss_only, [&](auto tag, const auto& out) {
    using T = decltype(tag);
    using O = std::decay_t<decltype(out)>;
    if constexpr (O::kGather) return launch_packed<GatherKernels<T, O>, T>(p, a, out, stream);
    else return launch_packed<CrossEntropyKernels<T>, T>(p, a, out, stream);
  });
}

cudaError_t launch_register_rows_stats(const Plan& p, const Call& a, const ConsumerArgs<float>& args,
                                       cudaStream_t stream) {
  return with_row_stats_out(a, args, [&](auto tag, const auto& out) {
    using T = decltype(tag);
    return launch_packed<GatherKernels<T, std::decay_t<decltype(out)>>, T>(p, a, out, stream);
  });
}

}  // namespace softlight
