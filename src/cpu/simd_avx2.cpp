// The CPU vector kernels (simd.hpp) for x86-64 CPUs with AVX2, FMA and F16C: 32-byte vectors.
// Built with -mavx2 -mfma -mf16c (CMakeLists.txt); called only where the CPU has all three
// (parallel.hpp).
#define SOFTLIGHT_VECTOR_BYTES 32
#include "cpu/simd.hpp"

softlight::cpu::KernelSet softlight::cpu::kernels_avx2() { return kernel_set(); }
