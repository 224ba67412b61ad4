// Host cost of the CUDA runtime calls a log-softmax launch makes (each timed over a loop), and the
// GPU time a stream-ordered workspace (allocate, fill, free) adds to an empty cluster launch.
//   nvcc -std=c++17 -O2 -arch=sm_90a -o /tmp/api_cost tools/api_cost.cu && /tmp/api_cost
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
__global__ void spin(long long c) { long long t = clock64(); while (clock64() - t < c) {} }
__global__ void k(const float* x, float* y, long n) {
  extern __shared__ float s[];
  if (threadIdx.x == 0 && x == nullptr) y[0] = s[0];
}
template <class F> double us(F f, int n = 2000) {
  for (int i = 0; i < 20; ++i) f();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) f();
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
}
int main() {
  float *x, *y;
  cudaMalloc(&x, 1 << 20); cudaMalloc(&y, 1 << 20);
  cudaStream_t st; cudaStreamCreate(&st);
  int smem = 200 * 1024;
  cudaMemPool_t pool; cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned; props.location.type = cudaMemLocationTypeDevice; props.location.id = 0;
  cudaMemPoolCreate(&pool, &props); unsigned long long keep = ~0ull;
  cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  printf("cudaFuncSetAttribute smem      %.3f us\n", us([&] { cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); }));
  printf("cudaFuncSetAttribute nonport   %.3f us\n", us([&] { cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1); }));
  cudaLaunchConfig_t cfg = {}; cudaLaunchAttribute a[1];
  a[0].id = cudaLaunchAttributeClusterDimension; a[0].val.clusterDim.x = 16; a[0].val.clusterDim.y = 1; a[0].val.clusterDim.z = 1;
  cfg.attrs = a; cfg.numAttrs = 1; cfg.blockDim = dim3(288); cfg.gridDim = dim3(16); cfg.dynamicSmemBytes = smem; cfg.stream = st;
  int active = 0;
  printf("cudaOccupancyMaxActiveClusters %.3f us", us([&] { cudaOccupancyMaxActiveClusters(&active, k, &cfg); }));
  printf("  (active %d)\n", active);
  int per = 0;
  printf("cudaOccupancyMaxActiveBlocks   %.3f us\n", us([&] { cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k, 288, smem); }));
  cudaPointerAttributes pa;
  printf("cudaPointerGetAttributes       %.3f us\n", us([&] { cudaPointerGetAttributes(&pa, x); }));
  int d, v;
  printf("cudaGetDevice                  %.3f us\n", us([&] { cudaGetDevice(&d); }));
  printf("cudaDeviceGetAttribute         %.3f us\n", us([&] { cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0); }));
  cudaDeviceSynchronize();
  printf("malloc+memset+free (async)     %.3f us\n", us([&] { void* w; cudaMallocFromPoolAsync(&w, 8, pool, st); cudaMemsetAsync(w, 0xff, 8, st); cudaFreeAsync(w, st); }, 500));
  cudaDeviceSynchronize();
  cfg.gridDim = dim3(16 * 8);
  long n = 0;
  printf("cudaLaunchKernelEx cluster 16  %.3f us\n", us([&] { cudaLaunchKernelEx(&cfg, k, (const float*)x, y, n); }, 500));
  cudaDeviceSynchronize();
  printf("cudaGetLastError               %.3f us\n", us([&] { cudaGetLastError(); }));
  printf("errors: %s\n", cudaGetErrorString(cudaGetLastError()));
  // GPU time of the memset between two events on a busy-free stream, with a kernel after.
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  float ms_a = 0, ms_b = 0;
  for (int r = 0; r < 3; ++r) {
    spin<<<1, 1, 0, st>>>(8000000);
    cudaEventRecord(e0, st);
    for (int i = 0; i < 100; ++i) cudaLaunchKernelEx(&cfg, k, (const float*)x, y, n);
    cudaEventRecord(e1, st); cudaEventSynchronize(e1); cudaEventElapsedTime(&ms_a, e0, e1);
    spin<<<1, 1, 0, st>>>(8000000);
    cudaEventRecord(e0, st);
    for (int i = 0; i < 100; ++i) { void* w; cudaMallocFromPoolAsync(&w, 8, pool, st); cudaMemsetAsync(w, 0xff, 8, st); cudaLaunchKernelEx(&cfg, k, (const float*)x, y, n); cudaFreeAsync(w, st); }
    cudaEventRecord(e1, st); cudaEventSynchronize(e1); cudaEventElapsedTime(&ms_b, e0, e1);
    printf("GPU per launch: kernel only %.2f us, with workspace+memset %.2f us\n", ms_a * 10, ms_b * 10);
  }
  return 0;
}
