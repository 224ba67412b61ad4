// Probe: how fast do cluster_rows' ingredients move the founding shape's bytes (4096 x 393216
// fp32), next to a copy? Each variant is timed in alternating rounds against cudaMemcpyAsync:
//   memcpy, copy_kernel, unroll*, tile*    copies with ordinary loads and stores
//   bulk*                                  bulk copies into shared memory and bulk stores out
//   softlight                              the library's forward (through the C ABI)
//   ring M0    one CTA per SM: a producer thread bulk-loads chunks into a ring, writer warps
//              store them (st.global.v4); C consecutive CTAs split a row, rows dealt in turn
//   ring M1    M0 plus statistics warps folding each chunk, the writers waiting for their own
//              CTA's (max, sum) of the row (cluster_rows without the cluster exchange)
//   ring M2/M3 M0/M1 with each CTA claiming its next (row, slice) from a counter
// For the ring variants it prints when the first and the last CTA finished.
// Build and run on an sm_90 GPU (RC_SET picks the variants: a, c, d, e, or f, g, h and i, the copy kernels alone):
//   nvcc -std=c++17 -O3 -arch=sm_90a -Isrc -Iinclude -o /tmp/ring_probe tools/ring_probe.cu -ldl
//   RC_SET=d /tmp/ring_probe path/to/libsoftlight.so 4096 393216
#include <cuda_runtime.h>

#include "probe_common.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common.cuh"
#include "hopper.cuh"
using namespace softlight;

struct Shape {
  int chunk, slots, C, stats_warps, writer_warps, slack;
};

__device__ __forceinline__ void named_bar(int id, int n) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}

__device__ __forceinline__ unsigned long long gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ unsigned long long g_t[2][1024];
__device__ int g_ctr;

// MODE 2: M0 with units (row, rank) claimed from a global counter by the producer.
template <int MODE>
__global__ void __launch_bounds__(800, 1) ring(const float* __restrict__ x, float* __restrict__ y, int64_t rows,
                                               int64_t cols, Shape sh) {
#ifdef SOFTLIGHT_HOPPER
  if (threadIdx.x == 0) g_t[0][blockIdx.x] = gtimer();
  __shared__ int64_t queue[64];
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* rp = smem;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + size_t(sh.slots) * sh.chunk);
  uint64_t* empty = full + sh.slots;
  float* rowstat = reinterpret_cast<float*>(empty + sh.slots);  // [4][2]
  float* scratch = rowstat + 8;                                   // [32]
  volatile int* stats_done = reinterpret_cast<volatile int*>(scratch + 32);
  volatile int* rows_started = stats_done + 1;
  const int C = sh.C;
  const int rank = blockIdx.x % C;
  const int64_t grp = blockIdx.x / C, groups = gridDim.x / C;
  const int64_t row_bytes = cols * 4;
  const int64_t cpr = (row_bytes + sh.chunk - 1) / sh.chunk;
  const int64_t cpc = (cpr + C - 1) / C;
  const int64_t first = rank * cpc;
  const int64_t my = MODE >= 2 ? cpc : max(int64_t{0}, min(cpc, cpr - first));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int S = sh.stats_warps, W = sh.writer_warps;
  auto bytes_of = [&](int64_t k) {
    return static_cast<uint32_t>(min(int64_t{sh.chunk}, row_bytes - (first + k) * sh.chunk));
  };
  if (threadIdx.x == 0) {
    for (int i = 0; i < sh.slots; ++i) {
      mbar_init(smem_addr(full + i), 1);
      mbar_init(smem_addr(empty + i), W);
    }
    *stats_done = 0;
    *rows_started = 0;
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp < S) {
    if (MODE == 0 || MODE == 2) return;
    RingPos pos;
    const int gt = threadIdx.x;
    int64_t iter = 0;
    for (int64_t row = grp;; row += groups, ++iter) {
      while (iter >= 2 && *rows_started < iter - 1) __nanosleep(64);
      if (MODE == 3) {
        mbar_wait(smem_addr(full + pos.slot), pos.phase);
        if (queue[iter % 64] < 0) break;
      } else if (row >= rows) {
        break;
      }
      MaxSum<float> part{neg_inf<float>(), 0.f};
      for (int64_t k = 0; k < my; ++k) {
        mbar_wait(smem_addr(full + pos.slot), pos.phase);
        const float* c = reinterpret_cast<const float*>(rp + size_t(pos.slot) * sh.chunk);
        const int vectors = bytes_of(k) / 16;
        MaxSum<float> cp{neg_inf<float>(), 0.f};
        for (int base = gt; base < vectors; base += 4 * S * 32) {
          float v[4][4];
          float m = cp.m;
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const int i = base + u * S * 32;
            if (i < vectors) {
              load_pack<float, 4>(c + i * 4, v[u]);
            } else {
#pragma unroll
              for (int j = 0; j < 4; ++j) v[u][j] = neg_inf<float>();
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) m = max_acc(m, v[u][j]);
          }
          float s = 0;
#pragma unroll
          for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int j = 0; j < 4; ++j) s += exp_shifted(v[u][j], m);
          cp = {m, cp.s * rescale(cp.m, m) + s};
        }
        part = merge_max_sum(part, cp);
        pos.advance(sh.slots);
      }
      part = block_max_sum(part, scratch, S * 32, 1);
      if (gt == 0) {
        rowstat[(iter % 4) * 2] = part.m;
        rowstat[(iter % 4) * 2 + 1] = part.s;
        __threadfence_block();
        *stats_done = static_cast<int>(iter + 1);
      }
    }
  } else if (warp < S + W) {
    RingPos pos;
    const int gt = threadIdx.x - S * 32;
    int64_t iter = 0;
    for (int64_t row = grp;; row += groups, ++iter) {
      int64_t fc = first;
      if (MODE >= 2) {
        mbar_wait(smem_addr(full + pos.slot), pos.phase);
        const int64_t u = queue[iter % 64];
        if (u < 0) break;
        row = u / C;
        fc = (u % C) * cpc;
      } else if (row >= rows) {
        break;
      }
      float m = 0.f, ls = 0.f;
      if (MODE == 1 || MODE == 3) {
        while (*stats_done <= iter) __nanosleep(32);
        __threadfence_block();
        m = rowstat[(iter % 4) * 2];
        ls = log_acc(rowstat[(iter % 4) * 2 + 1]);
        if (gt == 0) *rows_started = static_cast<int>(iter + 1);
      }
      float* dst = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(y + row * cols) + fc * sh.chunk);
      for (int64_t k = 0; k < my; ++k) {
        mbar_wait(smem_addr(full + pos.slot), pos.phase);
        const float* c = reinterpret_cast<const float*>(rp + size_t(pos.slot) * sh.chunk);
        float* out = dst + k * (sh.chunk / 4);
        const int vectors = bytes_of(k) / 16;
        for (int base = gt; base < vectors; base += 4 * W * 32) {
          float v[4][4];
#pragma unroll
          for (int u = 0; u < 4; ++u)
            if (base + u * W * 32 < vectors) load_pack<float, 4>(c + (base + u * W * 32) * 4, v[u]);
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            if (base + u * W * 32 < vectors) {
              if (MODE == 1 || MODE == 3) {
#pragma unroll
                for (int j = 0; j < 4; ++j) v[u][j] = (v[u][j] - m) - ls;
              }
              store_pack<float, 4>(out + (base + u * W * 32) * 4, v[u], false);
            }
          }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(smem_addr(empty + pos.slot));
        pos.advance(sh.slots);
      }
    }
    if (gt == 0) g_t[1][blockIdx.x] = gtimer();
  } else if (threadIdx.x == (S + W) * 32) {
    RingPos pos;
    int64_t iter = 0;
    for (int64_t row = grp;; row += groups, ++iter) {
      int64_t fc = first;
      if (MODE >= 2) {
        const int64_t u = atomicAdd(&g_ctr, 1);
        if (u >= rows * C) {
          queue[iter % 64] = -1;
          mbar_wait(smem_addr(empty + pos.slot), pos.phase ^ 1);
          mbar_arrive(smem_addr(full + pos.slot));
          break;
        }
        queue[iter % 64] = u;
        row = u / C;
        fc = (u % C) * cpc;
      } else if (row >= rows) {
        break;
      }
      const unsigned char* src = reinterpret_cast<const unsigned char*>(x + row * cols) + fc * sh.chunk;
      for (int64_t k = 0; k < my; ++k) {
        mbar_wait(smem_addr(empty + pos.slot), pos.phase ^ 1);
        const uint32_t b = bytes_of(k);
        mbar_arrive_expect_tx(smem_addr(full + pos.slot), b);
        bulk_load(smem_addr(rp + size_t(pos.slot) * sh.chunk), src + k * sh.chunk, b, smem_addr(full + pos.slot));
        pos.advance(sh.slots);
      }
    }
  }
#endif
}

__global__ void copy_kernel(const float4* __restrict__ x, float4* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = x[i];
}

template <int U>
__global__ void copy_unroll(const float4* __restrict__ x, float4* __restrict__ y, int64_t n) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += U * stride) {
    float4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i + u * stride < n) v[u] = __ldcs(x + i + u * stride);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i + u * stride < n) y[i + u * stride] = v[u];
  }
}

// One contiguous tile of blockDim * U vectors per CTA, non-persistent.
template <int U>
__global__ void copy_tile(const float4* __restrict__ x, float4* __restrict__ y, int64_t n) {
  const int64_t base = blockIdx.x * int64_t{blockDim.x} * U + threadIdx.x;
  float4 v[U];
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (base + u * blockDim.x < n) v[u] = x[base + u * blockDim.x];
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (base + u * blockDim.x < n) y[base + u * blockDim.x] = v[u];
}

// The same tile with cache hints: H bit 0 loads with an L2 prefetch of 256 bytes (and no L1
// allocation), bit 1 streaming stores (.cs), bit 2 loads evict-first in L2.
template <int U, int H>
__global__ void copy_tile_hint(const float4* __restrict__ x, float4* __restrict__ y, int64_t n) {
  const int64_t base = blockIdx.x * int64_t{blockDim.x} * U + threadIdx.x;
  float4 v[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (base + u * blockDim.x >= n) continue;
    const float4* src = x + base + u * blockDim.x;
    if (H & 1)
      asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.f32 {%0,%1,%2,%3}, [%4];"
                   : "=f"(v[u].x), "=f"(v[u].y), "=f"(v[u].z), "=f"(v[u].w) : "l"(src));
    else if (H & 4) {
      uint64_t pol;
      asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
      asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.f32 {%0,%1,%2,%3}, [%4], %5;"
                   : "=f"(v[u].x), "=f"(v[u].y), "=f"(v[u].z), "=f"(v[u].w) : "l"(src), "l"(pol));
    }
    else
      v[u] = *src;
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (base + u * blockDim.x >= n) continue;
    float4* dst = y + base + u * blockDim.x;
    if (H & 2) __stcs(dst, v[u]);
    else *dst = v[u];
  }
}

// One vector a thread, tiles of blockDim vectors, the tiles' order spread over K streams: CTA b
// copies tile (b % K) * (tiles / K) + b / K, so that the CTAs running at once touch K places of
// the array instead of one window (K = 1: in order).
// U vectors a thread: tiles of blockDim * U vectors, loaded all before any is stored.
template <int U>
__global__ void copy_tile_spread(const float4* __restrict__ x, float4* __restrict__ y, int64_t n, int K) {
  const int64_t tiles = n / (int64_t{blockDim.x} * U), per = tiles / K;  // n a multiple of blockDim * U * K
  const int64_t t = (blockIdx.x % K) * per + blockIdx.x / K;
  const int64_t base = t * blockDim.x * U + threadIdx.x;
  float4 v[U];
#pragma unroll
  for (int u = 0; u < U; ++u) v[u] = x[base + u * blockDim.x];
#pragma unroll
  for (int u = 0; u < U; ++u) y[base + u * blockDim.x] = v[u];
}

// Bulk copy through shared memory, one thread: loads into S slots, bulk stores out; D stores may
// still be reading shared memory. interleave: CTA takes chunks b, b + grid, ...; else a run.
template <int D>
__global__ void bulk_copy(const unsigned char* x, unsigned char* y, int64_t bytes, int chunk, int S, int interleave) {
#ifdef SOFTLIGHT_HOPPER
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + size_t(S) * chunk);
  if (threadIdx.x != 0) return;
  for (int i = 0; i < S; ++i) mbar_init(smem_addr(full + i), 1);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  const int64_t chunks = (bytes + chunk - 1) / chunk;
  const int64_t per = (chunks + gridDim.x - 1) / gridDim.x;
  const int64_t my = interleave ? (chunks - blockIdx.x + gridDim.x - 1) / gridDim.x
                                : max(int64_t{0}, min(per, chunks - blockIdx.x * per));
  auto gidx = [&](int64_t j) { return interleave ? blockIdx.x + j * gridDim.x : blockIdx.x * per + j; };
  auto sz = [&](int64_t j) { return static_cast<uint32_t>(min(int64_t{chunk}, bytes - gidx(j) * chunk)); };
  auto load = [&](int64_t j) {
    const int sl = j % S;
    mbar_arrive_expect_tx(smem_addr(full + sl), sz(j));
    bulk_load(smem_addr(smem + size_t(sl) * chunk), x + gidx(j) * chunk, sz(j), smem_addr(full + sl));
  };
  for (int64_t j = 0; j < min(int64_t{S}, my); ++j) load(j);
  for (int64_t j = 0; j < my; ++j) {
    const int sl = j % S;
    mbar_wait(smem_addr(full + sl), (j / S) & 1);
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(y + gidx(j) * chunk),
                 "r"(smem_addr(smem + size_t(sl) * chunk)), "r"(sz(j))
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(D) : "memory");
    const int64_t freed = j - D;  // its store has read the slot
    if (freed >= 0 && freed + S < my) load(freed + S);
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

// Persistent tile copy: tiles of blockDim * U vectors, static (b, b + grid, ...) or claimed.
template <int U>
__global__ void copy_tile_persistent(const float4* __restrict__ x, float4* __restrict__ y, int64_t n, int dyn) {
  __shared__ int64_t next;
  const int64_t per = int64_t{blockDim.x} * U, tiles = (n + per - 1) / per;
  int64_t t = blockIdx.x;
  if (dyn) {
    if (threadIdx.x == 0) next = atomicAdd(&g_ctr, 1);
    __syncthreads();
    t = next;
  }
  while (t < tiles) {
    const int64_t base = t * per + threadIdx.x;
    float4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + u * blockDim.x < n) v[u] = x[base + u * blockDim.x];
    if (dyn) {
      __syncthreads();
      if (threadIdx.x == 0) next = atomicAdd(&g_ctr, 1);
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + u * blockDim.x < n) y[base + u * blockDim.x] = v[u];
    if (dyn) {
      __syncthreads();
      t = next;
    } else {
      t += gridDim.x;
    }
  }
}

__global__ void count_diff(const float* a, const float* b, int64_t n, unsigned long long* bad) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    if (a[i] != b[i]) atomicAdd(bad, 1ull);
}



struct Variant {
  std::string name;
  int kind;  // 0 memcpy, 1 copy kernel, 2 softlight, 3 ring M0, 4 ring M1, 5 unroll, 6 tile, 7 bulk,
             // 8 persistent tile, 9/10 ring M2/M3, 11 tile with hints, 12 bulk with one store pending,
             // 13 tiles in K streams
  Shape sh;
  int grid;
  int p1 = 0, p2 = 0, p3 = 0;
  std::vector<float> ms;
};

int main(int argc, char** argv) {
  const int64_t rows = argc > 2 ? atoll(argv[2]) : 4096, cols = argc > 3 ? atoll(argv[3]) : 393216;
  const fwd_t fwd = open_forward(argv[1]);
  const int64_t n = rows * cols;
  float *x, *y;
  alloc_pair(n, &x, &y);
  {
    std::vector<float> h(cols);
    for (int64_t i = 0; i < cols; ++i) h[i] = float((i * 2654435761u) % 1000) / 1000.f;
    for (int64_t r = 0; r < rows; ++r) CK(cudaMemcpy(x + r * cols, h.data(), cols * 4, cudaMemcpyHostToDevice));
  }
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int smem_max = 227 * 1024;
  CK(cudaFuncSetAttribute(ring<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max - 1024));
  CK(cudaFuncSetAttribute(ring<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max - 1024));
  CK(cudaFuncSetAttribute(ring<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max - 1024));
  CK(cudaFuncSetAttribute(ring<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max - 1024));
  int* ctr;
  CK(cudaGetSymbolAddress((void**)&ctr, g_ctr));
  CK(cudaFuncSetAttribute(bulk_copy<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max));
  CK(cudaFuncSetAttribute(bulk_copy<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max));

  std::vector<Variant> vs;
  vs.push_back({"memcpy", 0, {}, 0, {}});
  vs.push_back({"copy_kernel", 1, {}, 0, {}});
  vs.push_back({"softlight", 2, {}, 0, {}});
  auto add = [&](int mode, int chunk, int C, int grid, int S, int W, int slots) {
    if (slots == 0) slots = (smem_max - 1024) / chunk;
    char b[160];
    std::snprintf(b, sizeof b, "ring M%d chunk=%dK slots=%d C=%d grid=%d warps=%d+%d", mode, chunk / 1024, slots, C,
                  grid, S, W);
    vs.push_back({b, mode == 2 ? 9 : mode == 3 ? 10 : 3 + mode, {chunk, slots, C, S, W, 0}, grid, {}});
  };
  const char* which = getenv("RC_SET");
  std::string set = which ? which : "a";
  auto addk = [&](const char* name, int kind, int grid, int p1, int p2, int p3) {
    Variant v{name, kind, {}, grid, {}};
    v.p1 = p1; v.p2 = p2; v.p3 = p3;
    vs.push_back(v);
  };
  if (set == "m") vs.resize(1);
  if (set == "c") {
    addk("unroll4 grid=sms*4 x512", 5, sms * 4, 4, 0, 0);
    addk("unroll8 grid=sms*4 x512", 5, sms * 4, 8, 0, 0);
    addk("unroll8 grid=sms*2 x512", 5, sms * 2, 8, 0, 0);
    addk("unroll4 grid=sms*8 x256", 5, sms * 8, 4, 0, 1);
    addk("tile8 x256 (32K tiles)", 6, 0, 8, 0, 0);
    addk("tile4 x512 (32K tiles)", 6, 0, 4, 0, 1);
    addk("bulk 32K S=6 D=3 grid=sms run", 7, sms, 32768, 6, 0);
    addk("bulk 32K S=6 D=3 grid=sms interleave", 7, sms, 32768, 6, 1);
    addk("bulk 16K S=12 D=3 grid=sms interleave", 7, sms, 16384, 12, 1);
    addk("bulk 16K S=12 D=3 grid=sms run", 7, sms, 16384, 12, 0);
    addk("bulk 32K S=6 D=3 grid=112 interleave", 7, 112, 32768, 6, 1);
    addk("bulk 32K S=6 D=3 grid=112 run", 7, 112, 32768, 6, 0);
  }
  if (set == "f") {  // the SM copy floor: which copy kernel comes nearest cudaMemcpyAsync
    addk("tile8 x256 (32K tiles)", 6, 0, 8, 0, 0);
    addk("tile4 x512 (32K tiles)", 6, 0, 4, 0, 1);
    addk("tile4 x256 (16K tiles) hint0", 11, 0, 4, 0, 0);
    addk("tile16 x256 (64K tiles) hint0", 11, 0, 16, 0, 0);
    addk("tile8 x256 hint1 (L2::256B loads)", 11, 0, 8, 1, 0);
    addk("tile8 x256 hint2 (.cs stores)", 11, 0, 8, 2, 0);
    addk("tile8 x256 hint3 (both)", 11, 0, 8, 3, 0);
    addk("tile8 x256 hint4 (evict-first loads)", 11, 0, 8, 4, 0);
    addk("tile16 x256 hint1", 11, 0, 16, 1, 0);
    addk("tile8 x256 persistent dynamic grid=sms*8", 8, sms * 8, 8, 1, 0);
    addk("unroll8 grid=sms*4 x512", 5, sms * 4, 8, 0, 0);
    addk("bulk 32K S=6 D=3 grid=sms interleave", 7, sms, 32768, 6, 1);
    addk("bulk 32K S=6 D=3 grid=sms run", 7, sms, 32768, 6, 0);
    addk("bulk 16K S=12 D=3 grid=sms interleave", 7, sms, 16384, 12, 1);
    addk("bulk 64K S=3 D=1 grid=sms interleave", 12, sms, 65536, 3, 1);
    addk("bulk 32K S=3 D=1 grid=sms*2 interleave", 12, sms * 2, 32768, 3, 1);
    addk("bulk 16K S=6 D=3 grid=sms*2 interleave", 7, sms * 2, 16384, 6, 1);
  }
  if (set == "h") {  // one vector a thread: the window of addresses in use at once
    addk("tile1 x256 (4K tiles)", 11, 0, 1, 0, 256);
    addk("tile1 x256 spread K=1", 13, 0, 1, 0, 256);
    addk("tile1 x256 spread K=4", 13, 0, 4, 0, 256);
    addk("tile1 x256 spread K=16", 13, 0, 16, 0, 256);
    addk("tile1 x256 spread K=64", 13, 0, 64, 0, 256);
    addk("tile1 x256 spread K=256", 13, 0, 256, 0, 256);
    addk("tile1 x512 (8K tiles)", 11, 0, 1, 0, 512);
    addk("tile1 x128 (2K tiles)", 11, 0, 1, 0, 128);
    addk("tile2 x128 (4K tiles)", 11, 0, 2, 0, 128);
    addk("tile2 x1024 (32K tiles)", 11, 0, 2, 0, 1024);
  }
  if (set == "i") {  // the spread with more in flight: eight vectors a thread (32 KB tiles)
    addk("tile1 x256 (4K tiles)", 11, 0, 1, 0, 256);
    addk("tile1 x256 spread K=1", 13, 0, 1, 1, 256);
    addk("tile1 x256 spread K=16", 13, 0, 16, 1, 256);
    addk("tile8 x256 (32K tiles)", 6, 0, 8, 0, 0);
    addk("tile8 x256 spread K=1", 13, 0, 1, 8, 256);
    addk("tile8 x256 spread K=4", 13, 0, 4, 8, 256);
    addk("tile8 x256 spread K=16", 13, 0, 16, 8, 256);
    addk("tile8 x256 spread K=64", 13, 0, 64, 8, 256);
  }
  if (set == "g") {  // fewer bytes in flight a thread, more threads
    addk("tile8 x256 (32K tiles)", 6, 0, 8, 0, 0);
    addk("tile4 x512 (32K tiles)", 6, 0, 4, 0, 1);
    addk("tile4 x256 (16K tiles) hint0", 11, 0, 4, 0, 0);
    addk("tile2 x512 (16K tiles)", 11, 0, 2, 0, 512);
    addk("tile2 x1024 (32K tiles)", 11, 0, 2, 0, 1024);
    addk("tile4 x1024 (64K tiles)", 11, 0, 4, 0, 1024);
    addk("tile1 x1024 (16K tiles)", 11, 0, 1, 0, 1024);
    addk("tile2 x256 (8K tiles)", 11, 0, 2, 0, 256);
    addk("tile1 x256 (4K tiles)", 11, 0, 1, 0, 256);
    addk("tile4 x512 hint2 (.cs stores)", 11, 0, 4, 2, 512);
    addk("tile4 x128 (8K tiles)", 11, 0, 4, 0, 128);
  }
  if (set == "d") {
    addk("tile8 x256 (32K tiles)", 6, 0, 8, 0, 0);
    addk("tile8 x256 persistent static grid=sms*8", 8, sms * 8, 8, 0, 0);
    addk("tile8 x256 persistent dynamic grid=sms*8", 8, sms * 8, 8, 1, 0);
    addk("tile8 x256 persistent static grid=sms*4", 8, sms * 4, 8, 0, 0);
    addk("tile8 x256 persistent dynamic grid=sms*4", 8, sms * 4, 8, 1, 0);
    add(0, 8192, 16, 112, 8, 8, 0);
    add(0, 8192, 12, 132, 8, 8, 0);
    add(2, 8192, 16, 112, 8, 8, 0);
    add(2, 8192, 16, 132, 8, 8, 0);
    add(2, 8192, 12, 132, 8, 8, 0);
    add(2, 16384, 16, 132, 8, 8, 0);
    add(1, 8192, 16, 112, 8, 8, 0);
    add(1, 8192, 12, 132, 8, 8, 0);
  }
  if (set == "e") {
    add(1, 8192, 16, 112, 8, 8, 0);
    add(3, 8192, 16, 112, 8, 8, 0);
    add(3, 8192, 16, 132, 8, 8, 0);
    add(1, 8192, 12, 132, 8, 8, 0);
    add(3, 8192, 12, 132, 8, 8, 0);
    add(3, 8192, 16, 112, 4, 8, 0);
    add(3, 16384, 16, 112, 8, 8, 0);
    add(3, 16384, 16, 132, 8, 8, 0);
    add(2, 8192, 16, 112, 8, 8, 0);
  }
  if (set == "a") {
    add(0, 8192, 16, 112, 8, 8, 0);
    add(0, 8192, 22, 132, 8, 8, 0);
    add(0, 8192, 16, 112, 8, 8, 14);
    add(0, 16384, 16, 112, 8, 8, 0);
    add(1, 8192, 16, 112, 8, 8, 0);
    add(1, 8192, 22, 132, 8, 8, 0);
    add(1, 8192, 12, 132, 8, 8, 0);
    add(1, 16384, 16, 112, 8, 8, 0);
    add(0, 8192, 16, 112, 8, 16, 0);
    add(0, 8192, 16, 112, 8, 4, 0);
    add(0, 8192, 12, 132, 8, 8, 0);
    add(0, 4096, 16, 112, 8, 8, 0);
    add(0, 32768, 16, 112, 8, 8, 0);
    add(1, 8192, 16, 112, 8, 16, 0);
    add(1, 8192, 16, 112, 4, 8, 0);
  }
  auto run = [&](Variant& v) {
    switch (v.kind) {
      case 0: CK(cudaMemcpyAsync(y, x, n * 4, cudaMemcpyDeviceToDevice, st)); break;
      case 1: copy_kernel<<<sms * 8, 512, 0, st>>>((const float4*)x, (float4*)y, n / 4); break;
      case 2: {
        int s = fwd(x, cols, y, cols, rows, cols, 0, st);
        if (s) {
          std::fprintf(stderr, "softlight status %d\n", s);
          std::exit(1);
        }
        break;
      }
      case 3: ring<0><<<v.grid, (v.sh.stats_warps + v.sh.writer_warps + 1) * 32, smem_max - 1024, st>>>(x, y, rows, cols, v.sh); break;
      case 5:
        if (v.p1 == 4) copy_unroll<4><<<v.grid, v.p3 ? 256 : 512, 0, st>>>((const float4*)x, (float4*)y, n / 4);
        else copy_unroll<8><<<v.grid, v.p3 ? 256 : 512, 0, st>>>((const float4*)x, (float4*)y, n / 4);
        break;
      case 6: {
        const int threads = v.p3 ? 512 : 256;
        const int64_t per = int64_t{threads} * v.p1;
        const int64_t g = (n / 4 + per - 1) / per;
        if (v.p1 == 8) copy_tile<8><<<g, threads, 0, st>>>((const float4*)x, (float4*)y, n / 4);
        else copy_tile<4><<<g, threads, 0, st>>>((const float4*)x, (float4*)y, n / 4);
        break;
      }
      case 11: {  // p1 vectors a thread, p2 hints, p3 threads (256 if 0)
        const int threads = v.p3 ? v.p3 : 256;
        const int64_t per = int64_t{threads} * v.p1;
        const int64_t g = (n / 4 + per - 1) / per;
        const float4* xs = (const float4*)x;
        float4* ys = (float4*)y;
        const int key = v.p1 * 8 + v.p2;
        if (key == 1 * 8) copy_tile_hint<1, 0><<<g, threads, 0, st>>>(xs, ys, n / 4);
        else if (key == 2 * 8) copy_tile_hint<2, 0><<<g, threads, 0, st>>>(xs, ys, n / 4);
        else if (key == 4 * 8) copy_tile_hint<4, 0><<<g, threads, 0, st>>>(xs, ys, n / 4);
        else if (key == 4 * 8 + 2) copy_tile_hint<4, 2><<<g, threads, 0, st>>>(xs, ys, n / 4);
        else if (key == 16 * 8) copy_tile_hint<16, 0><<<g, threads, 0, st>>>(xs, ys, n / 4);
        else if (key == 16 * 8 + 1) copy_tile_hint<16, 1><<<g, threads, 0, st>>>(xs, ys, n / 4);
        else if (key == 8 * 8 + 1) copy_tile_hint<8, 1><<<g, threads, 0, st>>>(xs, ys, n / 4);
        else if (key == 8 * 8 + 2) copy_tile_hint<8, 2><<<g, threads, 0, st>>>(xs, ys, n / 4);
        else if (key == 8 * 8 + 3) copy_tile_hint<8, 3><<<g, threads, 0, st>>>(xs, ys, n / 4);
        else if (key == 8 * 8 + 4) copy_tile_hint<8, 4><<<g, threads, 0, st>>>(xs, ys, n / 4);
        else {
          std::fprintf(stderr, "no tile variant %d/%d\n", v.p1, v.p2);
          std::exit(1);
        }
        break;
      }
      case 13:  // p1 = K, p2 = vectors a thread (1 or 8), p3 = threads
        if (v.p2 == 8)
          copy_tile_spread<8><<<n / 4 / v.p3 / 8, v.p3, 0, st>>>((const float4*)x, (float4*)y, n / 4, v.p1);
        else
          copy_tile_spread<1><<<n / 4 / v.p3, v.p3, 0, st>>>((const float4*)x, (float4*)y, n / 4, v.p1);
        break;
      case 12:
        bulk_copy<1><<<v.grid, 32, v.p2 * v.p1 + 1024, st>>>((const unsigned char*)x, (unsigned char*)y, n * 4, v.p1, v.p2, v.p3);
        break;
      case 7:
        bulk_copy<3><<<v.grid, 32, v.p2 * v.p1 + 1024, st>>>((const unsigned char*)x, (unsigned char*)y, n * 4, v.p1, v.p2, v.p3);
        break;
      case 10:
        CK(cudaMemsetAsync(ctr, 0, 4, st));
        ring<3><<<v.grid, (v.sh.stats_warps + v.sh.writer_warps + 1) * 32, smem_max - 1024, st>>>(x, y, rows, cols, v.sh);
        break;
      case 9:
        CK(cudaMemsetAsync(ctr, 0, 4, st));
        ring<2><<<v.grid, (v.sh.stats_warps + v.sh.writer_warps + 1) * 32, smem_max - 1024, st>>>(x, y, rows, cols, v.sh);
        break;
      case 8:
        CK(cudaMemsetAsync(ctr, 0, 4, st));
        copy_tile_persistent<8><<<v.grid, 256, 0, st>>>((const float4*)x, (float4*)y, n / 4, v.p2);
        break;
      case 4: ring<1><<<v.grid, (v.sh.stats_warps + v.sh.writer_warps + 1) * 32, smem_max - 1024, st>>>(x, y, rows, cols, v.sh); break;
    }
    CK(cudaGetLastError());
  };
  unsigned long long* bad;
  CK(cudaMalloc(&bad, 8));
  for (auto& v : vs) {  // warm up; the pure copies must reproduce x
    run(v);
    CK(cudaStreamSynchronize(st));
    if (v.kind != 2 && v.kind != 4 && v.kind != 10) {  // the copies must reproduce x
      CK(cudaMemset(bad, 0, 8));
      count_diff<<<sms * 4, 512, 0, st>>>(x, y, n, bad);
      unsigned long long h;
      CK(cudaMemcpyAsync(&h, bad, 8, cudaMemcpyDeviceToHost, st));
      CK(cudaStreamSynchronize(st));
      if (h) std::printf("WRONG %s: %llu mismatches\n", v.name.c_str(), h);
    }
    CK(cudaMemsetAsync(y, 0xff, n * 4, st));
  }
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const int rounds = getenv("RC_ROUNDS") ? atoi(getenv("RC_ROUNDS")) : 4, reps = 5;
  for (int r = 0; r < rounds; ++r)
    for (auto& v : vs)
      for (int i = 0; i < reps; ++i) {
        v.ms.push_back(time_once(st, a, b, [&] { run(v); }));
        if (r == rounds - 1 && i == reps - 1 && (v.kind == 3 || v.kind == 4 || v.kind == 9 || v.kind == 10)) {
          unsigned long long t[2][1024];
          CK(cudaMemcpyFromSymbol(t, g_t, sizeof t));
          unsigned long long s0 = ~0ull, s1 = 0, e0 = ~0ull, e1 = 0;
          for (int k = 0; k < v.grid; ++k) {
            s0 = std::min(s0, t[0][k]); s1 = std::max(s1, t[0][k]);
            e0 = std::min(e0, t[1][k]); e1 = std::max(e1, t[1][k]);
          }
          std::printf("  %s: starts within %.1f us, ends %.1f .. %.1f us\n", v.name.c_str(), (s1 - s0) / 1e3,
                      (e0 - s0) / 1e3, (e1 - s0) / 1e3);
        }
      }
  const float base = median(vs[0].ms);
  for (auto& v : vs) std::printf("%-60s %7.3f ms  %6.3fx memcpy\n", v.name.c_str(), median(v.ms), median(v.ms) / base);
}
