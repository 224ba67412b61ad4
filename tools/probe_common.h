// What the standalone probes (tools/ring_probe.cu, tools/hold_probe.cu) share: the CUDA error
// check, and the library's forward opened from its shared library, to be timed beside them.
#pragma once
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(e)                                                                                    \
  do {                                                                                           \
    cudaError_t _e = (e);                                                                        \
    if (_e != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(_e));            \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

// softlight_log_softmax_forward's signature (include/softlight.h), the dtype as its int code.
typedef int (*fwd_t)(const void*, int64_t, void*, int64_t, int64_t, int64_t, int, void*);

// The forward of the library at `path` (libsoftlight.so); exits where it cannot be opened.
inline fwd_t open_forward(const char* path) {
  void* lib = dlopen(path, RTLD_NOW);
  if (!lib) {
    std::fprintf(stderr, "dlopen: %s\n", dlerror());
    std::exit(1);
  }
  auto fwd = reinterpret_cast<fwd_t>(dlsym(lib, "softlight_log_softmax_forward"));
  if (!fwd) {
    std::fprintf(stderr, "dlsym: %s\n", dlerror());
    std::exit(1);
  }
  return fwd;
}

// x and y of n fp32 elements each.
inline void alloc_pair(int64_t n, float** x, float** y) {
  CK(cudaMalloc(x, n * 4));
  CK(cudaMalloc(y, n * 4));
}

// The ms of one call of run() on stream st, between events a and b.
template <class F> float time_once(cudaStream_t st, cudaEvent_t a, cudaEvent_t b, F&& run) {
  CK(cudaEventRecord(a, st));
  run();
  CK(cudaEventRecord(b, st));
  CK(cudaEventSynchronize(b));
  float ms;
  CK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

inline float median(std::vector<float> t) {
  std::sort(t.begin(), t.end());
  return t.empty() ? 0.f : t[t.size() / 2];
}
