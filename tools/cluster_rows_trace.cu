// Probe: where does a cluster_rows call's time go beyond its pace? The library's cluster_rows kernel,
// built here with its trace points on, records for every row the first and last time (%globaltimer,
// over all CTAs) at which the producers began and ended its loads, its partials were ready, its
// statistics reached the writers and the writers finished it, and for every CTA when it got past
// its first and its last cluster barrier. From these it splits the call into:
//   outside: the call's time (events on the stream) less the CTAs' lifetime (first start to last end):
//     the launch and what follows the last CTA;
//   pace: the rows' completions in the middle half of the call, fitted to a line (a row every p us);
//     its rate, in GB/s read and written, beside a cudaMemcpyAsync's of the same bytes;
//   fill: where that line crosses the call's first row, from the first CTA's start;
//   drain: the last CTA's end after the line's last row.
// With a fifth argument, `spin` us, each timed operation (copies and calls) waits behind a kernel
// spinning that long, queued before its start event: the host work of the launch is then hidden,
// and the times are the GPU's alone (and the spin's time, by events, checks %globaltimer's rate).
// So call = outside + fill + rows * p + drain, and a kernel whose pace matches the copy's loses to it
// only by fill and drain.
// Build and run on an sm_90 GPU (the plan is the planner's, as the library would launch it, with the
// SOFTLIGHT_* knobs of the environment):
//   nvcc -std=c++17 -O3 -arch=sm_90a -Isrc -Iinclude -o /tmp/cluster_rows_trace tools/cluster_rows_trace.cu \
//     src/plan.cpp && /tmp/cluster_rows_trace 636 393216 float32
#include <algorithm>
#include <vector>

#include "trace_common.cuh"

constexpr int kMaxCtas = 1024;
__device__ unsigned long long* g_cta;  // [event][CTA], kMaxCtas CTAs an event

__device__ __forceinline__ void trace_cta(int event) { g_cta[event * kMaxCtas + blockIdx.x] = trace_clock(); }
// Built with -DTRACE_OFF, the kernel is the library's own (no trace points): the calls' times alone,
// to see what the trace points cost.
#ifndef TRACE_OFF
#define SOFTLIGHT_CLUSTER_ROWS_TRACE(event, row) ::trace_point(event, row)
#define SOFTLIGHT_CLUSTER_ROWS_CTA(event) ::trace_cta(event)
#endif

#include "cluster_rows.cu"

using namespace softlight;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Least squares of t against k: (intercept, slope).
std::pair<double, double> fit_line(const std::vector<double>& t, size_t from, size_t to) {
  double n = 0, sk = 0, st = 0, skk = 0, skt = 0;
  for (size_t k = from; k < to; ++k, ++n) {
    sk += double(k), st += t[k], skk += double(k) * double(k), skt += double(k) * t[k];
  }
  const double slope = (n * skt - sk * st) / (n * skk - sk * sk);
  return {(st - slope * sk) / n, slope};
}

}  // namespace

int main(int argc, char** argv) {
  TraceSetup ts;
  if (const int status = trace_setup(argc, argv, " [calls] [spin us]", Family::cluster_rows, &ts)) return status;
  const long long rows = ts.rows, cols = ts.cols;
  const softlight_dtype dtype = ts.dtype;
  const int elem = ts.elem;
  const Plan& plan = ts.plan;
  void *x = ts.x, *y = ts.y;
  const int calls = argc > 4 ? std::max(1, std::atoi(argv[4])) : 5;
  const unsigned long long spin_ns = argc > 5 ? 1000ull * std::strtoull(argv[5], nullptr, 10) : 0;
  const size_t bytes = size_t(rows) * cols * elem;
  constexpr int kEvents = 5, kCtaEvents = 2;
  const size_t cta_words = size_t(kCtaEvents) * kMaxCtas;
  size_t words;
  unsigned long long *trace, *cta;
  CHECK(trace_store(kEvents, rows, &trace, &words));
  CHECK(trace_array(g_cta, cta_words, &cta));
  const RowsArgs args{x, cols, y, cols, rows, cols, dtype, 1.0, nullptr};
  cudaEvent_t es, e0, e1;
  CHECK(cudaEventCreate(&es));
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<double> spin_ms;
  // Before a timed operation: the spin, if asked for (timed itself), then the start event.
  const auto start = [&]() {
    cudaError_t e = cudaSuccess;
    if (spin_ns > 0) {
      e = cudaEventRecord(es);
      spin<<<1, 1>>>(spin_ns);
    }
    return e == cudaSuccess ? cudaEventRecord(e0) : e;
  };
  // After it: the end event, and the operation's time (and the spin's).
  const auto finish = [&](float* ms) {
    cudaError_t e;
    if ((e = cudaEventRecord(e1)) || (e = cudaEventSynchronize(e1)) || (e = cudaEventElapsedTime(ms, e0, e1))) return e;
    float s = 0;
    if (spin_ns > 0 && (e = cudaEventElapsedTime(&s, es, e0)) == cudaSuccess) spin_ms.push_back(s);
    return e;
  };

  // The copy's time, median of `calls`, from an idle stream as the library's call below; and a copy
  // of half the bytes, so that the copy too splits into a fixed part and a pace.
  std::vector<double> copy_ms, half_ms;
  float ms = 0;
  for (int c = 0; c < 2 * calls; ++c) {
    CHECK(start());
    CHECK(cudaMemcpyAsync(y, x, c % 2 ? bytes / 2 : bytes, cudaMemcpyDeviceToDevice));
    CHECK(finish(&ms));
    (c % 2 ? half_ms : copy_ms).push_back(ms);
  }
  // The launch alone: the same grid with no rows (every CTA sets up, meets its cluster and leaves),
  // beside a copy of 1 MB.
  std::vector<double> empty_ms, small_ms;
  RowsArgs none = args;
  none.rows = 0;
  for (int c = 0; c < calls; ++c) {
    CHECK(start());
    CHECK(launch_cluster_rows(plan, none, nullptr));
    CHECK(finish(&ms));
    empty_ms.push_back(ms);
    CHECK(start());
    CHECK(cudaMemcpyAsync(y, x, std::min<size_t>(bytes, 1 << 20), cudaMemcpyDeviceToDevice));
    CHECK(finish(&ms));
    small_ms.push_back(ms);
  }
  // The traced calls: the median call's trace is the one kept.
  struct Call {
    double ms;
    std::vector<unsigned long long> rows, ctas;
  };
  std::vector<Call> traced;
  for (int c = 0; c < calls; ++c) {
    CHECK(trace_reset(trace, words));
    CHECK(cudaMemset(cta, 0, cta_words * 8));
    CHECK(start());
    CHECK(launch_cluster_rows(plan, args, nullptr));
    CHECK(finish(&ms));
    Call t{ms, std::vector<unsigned long long>(words), std::vector<unsigned long long>(cta_words)};
    CHECK(cudaMemcpy(t.rows.data(), trace, words * 8, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(t.ctas.data(), cta, cta_words * 8, cudaMemcpyDeviceToHost));
    traced.push_back(std::move(t));
  }
  std::sort(traced.begin(), traced.end(), [](const Call& a, const Call& b) { return a.ms < b.ms; });
  const Call& t = traced[traced.size() / 2];
  const double copy = median(copy_ms), call = t.ms, copy_fixed = 2 * median(half_ms) - copy;
  std::printf("%lld x %lld %s: cluster_rows, clusters of %d, %d threads, %d slots of %d bytes, %lld chunks a CTA a row\n",
              rows, cols, argv[3], plan.cluster, plan.threads, plan.ring_slots, plan.chunk_bytes,
              static_cast<long long>(plan.chunks_per_cta));
  std::printf("  copy %.4f ms (%.0f GB/s; fixed part %.2f us from a copy of half the bytes); %s call %.4f ms (median "
              "of %d; %.3f x copy)%s\n",
              copy, 2.0 * double(bytes) / copy / 1e6, copy_fixed * 1e3, t.ctas[0] ? "traced" : "untraced", call, calls,
              call / copy, spin_ns > 0 ? "; host work hidden" : "");
  std::printf("  the same grid with no rows %.2f us, a copy of 1 MB %.2f us (medians)\n", median(empty_ms) * 1e3,
              median(small_ms) * 1e3);
  if (spin_ns > 0)
    std::printf("  spin of %llu us on %%globaltimer: %.2f us by events (median)\n", spin_ns / 1000,
                median(spin_ms) * 1e3);
  if (t.ctas[0] == 0) return 0;  // built with TRACE_OFF
  // CTAs that ran: those with a start time (the grid is whole clusters, at most the SM count).
  std::vector<double> starts, ends;
  int grid = 0;
  unsigned long long t0 = ~0ull;
  for (int b = 0; b < kMaxCtas; ++b)
    if (t.ctas[b] != 0) t0 = std::min(t0, t.ctas[b]);
  for (int b = 0; b < kMaxCtas; ++b) {
    if (t.ctas[b] == 0) continue;
    ++grid;
    starts.push_back((double(t.ctas[b]) - double(t0)) / 1e3);
    ends.push_back((double(t.ctas[kMaxCtas + b]) - double(t0)) / 1e3);
  }
  const auto at = [&](int event, long long row, int last) {
    return (double(t.rows[(size_t(event) * rows + row) * 2 + last]) - double(t0)) / 1e3;
  };
  // Rows in the order they were finished (the last CTA's writers done).
  std::vector<double> done(rows);
  for (long long r = 0; r < rows; ++r) done[r] = at(4, r, 1);
  std::sort(done.begin(), done.end());
  const double life = *std::max_element(ends.begin(), ends.end());
  const auto [a, p] = fit_line(done, size_t(rows) / 4, size_t(rows) * 3 / 4);
  const double row_bytes = 2.0 * double(cols) * elem;
  const double fill = a, drain = life - (a + double(rows) * p), outside = call * 1e3 - life;
  // The first rows (one a cluster): when their loads began, their partials were ready, the writers
  // had their statistics and had written them, averaged.
  const long long firsts = std::min<long long>(rows, grid / plan.cluster);
  double f_load = 0, f_ready = 0, f_stats = 0, f_done = 0;
  for (long long r = 0; r < firsts; ++r) {
    f_load += at(0, r, 0), f_ready += at(2, r, 1), f_stats += at(3, r, 0), f_done += at(4, r, 1);
  }
  double last_load = 0;
  for (long long r = 0; r < rows; ++r) last_load = std::max(last_load, at(1, r, 1));
  std::printf("  %d CTAs\n", grid);
  std::printf("  pace: a row every %.3f us over the middle half, %.0f GB/s (%.3f x the copy's time a byte, %.3f x its "
              "pace)\n",
              p, row_bytes / p / 1e3, (p * 1e-3 * double(rows)) / copy, (p * 1e-3 * double(rows)) / (copy - copy_fixed));
  std::printf("  split (us): outside %.2f + fill %.2f + rows x pace %.2f + drain %.2f = %.2f; copy %.2f; over the "
              "copy %.2f, of which fill + drain + outside %.2f\n",
              outside, fill, double(rows) * p, drain, call * 1e3, copy * 1e3, (call - copy) * 1e3,
              outside + fill + drain);
  std::printf("  CTAs start within %.2f us, end from %.2f to %.2f us (median %.2f); last load issued at %.2f us\n",
              *std::max_element(starts.begin(), starts.end()), *std::min_element(ends.begin(), ends.end()), life,
              median(ends), last_load);
  std::printf("  first rows (one a cluster, averaged, us): loads begin %.2f, partials ready %.2f, statistics at the "
              "writers %.2f, written %.2f\n",
              f_load / firsts, f_ready / firsts, f_stats / firsts, f_done / firsts);
  return 0;
}
