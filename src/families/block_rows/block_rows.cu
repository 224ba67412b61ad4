// block_rows: one CTA per row (grid-stride over rows), any alignment, any architecture from sm_80;
// rows whose x and y are equally misaligned are read in 16-byte vectors between a peeled head
// and tail.
// Resident: the row is copied into shared memory on its one DRAM read; max, sum and the output
// are then taken from shared memory. Streamed (row larger than shared memory): one pass keeps a
// running (max, sum) per thread, a second pass re-reads the row and writes it. The same rows write
// cross-entropy's gradient (launch_block_rows_ce).
#include "device/common.cuh"
#include "device/consumer_out.cuh"
#include "device/launch.hpp"
#include "families/block_rows/rule.hpp"

namespace softlight {
namespace {

constexpr int kBar = 1;  // named barrier id for the block reductions

// A row's layout: a peeled head of `head` elements (`peel`: x and y rows share their misalignment),
// `vectors` vectors of V elements, and a tail from `tail`; threads 0 .. V-1 hold the head's
// elements and threads V .. 2V-1 the tail's, one each (`edge`, -1 for none; its value ev), in a
// register across the passes.
template <class T, int V> struct BlockRow {
  int64_t head, vectors, tail, edge;
  acc_t<T> ev;
};

template <class T, int V> __device__ __forceinline__ BlockRow<T, V> block_row(const T* xr, int64_t cols, bool peel) {
  using A = acc_t<T>;
  int64_t head = 0;
  if (peel) {
    head = static_cast<int64_t>(((16 - (reinterpret_cast<uintptr_t>(xr) & 15)) & 15) / sizeof(T));
    if (head > cols) head = cols;
  }
  const int64_t vectors = (cols - head) / V;  // V > 1 only when aligned or peeled
  const int64_t tail = head + vectors * V;     // the tail starts here
  // This thread's element of the head or the tail, if any, and its value.
  const int t = threadIdx.x;
  const int64_t edge = t < head ? t : (t >= V && tail + (t - V) < cols && t < 2 * V) ? tail + (t - V) : -1;
  const A ev = edge >= 0 ? to_acc(xr[edge]) : neg_inf<A>();
  return {head, vectors, tail, edge, ev};
}

// The row's max and sum of exp((x - max) * scale) (f = exp_factor(scale)) over the CTA's `threads`
// threads into part (given as {-inf, 0}), xv the row's first vector. Resident: each vector copied
// into buf on its one DRAM read, max and sum then taken from shared memory. Streamed: a running
// (max, sum) per thread.
template <class T, int V>
__device__ __forceinline__ void block_row_max_sum(MaxSum<acc_t<T>>& part, const T* __restrict__ xv, T* buf,
                                                  const BlockRow<T, V>& b, bool resident, acc_t<T> f,
                                                  acc_t<T>* scratch, int threads) {
  using A = acc_t<T>;
  const int64_t vectors = b.vectors;
  if (resident) {
    A m = b.ev;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < vectors; i += threads) {
      A v[V];
      copy_pack<T, V>(buf + i * V, xv + i * V, v);
#pragma unroll
      for (int j = 0; j < V; ++j) m = max_acc(m, v[j]);
    }
    m = block_max(m, scratch, threads, kBar);
    A s = b.edge >= 0 ? exp_shifted(b.ev, m, f) : A(0);
    for (int64_t i = threadIdx.x; i < vectors; i += threads) {
      A v[V];
      load_pack<T, V>(buf + i * V, v);
#pragma unroll
      for (int j = 0; j < V; ++j) s += exp_shifted(v[j], m, f);
    }
    part = {m, block_sum(s, scratch, threads, kBar)};
  } else {
    if (b.edge >= 0) part = {b.ev, exp_shifted(b.ev, b.ev, f)};
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < vectors; i += threads) {
      A v[V];
      load_pack<T, V>(xv + i * V, v);
      A pm = part.m;
#pragma unroll
      for (int j = 0; j < V; ++j) pm = max_acc(pm, v[j]);
      A s = part.s * rescale(part.m, pm, f);
#pragma unroll
      for (int j = 0; j < V; ++j) s += exp_shifted(v[j], pm, f);
      part = {pm, s};
    }
    part = block_max_sum(part, scratch, threads, kBar, f);
  }
}

template <class T, int V>
__global__ void __launch_bounds__(1024)
block_rows_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys, int64_t rows,
                  int64_t cols, bool resident, bool peel, acc_t<T> scale, acc_t<T>* __restrict__ lse) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ A scratch[32];
  T* buf = reinterpret_cast<T*>(smem);
  const int threads = blockDim.x;
  // The max is of x and the sums are of exp((x - max) * scale) (see exp_shifted).
  const A f = exp_factor(scale);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * xs;
    T* yr = y + row * ys;
    const BlockRow<T, V> b = block_row<T, V>(xr, cols, peel);
    const T* xv = xr + b.head;
    T* yv = yr + b.head;
    MaxSum<A> part{neg_inf<A>(), A(0)};
    block_row_max_sum<T, V>(part, xv, buf, b, resident, f, scratch, threads);
    const A log_sum = log_acc(part.s);
    if (lse != nullptr && threadIdx.x == 0) lse[row] = part.m * scale + log_sum;
    if (b.edge >= 0) yr[b.edge] = from_acc<T>(log_softmax_out_scaled(b.ev, part.m, scale, log_sum));
    const T* src = resident ? buf : xv;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < b.vectors; i += threads) {
      A v[V];
      load_pack<T, V>(src + i * V, v);
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = log_softmax_out_scaled(v[j], part.m, scale, log_sum);
      store_pack<T, V>(yv + i * V, v);
    }
    __syncthreads();  // the buffer is refilled by the next row
  }
}

// A consumer's output (consumer_out.cuh; cross-entropy's gradient) written from the row as the
// log-softmax holds it: resident rows from shared memory, one DRAM read and one write (y may be
// x). 16-byte vectors are written whole (Out's pack), smaller ones element by element.
template <class T, int V, class Out>
__global__ void __launch_bounds__(1024)
block_rows_out_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys, int64_t rows, int64_t cols,
                      bool resident, bool peel, acc_t<T> scale, Out out) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ A scratch[32];
  T* buf = reinterpret_cast<T*>(smem);
  const int threads = blockDim.x;
  const A f = exp_factor(scale);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * xs;
    T* yr = y + row * ys;
    const BlockRow<T, V> b = block_row<T, V>(xr, cols, peel);
    const T* xv = xr + b.head;
    T* yv = yr + b.head;
    MaxSum<A> part{neg_inf<A>(), A(0)};
    block_row_max_sum<T, V>(part, xv, buf, b, resident, f, scratch, threads);
    const auto w = out.row(row, part.m, part.s, log_acc(part.s), threadIdx.x, threads);
    if (b.edge >= 0) yr[b.edge] = from_acc<T>(w.element(b.ev, b.edge));
    const T* src = resident ? buf : xv;
    for (int64_t i = threadIdx.x; i < b.vectors; i += threads) {
      if constexpr (V * sizeof(T) == 16) {
        w.pack(yv + i * V, *reinterpret_cast<const uint4*>(src + i * V), b.head + i * V);
      } else {
        A v[V];
        load_pack<T, V>(src + i * V, v);
#pragma unroll
        for (int j = 0; j < V; ++j) yv[i * V + j] = from_acc<T>(w.element(v[j], b.head + i * V + j));
      }
    }
    __syncthreads();  // the buffer is refilled by the next row
  }
}

// The kernel's shared memory past the default 48 KiB, where the plan asks it.
template <class K> cudaError_t allow_smem(K kernel, const Plan& p) {
  if (p.smem_bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(p.smem_bytes));
}

template <class T, int V>
cudaError_t launch(const Plan& p, const Call& a, cudaStream_t stream) {
  auto kernel = block_rows_kernel<T, V>;
  if (const cudaError_t e = allow_smem(kernel, p); e != cudaSuccess) return e;
  kernel<<<static_cast<unsigned>(p.grid), p.threads, p.smem_bytes, stream>>>(
      static_cast<const T*>(a.x()), a.x_stride(), static_cast<T*>(a.y()), a.y_stride(), a.rows(), a.cols(),
      p.resident, p.peel, static_cast<acc_t<T>>(a.scale), static_cast<acc_t<T>*>(a.lse));
  return cudaGetLastError();
}

template <class T, class O> cudaError_t launch_out(const Plan& p, const Call& a, const O& out, cudaStream_t stream) {
  return with_one_of<1, 16 / sizeof(T)>(p.vec, [&](auto vec) {
    auto kernel = block_rows_out_kernel<T, decltype(vec)::value, O>;
    if (const cudaError_t e = allow_smem(kernel, p); e != cudaSuccess) return e;
    kernel<<<static_cast<unsigned>(p.grid), p.threads, p.smem_bytes, stream>>>(
        static_cast<const T*>(a.x()), a.x_stride(), static_cast<T*>(a.y()), a.y_stride(), a.rows(), a.cols(),
        p.resident, p.peel, static_cast<acc_t<T>>(a.scale), out);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t launch_block_rows(const Plan& p, const Call& a, cudaStream_t stream) {
  return with_element_type_and_vec(a.dtype, p.vec, [&](auto tag, auto vec) {
    return launch<decltype(tag), decltype(vec)::value>(p, a, stream);
  });
}

cudaError_t launch_block_rows_ce(const Plan& p, const Call& a, const int64_t* target,
                                 const CrossEntropyArgs<float>& args, cudaStream_t stream) {
  return with_cross_entropy_out(a, target, args, false, [&](auto tag, const auto& out) -> cudaError_t {
    if constexpr (std::decay_t<decltype(out)>::kGather) return cudaErrorInvalidValue;  // (the gradient alone)
    else return launch_out<decltype(tag)>(p, a, out, stream);
  });
}

}  // namespace softlight
