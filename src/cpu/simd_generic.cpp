// The CPU vector kernels (simd.hpp) for any CPU: 16-byte vectors (SSE2 on x86-64, NEON on Arm).
#define SOFTLIGHT_VECTOR_BYTES 16
#include "cpu/simd.hpp"

softlight::cpu::KernelSet softlight::cpu::kernels_generic() { return kernel_set(); }
