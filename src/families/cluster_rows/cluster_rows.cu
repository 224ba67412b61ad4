// cluster_rows (Hopper, sm_90): a cluster of C CTAs owns a row; CTA k owns the row's chunks k, k + C,
// k + 2C, ... (its slice, striped; or the k-th contiguous run of chunks, see ClusterShape::striped).
// The grid is persistent: cluster i takes rows i, i + clusters, ...
//
// Per CTA, a ring of `ring_slots` chunks in shared memory is fed by a producer thread with bulk
// copies (cp.async.bulk, completing on a `full` mbarrier per slot). Two groups of consumer warps
// work on different rows at once:
//   statistics warps fold each chunk of row r + 1 into a running (max, sum) as it lands, reduce
//     over their group and send the CTA's partial to every CTA of the cluster (st.async into
//     their shared memory, completing on a `stats` mbarrier there);
//   writer warps, meanwhile, merge the C partials of row r, write y from shared memory and hand
//     each slot back (`empty` mbarrier), which the producer refills with row r + 2.
// So the DRAM sees reads and writes all the time, and the cluster exchange of a row is hidden
// behind the writing of the row before it. Resident: the slice fits the ring and is read once
// (the planner prefers clusters wide enough for two slices). Streamed: the slice outgrows the
// ring; the statistics pass leaves its last ring's worth of chunks in the ring for the writers,
// and the producer sends the slice's other chunks a second time, for the writers, from the last
// backwards (kept, writers_chunk).
//
// Grid groups: where `exchange` is set, the C CTAs of a row are consecutive CTAs of a cooperative
// grid (every CTA resident at once), not a cluster: any group size, so every SM can take part (7
// clusters of 16 CTAs leave 20 of the H200's 132 idle). Each CTA's (max, sum) of a row, two fp32
// values, is one 64-bit store into its own slot of a per-row table in global memory, which starts
// all ones: a sum is 0 or the result of arithmetic, never that NaN pattern, so the writers poll
// the slot itself and no flag or fence is needed (single-copy atomic 64-bit accesses).
//
// Claimed rows: where `counter` is set, the cluster does not take every clusters-th row but claims
// its next row from a counter in global memory, so that clusters on SMs with more bandwidth take
// more rows (SMs differ: dealt in turn, a copy through this ring left some SMs idle for a third of
// the run). Cluster i's first row is row i; CTA 0's producer claims the row of iteration j + 1
// while the cluster loads row j, and writes it into every CTA's row queue; each role of each CTA
// reads iteration j's row there. The counter's two words (tickets, and clusters done claiming)
// start all ones, and the last cluster to finish claiming puts them back: the next launch on the
// stream finds them ready (see stream_counter).
//
// Backward (dx = dy - exp(y) * sum(dy)): the ring holds dy, whose sum the statistics warps take;
// y, needed by the writers only, arrives through a second, short ring (`aux`) that a second
// producer thread keeps full. So dy and y are each read from DRAM once and dx written once.
#include "device/common.cuh"
#include "device/consumer_out.cuh"
#include "device/hopper.cuh"
#include "device/launch.hpp"
#include "device/workspace.hpp"
#include "families/cluster_rows/rule.hpp"

namespace softlight {
namespace {

struct ClusterShape {
  int chunk_bytes;
  int ring_slots;
  int64_t chunks_per_row;
  int64_t chunks_per_cta;
  int resident;  // the slice stays in the ring: one read
  double scale;  // 1 / temperature: y = (x - max) * scale - log(sum of exp((x - max) * scale))
  void* lse;     // optional per-row log-sum-exp (accumulation type)
  int hints;     // bit 0: loads evict-first in L2; bit 1: stores streaming; bit 2: chunks read twice
                 // held in L2 (kHintReadTwiceInL2, rule.hpp)
  int aux_slots; // backward: chunks of the y ring
  int grid_group; // grid groups: CTAs per row
  void* exchange; // grid groups: the partials table (rows x C packed pairs, see above)
  unsigned long long* counter; // claimed rows: [the next ticket, clusters done claiming]; or null
  int striped;    // a row's chunks dealt to its CTAs in turn, not in contiguous slices
};

// The kernel body exists in the sm_90 device pass only (SOFTLIGHT_HOPPER, hopper.cuh); other
// passes see an empty kernel.
#ifdef SOFTLIGHT_HOPPER
// Buffers for the cluster's partials, by row. The statistics warps start row j only once their
// writers have started row j - 2 (and so re-armed the buffer of row j + 2). A peer therefore
// sends its partial of row j only after it holds ours of row j - 2, by which time our writers
// have started row j - 4: rows j - 3 .. j may be unread here, and four buffers keep them apart.
constexpr int kStatsBuffers = 4;
constexpr int kBar = 1;  // named barrier over the consumer warps
constexpr uint32_t kUnsent = 0xffffffffu;  // the sum's bits in a grid group's slot not yet written
// Claimed rows: entries of the row queue, (iteration + 1) << 32 | row, by iteration. CTA 0 writes
// the entry of iteration j only once its writers have begun row j - kRowQueue + 4: by then every
// role of every CTA of the cluster is done with the entry's previous use (see publish).
constexpr int kRowQueue = 32;

// One CTA's share of the work. Warps [0, G) fold statistics, warps [G, 2G) write, warp 2G
// produces. Both consumer groups walk the ring's sequence of chunks; in streaming mode each row
// is sent twice, the first pass for the statistics warps and the second for the writers.
// U: 16-byte vectors per thread and step. Peel (forward): rows not on 16 bytes, x and y misaligned
// alike (see head_bytes).
template <class T, int U, bool Backward, bool Peel> struct ClusterCta {
  using A = acc_t<T>;
  static constexpr int V = 16 / sizeof(T);

  ClusterShape sh;
  unsigned char* ring;
  uint64_t* full;
  uint64_t* empty;
  unsigned char* aux;  // backward: the y ring, with its own barriers
  uint64_t* aux_full;
  uint64_t* aux_empty;
  uint64_t* stats_bar;          // [kStatsBuffers]
  MaxSum<A>* partials;          // [kStatsBuffers][kMaxCluster]
  A* scratch;                   // [32]
  volatile int* rows_started;   // rows the writers have begun (gates the statistics warps)
  volatile int* rows_done;      // rows the writers have finished (gates them when streaming)
  uint64_t* queue;              // claimed rows: [kRowQueue] entries (see kRowQueue)
  int64_t cluster_id, clusters, rows;
  uint32_t rank, csize;
  uint64_t* table;              // grid groups: packed partials by (row, rank), or null (clusters)
  int group;                    // threads per consumer group
  int gtid, lane;               // thread index within its group, lane
  // The CTA's chunks of a row: its k-th is the row's chunk first_chunk + k * chunk_step.
  int64_t first_chunk, chunk_step, my_chunks, row_bytes;
  // Streamed forward: the statistics pass's last `kept` chunks (a ring's worth) stay in the ring
  // for the writers, who take them first, in the ring's order, and then the others, sent again,
  // from the last backwards. Only those are read twice, and from L2 the likelier for it (rows of
  // 1 M fp32 in 16-CTA clusters: 1.24 -> 1.16 x copy). The backward keeps none: it measured 1-3 %
  // slower keeping them (rows of 4 M, fp32 and bf16).
  int64_t kept;
  A scale;

  // Peeled rows: the ring carries a row's interior, from its first 16-byte boundary
  // (head_bytes in) to its last; CTA 0 takes the elements before and after (under 16 bytes each)
  // straight from global memory (nothing outside the row is read: see stats). The planner keeps
  // every CTA's chunks non-empty for every row.
  __device__ __forceinline__ int64_t head_bytes(const void* row) const {
    return Peel ? static_cast<int64_t>(head_bytes16(row)) : 0;
  }
  __device__ __forceinline__ int64_t interior_bytes(int64_t head) const {
    return Peel ? (row_bytes - head) & ~int64_t{15} : row_bytes;
  }
  // The chunk that the writers' pass takes at its k-th step. Streamed: first the `kept` ones, in
  // the ring's order, then the others from the last backwards (the chunks the statistics pass
  // read last are the likeliest to be in L2 still).
  __device__ __forceinline__ int64_t writers_chunk(int64_t k) const {
    return sh.resident ? k : k < kept ? my_chunks - kept + k : my_chunks - 1 - k;
  }
  // Where the CTA's k-th chunk starts in the row (in its interior, peeled), and its bytes.
  __device__ __forceinline__ int64_t offset_of(int64_t k) const { return (first_chunk + k * chunk_step) * sh.chunk_bytes; }
  __device__ __forceinline__ uint32_t bytes_of(int64_t k, int64_t interior) const {
    return static_cast<uint32_t>(min(int64_t{sh.chunk_bytes}, interior - offset_of(k)));
  }
  // A peeled row's edges, in elements: the head is [0, h), the tail [t, end).
  struct Edges {
    int64_t h, t, end;
  };
  __device__ __forceinline__ Edges edges_of(int64_t head, int64_t interior) const {
    constexpr int64_t e = sizeof(T);
    return {head / e, (head + interior) / e, row_bytes / e};
  }
  __device__ __forceinline__ const T* slot_data(uint32_t slot) const {
    return reinterpret_cast<const T*>(ring + size_t(slot) * sh.chunk_bytes);
  }
  __device__ __forceinline__ void release(uint32_t slot) const {
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_addr(empty + slot));
  }
  __device__ __forceinline__ void release_aux(uint32_t slot) const {
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_addr(aux_empty + slot));
  }

  // The row of iteration `iter` (rows when there is none left).
  __device__ __forceinline__ int64_t row_of(int64_t iter) const {
    if (sh.counter == nullptr) return min(rows, cluster_id + iter * clusters);
    const uint32_t addr = smem_addr(queue + iter % kRowQueue);
    uint64_t e;
    while (static_cast<uint32_t>((e = load_relaxed_cluster(addr)) >> 32) != static_cast<uint32_t>(iter + 1))
      __nanosleep(32);
    return static_cast<uint32_t>(e);
  }
  // CTA 0's producer: claims a row. Rows below `clusters` are every cluster's first; the counter
  // starts all ones, so the first ticket is 0.
  __device__ __forceinline__ unsigned long long claim() const {
    return atomicAdd(sh.counter, 1ull) + 1ull + static_cast<unsigned long long>(clusters);
  }
  // CTA 0's producer, after its last claim: the last cluster here puts both words back to all ones
  // (every claim of the launch is behind it) for the next launch on the stream.
  __device__ __forceinline__ void retire() const {
    __threadfence();
    if (atomicAdd(sh.counter + 1, 1ull) + 1ull == static_cast<unsigned long long>(clusters - 1)) {
      __threadfence();
      atomicExch(sh.counter, ~0ull);
      atomicExch(sh.counter + 1, ~0ull);
    }
  }
  // CTA 0's producer: write the claimed row `claimed` into every CTA's queue as iteration `iter`'s. The
  // entry's previous use, iteration iter - kRowQueue, is behind every role of every CTA once our
  // writers have begun row iter - kRowQueue + 4: they have every CTA's partial of it, so every
  // CTA's statistics warps are past it, and those run at most two rows ahead of their writers
  // (producers run ahead of both). Returns false once the rows have run out.
  __device__ __forceinline__ bool publish(int64_t iter, unsigned long long claimed) const {
    while (iter >= *rows_started + kRowQueue - 4) __nanosleep(64);
    const uint64_t row = claimed < static_cast<unsigned long long>(rows) ? claimed : static_cast<uint64_t>(rows);
    const uint64_t e = (static_cast<uint64_t>(iter + 1) << 32) | row;
    const uint32_t addr = smem_addr(queue + iter % kRowQueue);
    store_relaxed_all(addr, e, csize);
    return row < static_cast<uint64_t>(rows);
  }

  // Folds N packs into a running (max of x, sum of exp((x - max) * scale)).
  template <int N> __device__ __forceinline__ void fold(const uint4 (&p)[N], MaxSum<A>& cp) const {
    fold_packs<T, N>(p, cp, scale);
  }
  // Forward, one step of a consumer group over a chunk: U packs per thread, packs i + u * group,
  // those at or past `end` absent (Full: none is). The statistics step folds them into the
  // chunk's partial; the writer step writes y for them.
  template <bool Full>
  __device__ __forceinline__ void stats_step(const uint4* src, int i, int end, MaxSum<A>& cp) const {
    uint4 p[U];
#pragma unroll
    for (int u = 0; u < U; ++u) p[u] = Full || i + u * group < end ? src[i + u * group] : neg_inf_pack<T>();
    fold<U>(p, cp);
  }
  // (w: the output's writer of the row, see consumer_out.cuh; col: the row's column of src[0].)
  template <bool Full, class W>
  __device__ __forceinline__ void write_step(const uint4* src, uint4* dst, int i, int end, const W& w,
                                             int64_t col) const {
    uint4 p[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (Full || i + u * group < end) p[u] = src[i + u * group];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (Full || i + u * group < end)
        w.pack(reinterpret_cast<T*>(dst + (i + u * group)), p[u], col + int64_t{i + u * group} * V,
               (sh.hints & 2) != 0);
    }
  }

  // Statistics warps: fold the slice of row `iter` into a running (max, sum) as its chunks land,
  // reduce over the group, send the result to every CTA of the cluster (grid groups: post it in
  // the row's table).
  __device__ __forceinline__ void stats(RingPos& pos, int64_t iter, int64_t row_index, const T* xr) const {
    // Stay at most two rows ahead of the writers: the partial buffers of peers are reused on
    // that distance (see kStatsBuffers). Streaming, wait for the writers to finish the row
    // before: the chunks between (the writers' pass) may span more than one lap of the ring,
    // and a slot's parity can only tell apart uses one lap apart.
    if (sh.resident) {
      // (Grid groups have a slot per row: no buffer to guard, and the ring keeps them in step.)
      while (table == nullptr && iter >= 2 && *rows_started < iter - 1) __nanosleep(64);
    } else {
      while (*rows_done < iter) __nanosleep(64);
    }
    // Backward: the max stays 0, so the (max, sum) algebra below reduces to plain sums of dy.
    // Forward: the partials hold the max of x and the sum of exp((x - max) * scale).
    MaxSum<A> part{Backward ? A(0) : neg_inf<A>(), A(0)};
    const A f = exp_factor(scale);
    const int64_t head = head_bytes(xr), interior = interior_bytes(head);
    // Peeled: CTA 0 loads the row's edges from global memory before its chunks, so that the loads'
    // latency hides behind them: where a CTA holds two rows, the statistics warps are on each row's
    // critical path (loaded after the chunks: rows of 50 257 bf16 1.25 x copy, against 1.11 x). The
    // group's last thread folds them in, the one with the fewest packs in a chunk's last step.
    const bool edge_thread = Peel && rank == 0 && gtid == group - 1;
    uint4 edges[2];
    if (edge_thread) {
      const Edges g = edges_of(head, interior);
      edges[0] = edge_pack(xr, 0, g.h);
      edges[1] = edge_pack(xr, g.t, g.end);
    }
    for (int64_t k = 0; k < my_chunks; ++k) {
      mbar_wait_cta(smem_addr(full + pos.slot), pos.phase);
      const T* c = slot_data(pos.slot);
      const int vectors = static_cast<int>(bytes_of(k, interior) / 16);
      if constexpr (Backward) {
        A s = 0;
        for (int base = gtid; base < vectors; base += U * group) {
#pragma unroll
          for (int u = 0; u < U; ++u) {
            A v[V];
            if (base + u * group < vectors) {
              load_pack<T, V>(c + (base + u * group) * V, v);
#pragma unroll
              for (int j = 0; j < V; ++j) s += v[j];
            }
          }
        }
        part.s += s;
        if (!sh.resident && k < my_chunks - kept) release(pos.slot);
        pos.advance(sh.ring_slots);
        continue;
      }
      // Each chunk is summed on its own and merged into the row's running partial: a short
      // chain of additions per sum keeps very long rows accurate.
      const uint4* src = reinterpret_cast<const uint4*>(c);
      MaxSum<A> cp{neg_inf<A>(), A(0)};
      // Full steps while a whole step of the group fits (no division: the bound is a runtime value).
      int base = gtid;
      for (int done = 0; done + U * group <= vectors; done += U * group, base += U * group)
        stats_step<true>(src, base, vectors, cp);
      if (base < vectors) stats_step<false>(src, base, vectors, cp);
      part = merge_max_sum(part, cp, f);
      if (!sh.resident && k < my_chunks - kept) release(pos.slot);
      pos.advance(sh.ring_slots);
    }
    if (!sh.resident) pos.advance(sh.ring_slots, my_chunks - kept);  // the writers' sends of this row
    if (edge_thread) fold<2>(edges, part);
    part = block_max_sum(part, scratch, group, kBar, f);
    if (table != nullptr) {
      if constexpr (sizeof(A) == 4)
        if (gtid == 0) store_relaxed_gpu(table + row_index * csize + rank, pack_pair(part.m, part.s));
      return;
    }
    if (gtid == 0) {
      const int buf = static_cast<int>(iter % kStatsBuffers);
      const uint32_t slot_addr = smem_addr(partials + buf * kMaxCluster + rank);
      const uint32_t bar = smem_addr(stats_bar + buf);
      broadcast_pair(slot_addr, part.m, part.s, bar, csize);
    }
  }

  // Writer warps: wait for the cluster's partials of row `iter`, merge them, write the slice out
  // from shared memory and hand each slot back as soon as it is read. Forward: what the row's
  // elements become is `out`'s (consumer_out.cuh: the log-softmax, or cross-entropy's gradient).
  template <class Out>
  __device__ __forceinline__ void write(RingPos& pos, RingPos& apos, int64_t iter, int64_t row_index,
                                        const T* xr, T* yr, const Out& out) const {
    const int64_t head = head_bytes(xr), interior = interior_bytes(head);
    unsigned char* dst = reinterpret_cast<unsigned char*>(yr) + head;
    if (!sh.resident) pos.advance(sh.ring_slots, my_chunks - kept);  // the statistics pass, but what it kept
    // Lane r takes the partials of CTAs r, r + 32, ...; five shuffle steps merge the lanes' (a
    // serial merge of 16 is long enough to show at the founding shape, and the writers wait on it
    // once per row).
    MaxSum<A> row{neg_inf<A>(), A(0)};
    const A f = exp_factor(scale);
    const int buf = static_cast<int>(iter % kStatsBuffers);
    const uint32_t bar = smem_addr(stats_bar + buf);
    if constexpr (sizeof(A) == 4) {
      if (table != nullptr) {
        for (int64_t i = row_index * csize + lane; i < (row_index + 1) * csize; i += 32) {
          uint64_t v;
          while (((v = load_relaxed_gpu(table + i)) >> 32) == kUnsent) __nanosleep(32);
          row = merge_max_sum(row, unpack_pair(v), f);
        }
      }
    }
    if (table == nullptr) {
      mbar_wait(bar, static_cast<uint32_t>((iter / kStatsBuffers) & 1));
      if (lane < static_cast<int>(csize)) row = partials[buf * kMaxCluster + lane];
    }
    row = shfl_merge_max_sum(row, f);
    // Re-arm this buffer for row iter + kStatsBuffers (see kStatsBuffers), then let the
    // statistics warps move on.
    if (gtid == 0) {
      if (table == nullptr) mbar_arrive_expect_tx(bar, 2 * sizeof(A) * csize);
      *rows_started = static_cast<int>(iter + 1);
    }
    const A log_sum = log_acc(row.s);
    const auto w = out.row(row_index, row.m, row.s, log_sum, rank == 0 && gtid == 0 ? 0 : -1, 1);
    if (Peel && rank == 0 && gtid < 2 * V) {
      // The edges of a peeled row: thread i < V writes the head's element i, V + i the tail's.
      const Edges g = edges_of(head, interior);
      const int64_t j = gtid < V ? gtid : g.t + (gtid - V);
      if (gtid < V ? j < g.h : j < g.end) yr[j] = from_acc<T>(w.element(to_acc(xr[j]), j));
    }
    for (int64_t step = 0; step < my_chunks; ++step) {
      const int64_t k = writers_chunk(step);
      mbar_wait_cta(smem_addr(full + pos.slot), pos.phase);  // long complete when resident
      const T* c = slot_data(pos.slot);
      T* dst_k = reinterpret_cast<T*>(dst + offset_of(k));
      const int vectors = static_cast<int>(bytes_of(k, interior) / 16);
      if constexpr (Backward) {
        mbar_wait_cta(smem_addr(aux_full + apos.slot), apos.phase);
        const T* yc = reinterpret_cast<const T*>(aux + size_t(apos.slot) * sh.chunk_bytes);
        for (int base = gtid; base < vectors; base += U * group) {
          A g[U][V], v[U][V];
#pragma unroll
          for (int u = 0; u < U; ++u) {
            if (base + u * group < vectors) {
              load_pack<T, V>(c + (base + u * group) * V, g[u]);
              load_pack<T, V>(yc + (base + u * group) * V, v[u]);
            }
          }
#pragma unroll
          for (int u = 0; u < U; ++u) {
            if (base + u * group < vectors) {
#pragma unroll
              for (int j = 0; j < V; ++j) v[u][j] = log_softmax_grad(g[u][j], v[u][j], row.s);
              store_pack<T, V>(dst_k + (base + u * group) * V, v[u], (sh.hints & 2) != 0);
            }
          }
        }
        release(pos.slot);
        pos.advance(sh.ring_slots);
        release_aux(apos.slot);
        apos.advance(sh.aux_slots);
        continue;
      }
      const uint4* src = reinterpret_cast<const uint4*>(c);
      uint4* o = reinterpret_cast<uint4*>(dst_k);
      const int64_t col = (head + offset_of(k)) / int64_t{sizeof(T)};
      int base = gtid;
      for (int done = 0; done + U * group <= vectors; done += U * group, base += U * group)
        write_step<true>(src, o, base, vectors, w, col);
      if (base < vectors) write_step<false>(src, o, base, vectors, w, col);
      release(pos.slot);
      pos.advance(sh.ring_slots);
    }
    if (gtid == 0) {
      *rows_done = static_cast<int>(iter + 1);
    }
  }
};
#endif  // SOFTLIGHT_HOPPER

// Forward: x in, y out (aux unused), what y holds `out`'s. Backward: x is dy, aux is y, y is dx.
template <class T, int U, bool Backward, bool Peel, class Out>
__device__ __forceinline__ void cluster_rows(const T* __restrict__ x, int64_t xs, const T* __restrict__ aux, int64_t as,
                                             T* __restrict__ y, int64_t ys, int64_t rows, int64_t cols,
                                             const ClusterShape& sh, const Out& out) {
#ifdef SOFTLIGHT_HOPPER
  extern __shared__ __align__(128) unsigned char smem[];
  ClusterCta<T, U, Backward, Peel> cta;
  cta.sh = sh;
  cta.scale = static_cast<acc_t<T>>(sh.scale);
  cta.ring = smem;
  cta.aux = smem + size_t(sh.ring_slots) * sh.chunk_bytes;
  cta.full = reinterpret_cast<uint64_t*>(cta.aux + size_t(sh.aux_slots) * sh.chunk_bytes);
  cta.empty = cta.full + sh.ring_slots;
  cta.aux_full = cta.empty + sh.ring_slots;
  cta.aux_empty = cta.aux_full + sh.aux_slots;
  cta.stats_bar = cta.aux_empty + sh.aux_slots;  // an even count of barriers before: 16-aligned below
  cta.partials = reinterpret_cast<MaxSum<acc_t<T>>*>(cta.stats_bar + kStatsBuffers);  // 16-aligned
  cta.scratch = reinterpret_cast<acc_t<T>*>(cta.partials + kStatsBuffers * kMaxCluster);
  cta.rows_started = reinterpret_cast<volatile int*>(cta.scratch + 32);
  cta.rows_done = cta.rows_started + 1;
  cta.queue = reinterpret_cast<uint64_t*>(const_cast<int*>(cta.rows_done + 1));  // 8-aligned
  cta.rows = rows;
  if (sh.exchange != nullptr) {
    cta.csize = static_cast<uint32_t>(sh.grid_group);
    cta.rank = blockIdx.x % cta.csize;
    cta.table = static_cast<uint64_t*>(sh.exchange);
  } else {
    cta.rank = cluster_rank();
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(cta.csize));
    cta.table = nullptr;
  }
  cta.group = (static_cast<int>(blockDim.x) - 32) / 2;
  const int warp = threadIdx.x >> 5, group_warps = cta.group >> 5;
  cta.gtid = static_cast<int>(threadIdx.x) % cta.group;
  cta.lane = threadIdx.x & 31;
  cta.row_bytes = cols * int64_t{sizeof(T)};
  // Striped: CTA k takes the row's chunks k, k + C, ... (C CTAs a row), so that a row's CTAs read
  // and write it front to back together. Else a contiguous slice of chunks_per_cta.
  if (sh.striped) {
    cta.first_chunk = cta.rank;
    cta.chunk_step = cta.csize;
    cta.my_chunks = cta.first_chunk < sh.chunks_per_row ? (sh.chunks_per_row - cta.first_chunk + cta.csize - 1) / cta.csize : 0;
  } else {
    cta.first_chunk = int64_t{cta.rank} * sh.chunks_per_cta;
    cta.chunk_step = 1;
    cta.my_chunks = max(int64_t{0}, min(sh.chunks_per_cta, sh.chunks_per_row - cta.first_chunk));
  }
  cta.kept = sh.resident || Backward ? 0 : min(cta.my_chunks, int64_t{sh.ring_slots});
  cta.cluster_id = blockIdx.x / cta.csize;
  cta.clusters = gridDim.x / cta.csize;

  if (threadIdx.x == 0) {
    for (int i = 0; i < sh.ring_slots; ++i) {
      mbar_init(smem_addr(cta.full + i), 1);
      mbar_init(smem_addr(cta.empty + i), group_warps);
    }
    for (int i = 0; i < sh.aux_slots; ++i) {
      mbar_init(smem_addr(cta.aux_full + i), 1);
      mbar_init(smem_addr(cta.aux_empty + i), group_warps);
    }
    for (int b = 0; b < kStatsBuffers; ++b) {
      mbar_init(smem_addr(cta.stats_bar + b), 1);
      mbar_arrive_expect_tx(smem_addr(cta.stats_bar + b), 2 * sizeof(acc_t<T>) * cta.csize);
    }
    *cta.rows_started = 0;
    *cta.rows_done = 0;
    for (int i = 0; i < kRowQueue; ++i) cta.queue[i] = 0;
    cta.queue[0] = (uint64_t{1} << 32) | static_cast<uint64_t>(cta.cluster_id);  // claimed rows: the first
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync();

  if (warp < group_warps) {
    RingPos pos;
    for (int64_t iter = 0, row; (row = cta.row_of(iter)) < rows; ++iter) cta.stats(pos, iter, row, x + row * xs);
  } else if (warp < 2 * group_warps) {
    RingPos pos, apos;
    for (int64_t iter = 0, row; (row = cta.row_of(iter)) < rows; ++iter)
      cta.write(pos, apos, iter, row, x + row * xs, y + row * ys, out);
  } else if (Backward && threadIdx.x == 2 * cta.group + 1) {
    // Backward: a second producer thread keeps the y ring full, in the writers' order.
    RingPos pos;
    for (int64_t iter = 0, row; (row = cta.row_of(iter)) < rows; ++iter) {
      const unsigned char* src = reinterpret_cast<const unsigned char*>(aux + row * as);
      for (int64_t step = 0; step < cta.my_chunks; ++step) {
        const int64_t k = cta.writers_chunk(step);
        mbar_wait_cta(smem_addr(cta.aux_empty + pos.slot), pos.phase ^ 1);
        const uint32_t bytes = cta.bytes_of(k, cta.row_bytes);
        mbar_arrive_expect_tx(smem_addr(cta.aux_full + pos.slot), bytes);
        bulk_load(smem_addr(cta.aux + size_t(pos.slot) * sh.chunk_bytes), src + cta.offset_of(k), bytes,
                  smem_addr(cta.aux_full + pos.slot));
        pos.advance(sh.aux_slots);
      }
    }
  } else if (threadIdx.x == 2 * cta.group) {
    // Producer: one thread walks the same rows and keeps the ring full. CTA 0's claims the next
    // row before it loads this one and publishes it after (the claim's round trip overlaps the
    // loads).
    RingPos pos;
    bool more = sh.counter != nullptr && cta.rank == 0;
    for (int64_t iter = 0, row; (row = cta.row_of(iter)) < rows; ++iter) {
      const unsigned long long next = more ? cta.claim() : 0;
      const int64_t head = cta.head_bytes(x + row * xs), interior = cta.interior_bytes(head);
      const unsigned char* src = reinterpret_cast<const unsigned char*>(x + row * xs) + head;
      for (int pass = 0; pass < (sh.resident ? 1 : 2); ++pass) {
        for (int64_t step = pass == 0 ? 0 : cta.kept; step < cta.my_chunks; ++step) {
          const int64_t k = pass == 0 ? step : cta.writers_chunk(step);
          mbar_wait_cta(smem_addr(cta.empty + pos.slot), pos.phase ^ 1);
          const uint32_t bytes = cta.bytes_of(k, interior);
          mbar_arrive_expect_tx(smem_addr(cta.full + pos.slot), bytes);
          const uint32_t dst = smem_addr(cta.ring + size_t(pos.slot) * sh.chunk_bytes);
          // Forward, streamed: chunks read twice go evict-last the first time, evict-first the
          // second (kHintReadTwiceInL2), so that the second read finds them in L2.
          const bool again = !Backward && (sh.hints & kHintReadTwiceInL2) && !sh.resident &&
                             (pass == 1 || step < cta.my_chunks - cta.kept);
          if (again && pass == 0) {
            bulk_load_policy<true>(dst, src + cta.offset_of(k), bytes, smem_addr(cta.full + pos.slot));
          } else if ((sh.hints & 1) || again) {
            bulk_load_policy<false>(dst, src + cta.offset_of(k), bytes, smem_addr(cta.full + pos.slot));
          } else {
            bulk_load(dst, src + cta.offset_of(k), bytes, smem_addr(cta.full + pos.slot));
          }
          pos.advance(sh.ring_slots);
        }
      }
      if (more && !(more = cta.publish(iter + 1, next))) cta.retire();
    }
  }
  // No CTA may leave while a peer can still write into its shared memory.
  __syncwarp();
  cluster_sync();
#endif
}

// The log-softmax (and the lse where sh.lse is set), or its backward.
template <class T, int U, bool Backward, bool Peel>
__global__ void __launch_bounds__(kClusterMaxThreads, 1)
cluster_rows_kernel(const T* __restrict__ x, int64_t xs, const T* __restrict__ aux, int64_t as,
                    T* __restrict__ y, int64_t ys, int64_t rows, int64_t cols, ClusterShape sh) {
  cluster_rows<T, U, Backward, Peel>(x, xs, aux, as, y, ys, rows, cols, sh,
                                     LogSoftmaxOut<T>{static_cast<acc_t<T>>(sh.scale), static_cast<acc_t<T>*>(sh.lse)});
}

// Cross-entropy's loss, lse and gradient (into y), the row held in the ring between its read and the
// gradient's write. CTAs of at most kClusterDefaultThreads (plan_consumer gives no other), so that the
// writers keep the registers the gradient wants: under the log-softmax's bound of 800 threads the
// compiler held them to 72 and the fp32 kernel spilled (docs/consumers.md, "Kernel choices").
template <class T, int U, bool Peel>
__global__ void __launch_bounds__(kClusterDefaultThreads, 1)
cluster_rows_ce_kernel(const T* __restrict__ x, int64_t xs, const T* __restrict__ aux, int64_t as,
                       T* __restrict__ y, int64_t ys, int64_t rows, int64_t cols, ClusterShape sh,
                       CrossEntropyOut<T> out) {
  cluster_rows<T, U, false, Peel>(x, xs, aux, as, y, ys, rows, cols, sh, out);
}

// The kernels of an output, by packs a step (U) and peeling.
template <class T, bool Backward> struct LogSoftmaxKernels {
  template <int U, bool Peel> static constexpr auto kernel = cluster_rows_kernel<T, U, Backward, Peel>;
};
template <class T> struct CrossEntropyKernels {
  template <int U, bool Peel> static constexpr auto kernel = cluster_rows_ce_kernel<T, U, Peel>;
};

// The operands of one launch: x (dy), aux (y, backward only), y (dx), with their row strides.
struct Operands {
  const void* x;
  int64_t xs;
  const void* aux;
  int64_t as;
  void* y;
  int64_t ys;
  int64_t rows, cols;
  double scale;
  void* lse;
};

// K: the kernels (LogSoftmaxKernels or CrossEntropyKernels); extra: the kernel's arguments after sh.
template <class T, bool Backward, class K = LogSoftmaxKernels<T, Backward>, class... Extra>
cudaError_t launch(const Plan& p, const Operands& a, cudaStream_t stream, const Extra&... extra) {
  // A step of a consumer group covers group * U vectors: U = 4 when a chunk holds that many,
  // else 2, so that small chunks do not leave lanes idle. The backward's writers hold two packs
  // per vector, and float64's packs hold wider values: both keep U = 2 within the register budget.
  const int group = (p.threads - 32) / 2;
  auto kernel = K::template kernel<2, false>;
  if constexpr (!Backward) {
    if (p.peel) kernel = K::template kernel<2, true>;
    if constexpr (sizeof(T) < 8)
      if (p.ring.chunk_bytes / 16 >= 4 * group)
        kernel = p.peel ? K::template kernel<4, true> : K::template kernel<4, false>;
  }
  ClusterLaunch l;
  cudaError_t e = prepare_cluster_launch(kernel, p, stream, &l);
  if (e != cudaSuccess) return e;

  ClusterShape sh{p.ring.chunk_bytes, p.ring.ring_slots, p.ring.chunks_per_row, p.ring.chunks_per_cta, p.resident ? 1 : 0, a.scale,
                  a.lse, p.ring.hints, Backward ? p.ring.aux_slots : 0, p.ring.grid_exchange ? p.cluster : 0, nullptr, nullptr,
                  p.ring.striped ? 1 : 0};
  // Rows are claimed only where a cluster has more than one to take (rows fit the queue's 32 bits).
  const bool claim = p.ring.claim_rows && a.rows > l.clusters && a.rows < (int64_t{1} << 32) - 1;
  // A workspace, all ones on the stream before the kernel and freed on the stream after it: grid
  // groups' table of packed (max, sum) pairs by row and rank (kUnsent; fp32 partials only), or
  // claimed rows' counter where the stream has none of its own.
  if (p.ring.grid_exchange && sizeof(acc_t<T>) != 4) return cudaErrorInvalidValue;
  if (claim && (e = stream_counter(stream, &sh.counter))) return e;
  const size_t bytes = p.ring.grid_exchange ? static_cast<size_t>(a.rows) * static_cast<size_t>(p.cluster) * sizeof(uint64_t)
                       : claim && sh.counter == nullptr ? kCounterBytes
                                                        : 0;
  void* workspace = nullptr;
  if (bytes > 0) {
    cudaMemPool_t pool;
    if ((e = workspace_pool(&pool)) || (e = cudaMallocFromPoolAsync(&workspace, bytes, pool, stream))) return e;
    e = cudaMemsetAsync(workspace, 0xff, bytes, stream);
    if (p.ring.grid_exchange) {
      sh.exchange = workspace;
    } else {
      sh.counter = static_cast<unsigned long long*>(workspace);
    }
  }
  if (e == cudaSuccess)
    e = cudaLaunchKernelEx(&l.cfg, kernel, static_cast<const T*>(a.x), a.xs, static_cast<const T*>(a.aux), a.as,
                           static_cast<T*>(a.y), a.ys, a.rows, a.cols, sh, extra...);
  if (e == cudaSuccess) e = cudaGetLastError();
  // A grid that cannot be resident at once (a partitioned GPU): the caller falls back to clusters.
  if (e == cudaErrorCooperativeLaunchTooLarge) e = cudaErrorInvalidClusterSize;
  if (workspace != nullptr) {
    const cudaError_t f = cudaFreeAsync(workspace, stream);
    if (e == cudaSuccess) e = f;
  }
  return e;
}

}  // namespace

cudaError_t launch_cluster_rows(const Plan& p, const Call& a, cudaStream_t stream) {
  if (a.backward) {
    const Operands o{a.in0, a.in0_s[0], a.in1, a.in1_s[0], a.out, a.out_s[0], a.n[0], a.n[1], 1.0, nullptr};
    return with_element_type(a.dtype, [&](auto tag) { return launch<decltype(tag), true>(p, o, stream); });
  }
  const Operands o{a.x(), a.x_stride(), nullptr, 0, a.y(), a.y_stride(), a.rows(), a.cols(), a.scale, a.lse};
  return with_element_type(a.dtype, [&](auto tag) { return launch<decltype(tag), false>(p, o, stream); });
}

cudaError_t launch_cluster_rows_ce(const Plan& p, const Call& a, const int64_t* target,
                                   const CrossEntropyArgs<float>& args, cudaStream_t stream) {
  const Operands o{a.x(), a.x_stride(), nullptr, 0, a.y(), a.y_stride(), a.rows(), a.cols(), a.scale, nullptr};
  return with_cross_entropy_out(a, target, args, false, [&](auto tag, const auto& out) -> cudaError_t {
    using T = decltype(tag);
    if constexpr (std::decay_t<decltype(out)>::kGather) return cudaErrorInvalidValue;  // (the gradient alone)
    else return launch<T, false, CrossEntropyKernels<T>>(p, o, stream, out);
  });
}

}  // namespace softlight
