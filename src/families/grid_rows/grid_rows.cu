// grid_rows (Hopper, sm_90): rows held once in the shared memory of a whole cooperative grid, in
// items of a few chunks that any CTA claims. For rows that no cluster holds: 16-bit rows the widest
// clusters can only stream, reading most of each slice twice (rows of 4 M), and fp32 rows of the
// grid groups and streamed clusters (rule.cpp, grid_rows_instead); rows past a quarter of the rings
// hold only part of each row (Spill, below).
//
// One CTA per SM, every CTA resident at once. A row is cut into items of `item_chunks` chunks,
// numbered in order over all rows; a CTA's producer thread reserves an item's worth of free slots
// in its ring, claims the next item from a counter in global memory and loads its chunks with
// bulk copies (meta: the chunk each slot holds, by its number over all rows). Two groups of
// consumer warps walk the ring in order:
//   statistics warps fold each chunk as it lands into the item's (max, sum) partial and post it
//     into the item's slot of a table in global memory (one 64-bit store of two fp32 values, whose
//     high half is never all ones once written: the table starts all ones), then hand the item to
//     the merger warp;
//   the merger warp, at the first item of each row its CTA holds, folds the row's partials as they
//     are posted (loads in flight together, each polled until posted) and hands the row's
//     (max, log-sum) to the writers through shared memory. Every CTA holding a row folds the same
//     partials in the same order, so all get the same bits; the one holding the row's first item
//     writes its log-sum-exp;
//   writer warps take each chunk once its row's statistics are in, write y from shared memory and
//     hand the slot back.
// Each chunk is read from DRAM once and written once; the rows in flight are those the rings hold
// (132 x 224 KB on an H200: a row of 4 M fp32 and most of the next). No role waits on the writers
// but the producer (for free slots), so a row's statistics reach every CTA holding it about one
// L2 round trip after its last item is posted.
//
// Spill (rows past a quarter of the rings): a row's first spill_chunks chunks are loaded and folded
// as the rest, but their slot then serves the row before: once folded, a statistics thread loads that
// row's same chunk into it from L2 (where the first load marked it evict-last) with a bulk copy on
// the slot's refill barrier, and the writers write it with the row before's statistics. The last
// row's spilled chunks are claimed again after every row (slots with nothing to load). The rows the
// writers need never decrease in ring order, so the merger hands them over as above. The writers
// hand a slot back only once the statistics warps have read it: a kept chunk's row statistics come
// after its fold, and a spilled slot's refill barrier completes after its fold (with no load for
// the first row's), so the producer never loads a slot again before it is folded.
//
// No deadlock: items are claimed in order and a producer claims only with an item's slots free,
// so every claimed item loads and its partial posts (the planner keeps a ring's slots fewer than the
// merger queue's entries, so the statistics warps never wait on a merger that waits on a row, and
// fewer than the writers' table of merged rows, so no entry is rewritten while a writer needs it). The
// earliest row not all posted has all rows before it posted and merged, so every ring can drain
// down to that row's chunks; while the row is not all claimed some CTA has an item's slots free,
// unless every ring is full of the row, which the planner rules out (chunks a row < CTAs x
// (slots - item chunks + 1)). A spilled slot waits only for the row before, all of whose items
// were claimed before it, so the bound counts the chunks a row keeps.

#include "device/common.cuh"
#include "device/hopper.cuh"
#include "device/launch.hpp"
#include "device/workspace.hpp"
#include "families/grid_rows/rule.hpp"

namespace softlight {
namespace {

struct GridShape {
  int chunk_bytes;
  int ring_slots;
  int item_chunks;
  int64_t chunks_per_row;
  int64_t items_per_row;
  double scale;
  void* lse;
  unsigned long long* counter;  // the next ticket (starts all ones)
  uint64_t* item_stats;         // by item: (max, sum) packed, all ones until posted
  int64_t spill_chunks;         // a row's first chunks folded in the ring, written a row later from L2
};

#ifdef SOFTLIGHT_HOPPER
constexpr uint32_t kUnposted = 0xffffffffu;  // the high word of a slot not yet written
constexpr int kStatsBar = 1;
constexpr int kMergeQueue = kGridRowsMergeQueue;  // posted items, statistics warps to merger; rows, merger to writers

template <class T, int U, bool Spill, bool WaitLast> struct GridCta {
  using A = float;
  GridShape sh;
  unsigned char* ring;
  uint64_t* full;
  uint64_t* empty;
  volatile int64_t* meta;    // [ring_slots] the chunk each slot holds (rows x chunks_per_row: none)
  volatile int64_t* queue;   // [kMergeQueue] posted items, by number over all rows (all items: no more)
  volatile int* queued;      // entries the statistics warps have written
  volatile int* merged;      // entries the merger has taken
  A* scratch;                // [32] statistics warps
  // Rows merged, handed to the writers: the n-th row this CTA holds (in ring order, counted from 0)
  // at n % kMergeQueue. The merger is fewer rows ahead of any chunk still held than the ring has
  // slots (slots are handed back in ring order), so no entry is rewritten while a writer needs it.
  volatile int64_t* row_tag;     // [kMergeQueue] the row merged there (-1: none yet)
  volatile uint64_t* row_word;   // [kMergeQueue] its (max, log-sum), packed
  uint64_t* refill;              // [ring_slots] Spill: a spilled slot loaded again with the row before's chunk
  int64_t rows, total_chunks;
  int64_t row_bytes;
  int group, gtid, lane;
  A scale;

  // Chunks a row spills (none unless Spill); the walk ends at a slot whose chunk is end_chunk(),
  // past the last row's spilled chunks, which are claimed again after every row (total_items()).
  __device__ __forceinline__ int64_t spill() const { return Spill ? sh.spill_chunks : 0; }
  __device__ __forceinline__ int64_t end_chunk() const { return Spill ? total_chunks + sh.chunks_per_row : total_chunks; }
  __device__ __forceinline__ int64_t total_items() const {
    return Spill ? rows * sh.items_per_row + sh.spill_chunks / sh.item_chunks : rows * sh.items_per_row;
  }
  __device__ __forceinline__ uint32_t bytes_of(int64_t k) const {
    return static_cast<uint32_t>(min(int64_t{sh.chunk_bytes}, row_bytes - k * sh.chunk_bytes));
  }
  __device__ __forceinline__ const uint4* slot_data(uint32_t slot) const {
    return reinterpret_cast<const uint4*>(ring + size_t(slot) * sh.chunk_bytes);
  }
  __device__ __forceinline__ void release(uint32_t slot) const {
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_addr(empty + slot));
  }

  // The (max, sum) of one chunk's packs held by this thread (packs gtid, gtid + group, ...).
  __device__ __forceinline__ MaxSum<A> fold_chunk(const uint4* src, int vectors) const {
    MaxSum<A> cp{neg_inf<A>(), A(0)};
    int base = gtid;
    for (; base + (U - 1) * group < vectors; base += U * group) {
      uint4 p[U];
#pragma unroll
      for (int u = 0; u < U; ++u) p[u] = src[base + u * group];
      fold_packs<T, U>(p, cp, scale);
    }
    if (base < vectors) {
      uint4 p[U];
#pragma unroll
      for (int u = 0; u < U; ++u) p[u] = base + u * group < vectors ? src[base + u * group] : neg_inf_pack<T>();
      fold_packs<T, U>(p, cp, scale);
    }
    return cp;
  }
  // Spilled rows' y is stored evict-first (st.global.cs), so that it does not push out of L2 the
  // spilled chunks (marked evict-last) before their second read: at rows of 4 M fp32, 1.30 -> 1.11 GB
  // read from DRAM.
  __device__ __forceinline__ void write_chunk(const uint4* src, uint4* dst, int vectors, A m, A log_sum) const {
    int base = gtid;
    for (; base + (U - 1) * group < vectors; base += U * group) {
      uint4 p[U];
#pragma unroll
      for (int u = 0; u < U; ++u) p[u] = src[base + u * group];
#pragma unroll
      for (int u = 0; u < U; ++u)
        store_log_softmax_pack<T>(reinterpret_cast<T*>(dst + base + u * group), p[u], m, scale, log_sum, Spill);
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + u * group < vectors)
        store_log_softmax_pack<T>(reinterpret_cast<T*>(dst + base + u * group), src[base + u * group], m, scale,
                                  log_sum, Spill);
  }

  // Producer: reserve an item's slots, claim the item, load its chunks; at the end, a slot whose
  // meta says none (every consumer stops there). Where the next item's slots are free already, its
  // claim goes out before this item's loads, so that its round trip overlaps them.
  __device__ __forceinline__ unsigned long long claim() const { return atomicAdd(sh.counter, 1ull) + 1ull; }
  // Whether the `count` slots from `r` on are free (wait: until they are).
  __device__ __forceinline__ bool slots_free(RingPos r, int count, bool wait) const {
    for (int c = 0; c < count; ++c) {
      if (wait) {
        mbar_wait_cta(smem_addr(empty + r.slot), r.phase ^ 1);
      } else if (!mbar_done_cta(smem_addr(empty + r.slot), r.phase ^ 1)) {
        return false;
      }
      r.advance(sh.ring_slots);
    }
    return true;
  }
  __device__ __forceinline__ void produce(const T* x, int64_t xs) const {
    RingPos pos;
    const int64_t total_items = this->total_items();
    const bool ahead = 2 * sh.item_chunks <= sh.ring_slots;
    bool claimed = false;
    unsigned long long next = 0;
    for (;;) {
      if (!claimed) slots_free(pos, sh.item_chunks, true);
      if (!claimed) next = claim();
      const unsigned long long ticket = next;
      RingPos after = pos;
      after.advance(sh.ring_slots, sh.item_chunks);
      // The next item takes at most the slots from this one's end (pos + its chunks) to after + item_chunks.
      claimed = ahead && slots_free(after, sh.item_chunks, false);
      if (claimed) next = claim();
      if (ticket >= static_cast<unsigned long long>(total_items)) {
        meta[pos.slot] = end_chunk();
        mbar_arrive(smem_addr(full + pos.slot));
        return;
      }
      const int64_t item = static_cast<int64_t>(ticket);
      const int64_t row = item / sh.items_per_row;
      const int64_t k0 = (item - row * sh.items_per_row) * sh.item_chunks;
      const int64_t n = min(int64_t{sh.item_chunks}, sh.chunks_per_row - k0);
      const unsigned char* src = reinterpret_cast<const unsigned char*>(x + row * xs);
      for (int64_t k = k0; k < k0 + n; ++k) {
        const uint32_t bytes = bytes_of(k);
        meta[pos.slot] = row * sh.chunks_per_row + k;
        if constexpr (!Spill) {
          mbar_arrive_expect_tx(smem_addr(full + pos.slot), bytes);
          bulk_load(smem_addr(ring + size_t(pos.slot) * sh.chunk_bytes), src + k * sh.chunk_bytes, bytes,
                    smem_addr(full + pos.slot));
          pos.advance(sh.ring_slots);
          continue;
        }
        const uint32_t dst = smem_addr(ring + size_t(pos.slot) * sh.chunk_bytes), bar = smem_addr(full + pos.slot);
        if (row == rows) {
          mbar_arrive(bar);  // the last row's spilled chunk: nothing to load here (see stats)
        } else {
          // Spilled chunks are read again a row later: kept in L2; the rest read once.
          mbar_arrive_expect_tx(bar, bytes);
          if (k < spill()) bulk_load_policy<true>(dst, src + k * sh.chunk_bytes, bytes, bar);
          else bulk_load_policy<false>(dst, src + k * sh.chunk_bytes, bytes, bar);
        }
        pos.advance(sh.ring_slots);
      }
    }
  }

  // Statistics warps: each item's (max, sum), posted once its last chunk is folded.
  __device__ __forceinline__ void stats(const T* x, int64_t xs) const {
    RingPos pos;
    MaxSum<A> part{neg_inf<A>(), A(0)};
    const A f = exp_factor(scale);
    for (;;) {
      mbar_wait_cta(smem_addr(full + pos.slot), pos.phase);
      const int64_t g = meta[pos.slot];
      if (g >= end_chunk()) {
        if (gtid == 0) enqueue(total_items());
        return;
      }
      const int64_t row = g / sh.chunks_per_row, k = g - row * sh.chunks_per_row;
      const bool real = !Spill || row < rows;  // else the spilled tail: nothing to fold
      const uint32_t slot = pos.slot;
      if (real) part = merge_max_sum(part, fold_chunk(slot_data(slot), static_cast<int>(bytes_of(k) / 16)), f);
      pos.advance(sh.ring_slots);
      const bool ends_item = (k + 1) % sh.item_chunks == 0 || k + 1 == sh.chunks_per_row;
      if (ends_item) {
        MaxSum<A> item{};
        if (real) item = block_max_sum(part, scratch, group, kStatsBar, f);
        if (gtid == 0) {
          const int64_t number = row * sh.items_per_row + k / sh.item_chunks;
          if (real) store_relaxed_gpu(sh.item_stats + number, pack_pair(item.m, item.s));
          enqueue(number);
        }
        part = {neg_inf<A>(), A(0)};
      }
      if (Spill && k < spill()) {
        // Folded (every statistics thread is past a barrier since its reads): the slot loads the
        // same chunk of the row before, from L2, for the writers. The first row's spilled slots have
        // nothing to write; their refill barrier completes with no load, so that the writers hand
        // them back only once they are folded (else the producer could load a slot again, a lap
        // on, before the statistics warps had read it).
        if (real && !ends_item) sync_threads_named(kStatsBar, group);
        if (gtid == 0) {
          const uint32_t bytes = bytes_of(k), bar = smem_addr(refill + slot);
          if (row > 0) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            mbar_arrive_expect_tx(bar, bytes);
            bulk_load_policy<false>(smem_addr(ring + size_t(slot) * sh.chunk_bytes),
                                    reinterpret_cast<const unsigned char*>(x + (row - 1) * xs) + k * sh.chunk_bytes,
                                    bytes, bar);
          } else {
            mbar_arrive(bar);
          }
        }
      }
    }
  }

  // Statistics warps' thread 0: hands the merger a posted item (the fence orders the entry before
  // the count that publishes it).
  __device__ __forceinline__ void enqueue(int64_t item) const {
    const int n = *queued;
    while (n - *merged >= kMergeQueue) __nanosleep(64);
    queue[n % kMergeQueue] = item;
    __threadfence_block();
    *queued = n + 1;
  }

  // Merger warp: takes the posted items in order and merges the row of each first item of a row it
  // sees (the row's items in this CTA are consecutive), then hands the row to the writers.
  __device__ __forceinline__ void merge() const {
    const A f = exp_factor(scale);
    const int64_t total_items = this->total_items(), spill_items = spill() / sh.item_chunks;
    int64_t last = -1;
    int seen = -1;  // rows merged
    for (int n = 0;; ++n) {
      if (lane == 0)
        while (*queued <= n) __nanosleep(32);
      __syncwarp();
      __threadfence_block();
      const int64_t item = queue[n % kMergeQueue];
      __syncwarp();
      if (lane == 0) *merged = n + 1;
      if (item >= total_items) return;
      // The row whose statistics the writers need at this item: a spilled item's writers write the
      // row before it.
      const int64_t q = item / sh.items_per_row;
      const int64_t r = Spill && item - q * sh.items_per_row < spill_items ? q - 1 : q;
      if ((Spill && r < 0) || r == last) continue;
      last = r;
      ++seen;
      const MaxSum<A> p = shfl_merge_max_sum(fold_posted(sh.item_stats + r * sh.items_per_row, f), f);
      if (lane == 0) {
        const A log_sum = log_acc(p.s);
        row_word[seen % kMergeQueue] = pack_pair(p.m, log_sum);
        __threadfence_block();
        row_tag[seen % kMergeQueue] = r;
        if (sh.lse != nullptr && item == r * sh.items_per_row + spill_items) static_cast<A*>(sh.lse)[r] = p.m * scale + log_sum;
      }
    }
  }
  // Lane i's fold of a row's item partials i, i + 32, ... in order, four loads in flight at once,
  // each polled until posted (WaitLast: once the row's last item is posted).
  __device__ __forceinline__ MaxSum<A> fold_posted(const uint64_t* slots, A f) const {
    MaxSum<A> p{neg_inf<A>(), A(0)};
    // WaitLast: the row's last item, claimed last, is most often posted last; one lane polls it
    // first, so that the warp's 32 lanes do not all poll the row's words while it is read.
    if constexpr (WaitLast) {
      if (lane == 0)
        while (static_cast<uint32_t>(load_relaxed_gpu(slots + sh.items_per_row - 1) >> 32) == kUnposted)
          __nanosleep(32);
      __syncwarp();
    }
    for (int64_t i = lane; i < sh.items_per_row; i += 4 * 32) {
      uint64_t w[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) w[u] = i + 32 * u < sh.items_per_row ? load_relaxed_gpu(slots + i + 32 * u) : 0;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (i + 32 * u >= sh.items_per_row) break;
        while (static_cast<uint32_t>(w[u] >> 32) == kUnposted) {
          __nanosleep(32);
          w[u] = load_relaxed_gpu(slots + i + 32 * u);
        }
        p = merge_max_sum(p, unpack_pair(w[u]), f);
      }
    }
    return p;
  }

  // Writers: walk the ring, each thread waiting for a chunk's row statistics itself.
  __device__ __forceinline__ void write(T* y, int64_t ys) const {
    RingPos pos;
    uint64_t refills = 0;  // parity of each slot's refill barrier
    const auto wait_refill = [&](uint32_t slot) {
      mbar_wait_cta(smem_addr(refill + slot), static_cast<uint32_t>(refills >> slot) & 1u);
      refills ^= uint64_t{1} << slot;
    };
    int64_t current = -1;
    int seen = -1;             // rows taken, as the merger counts them
    MaxSum<A> st{A(0), A(0)};  // (max, log-sum) of `current`
    for (;;) {
      mbar_wait_cta(smem_addr(full + pos.slot), pos.phase);
      const int64_t g = meta[pos.slot];
      if (g >= end_chunk()) return;
      const int64_t q = g / sh.chunks_per_row, k = g - q * sh.chunks_per_row;
      const bool spilled = Spill && k < spill();
      const int64_t row = spilled ? q - 1 : q;  // a spilled slot writes the same chunk of the row before
      if (Spill && row < 0) {  // the first row's spilled chunk, once folded: nothing to write
        wait_refill(pos.slot);
        release(pos.slot);
        pos.advance(sh.ring_slots);
        continue;
      }
      if (row != current) {
        ++seen;
        while (row_tag[seen % kMergeQueue] != row) __nanosleep(32);
        __threadfence_block();
        st = unpack_pair(row_word[seen % kMergeQueue]);
        current = row;
      }
      uint4* dst = reinterpret_cast<uint4*>(reinterpret_cast<unsigned char*>(y + row * ys) + k * sh.chunk_bytes);
      if (spilled) wait_refill(pos.slot);
      write_chunk(slot_data(pos.slot), dst, static_cast<int>(bytes_of(k) / 16), st.m, st.s);
      release(pos.slot);
      pos.advance(sh.ring_slots);
    }
  }
};
#endif  // SOFTLIGHT_HOPPER

template <class T, int U, bool Spill, bool WaitLast>
__global__ void __launch_bounds__(kClusterMaxThreads, 1)
grid_rows_kernel(const T* __restrict__ x, int64_t xs, T* __restrict__ y, int64_t ys, int64_t rows, int64_t cols,
                 GridShape sh) {
#ifdef SOFTLIGHT_HOPPER
  extern __shared__ __align__(128) unsigned char smem[];
  GridCta<T, U, Spill, WaitLast> cta;
  cta.sh = sh;
  cta.scale = static_cast<float>(sh.scale);
  cta.ring = smem;
  cta.full = reinterpret_cast<uint64_t*>(smem + size_t(sh.ring_slots) * sh.chunk_bytes);
  cta.empty = cta.full + sh.ring_slots;
  cta.meta = reinterpret_cast<volatile int64_t*>(cta.empty + sh.ring_slots);
  cta.queue = cta.meta + sh.ring_slots;
  cta.queued = reinterpret_cast<volatile int*>(cta.queue + kMergeQueue);
  cta.merged = cta.queued + 1;
  cta.scratch = reinterpret_cast<float*>(const_cast<int*>(cta.merged + 1));
  cta.row_tag = reinterpret_cast<volatile int64_t*>(cta.scratch + 32);
  cta.row_word = reinterpret_cast<volatile uint64_t*>(cta.row_tag + kMergeQueue);
  if constexpr (Spill) cta.refill = const_cast<uint64_t*>(cta.row_word + kMergeQueue);  // ring_slots more words
  cta.rows = rows;
  cta.row_bytes = cols * int64_t{sizeof(T)};
  cta.total_chunks = rows * sh.chunks_per_row;
  cta.group = (static_cast<int>(blockDim.x) - 64) / 2;
  const int warp = threadIdx.x >> 5, group_warps = cta.group >> 5;
  cta.gtid = static_cast<int>(threadIdx.x) % cta.group;
  cta.lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int i = 0; i < sh.ring_slots; ++i) {
      mbar_init(smem_addr(cta.full + i), 1);
      mbar_init(smem_addr(cta.empty + i), group_warps);
      if (Spill) mbar_init(smem_addr(cta.refill + i), 1);
      cta.meta[i] = -1;
    }
    for (int i = 0; i < kMergeQueue; ++i) cta.row_tag[i] = -1;
    *cta.queued = 0;
    *cta.merged = 0;
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp < group_warps) {
    cta.stats(x, xs);
  } else if (warp < 2 * group_warps) {
    cta.write(y, ys);
  } else if (threadIdx.x == 2 * cta.group) {
    cta.produce(x, xs);
  } else if (warp == 2 * group_warps + 1) {
    cta.merge();
  }
#endif
}

// The kernel for a plan: rows held whole always have the merger wait for a row's last item (the
// planner's wait_last).
template <class T, int U> auto grid_rows_kernel_for(bool spill, bool wait_last) {
  return !spill ? grid_rows_kernel<T, U, false, true>
                : wait_last ? grid_rows_kernel<T, U, true, true> : grid_rows_kernel<T, U, true, false>;
}

}  // namespace

cudaError_t launch_grid_rows(const Plan& p, const Call& a, cudaStream_t stream) {
  return with_element_type(a.dtype, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    if constexpr (sizeof(T) > 4) {
      return cudaErrorInvalidValue;
    } else {
      const int group = (p.threads - 64) / 2;
      const bool wide = p.ring.chunk_bytes / 16 >= 4 * group, spill = p.ring.spill_chunks > 0;
      auto kernel =
          wide ? grid_rows_kernel_for<T, 4>(spill, p.ring.wait_last) : grid_rows_kernel_for<T, 2>(spill, p.ring.wait_last);
      ClusterLaunch l;
      cudaError_t e = prepare_cluster_launch(kernel, p, stream, &l);
      if (e != cudaSuccess) return e;
      // Every ring full of one row must leave a row unfinished (see the deadlock argument above).
      if (l.clusters * (p.ring.ring_slots - p.ring.chunks_per_cta + 1) <= p.ring.chunks_per_row - p.ring.spill_chunks ||
          p.ring.spill_chunks % p.ring.chunks_per_cta != 0 || p.ring.spill_chunks >= p.ring.chunks_per_row)
        return cudaErrorInvalidClusterSize;
      const int64_t items_per_row = (p.ring.chunks_per_row + p.ring.chunks_per_cta - 1) / p.ring.chunks_per_cta;
      // Workspace, all ones: the counter, then the item slots.
      const size_t words = 1 + static_cast<size_t>(a.rows() * items_per_row);
      cudaMemPool_t pool;
      void* ws = nullptr;
      if ((e = workspace_pool(&pool)) || (e = cudaMallocFromPoolAsync(&ws, words * 8, pool, stream))) return e;
      e = cudaMemsetAsync(ws, 0xff, words * 8, stream);
      uint64_t* w = static_cast<uint64_t*>(ws);
      GridShape sh{p.ring.chunk_bytes, p.ring.ring_slots, static_cast<int>(p.ring.chunks_per_cta), p.ring.chunks_per_row, items_per_row,
                   a.scale, a.lse, reinterpret_cast<unsigned long long*>(w), w + 1, p.ring.spill_chunks};
      if (e == cudaSuccess)
        e = cudaLaunchKernelEx(&l.cfg, kernel, static_cast<const T*>(a.x()), a.x_stride(), static_cast<T*>(a.y()), a.y_stride(),
                               a.rows(), a.cols(), sh);
      if (e == cudaSuccess) e = cudaGetLastError();
      if (e == cudaErrorCooperativeLaunchTooLarge) e = cudaErrorInvalidClusterSize;
      const cudaError_t f = cudaFreeAsync(ws, stream);
      return e == cudaSuccess ? f : e;
    }
  });
}

}  // namespace softlight
