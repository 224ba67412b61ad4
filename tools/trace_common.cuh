// Shared by the trace tools (grid_rows_trace.cu, cluster_rows_trace.cu): the trace points' store
// (per event and row, the first and the last %globaltimer over all CTAs), an input filler, the
// problem set up as the library would plan it, and a check macro for main().
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "kernels.hpp"
#include "plan.hpp"
#include "softlight/softlight.h"

__device__ unsigned long long* g_trace;  // [event][row][first, last]
__device__ long long g_rows;

__device__ __forceinline__ unsigned long long trace_clock() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void trace_point(int event, long long row) {
  const unsigned long long t = trace_clock();
  unsigned long long* p = g_trace + (event * g_rows + row) * 2;
  atomicMin(p, t);
  atomicMax(p + 1, t);
}

// Keeps one thread busy until `ns` have passed on %globaltimer: queued ahead of a timed operation,
// it hides the host work of the launch behind it.
__global__ void spin(unsigned long long ns) {
  const unsigned long long t0 = trace_clock();
  while (trace_clock() - t0 < ns) {
  }
}

// Values in [-6, 6) from a hash of the index, in the element type.
__global__ void fill(uint16_t* p16, float* p32, size_t n, int bf16) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i * 2654435761u) ^ static_cast<uint32_t>(i >> 32);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float v = (static_cast<float>(h & 0xffffff) / 16777216.0f - 0.5f) * 12.0f;
    if (p32) {
      p32[i] = v;
    } else if (bf16) {
      p16[i] = static_cast<uint16_t>(__float_as_uint(v) >> 16);
    } else {
      const __half hv = __float2half_rn(v);
      memcpy(&p16[i], &hv, 2);
    }
  }
}

#define CHECK(call)                                                                  \
  do {                                                                               \
    const cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));               \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

inline softlight_dtype dtype_named(std::string_view name) {
  return name == "float32" ? SOFTLIGHT_FLOAT32 : name == "bfloat16" ? SOFTLIGHT_BFLOAT16 : SOFTLIGHT_FLOAT16;
}

// x filled (the element type's hash values) and y allocated, rows x cols each.
inline cudaError_t trace_operands(size_t n, softlight_dtype dtype, void** x, void** y) {
  const int elem = dtype == SOFTLIGHT_FLOAT32 ? 4 : 2;
  cudaError_t e;
  if ((e = cudaMalloc(x, n * elem)) || (e = cudaMalloc(y, n * elem))) return e;
  fill<<<1024, 256>>>(elem == 2 ? static_cast<uint16_t*>(*x) : nullptr, elem == 4 ? static_cast<float*>(*x) : nullptr,
                      n, dtype == SOFTLIGHT_BFLOAT16);
  return cudaDeviceSynchronize();
}

// The problem as the library would plan it for rows x cols of a contiguous array.
inline softlight::Problem trace_problem(long long rows, long long cols, int elem) {
  softlight::Problem p;
  p.rows = rows;
  p.cols = cols;
  p.elem_bytes = elem;
  p.aligned16 = p.aligned8 = p.peelable = p.flat16 = (cols * elem) % 16 == 0;
  return p;
}

// A tool's problem, from its first arguments (rows cols dtype): x filled and y allocated, the device's
// attributes, and the library's plan for it (SOFTLIGHT_* knobs applied), which must be of `family`.
struct TraceSetup {
  long long rows = 0, cols = 0;
  softlight_dtype dtype = SOFTLIGHT_FLOAT32;
  int elem = 4;
  void *x = nullptr, *y = nullptr;
  softlight::DeviceInfo d;
  softlight::Plan plan;
};
// 0, or the exit status for main (the reason printed).
inline int trace_setup(int argc, char** argv, const char* more_usage, softlight::Family family, TraceSetup* t) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s rows cols float32|bfloat16|float16%s\n", argv[0], more_usage);
    return 2;
  }
  t->rows = std::atoll(argv[1]);
  t->cols = std::atoll(argv[2]);
  t->dtype = dtype_named(argv[3]);
  t->elem = t->dtype == SOFTLIGHT_FLOAT32 ? 4 : 2;
  CHECK(trace_operands(size_t(t->rows) * t->cols, t->dtype, &t->x, &t->y));
  int device = 0;
  CHECK(cudaGetDevice(&device));
  CHECK(softlight::query_device_info(device, &t->d));
  t->plan = softlight::plan_rows(trace_problem(t->rows, t->cols, t->elem), t->d, softlight::knobs_from_env().rows);
  if (t->plan.family != family) {
    std::fprintf(stderr, "%lld x %lld %s is planned as %s, not %s\n", t->rows, t->cols, argv[3],
                 softlight::family_name(t->plan.family), softlight::family_name(family));
    return 1;
  }
  return 0;
}

// The event store for `events` events of `rows` rows (`words` words), made the trace points' own.
inline cudaError_t trace_store(int events, long long rows, unsigned long long** trace, size_t* words) {
  *words = size_t(events) * rows * 2;
  cudaError_t e;
  if ((e = cudaMalloc(trace, *words * 8)) || (e = cudaMemcpyToSymbol(g_trace, trace, sizeof(*trace)))) return e;
  return cudaMemcpyToSymbol(g_rows, &rows, sizeof(rows));
}
// An array of `words` words more for a tool's own trace points, held in its device symbol.
template <class Symbol>
inline cudaError_t trace_array(const Symbol& symbol, size_t words, unsigned long long** p) {
  const cudaError_t e = cudaMalloc(p, words * 8);
  return e != cudaSuccess ? e : cudaMemcpyToSymbol(symbol, p, sizeof(*p));
}

// Events, set up: first times all ones, last times zero (`words` words, pairs of first and last).
__global__ void trace_init(unsigned long long* trace, size_t words) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x)
    trace[i] = i % 2 == 0 ? ~0ull : 0ull;
}
inline cudaError_t trace_reset(unsigned long long* trace, size_t words) {
  trace_init<<<256, 256>>>(trace, words);
  return cudaDeviceSynchronize();
}
