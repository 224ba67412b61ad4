// Probe: can rows of 8-16 MB be held on chip by ordinary loads (registers, and shared memory
// filled by cp.async) instead of grid_rows' bulk-copy rings, and how near the copy does that run?
//
// The kernel, `hold`, is a whole fp32 log-softmax over rows too long for any cluster:
//   * a row is cut into items of T x P 16-byte packs (T threads, P packs a thread); persistent CTAs
//     claim items in order from one counter;
//   * each CTA holds up to 1 + NS items: one in registers, NS in shared memory (each thread loads
//     its own packs there with cp.async and reads only those back);
//   * an item is folded into a (max, sum) partial as soon as it lands, posted to a table, and
//     counted into its row with an acq_rel atomic; the CTA that counts a row's last item merges
//     the row's partials and posts (row + 1, log-sum-exp) as one 64-bit word;
//   * a buffer is refilled only after its item is written, and a CTA waits for a row's word only
//     while every item it holds is posted. Items are claimed in order, so the earliest unfinished
//     row has all its items claimed or some CTA not waiting, provided the grid holds more items
//     than a row has ((1 + NS) x CTAs > items a row): no deadlock, with every CTA resident
//     (cooperative launch).
// DEP = false is the same engine with no row dependency (each item written back as loaded): the
// engine's own copy rate.
//
// Each variant is timed in alternating rounds against cudaMemcpyAsync and the library's forward
// (through the C ABI); every log-softmax is checked against a float64 reference on sampled rows.
// Build and run on an sm_90 GPU:
//   nvcc -std=c++17 -O3 -arch=sm_90a -o hold_probe tools/hold_probe.cu -ldl
//   ./hold_probe path/to/libsoftlight.so 60 4194304
#include <cuda_runtime.h>

#include "probe_common.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>


struct HoldArgs {
  const float* x;
  float* y;
  int64_t cols;
  int64_t total;  // items
  int ipr;        // items a row
  unsigned* claim;
  unsigned* count;           // [rows]
  float2* part;              // [total]
  unsigned long long* word;  // [rows]
  unsigned* stuck;
};

__device__ __forceinline__ unsigned long long ld_acquire_u64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned ld_acquire_u32(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_u64(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned add_acq_rel(unsigned* p, unsigned v) {
  unsigned old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

__device__ __forceinline__ void combine(float& m, float& s, float m2, float s2) {
  const float n = fmaxf(m, m2);
  if (n == -INFINITY) return;  // both empty (s stays 0)
  s = s * __expf(m - n) + s2 * __expf(m2 - n);
  m = n;
}

template <int P>
__device__ __forceinline__ void fold(const float4 (&v)[P], float& m, float& s) {
  m = v[0].x;
#pragma unroll
  for (int p = 0; p < P; ++p) m = fmaxf(fmaxf(fmaxf(m, v[p].x), fmaxf(v[p].y, v[p].z)), v[p].w);
  s = 0.f;
#pragma unroll
  for (int p = 0; p < P; ++p)
    s += __expf(v[p].x - m) + __expf(v[p].y - m) + __expf(v[p].z - m) + __expf(v[p].w - m);
}

__device__ __forceinline__ float4 lds16(const float4* p) {  // volatile: not merged with the other pass's
  float4 v;
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a));
  return v;
}

template <int P, int T>
__device__ __forceinline__ void fold_shared(const float4* sp, float& m, float& s) {
  m = -INFINITY;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const float4 q = lds16(sp + p * T);
    m = fmaxf(fmaxf(fmaxf(m, q.x), fmaxf(q.y, q.z)), q.w);
  }
  s = 0.f;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const float4 q = lds16(sp + p * T);
    s += __expf(q.x - m) + __expf(q.y - m) + __expf(q.z - m) + __expf(q.w - m);
  }
}

// The CTA's (max, sum) of one item, posted and counted; the last item's CTA merges the row.
template <int T>
__device__ void post(const HoldArgs& a, int64_t item, float m, float s, float2* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o; o >>= 1) combine(m, s, __shfl_xor_sync(~0u, m, o), __shfl_xor_sync(~0u, s, o));
  if (lane == 0) red[warp] = make_float2(m, s);
  __syncthreads();
  if (warp == 0) {
    float2 r = lane < T / 32 ? red[lane] : make_float2(-INFINITY, 0.f);
    m = r.x;
    s = r.y;
#pragma unroll
    for (int o = 16; o; o >>= 1) combine(m, s, __shfl_xor_sync(~0u, m, o), __shfl_xor_sync(~0u, s, o));
    const int64_t row = item / a.ipr;
    unsigned old = 0;
    if (lane == 0) {
      a.part[item] = make_float2(m, s);
      old = add_acq_rel(a.count + row, 1u);
    }
    old = __shfl_sync(~0u, old, 0);
    if (old == unsigned(a.ipr - 1)) {  // the row's last item: merge it
      while (ld_acquire_u32(a.count + row) < unsigned(a.ipr)) {
      }
      float mm = -INFINITY, ss = 0.f;
      for (int k = lane; k < a.ipr; k += 32) {
        const float2 q = __ldcg(a.part + row * a.ipr + k);
        combine(mm, ss, q.x, q.y);
      }
#pragma unroll
      for (int o = 16; o; o >>= 1) combine(mm, ss, __shfl_xor_sync(~0u, mm, o), __shfl_xor_sync(~0u, ss, o));
      if (lane == 0) {
        const float lse = mm + __logf(ss);
        st_release_u64(a.word + row, (static_cast<unsigned long long>(row + 1) << 32) | __float_as_uint(lse));
      }
    }
  }
  __syncthreads();  // red is free again
}

__device__ float wait_row(const HoldArgs& a, int64_t row, float* lse_s) {
  if (threadIdx.x == 0) {
    unsigned long long w;
    unsigned spins = 0;
    while (((w = ld_acquire_u64(a.word + row)) >> 32) != static_cast<unsigned long long>(row + 1)) {
      __nanosleep(64);
      if (++spins == (1u << 25)) {  // about 2 s: report, and let the call end with a wrong y
        atomicAdd(a.stuck, 1u);
        break;
      }
    }
    *lse_s = __uint_as_float(static_cast<unsigned>(w));
  }
  __syncthreads();
  return *lse_s;
}

// The next item, or -1. Two slots taken in turn: a slot is written again only after the
// barrier of the claim between, by which every thread has read it.
__device__ int64_t claim(const HoldArgs& a, int64_t* slots, int& turn) {
  int64_t* slot = slots + turn;
  turn ^= 1;
  if (threadIdx.x == 0) *slot = atomicAdd(a.claim, 1u);
  __syncthreads();
  const int64_t it = *slot;
  return it < a.total ? it : -1;
}

template <int T, int P, int NS, bool DEP, int MINB = 1>
__global__ void __launch_bounds__(T, MINB) hold(HoldArgs a) {
  extern __shared__ float4 sbuf[];  // [NS][P][T]
  __shared__ float2 red[T / 32];
  __shared__ int64_t slots[2];
  int turn = 0;
  __shared__ float lse_s;
  constexpr int E = T * P * 4;  // elements an item
  const int t = threadIdx.x;
  auto at = [&](int64_t item) {  // this thread's first pack of an item
    const int64_t row = item / a.ipr, piece = item % a.ipr;
    return row * a.cols + piece * E + int64_t{t} * 4;
  };
  float4 v[P];
  int64_t held[1 + NS];
#pragma unroll
  for (int b = 0; b <= NS; ++b) held[b] = -1;
  bool first = true;
  for (;;) {
    bool any = false;
#pragma unroll
    for (int b = 0; b <= NS; ++b) {
      const int64_t old = held[b];
      if (old >= 0) {  // write the item this buffer holds
        const float lse = DEP ? wait_row(a, old / a.ipr, &lse_s) : 0.f;
        float4* yp = reinterpret_cast<float4*>(a.y + at(old));
#pragma unroll
        for (int p = 0; p < P; ++p) {
          float4 q = b == 0 ? v[p] : lds16(sbuf + (b - 1) * P * T + p * T + t);
          q.x -= lse;
          q.y -= lse;
          q.z -= lse;
          q.w -= lse;
          yp[p * T] = q;
        }
      }
      held[b] = (first || old >= 0) ? claim(a, slots, turn) : -1;
      if (held[b] < 0) continue;
      any = true;
      const float4* xp = reinterpret_cast<const float4*>(a.x + at(held[b]));
      if (b == 0) {
#pragma unroll
        for (int p = 0; p < P; ++p) v[p] = xp[p * T];
        if (DEP) {
          float m, s;
          fold<P>(v, m, s);
          post<T>(a, held[b], m, s, red);
        }
      } else {
        float4* sp = sbuf + (b - 1) * P * T + t;
#pragma unroll
        for (int p = 0; p < P; ++p) cp_async16(sp + p * T, xp + p * T);
        if (DEP) {
          cp_async_wait_all();
          float m, s;  // read from shared memory twice: the register buffer's item is live
          fold_shared<P, T>(sp, m, s);
          post<T>(a, held[b], m, s, red);
        }
      }
    }
    first = false;
    if (!DEP) cp_async_wait_all();
    if (!any) break;  // every buffer written and no item left
  }
}

__global__ void copy_tile1(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n4) y[i] = x[i];
}


struct Variant {
  std::string name;
  int kind;  // 0 memcpy, 1 tile copy, 2 library, 3 hold
  void (*kernel)(HoldArgs);
  int T, P, NS;
  bool dep;
  int grid;
  size_t smem;
  std::vector<float> ms;
};

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: hold_probe libsoftlight.so rows cols [rounds]\n");
    return 2;
  }
  const int64_t rows = atoll(argv[2]), cols = atoll(argv[3]);
  const int rounds = argc > 4 ? atoi(argv[4]) : 4;
  const fwd_t fwd = open_forward(argv[1]);
  const int64_t n = rows * cols;
  float *x, *y;
  alloc_pair(n, &x, &y);
  std::vector<float> hx(cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < cols; ++i)
      hx[i] = float(((i + 7919 * r) * 2654435761u) % 100003) / 100003.f * 8.f - 4.f;
    CK(cudaMemcpy(x + r * cols, hx.data(), cols * 4, cudaMemcpyHostToDevice));
  }
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int sms, dev = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("# %s, %d SMs; rows %lld x %lld fp32 (%.1f MB a row)\n", prop.name, sms, (long long)rows,
              (long long)cols, cols * 4 / 1e6);

  // workspace: claim counter, stuck flag, counts, words, partials (the largest item count: P=4, T=256)
  const int64_t max_items = n / 2048;
  unsigned char* ws;
  const size_t head = 256, counts = rows * 4, words = rows * 8;
  CK(cudaMalloc(&ws, head + counts + words + max_items * 8 + 256));
  HoldArgs base{};
  base.x = x;
  base.y = y;
  base.cols = cols;
  base.claim = reinterpret_cast<unsigned*>(ws);
  base.stuck = reinterpret_cast<unsigned*>(ws + 4);
  base.count = reinterpret_cast<unsigned*>(ws + head);
  base.word = reinterpret_cast<unsigned long long*>(ws + ((head + counts + 7) / 8) * 8);
  base.part = reinterpret_cast<float2*>(ws + ((head + counts + words + 15) / 16) * 16 + 16);
  const size_t clear = ((head + counts + words + 15) / 16) * 16;

  std::vector<Variant> vs;
  vs.push_back({"memcpy", 0, nullptr, 0, 0, 0, false, 0, 0, {}});
  vs.push_back({"tile1 x256 copy", 1, nullptr, 0, 0, 0, false, 0, 0, {}});
  vs.push_back({"softlight (C ABI)", 2, nullptr, 0, 0, 0, false, 0, 0, {}});
  auto add = [&](void (*k)(HoldArgs), int T, int P, int NS, bool dep) {
    const size_t smem = size_t(NS) * P * T * 16;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k, T, smem));
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, k));
    const int64_t item_el = int64_t{T} * P * 4;
    const int grid = occ * sms;
    const int64_t ipr = cols / item_el;
    char b[200];
    std::snprintf(b, sizeof b, "hold T=%d P=%d NS=%d %s (%d regs, %d CTAs/SM, items %lld KB, %lld a row, holds %.1f MB)",
                  T, P, NS, dep ? "dep" : "nodep", fa.numRegs, occ, (long long)(item_el * 4 / 1024),
                  (long long)ipr, grid * (1 + NS) * item_el * 4 / 1e6);
    if (cols % item_el || (dep && int64_t{grid} * (1 + NS) <= ipr) || occ == 0) {
      std::printf("# skipped: %s\n", b);
      return;
    }
    vs.push_back({b, 3, k, T, P, NS, dep, grid, smem, {}});
  };
  add(hold<256, 8, 1, false>, 256, 8, 1, false);
  add(hold<256, 8, 1, false, 4>, 256, 8, 1, false);
  add(hold<256, 8, 1, true>, 256, 8, 1, true);
  add(hold<256, 8, 1, true, 4>, 256, 8, 1, true);
  add(hold<256, 8, 1, true, 5>, 256, 8, 1, true);
  add(hold<256, 8, 0, true>, 256, 8, 0, true);
  add(hold<256, 8, 0, true, 5>, 256, 8, 0, true);
  add(hold<256, 4, 1, true>, 256, 4, 1, true);
  add(hold<256, 4, 2, true>, 256, 4, 2, true);
  add(hold<256, 4, 2, true, 6>, 256, 4, 2, true);
  add(hold<256, 8, 2, true, 3>, 256, 8, 2, true);
  add(hold<512, 4, 1, true, 2>, 512, 4, 1, true);
  add(hold<128, 8, 1, true, 8>, 128, 8, 1, true);
  add(hold<128, 8, 2, true, 6>, 128, 8, 2, true);

  auto run = [&](Variant& v) {
    switch (v.kind) {
      case 0: CK(cudaMemcpyAsync(y, x, n * 4, cudaMemcpyDeviceToDevice, st)); break;
      case 1: copy_tile1<<<(n / 4 + 255) / 256, 256, 0, st>>>((const float4*)x, (float4*)y, n / 4); break;
      case 2: {
        const int s = fwd(x, cols, y, cols, rows, cols, 0, st);
        if (s) {
          std::fprintf(stderr, "softlight status %d\n", s);
          std::exit(1);
        }
        break;
      }
      case 3: {
        HoldArgs a = base;
        const int64_t item_el = int64_t{v.T} * v.P * 4;
        a.ipr = int(cols / item_el);
        a.total = rows * a.ipr;
        CK(cudaMemsetAsync(ws, 0, clear, st));
        void* args[] = {&a};
        CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(v.kernel), v.grid, v.T, args, v.smem, st));
        break;
      }
    }
    CK(cudaGetLastError());
  };

  // check: every log-softmax against float64 on three rows; the copies against x
  std::vector<float> hy(cols);
  for (auto& v : vs) {
    CK(cudaMemsetAsync(y, 0xff, n * 4, st));  // NaN
    run(v);
    CK(cudaStreamSynchronize(st));
    unsigned stuck = 0;
    if (v.kind == 3) CK(cudaMemcpy(&stuck, base.stuck, 4, cudaMemcpyDeviceToHost));
    double worst = 0;
    const bool is_copy = v.kind < 2 || (v.kind == 3 && !v.dep);
    for (int64_t r : {int64_t{0}, rows / 2, rows - 1}) {
      CK(cudaMemcpy(hx.data(), x + r * cols, cols * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(hy.data(), y + r * cols, cols * 4, cudaMemcpyDeviceToHost));
      double m = -INFINITY, s = 0;
      for (float f : hx) m = std::fmax(m, double(f));
      for (float f : hx) s += std::exp(double(f) - m);
      const double lse = m + std::log(s);
      for (int64_t i = 0; i < cols; ++i) {
        const double want = is_copy ? double(hx[i]) : double(hx[i]) - lse;
        const double e = std::fabs(double(hy[i]) - want);
        if (!(e <= worst)) worst = std::isnan(e) ? INFINITY : e;
      }
    }
    std::printf("# check %-100s max |err| %.3g%s\n", v.name.c_str(), worst, stuck ? "  STUCK" : "");
    if (!(worst < 1e-4) || stuck) {
      std::printf("# FAILED: %s\n", v.name.c_str());
      v.kind = -1;
    }
  }
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int r = 0; r < rounds; ++r)
    for (auto& v : vs) {
      if (v.kind < 0) continue;
      for (int w = 0; w < 2; ++w) run(v);
      std::vector<float> t;
      for (int k = 0; k < 5; ++k) t.push_back(time_once(st, e0, e1, [&] { run(v); }));
      v.ms.push_back(median(t));
    }
  const float copy = median(vs[0].ms);
  for (auto& v : vs) {
    if (v.kind < 0) continue;
    std::printf("RESULT %-100s %.4f ms  %.3fx  rounds", v.name.c_str(), median(v.ms), median(v.ms) / copy);
    for (float m : v.ms) std::printf(" %.4f", m);
    std::printf("\n");
  }
  return 0;
}
