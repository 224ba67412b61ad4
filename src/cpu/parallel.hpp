// The CPU backend's threads and vector kernels, as its entry points (rows.cpp,
// consumers.cpp) take them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

#include "cpu/pool.hpp"
#include "cpu/simd.hpp"
#include "cpu/types.hpp"
#include "softlight/softlight.h"
#include "planner/tuning.hpp"

namespace softlight {
namespace cpu {

// The machine's thread count, asked once: each ask reads the system's CPU list (microseconds).
inline unsigned hardware_threads() {
  static const unsigned n = std::max(1u, std::thread::hardware_concurrency());
  return n;
}

// Work over [0, n) positions split among threads; f(begin, end) does a range.
template <class F> void parallel_for(int64_t n, int64_t elements_per_position, int num_threads, F f) {
  constexpr int64_t kMinElementsPerThread = int64_t{1} << 16;
  int64_t workers = num_threads > 0 ? num_threads : static_cast<int64_t>(hardware_threads());
  workers = std::min({workers, n, std::max<int64_t>(1, n * elements_per_position / kMinElementsPerThread)});
  if (workers <= 1) return f(int64_t{0}, n);
  const int64_t per = (n + workers - 1) / workers;
  // The kept worker threads (pool.cpp), a range a task; where another call holds them, threads
  // of this call's own.
  auto range = [&f, per, n](int64_t t) { f(t * per, std::min(n, (t + 1) * per)); };
  using Range = decltype(range);
  if (run_tasks((n + per - 1) / per, workers, [](void* c, int64_t t) { (*static_cast<Range*>(c))(t); }, &range))
    return;
  std::vector<std::thread> pool;
  int64_t next = per;  // positions [0, per) stay on this thread
  try {
    for (; next < n; next += per) pool.emplace_back(f, next, std::min(n, next + per));
  } catch (...) {  // no more threads: this thread takes the rest
    f(next, n);
  }
  f(int64_t{0}, std::min(n, per));
  for (auto& t : pool) t.join();
}

// The instruction sets the vector kernels are built for (simd.hpp), narrowest first.
enum CpuKernels : int { kGenericKernels = 0, kAvx2Kernels = 1 };

// Whether this build holds kernels for `set` and this CPU (and its operating system) can run them.
inline bool cpu_runs(int set) {
  if (set == kGenericKernels) return true;
#ifdef SOFTLIGHT_CPU_X86
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  if (set == kAvx2Kernels) return avx2;
#endif
  return false;
}

// The kernels of `set` where this CPU runs it, else the generic ones. (Each set's function is
// compiled for its instructions, down to how it fills the table it returns: it is called only where
// the CPU has them.)
inline KernelSet kernels_of(int set) {
#ifdef SOFTLIGHT_CPU_X86
  if (set == kAvx2Kernels && cpu_runs(set)) return kernels_avx2();
#endif
  return kernels_generic();
}

// The vector kernels of the widest instruction set this CPU has (asked once); in a tuning build, the
// set forced on the calling thread where one is (forcing refuses a set the CPU cannot run).
inline const KernelSet& simd() {
  static const KernelSet sets[] = {kernels_of(kGenericKernels), kernels_of(kAvx2Kernels)};
  static const int widest = cpu_runs(kAvx2Kernels) ? kAvx2Kernels : kGenericKernels;
  const int forced = forced_tuning().cpu_kernels;
  return sets[forced >= 0 ? forced : widest];
}

template <class T> const auto& kernels_for() {
  if constexpr (std::is_same_v<T, float>) return simd().f32;
  else if constexpr (std::is_same_v<T, double>) return simd().f64;
  else if constexpr (std::is_same_v<T, Half>) return simd().f16;
  else return simd().bf16;
}

// f(T{}) for the storage type T of a (checked) dtype.
template <class F> softlight_status with_cpu_type(softlight_dtype dtype, F&& f) {
  switch (dtype) {
    case SOFTLIGHT_FLOAT32: f(float{}); break;
    case SOFTLIGHT_FLOAT64: f(double{}); break;
    case SOFTLIGHT_FLOAT16: f(Half{}); break;
    case SOFTLIGHT_BFLOAT16: f(BFloat16{}); break;
  }
  return SOFTLIGHT_SUCCESS;
}

}  // namespace cpu
}  // namespace softlight
