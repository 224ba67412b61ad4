// Host time of one softlight call through the C ABI, against the CUDA calls it is made of: each
// timed over a loop while the stream waits behind a long kernel (so the host alone is measured).
//   nvcc -std=c++17 -O2 -arch=sm_90a -Iinclude -o /tmp/host_cost tools/host_cost.cu \
//     -L<dir of libsoftlight.so> -lsoftlight -Xlinker -rpath=<same dir> && /tmp/host_cost
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "softlight/softlight.h"

__global__ void spin(long long c) {
  const long long t = clock64();
  while (clock64() - t < c) {
  }
}
__global__ void empty(const float* x, float* y, long n) {
  extern __shared__ float s[];
  if (threadIdx.x == 0 && x == nullptr) y[0] = s[0] + float(n);
}

template <class F>
double host_us(cudaStream_t st, F f, int n = 200) {
  cudaStreamSynchronize(st);
  spin<<<1, 1, 0, st>>>(500000000LL);  // ~0.25 s: every call below queues behind it
  for (int i = 0; i < 10; ++i) f();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) f();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
}

int main() {
  cudaStream_t st;
  cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  const size_t bytes = size_t(1) << 30;
  void *x, *y;
  if (cudaMalloc(&x, bytes) || cudaMalloc(&y, bytes)) return 1;
  cudaMemset(x, 0, bytes);
  struct Case {
    long long rows, cols;
    softlight_dtype dtype;
    const char* name;
  } cases[] = {{15259, 32768, SOFTLIGHT_BFLOAT16, "15259x32768 bf16"},
               {7629, 65536, SOFTLIGHT_BFLOAT16, "7629x65536 bf16"},
               {7629, 32768, SOFTLIGHT_FLOAT32, "7629x32768 fp32"},
               {682, 393216, SOFTLIGHT_FLOAT32, "682x393216 fp32"},
               {61035, 4096, SOFTLIGHT_FLOAT32, "61035x4096 fp32"},
               {1953125, 128, SOFTLIGHT_FLOAT32, "1953125x128 fp32"},
               {2500000, 100, SOFTLIGHT_FLOAT32, "2500000x100 fp32"}};
  for (const Case& c : cases) {
    const double us = host_us(st, [&] {
      softlight_log_softmax_forward(x, c.cols, y, c.cols, c.rows, c.cols, c.dtype, st);
    }, 100);
    std::printf("softlight_log_softmax_forward %-18s %6.2f us\n", c.name, us);
  }
  std::printf("cudaMemcpyAsync 1 GB d2d                         %6.2f us\n",
              host_us(st, [&] { cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, st); }, 100));
  cudaFuncSetAttribute(empty, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 * 1024);
  cudaFuncSetAttribute(empty, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  for (int cluster : {0, 1, 2, 8, 16}) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute a[1];
    a[0].id = cudaLaunchAttributeClusterDimension;
    a[0].val.clusterDim.x = cluster;
    a[0].val.clusterDim.y = 1;
    a[0].val.clusterDim.z = 1;
    cfg.attrs = a;
    cfg.numAttrs = cluster ? 1 : 0;
    cfg.blockDim = dim3(544);
    cfg.gridDim = dim3(cluster == 16 ? 112 : cluster == 8 ? 120 : 132);  // whole clusters, as many as fit
    cfg.dynamicSmemBytes = 220 * 1024;
    cfg.stream = st;
    cudaError_t launched = cudaSuccess;
    const double us = host_us(st, [&] {
      const cudaError_t e = cudaLaunchKernelEx(&cfg, empty, (const float*)x, (float*)y, 0L);
      if (e != cudaSuccess) launched = e, cudaGetLastError();
    });
    std::printf("cudaLaunchKernelEx cluster %-2d (220 KB, 544 thr)   %6.2f us  %s\n", cluster, us,
                launched == cudaSuccess ? "" : cudaGetErrorString(launched));
  }
  std::printf("empty<<<132, 256>>>                              %6.2f us\n",
              host_us(st, [&] { empty<<<132, 256, 0, st>>>((const float*)x, (float*)y, 0L); }));
  cudaStreamCaptureStatus cap;
  unsigned long long id;
  int dev;
  std::printf("cudaStreamIsCapturing                            %6.3f us\n",
              host_us(st, [&] { cudaStreamIsCapturing(st, &cap); }, 2000));
  std::printf("cudaStreamGetId                                  %6.3f us\n",
              host_us(st, [&] { cudaStreamGetId(st, &id); }, 2000));
  std::printf("cudaGetDevice                                    %6.3f us\n",
              host_us(st, [&] { cudaGetDevice(&dev); }, 2000));
  volatile const char* sink = nullptr;
  std::printf("getenv x 15                                      %6.3f us\n", host_us(st, [&] {
                for (int i = 0; i < 15; ++i) sink = std::getenv("SOFTLIGHT_CLUSTER");
              }, 2000));
  (void)sink;
  std::printf("errors: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
  return 0;
}
