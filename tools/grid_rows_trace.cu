// Probe: when does each row of a grid_rows call pass each step, and what does each role wait on? The
// library's grid_rows kernel, built here with its trace points on, records for every row the first
// and last time (%globaltimer, over all CTAs) at which an item of it was claimed, a chunk of it
// landed in a ring, an item of it was posted, its statistics reached a CTA's writers, the first
// writer warp started it and handed back a slot of it; and, summed over the CTAs, the time each
// role spent on the row: the producer waiting for free slots and claiming, the statistics warps
// waiting for chunks and folding them, the writers (their first warp) waiting for a filled slot, for
// the row's statistics, for refills, and writing, and the merger reading the row's partials.
// Prints each row's times from the start of the call, then averages over the rows past the first
// two: the row's period (first claim to first claim), its claims' span, the tail of its loads (last
// claim to last landed), its last fold and post, the merge (last post to the statistics in the first
// and the last CTA), the writes after that, and each role's time a CTA per row.
// Build and run on an sm_90 GPU (the plan is the planner's, as the library would launch it, with the
// SOFTLIGHT_* knobs of the environment):
//   nvcc -std=c++17 -O3 -arch=sm_90a -Isrc -Iinclude -o /tmp/grid_rows_trace tools/grid_rows_trace.cu \
//     src/plan.cpp src/cluster_rows.cu && /tmp/grid_rows_trace 60 4194304 float32
// (src/cluster_rows.cu for the library's workspace pool.)
#include <algorithm>
#include <vector>

#include "trace_common.cuh"

__device__ unsigned long long* g_span;   // [span][row], ns summed over CTAs

__device__ __forceinline__ void trace_span(int span, long long row, unsigned long long from, unsigned long long to) {
  atomicAdd(g_span + span * g_rows + row, to - from);
}
#define SOFTLIGHT_GRID_ROWS_TRACE(event, row) ::trace_point(event, row)
#define SOFTLIGHT_GRID_ROWS_CLOCK() ::trace_clock()
#define SOFTLIGHT_GRID_ROWS_SPAN(span, row, from, to) ::trace_span(span, row, from, to)

#include "grid_rows.cu"


using namespace softlight;

int main(int argc, char** argv) {
  TraceSetup t;
  if (const int status = trace_setup(argc, argv, "", Family::grid_rows, &t)) return status;
  const long long rows = t.rows, cols = t.cols;
  const softlight_dtype dtype = t.dtype;
  const DeviceInfo& d = t.d;
  const Plan& plan = t.plan;
  void *x = t.x, *y = t.y;
  std::printf("# %lld x %lld %s: grid_rows, %d slots of %d bytes, items of %lld chunks, %lld chunks a row, %lld spilled, "
              "wait_last %d\n",
              rows, cols, argv[3], plan.ring_slots, plan.chunk_bytes, static_cast<long long>(plan.chunks_per_cta),
              static_cast<long long>(plan.chunks_per_row), static_cast<long long>(plan.spill_chunks), plan.wait_last ? 1 : 0);

  constexpr int kEvents = 6, kSpans = 9;
  const size_t span_words = size_t(kSpans) * rows;
  size_t words;
  unsigned long long *trace, *spans;
  CHECK(trace_store(kEvents, rows, &trace, &words));
  CHECK(trace_array(g_span, span_words, &spans));
  std::vector<unsigned long long> h(words);
  const RowsArgs args{x, cols, y, cols, rows, cols, dtype, 1.0, nullptr};
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  float ms = 0;
  for (int rep = 0; rep < 3; ++rep) {  // the last call's trace is printed
    CHECK(trace_reset(trace, words));
    CHECK(cudaMemset(spans, 0, span_words * 8));
    CHECK(cudaEventRecord(e0));
    CHECK(launch_grid_rows(plan, args, nullptr));
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
  }
  CHECK(cudaMemcpy(h.data(), trace, words * 8, cudaMemcpyDeviceToHost));
  std::vector<unsigned long long> hs(span_words);
  CHECK(cudaMemcpy(hs.data(), spans, span_words * 8, cudaMemcpyDeviceToHost));
  const auto at = [&](int event, long long row, int last) { return h[(size_t(event) * rows + row) * 2 + last]; };
  const unsigned long long t0 = at(0, 0, 0);
  const auto us = [&](int event, long long row, int last) { return (double(at(event, row, last)) - double(t0)) / 1e3; };
  std::printf("# call %.3f ms (with the trace points' atomics)\n", ms);
  std::printf("# row  claimed first last  landed first last  posted last  stats first last  writes first  written last (us)\n");
  for (long long r = 0; r < rows; ++r)
    std::printf("%5lld %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f\n", r, us(0, r, 0), us(0, r, 1), us(1, r, 0),
                us(1, r, 1), us(2, r, 1), us(3, r, 0), us(3, r, 1), us(4, r, 0), us(5, r, 1));
  double period = 0, claims = 0, tail = 0, post = 0, merge_first = 0, merge_last = 0, writes = 0, overlap = 0;
  long long counted = 0;
  for (long long r = 2; r + 1 < rows; ++r, ++counted) {
    period += us(0, r + 1, 0) - us(0, r, 0);
    claims += us(0, r, 1) - us(0, r, 0);
    tail += us(1, r, 1) - us(0, r, 1);
    post += us(2, r, 1) - us(1, r, 1);
    merge_first += us(3, r, 0) - us(2, r, 1);
    merge_last += us(3, r, 1) - us(2, r, 1);
    writes += us(5, r, 1) - us(3, r, 1);
    overlap += us(0, r + 1, 0) - us(0, r, 1);
  }
  if (counted > 0) {
    const double c = double(counted);
    std::printf("# averages over rows 2 to %lld (us): period %.2f; claims span %.2f, next row's first claim %+.2f after "
                "the last; last claim to last landed %.2f; to last post %.2f; merge: stats in the first CTA %.2f, in the "
                "last %.2f after the last post; last slot handed back %.2f after that\n",
                rows - 2, period / c, claims / c, overlap / c, tail / c, post / c, merge_first / c, merge_last / c,
                writes / c);
    // Each role's time on a row, a CTA (one CTA per SM: the grid is at most the SM count).
    const double ctas = double(std::min<long long>(d.sm_count, rows * ((plan.chunks_per_row + plan.chunks_per_cta - 1) /
                                                                       plan.chunks_per_cta)));
    static const char* names[kSpans] = {"producer waits for free slots", "producer claims",
                                        "statistics wait for a chunk", "statistics fold",
                                        "writers wait for a filled slot", "writers wait for the row's statistics",
                                        "writers wait for a refill", "writers write", "merger reads the row"};
    std::printf("# time a CTA per row (us), averaged over rows 2 to %lld:", rows - 2);
    for (int s = 0; s < kSpans; ++s) {
      double sum = 0;
      for (long long r = 2; r + 1 < rows; ++r) sum += double(hs[size_t(s) * rows + r]);
      std::printf("%s %s %.2f", s ? ";" : "", names[s], sum / c / ctas / 1e3);
    }
    std::printf("\n");
  }
  return 0;
}
