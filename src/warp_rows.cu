// warp_rows: rows held in registers. Rows in 16-byte packs up to 128 bytes: short_rows_kernel, a
// lane holding a pack of each of several rows. Longer rows in 16-byte packs under 32 KB:
// rows_in_registers_kernel, a group of up to a CTA of 1024 threads per row, the packs kept packed.
// Short contiguous rows not in 16-byte packs: flat_rows_kernel, tiles through shared memory. Other
// rows of up to 256 vectors (8-byte packs where rows are aligned to 8 bytes only, or elements):
// warp_rows_kernel, a group of `group` lanes (a power of two, at most a warp) per row, ITERS vectors
// of V elements per lane, reducing with shuffles. On Hopper, rows past one CTA's registers (in
// 16-byte packs, or off 16 bytes alike in x and y, peeled): register_cluster_kernel, a row in the
// registers of a cluster of CTAs. One DRAM read, one write. Rows are walked warp by warp so that
// every lane of a warp stays in the shuffles even where the last rows run out.
#include <cuda_pipeline.h>

#include <algorithm>

#include "common.cuh"
#include "hopper.cuh"
#include "kernels.hpp"

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
// multiply-add per exp, y = (x - max) * scale - log(sum) (see shifted_exp). A group of up to 1024
// threads holds a row: up to a warp, as warp_rows_kernel; beyond, the CTA is the group and reduces
// through shared memory. Rows are walked unit by unit (a warp, or the CTA) so that every thread of
// a unit stays in its reductions even where the last rows run out.
// Peel: rows off 16 bytes, x and y off alike (odd lengths in a contiguous array); `length` is the
// row in elements, not packs. The packs are the 16-byte blocks that end in the row. The row's
// elements in the blocks it starts and ends inside (fewer than V each) take one of two forms, by
// what each measured fastest (docs/design.md, "A peeled row's edges over lanes"):
//   Lanes (four packs a thread): an element each on the group's threads 0 to 2V - 1, one warp-wide
//     load and store (the planner gives peeled rows groups of at least 2V threads). The kernels
//     take 6-9 registers fewer, which at four packs lifts the CTAs an SM holds;
//   Blocks (five packs, where the registers saved lift no CTA and the lanes measured slower): the
//     two blocks whole on threads 0 and 1, block 0 as its first pack and the last as an extra pack
//     (-inf elsewhere), cut to the row and written element by element.
template <class T, int ITERS, bool Peel = false>
__global__ void __launch_bounds__(1024)
rows_in_registers_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys, int64_t rows,
                         int length, int group, acc_t<T> scale, acc_t<T>* __restrict__ lse) {
  using A = acc_t<T>;
  constexpr int V = 16 / sizeof(T);
  constexpr bool Lanes = Peel && ITERS == 4;
  constexpr bool Blocks = Peel && !Lanes;
  constexpr int N = Blocks ? ITERS + 1 : ITERS;
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
    const ShiftedExp<A> ex = shifted_exp(m, scale);
    A s = packs_exp_sum<T, N>(p, ex);
    if constexpr (Lanes) s += exp_base(fma(ev, ex.f, -ex.hi));
    s = (group > 32 ? block_sum(s, scratch, group, 1) : group_sum(s, group)) * exp_base(-ex.lo);
    const A log_sum = log_acc(s);
    if (lse != nullptr && live && sub == 0) lse[row] = m * scale + log_sum;
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
        store_log_softmax_part(yb, p[0], lead, V, m, scale, log_sum);
      else if (live && e < vectors && (!Lanes || e >= first_pack))
        store_log_softmax_pack<T>(yb + e * V, p[i], m, scale, log_sum);
    }
    if (tail_thread) store_log_softmax_part(yb + vectors * V, p[ITERS], 0, tail, m, scale, log_sum);
    if (edge >= 0) ye[edge] = from_acc<T>(log_softmax_out_scaled(ev, m, scale, log_sum));
  }
}

// Rows in registers over a cluster (Hopper): rows too long for one CTA's registers, one row to a
// cluster of C CTAs (the grid is rows * C CTAs, not persistent), CTA k holding packs
// [k * span, (k + 1) * span) of the row, ITERS a thread. Each thread reduces its packs to a
// (max, sum) pair, the CTA merges its threads' pairs (shuffles, then the warps' pairs through
// shared memory) and sends its pair into every CTA's shared memory with st.async, completing on
// that CTA's mbarrier; each CTA waits there for the C pairs, merges them and writes its share of y
// from its registers. One read and one write. No cluster barrier per row (its release is a memory
// fence that waits for the CTA's outstanding accesses, and took 2.5 cycles of every issued
// instruction: docs/design.md, "Rows in registers over a cluster"), only one at the start, so that
// no pair reaches a CTA before its mbarrier is initialised. The SM overlaps the loads, exchanges
// and stores of the several CTAs it holds and takes a new one as each ends.
// Peel: rows off 16 bytes, x and y off alike (rows of 50 257). The packs are the 16-byte blocks the
// row touches, block k holding row elements [k * V - lead, (k + 1) * V - lead), `lead` the elements
// before the row in its first block: the blocks that end in the row are the cluster's packs, block 0
// cut to the row by CTA 0's thread 0; the block the row ends inside (if any) is loaded with the
// packs by CTA 0's thread 1, which folds its part in. Each writes its block's part element by
// element. So no load waits after the reduction on CTA 0, whose pair the whole cluster waits for:
// the edges loaded one by one after it cost 4-6 % at rows of 50 257 16-bit (docs/design.md, "A
// peeled row's edges as blocks"). Where a block would leave the array (the first row's first
// block, the last row's last), its part of the row is loaded element by element.
// Bounded (Plan::bounded; register_cluster_bounded_kernel): 64 registers a thread, the packs
// unpacked again for y. CTAs of 256 threads, four to an SM: bf16 took 79 registers and three CTAs,
// 4-11 % slower than fp16 at the same bytes. CTAs of 128 threads, eight to an SM, for 16-bit rows in
// packs that do not start on 128 bytes (bf16 rows of 50 264: six CTAs of 80 registers, 8 % slower).
// Other CTAs of 128 threads keep the compiler's choice (register_cluster_kernel), which was 2 %
// faster in bf16 rows on 128 bytes than the bound.
template <class T, int ITERS, bool Peel, bool Bounded>
__device__ __forceinline__ void register_cluster_row(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys,
                                                     int cols, int span, acc_t<T> scale, acc_t<T>* __restrict__ lse) {
#ifdef SOFTLIGHT_HOPPER
  using A = acc_t<T>;
  constexpr int V = 16 / sizeof(T);
  __shared__ MaxSum<A> warp_pairs[kRegisterClusterMaxThreads / 32];
  __shared__ alignas(16) MaxSum<A> partials[kMaxCluster];
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
  MaxSum<A> q = packs_max_sum<T, ITERS>(p, scale);
  if (tail_thread) {
    const uint4 t[1] = {cut_block(xb + full * V, last, 0, tail, tail_out)};
    last = t[0];
    q = merge_max_sum(q, packs_max_sum<T, 1>(t, scale), f);
  }
  q = shfl_merge_max_sum(q, f);
  if ((threadIdx.x & 31) == 0) warp_pairs[threadIdx.x >> 5] = q;
  __syncthreads();
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");  // every CTA's mbarrier is ready
  if (tid == 0) {
    MaxSum<A> c{neg_inf<A>(), A(0)};
    for (int w = 0; w < threads / 32; ++w) c = merge_max_sum(c, warp_pairs[w], f);
    mbar_arrive_expect_tx(bar, csize * uint32_t{2 * sizeof(A)});
    broadcast_pair(smem_addr(&partials[rank]), c.m, c.s, bar, csize);
  }
  mbar_wait(bar, 0);
  MaxSum<A> r{neg_inf<A>(), A(0)};
  for (uint32_t k = 0; k < csize; ++k) r = merge_max_sum(r, partials[k], f);
  const A log_sum = log_acc(r.s);
  if (lse != nullptr && rank == 0 && tid == 0) lse[row] = r.m * scale + log_sum;
  T* yb = y + row * ys - lead;  // y's blocks: y is off 16 bytes as x is
  if (tail_thread) store_log_softmax_part(yb + full * V, last, 0, tail, r.m, scale, log_sum);
  if constexpr (Bounded) {
#pragma unroll
    for (int i = 0; i < ITERS; ++i) opaque(p[i]);  // unpacked again (see rows_in_registers_kernel)
  }
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int e = begin + i * threads + tid;
    if (i == 0 && head_thread)
      store_log_softmax_part(yb, p[0], lead, V, r.m, scale, log_sum);
    else if (e < end)
      store_log_softmax_pack<T>(yb + e * V, p[i], r.m, scale, log_sum);
  }
#endif
}

template <class T, int ITERS, bool Peel>
__global__ void __launch_bounds__(kRegisterClusterMaxThreads)
register_cluster_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys, int cols, int span,
                        acc_t<T> scale, acc_t<T>* __restrict__ lse) {
  register_cluster_row<T, ITERS, Peel, false>(x, xs, y, ys, cols, span, scale, lse);
}

template <class T, bool Peel>
__global__ void __launch_bounds__(kRegisterClusterMaxThreads, kRegisterClusterMinBlocks)
register_cluster_bounded_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys, int cols,
                                int span, acc_t<T> scale, acc_t<T>* __restrict__ lse) {
  register_cluster_row<T, kWarpRowsMaxIters, Peel, true>(x, xs, y, ys, cols, span, scale, lse);
}

// Short rows in 16-byte packs, one pack per lane and several rows per lane: a group of `group`
// lanes (at least the row's packs, at most a warp) holds a row, a warp 32 / group rows per load, so
// that each of a lane's R loads covers 512 contiguous bytes of the warp's R * 32 / group rows.
// Same arithmetic as rows_in_registers_kernel, R rows reduced side by side.
// G > 0 (16-bit rows, docs/design.md "Short rows, leaner"): the group known at compile time, so that
// its butterflies unroll to their levels; and where the group has a lane for each of the R rows
// (G >= R), each row's log is taken on one lane of the group and passed to the others, one log a
// lane instead of R.
template <class T, int R, int G = 0>
__global__ void __launch_bounds__(kWarpRowsThreads)
short_rows_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys, int64_t rows, int vectors,
                  int group_arg, acc_t<T> scale, acc_t<T>* __restrict__ lse) {
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
    A m[R], log_sum[R];
    if constexpr (G > 0) {
#pragma unroll
      for (int i = 0; i < R; ++i) m[i] = group_max<G>(packs_max<T, 1>(p[i]));
      A sum[R];
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
        log_sum[i] = log_acc(group_sum(packs_exp_sum<T, 1>(p[i], ex), group) * exp_base(-ex.lo));
      }
    }
#pragma unroll
    for (int i = 0; i < R; ++i) opaque(p[i][0]);
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t row = base + i * step + lane / group;
      if (lse != nullptr && row < rows && sub == 0) lse[row] = m[i] * scale + log_sum[i];
      if (live[i]) store_log_softmax_pack<T>(y + row * ys + sub * (16 / sizeof(T)), p[i][0], m[i], scale, log_sum[i]);
    }
  }
}

// Flat tiles: short rows in one contiguous run from a 16-byte boundary, not in 16-byte packs
// themselves (rows of 7 or 100 bf16). A CTA moves a tile of blockDim.x * k rows between global
// memory and shared memory as 16-byte packs of the flat array (a tile starts on 16 bytes: its
// rows are a multiple of 128), and each thread does k rows in shared memory, x replaced by y in
// place. Same arithmetic as rows_in_registers_kernel.
template <class T>
__global__ void __launch_bounds__(kWarpRowsThreads)
flat_rows_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int cols, int k, int spread,
                 acc_t<T> scale, acc_t<T>* __restrict__ lse) {
  using A = acc_t<T>;
  constexpr int V = 16 / sizeof(T);
  extern __shared__ uint4 tile[];
  T* t = reinterpret_cast<T*>(tile);
  const int64_t tile_rows = int64_t{blockDim.x} * k;
  for (int64_t r0 = blockIdx.x * tile_rows; r0 < rows; r0 += int64_t{gridDim.x} * tile_rows) {
    const int n_rows = static_cast<int>(rows - r0 < tile_rows ? rows - r0 : tile_rows);
    const int n = n_rows * cols;  // elements of this tile
    const int packs = n / V;
    const int64_t e0 = r0 * cols;
    const uint4* src = reinterpret_cast<const uint4*>(x + e0);
    // Asynchronous copies (cp.async): every pack of the tile in flight at once, none through registers.
    for (int i = threadIdx.x; i < packs; i += blockDim.x) __pipeline_memcpy_async(tile + i, src + i, 16);
    __pipeline_commit();
    for (int i = packs * V + threadIdx.x; i < n; i += blockDim.x) t[i] = x[e0 + i];
    __pipeline_wait_prior(0);
    __syncthreads();
    // A warp takes 32 rows `spread` rows apart (the planner picks spread so that the lanes' rows
    // start on distinct banks of shared memory), rounds of them in turn.
    const int rounds = (n_rows + 32 * spread - 1) / (32 * spread) * spread;
    for (int round = threadIdx.x >> 5; round < rounds; round += blockDim.x >> 5) {
      const int r = round / spread * 32 * spread + round % spread + spread * (threadIdx.x & 31);
      if (r >= n_rows) continue;
      T* row = t + r * cols;
      A m = neg_inf<A>();
#pragma unroll 4
      for (int j = 0; j < cols; ++j) m = max_acc(m, to_acc(row[j]));
      const ShiftedExp<A> ex = shifted_exp(m, scale);
      A s0 = A(0), s1 = A(0);
#pragma unroll 2
      for (int j = 0; j + 1 < cols; j += 2) {
        s0 += exp_base(fma(to_acc(row[j]), ex.f, -ex.hi));
        s1 += exp_base(fma(to_acc(row[j + 1]), ex.f, -ex.hi));
      }
      if (cols & 1) s0 += exp_base(fma(to_acc(row[cols - 1]), ex.f, -ex.hi));
      const A log_sum = log_acc((s0 + s1) * exp_base(-ex.lo));
      if (lse != nullptr) lse[r0 + r] = m * scale + log_sum;
#pragma unroll 4
      for (int j = 0; j < cols; ++j) row[j] = from_acc<T>(log_softmax_out_scaled(to_acc(row[j]), m, scale, log_sum));
    }
    __syncthreads();
    uint4* dst = reinterpret_cast<uint4*>(y + e0);
    for (int i = threadIdx.x; i < packs; i += blockDim.x) store_global_v4(dst + i, tile[i]);
    for (int i = packs * V + threadIdx.x; i < n; i += blockDim.x) y[e0 + i] = t[i];
    __syncthreads();  // the tile is refilled by the next
  }
}

// The backward's steps on a pack of dy (g) and y (p) as load_raw gave them: dy's elements added to
// s in order; dx = dy - exp(y) * s.
template <class T, int V> __device__ __forceinline__ void add_raw(acc_t<T>& s, const T (&g)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) s += to_acc(g[j]);
}
template <class T, int V>
__device__ __forceinline__ void grad_pack(acc_t<T> (&d)[V], const T (&g)[V], const T (&p)[V], acc_t<T> s) {
#pragma unroll
  for (int j = 0; j < V; ++j) d[j] = log_softmax_grad(to_acc(g[j]), to_acc(p[j]), s);
}

// The backward, dx = dy - exp(y) * sum(dy): the group holds a row of dy and of y in registers.
template <class T, int V, int ITERS>
__global__ void __launch_bounds__(kWarpRowsThreads)
warp_rows_backward_kernel(const T* __restrict__ dy, int64_t dys, const T* __restrict__ y, int64_t ys,
                          T* __restrict__ dx, int64_t dxs, int64_t rows, int cols, int group) {
  using A = acc_t<T>;
  const int lane = threadIdx.x & 31;
  const int sub = lane & (group - 1);
  const int rows_per_warp = 32 / group;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  const int64_t warp = int64_t{blockIdx.x} * (blockDim.x / 32) + (threadIdx.x >> 5);
  for (int64_t base = warp * rows_per_warp; base < rows; base += warps * rows_per_warp) {
    const int64_t row = base + lane / group;
    const bool live = row < rows;
    // dy and y as loaded (zeros past the row), every load issued before any is converted or summed.
    T g[ITERS][V], p[ITERS][V];
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int e = (i * group + sub) * V;
      load_raw<T, V>(dy + row * dys + e, live && e < cols, g[i]);
      load_raw<T, V>(y + row * ys + e, live && e < cols, p[i]);
    }
    A s = 0;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) add_raw(s, g[i]);
    s = group_sum(s, group);
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int e = (i * group + sub) * V;
      if (live && e < cols) {
        A d[V];
        grad_pack(d, g[i], p[i], s);
        store_pack<T, V>(dx + row * dxs + e, d);
      }
    }
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

// The same backward where the group is the CTA (rows past a warp's eight packs a thread): a row a
// CTA, the sum over the CTA. The kernels share the pack steps only: sharing one row function changed
// warp_rows_backward_kernel's code as measured.
template <class T, int V, int ITERS>
__global__ void __launch_bounds__(kBackwardCtaThreads, 2)
cta_rows_backward_kernel(const T* __restrict__ dy, int64_t dys, const T* __restrict__ y, int64_t ys,
                         T* __restrict__ dx, int64_t dxs, int64_t rows, int cols) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  const int t = threadIdx.x, threads = blockDim.x;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    T g[ITERS][V], p[ITERS][V];  // dy and y as loaded, every load issued before any is summed
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int e = (i * threads + t) * V;
      load_raw<T, V>(dy + row * dys + e, e < cols, g[i]);
      load_raw<T, V>(y + row * ys + e, e < cols, p[i]);
    }
    A s = 0;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) add_raw(s, g[i]);
    s = block_sum(s, scratch, threads, 1);
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int e = (i * threads + t) * V;
      if (e < cols) {
        A d[V];
        grad_pack(d, g[i], p[i], s);
        store_pack<T, V>(dx + row * dxs + e, d);
      }
    }
  }
}

// Calls f(std::integral_constant<int, N>{}) for the count n the planner chose, one of Ns (the
// unroll counts a kernel is built for); any other is an error.
template <int... Ns, class F> cudaError_t with_one_of(int n, F&& f) {
  cudaError_t r = cudaErrorInvalidValue;
  (void)((n == Ns && ((r = f(std::integral_constant<int, Ns>{})), true)) || ...);
  return r;
}
// Packs, rows or vectors a lane: 1, 2, 4 or 8.
template <class F> cudaError_t with_count(int n, F&& f) { return with_one_of<1, 2, 4, 8>(n, std::forward<F>(f)); }

template <class T, int V>
cudaError_t launch_backward_iters(const Plan& p, const Call& a, cudaStream_t stream) {
  const auto dy = static_cast<const T*>(a.in0), y = static_cast<const T*>(a.in1);
  const auto dx = static_cast<T*>(a.out);
  const int64_t rows = a.n[0];
  const int cols = static_cast<int>(a.n[1]);
  const dim3 grid(static_cast<unsigned>(p.grid)), block(p.threads);
  if (p.rows_per_lane > 0)  // short rows: a pack of each of rows_per_lane rows a lane
    return with_count(p.rows_per_lane, [&](auto per_lane) {
      short_rows_backward_kernel<T, V, decltype(per_lane)::value><<<grid, block, 0, stream>>>(
          dy, a.in0_s[0], y, a.in1_s[0], dx, a.out_s[0], rows, cols, p.group);
      return cudaGetLastError();
    });
  if (p.group > 32) {  // a CTA a row, four packs a thread (the planner's only count there)
    if (p.iters != 4) return cudaErrorInvalidValue;
    cta_rows_backward_kernel<T, V, 4><<<grid, block, 0, stream>>>(dy, a.in0_s[0], y, a.in1_s[0], dx, a.out_s[0],
                                                                  rows, cols);
    return cudaGetLastError();
  }
  return with_count(p.iters, [&](auto iters) {
    warp_rows_backward_kernel<T, V, decltype(iters)::value><<<grid, block, 0, stream>>>(
        dy, a.in0_s[0], y, a.in1_s[0], dx, a.out_s[0], rows, cols, p.group);
    return cudaGetLastError();
  });
}

// Rows of one element: the same algebra, eight rows per thread in flight (one row per lane and
// step would leave the loads latency-bound: 1 GB of one-element rows took 3x a copy).
constexpr int kSingleRows = 8;
template <class T>
__global__ void __launch_bounds__(kWarpRowsThreads)
single_column_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys, int64_t rows,
                     acc_t<T> scale, acc_t<T>* __restrict__ lse) {
  using A = acc_t<T>;
  const int64_t threads = int64_t{gridDim.x} * blockDim.x;
  for (int64_t base = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; base < rows; base += threads * kSingleRows) {
    A v[kSingleRows];
#pragma unroll
    for (int k = 0; k < kSingleRows; ++k) {
      const int64_t r = base + k * threads;
      v[k] = r < rows ? to_acc(x[r * xs]) * scale : A(0);
    }
#pragma unroll
    for (int k = 0; k < kSingleRows; ++k) {
      const int64_t r = base + k * threads;
      if (r < rows) {
        const A log_sum = log_acc(exp_shifted(v[k], v[k]));
        y[r * ys] = from_acc<T>(log_softmax_out(v[k], v[k], log_sum));
        if (lse != nullptr) lse[r] = v[k] + log_sum;
      }
    }
  }
}

// Contiguous one-element rows are one flat array: 16-byte packs of V rows, kSinglePacks packs per
// thread in flight (element by element, 1 GB of 16-bit rows took 2.5x a copy). Thread t of the
// grid also takes row packs * V + t of the tail.
constexpr int kSinglePacks = 4;
template <class T, int V>
__global__ void __launch_bounds__(kWarpRowsThreads)
single_column_packed_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, acc_t<T> scale,
                            acc_t<T>* __restrict__ lse) {
  using A = acc_t<T>;
  const int64_t threads = int64_t{gridDim.x} * blockDim.x;
  const int64_t tid = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t packs = rows / V;
  // A lone value's sum is exp(0) = 1 where it is finite: y = v - v (0, or NaN for NaN and +-inf)
  // and the LSE is v (NaN for +inf, as for any row holding +inf), with no exp or log to take.
  auto one = [&](A v, int64_t r) {
    if (lse != nullptr) lse[r] = v == -neg_inf<A>() ? v - v : v;
    return v - v;
  };
  for (int64_t base = tid; base < packs; base += threads * kSinglePacks) {
    A v[kSinglePacks][V];
#pragma unroll
    for (int k = 0; k < kSinglePacks; ++k)
      if (base + k * threads < packs) load_pack<T, V>(x + (base + k * threads) * V, v[k]);
#pragma unroll
    for (int k = 0; k < kSinglePacks; ++k) {
      const int64_t pk = base + k * threads;
      if (pk < packs) {
#pragma unroll
        for (int j = 0; j < V; ++j) v[k][j] = one(v[k][j] * scale, pk * V + j);
        store_pack<T, V>(y + pk * V, v[k]);
      }
    }
  }
  const int64_t r = packs * V + tid;
  if (r < rows) y[r] = from_acc<T>(one(to_acc(x[r]) * scale, r));
}

template <class T>
cudaError_t launch_single_column(const Plan& p, const Call& a, cudaStream_t stream) {
  const T* x = static_cast<const T*>(a.x());
  T* y = static_cast<T*>(a.y());
  const auto scale = static_cast<acc_t<T>>(a.scale);
  auto* lse = static_cast<acc_t<T>*>(a.lse);
  constexpr int V = 16 / sizeof(T);
  const bool flat = (a.rows() == 1 || (a.x_stride() == 1 && a.y_stride() == 1)) &&
                    reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  if (flat && V > 1) {
    const int64_t per_cta = int64_t{kWarpRowsThreads} * kSinglePacks * V;
    const int64_t grid = std::clamp<int64_t>((a.rows() + per_cta - 1) / per_cta, 1, p.grid);
    single_column_packed_kernel<T, V><<<static_cast<unsigned>(grid), kWarpRowsThreads, 0, stream>>>(
        x, y, a.rows(), scale, lse);
    return cudaGetLastError();
  }
  const int64_t grid = std::min<int64_t>(p.grid, (a.rows() + kWarpRowsThreads * kSingleRows - 1) /
                                                     (kWarpRowsThreads * kSingleRows));
  single_column_kernel<T><<<static_cast<unsigned>(grid), kWarpRowsThreads, 0, stream>>>(
      x, a.x_stride(), y, a.y_stride(), a.rows(), scale, lse);
  return cudaGetLastError();
}

// Rows in registers over clusters of plan.cluster CTAs (plan.threads threads, plan.iters packs
// each, plan.segment packs a CTA), one row to a cluster: plan.grid clusters, one per row; plan.peel
// for rows off 16 bytes.
template <class T>
cudaError_t launch_register_clusters(const Plan& p, const Call& a, cudaStream_t stream) {
  // Built for 16-byte packs of 2- and 4-byte types, four or eight a thread (the planner's only).
  if constexpr (sizeof(T) == 8) {
    return cudaErrorInvalidValue;
  } else {
    if ((p.iters != 4 && p.iters != 8) || p.grid != a.rows()) return cudaErrorInvalidValue;
    using Kernel = void (*)(const T*, int64_t, T*, int64_t, int, int, acc_t<T>, acc_t<T>*);
    Kernel kernel = p.peel ? register_cluster_kernel<T, 4, true> : register_cluster_kernel<T, 4, false>;
    if (p.iters == 8 && p.bounded)
      kernel = p.peel ? register_cluster_bounded_kernel<T, true> : register_cluster_bounded_kernel<T, false>;
    else if (p.iters == 8)
      kernel = p.peel ? register_cluster_kernel<T, 8, true> : register_cluster_kernel<T, 8, false>;
    ClusterLaunch l;
    cudaError_t e = prepare_cluster_launch(kernel, p, stream, &l);
    if (e != cudaSuccess) return e;
    l.cfg.gridDim = dim3(static_cast<unsigned>(p.grid * p.cluster));  // a cluster per row, not persistent
    e = cudaLaunchKernelEx(&l.cfg, kernel, static_cast<const T*>(a.x()), a.x_stride(), static_cast<T*>(a.y()), a.y_stride(),
                           static_cast<int>(a.cols()), static_cast<int>(p.segment), static_cast<acc_t<T>>(a.scale),
                           static_cast<acc_t<T>*>(a.lse));
    return e != cudaSuccess ? e : cudaGetLastError();
  }
}

// short_rows_kernel for the plan's rows a lane: 16-bit rows as planned (four a lane, groups up to
// 8) with the group at compile time (docs/design.md, "Short rows, leaner"; fp32 rows of 32 ran 1.5 %
// slower so, and keep the group as an argument).
template <class T, class Kernel> cudaError_t choose_short_rows(const Plan& p, Kernel& k) {
  if constexpr (sizeof(T) == 2) {
    if (p.rows_per_lane == kShortRowsPerLane && p.group <= 8)
      return with_count(p.group, [&](auto g) {
        k = short_rows_kernel<T, kShortRowsPerLane, decltype(g)::value>;
        return cudaSuccess;
      });
  }
  return with_count(p.rows_per_lane, [&](auto n) {
    k = short_rows_kernel<T, decltype(n)::value>;
    return cudaSuccess;
  });
}

template <class T, int V>
cudaError_t launch_iters(const Plan& p, const Call& a, cudaStream_t stream) {
  // Rows in 16-byte packs go to short_rows_kernel (several rows a lane) or rows_in_registers_kernel,
  // which take the row length in packs; the rest to warp_rows_kernel, in elements. All three take
  // the same arguments.
  constexpr bool kPacked = sizeof(T) * V == 16;
  using Kernel = void (*)(const T*, int64_t, T*, int64_t, int64_t, int, int, acc_t<T>, acc_t<T>*);
  Kernel k = nullptr;
  cudaError_t chosen;
  if constexpr (kPacked) {
    if (p.rows_per_lane > 0)
      chosen = choose_short_rows<T>(p, k);
    else if (p.peel) {
      if constexpr (sizeof(T) <= 4)  // the planner peels fp32 and 16-bit rows only
        chosen = with_one_of<4, 5>(p.iters, [&](auto n) {  // the edge's pack more: six spilled
          k = rows_in_registers_kernel<T, decltype(n)::value, true>;
          return cudaSuccess;
        });
      else
        chosen = cudaErrorInvalidValue;
    } else
      chosen = with_one_of<1, 2, 3, 4, 5, 6, 7, 8>(p.iters, [&](auto n) {  // fitted to the row
        k = rows_in_registers_kernel<T, decltype(n)::value>;
        return cudaSuccess;
      });
  } else {
    chosen = with_count(p.iters, [&](auto n) {
      k = warp_rows_kernel<T, V, decltype(n)::value>;
      return cudaSuccess;
    });
  }
  if (chosen != cudaSuccess) return chosen;
  const int length = static_cast<int>(kPacked && !p.peel ? a.cols() / V : a.cols());
  k<<<static_cast<unsigned>(p.grid), p.threads, 0, stream>>>(static_cast<const T*>(a.x()), a.x_stride(),
                                                             static_cast<T*>(a.y()), a.y_stride(), a.rows(), length,
                                                             p.group, static_cast<acc_t<T>>(a.scale),
                                                             static_cast<acc_t<T>*>(a.lse));
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_warp_rows(const Plan& p, const Call& a, cudaStream_t stream) {
  if (p.flat_rows > 0)
    return with_element_type(a.dtype, [&](auto tag) {
      using T = decltype(tag);
      flat_rows_kernel<T><<<static_cast<unsigned>(p.grid), p.threads, p.smem_bytes, stream>>>(
          static_cast<const T*>(a.x()), static_cast<T*>(a.y()), a.rows(), static_cast<int>(a.cols()), p.flat_rows,
          p.flat_spread, static_cast<acc_t<T>>(a.scale), static_cast<acc_t<T>*>(a.lse));
      return cudaGetLastError();
    });
  if (a.cols() == 1)
    return with_element_type(a.dtype, [&](auto tag) { return launch_single_column<decltype(tag)>(p, a, stream); });
  if (p.cluster > 0)
    return with_element_type(a.dtype, [&](auto tag) { return launch_register_clusters<decltype(tag)>(p, a, stream); });
  return with_element_type_and_vec<true>(a.dtype, p.vec, [&](auto tag, auto vec) {
    return launch_iters<decltype(tag), decltype(vec)::value>(p, a, stream);
  });
}

cudaError_t launch_warp_rows_backward(const Plan& p, const Call& a, cudaStream_t stream) {
  return with_element_type_and_vec(a.dtype, p.vec, [&](auto tag, auto vec) {
    return launch_backward_iters<decltype(tag), decltype(vec)::value>(p, a, stream);
  });
}

}  // namespace softlight
