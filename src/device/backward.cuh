// The backward's steps on a pack, shared by the families that hold rows of dy and y in registers
// (short_rows, register_rows).
#pragma once

#include "device/common.cuh"

namespace softlight {
namespace {

// The backward's steps on a pack of dy (g) and y (p) as load_raw gave them: dy's elements added to
// s in order; dx = dy - exp(y) * s.
template <class T, int V> __device__ __forceinline__ void add_raw(acc_t<T>& s, const T (&g)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) s += to_acc(g[j]);
}
template <class T, int V>
__device__ __forceinline__ void grad_pack(acc_t<T> (&d)[V], const T (&g)[V], const T (&p)[V], acc_t<T> s) {
#pragma unroll
  for (int j = 0; j < V; ++j) d[j] = log_softmax_grad(to_acc(g[j]), to_acc(p[j]), s);
}

}  // namespace
}  // namespace softlight
