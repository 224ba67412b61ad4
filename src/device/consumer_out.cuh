// What a rows kernel writes for a row's elements once it has the row's max and log-sum: the
// log-softmax (LogSoftmaxOut), cross-entropy's gradient with the row's loss (CrossEntropyOut,
// docs/consumers.md), or nothing but the row's statistics (RowStatsOut). A kernel calls
// row(r, m, s, log_sum, lane, lanes) once a row, s the sum of exp((x - m) * scale) and log_sum its
// log, lane the thread's place among the `lanes` threads that write the row's own values (-1 for
// the others; lane 0 is the leader), and writes each 16-byte block of the row through what it
// returns: pack(dst, p, col[, evict_first]) a whole block, part(dst, p, lo, hi, col) its elements
// [lo, hi); col is the row's column of the block's element 0. element(v, col) is one element's output.
// kGather: the output writes nothing of the row's elements and its row() needs the statistics only
// where lane >= 0 (a kernel may then collect them in one CTA alone).
#pragma once

#include <cstdint>

#include "device/dispatch.cuh"
#include "device/launch.hpp"
#include "device/packs.cuh"

namespace softlight {

// scaled_difference(v, m, sc, 1) with the row's halving h and factor c hoisted: fma(v, h, -m h) * c.
template <class A> struct Difference {
  A h, mh, c;
  __device__ __forceinline__ Difference(A m, A sc) {
    const bool halve = sc < A(1);
    h = halve ? A(0.5) : A(1);
    mh = m * h;
    c = halve ? sc + sc : sc;
  }
  __device__ __forceinline__ A operator()(A v) const { return fma(v, h, -mh) * c; }
};

template <class T> struct LogSoftmaxOut {
  using A = acc_t<T>;
  static constexpr bool kMoment = false, kGather = false;
  A scale;
  A* lse;  // the row's log-sum-exp, where asked
  struct Row {
    A m, scale, log_sum;
    __device__ __forceinline__ void pack(T* dst, uint4 p, int64_t, bool evict_first = false) const {
      store_log_softmax_pack<T>(dst, p, m, scale, log_sum, evict_first);
    }
    __device__ __forceinline__ void part(T* dst, uint4 p, int lo, int hi, int64_t) const {
      store_log_softmax_part(dst, p, lo, hi, m, scale, log_sum);
    }
    __device__ __forceinline__ A element(A v, int64_t) const { return log_softmax_out_scaled(v, m, scale, log_sum); }
  };
  __device__ __forceinline__ Row row(int64_t r, A m, A, A log_sum, int lane, int) const {
    if (lse != nullptr && lane == 0) lse[r] = m * scale + log_sum;
    return {m, scale, log_sum};
  }
};

// Cross-entropy without label smoothing: the row's loss (into a.losses, or a.loss without a
// reduction) and lse, and its gradient for an upstream gradient of 1 (of the mean: 1 / *a.count),
// (softmax - onehot(target)) * g * (1 + 2 z lse) * scale, the target's term where the block holds
// it. A target outside the row gives a NaN loss and gradient row; an ignored one 0. As
// consumer_rows.cu's cross_entropy_kernel computes them. The loss is written by the thread that
// writes the target's element, from the logit it holds: nothing of x is read after the row's first
// read, so the gradient may be x itself.
template <class T> struct CrossEntropyOut {
  using A = acc_t<T>;
  static constexpr bool kMoment = false, kGather = false;
  int64_t cols;
  const int64_t* target;
  A scale;
  CrossEntropyArgs<A> a;
  // An element's gradient: softmax * ca * scale = exp_base(fma(v, f, -hi)) * k (shifted_exp of the
  // row's max: the sum's exps again, k holding exp_base(-lo) / s), less g1 at the target.
  struct Row {
    A f, hi, k, g1, none;
    int64_t t;
    bool skip;
    // The loss from the target's logit v: base (log_sum + z lse^2) less v's scaled difference from
    // the row's max, into *at (a double where reduced).
    A shift, sc;
    double base;
    void* at;
    bool wide;
    __device__ __forceinline__ A value(A v) const { return exp_base(fma(v, f, -hi)) * k; }
    __device__ __forceinline__ void loss(A v) const {
      const double l = base - scaled_difference(static_cast<double>(v), static_cast<double>(shift),
                                                static_cast<double>(sc), 1.0);
      if (wide) *static_cast<double*>(at) = l;
      else *static_cast<A*>(at) = static_cast<A>(l);
    }
    __device__ __forceinline__ void pack(T* dst, uint4 p, int64_t col, bool evict_first = false) const {
      constexpr int V = 16 / sizeof(T);
      const uint64_t at_ = static_cast<uint64_t>(t - col);  // the target's place in the block, if it is there
      const bool here = !skip && at_ < uint64_t{V};
      if (here) loss(pack_element<T>(p, static_cast<int>(at_)));
      A v[V];
      unpack<T, V>(p, v);
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = skip ? none : value(v[j]);
      if (here) {
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] -= j == static_cast<int>(at_) ? g1 : A(0);
      }
      store_pack<T, V>(dst, v, evict_first);
    }
    __device__ __forceinline__ void part(T* dst, uint4 p, int lo, int hi_, int64_t col) const {
      constexpr int V = 16 / sizeof(T);
      A v[V];
      unpack<T, V>(p, v);
#pragma unroll
      for (int k = 0; k < V; ++k)
        if (k >= lo && k < hi_) dst[k] = from_acc<T>(element(v[k], col + k));
    }
    __device__ __forceinline__ A element(A v, int64_t col) const {
      if (skip) return none;
      if (col != t) return value(v);
      loss(v);
      return value(v) - g1;
    }
  };
  __device__ __forceinline__ Row row(int64_t r, A m, A s, A log_sum, int lane, int) const {
    const double g = a.mean ? (*a.count > 0 ? 1.0 / static_cast<double>(*a.count) : 0.0) : 1.0;
    const int64_t t = target[r];
    const bool ignored = a.ignore && t == a.ignore_index;
    const bool bad = !ignored && (t < 0 || t >= cols);
    const A shift = m == neg_inf<A>() ? A(0) : m;
    const double ls = log_sum;
    const double lse = static_cast<double>(shift) * static_cast<double>(scale) + ls;
    void* const at = a.reduce ? static_cast<void*>(a.losses + r) : static_cast<void*>(a.loss + r);
    if (lane == 0) {  // the leader: the lse, and the loss of a row without a target in it
      if (ignored || bad) {
        if (a.reduce) a.losses[r] = bad ? NAN : 0.0;
        else a.loss[r] = bad ? A(NAN) : A(0);
      }
      if (a.lse) a.lse[r] = m * scale + log_sum;
    }
    const ShiftedExp<A> e = shifted_exp(m, scale);
    const A ca = static_cast<A>(g * (1.0 + 2.0 * a.z_loss * lse));
    return {e.f, e.hi, exp_base(-e.lo) * (ca * scale) / s, static_cast<A>(g) * scale, bad ? A(NAN) : A(0), t,
            ignored || bad, shift, scale, ls + (a.z_loss == 0.0 ? 0.0 : a.z_loss * lse * lse), at, a.reduce};
  }
};

// Cross-entropy's loss and lse alone, no gradient (an evaluation's loss): nothing of the row's
// elements is written (kGather), and the leader writes what CrossEntropyOut's row writes, the loss
// of a row that keeps its target from the target's logit read again (the same bits as the gradient's
// call, whose writer of the target's element computes it from the same logit).
template <class T> struct CrossEntropyLossOut {
  using A = acc_t<T>;
  static constexpr bool kMoment = false, kGather = true;
  CrossEntropyOut<T> ce;
  const T* x;
  int64_t xs;
  struct Row {
    __device__ __forceinline__ void pack(T*, uint4, int64_t) const {}
    __device__ __forceinline__ void part(T*, uint4, int, int, int64_t) const {}
  };
  __device__ __forceinline__ Row row(int64_t r, A m, A s, A log_sum, int lane, int lanes) const {
    if (lane != 0) return {};
    const typename CrossEntropyOut<T>::Row w = ce.row(r, m, s, log_sum, lane, lanes);
    if (!w.skip) w.loss(to_acc(x[r * xs + w.t]));
    return {};
  }
};

// Calls launch(T{}, out) for the rows of call a (x, their gradient in y), T the element type of
// a.dtype, out a CrossEntropyOut<T>, or where loss_only a CrossEntropyLossOut<T> (y is x, not
// written); float64 rows have no such output (consumer_rows.cu takes them).
template <class F>
cudaError_t with_cross_entropy_out(const Call& a, const int64_t* target, const CrossEntropyArgs<float>& args,
                                   bool loss_only, F&& launch) {
  return with_element_type(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (sizeof(T) == 8) {
      return cudaErrorInvalidValue;
    } else {
      const CrossEntropyOut<T> out{a.cols(), target, static_cast<float>(a.scale), args};
      if (loss_only) return launch(tag, CrossEntropyLossOut<T>{out, static_cast<const T*>(a.x()), a.x_stride()});
      return launch(tag, out);
    }
  });
}

// Row r's picked logits and log-probs of its tokens (a.picked, a.logprobs; tokens q = first, first +
// step, ...), xr the row, shift its max (0 for a row of -inf), sc the scale, log_sum its log-sum. A
// token outside the row picks 0 from a shard, and NaN otherwise: a call already queued cannot refuse
// it (the CPU entries do). (References and the callers' index type: the kernels compile as they did
// with the loop written in each.)
template <class T, class A, class I>
__device__ __forceinline__ void pick_tokens(const ConsumerArgs<A>& a, const T* xr, int64_t r, const int64_t& cols,
                                            const A& shift, const A& sc, const A& log_sum, I first, I step) {
  for (int64_t q = first; q < a.count; q += step) {
    const int64_t token = a.index[r * a.index_stride + q];
    const int64_t j = token - a.offset;
    const bool inside = token >= a.offset && j < cols;
    const A none = a.shard ? A(0) : A(NAN);
    const A v = inside ? to_acc(xr[j]) : A(0);
    if (a.picked) a.picked[r * a.count + q] = inside ? v * sc : none;
    if (a.logprobs) a.logprobs[r * a.count + q] = inside ? scaled_difference(v, shift, sc, A(1)) - log_sum : none;
  }
}

// The statistics of a row that its max and sum give, and no element written (row_stats without the
// row's sum): lse, max and sumexp from the leader, each token's picked logit and log-prob over the
// lanes; where Moment, the entropy and the moment too (the row(r, m, s, t, ...) form). As
// consumer_rows.cu's row_stats_kernel computes them (a token outside the row picks 0 from a shard,
// NaN otherwise).
template <class T, bool Moment = false> struct RowStatsOut {
  using A = acc_t<T>;
  static constexpr bool kMoment = Moment, kGather = true;
  const T* x;
  int64_t xs, cols;
  A scale;
  ConsumerArgs<A> a;
  struct Row {
    __device__ __forceinline__ void pack(T*, uint4, int64_t) const {}
    __device__ __forceinline__ void part(T*, uint4, int, int, int64_t) const {}
  };
  __device__ __forceinline__ Row row(int64_t r, A m, A s, A log_sum, int lane, int lanes) const {
    if (lane < 0) return {};
    const A shift = m == neg_inf<A>() ? A(0) : m;
    if (lane == 0) {
      const A mz = m * scale;
      if (a.lse) a.lse[r] = mz + log_sum;
      if (a.max) a.max[r] = mz;
      if (a.sumexp) a.sumexp[r] = s;
    }
    pick_tokens(a, x + r * xs, r, cols, shift, scale, log_sum, lane, lanes);
    return {};
  }
  __device__ __forceinline__ Row row(int64_t r, A m, A s, A t, A log_sum, int lane, int lanes) const {
    if (lane == 0) {
      if (a.entropy) a.entropy[r] = log_sum - t / s;
      if (a.moment) a.moment[r] = t;
    }
    return row(r, m, s, log_sum, lane, lanes);
  }
};

// Calls launch(T{}, RowStatsOut<T, Moment>{...}) for the rows of call a (x; nothing written), T the
// element type of a.dtype, with the moment where the entropy or the moment is asked; float64 rows
// have no such output (consumer_rows.cu takes them).
template <class F>
cudaError_t with_row_stats_out(const Call& a, const ConsumerArgs<float>& args, F&& launch) {
  return with_element_type(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (sizeof(T) == 8) {
      return cudaErrorInvalidValue;
    } else {
      const auto out = [&](auto moment) {
        return RowStatsOut<T, decltype(moment)::value>{static_cast<const T*>(a.x()), a.x_stride(), a.cols(),
                                                       static_cast<float>(a.scale), args};
      };
      return args.entropy || args.moment ? launch(tag, out(std::true_type{})) : launch(tag, out(std::false_type{}));
    }
  });
}

}  // namespace softlight
