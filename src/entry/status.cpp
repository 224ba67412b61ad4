// Status strings, version and dtype sizes: the parts of the C ABI that need no device.
#include <cstring>

#include "softlight/softlight.h"

extern "C" {

const char* softlight_status_string(softlight_status status) {
  int code;  // the caller's value as an int: an enum outside its values may not be loaded as one
  std::memcpy(&code, &status, sizeof code);
  switch (code) {
    case SOFTLIGHT_SUCCESS: return "success";
    case SOFTLIGHT_ERROR_NULL_POINTER: return "an array pointer is null";
    case SOFTLIGHT_ERROR_INVALID_SIZE: return "rows or cols is negative, or the matrix is too large to address";
    case SOFTLIGHT_ERROR_INVALID_STRIDE: return "a row stride is smaller than cols, a stride is negative, or an output's elements alias one another";
    case SOFTLIGHT_ERROR_UNSUPPORTED_DTYPE: return "unsupported dtype (float32, float16, bfloat16 and float64 are supported)";
    case SOFTLIGHT_ERROR_OVERLAP: return "an output overlaps an input without being the same array (only exact in-place is allowed)";
    case SOFTLIGHT_ERROR_NOT_DEVICE_MEMORY: return "an array is not CUDA device (or managed) memory";
    case SOFTLIGHT_ERROR_DEVICE_MISMATCH: return "the arrays are on different CUDA devices";
    case SOFTLIGHT_ERROR_NO_DEVICE: return "no usable CUDA driver or device";
    case SOFTLIGHT_ERROR_UNSUPPORTED_DEVICE: return "the CUDA device is older than compute capability 8.0";
    case SOFTLIGHT_ERROR_CUDA: return "the CUDA runtime reported an error";
    case SOFTLIGHT_ERROR_INVALID_ARGUMENT:
      return "invalid argument (a temperature out of its range, or a pointer not aligned to its element)";
    case SOFTLIGHT_ERROR_OUT_OF_MEMORY: return "out of memory for a workspace";
    case SOFTLIGHT_ERROR_INVALID_AXIS: return "dim is out of range for the array";
    case SOFTLIGHT_ERROR_UNMERGED_LAYOUT:
      return "the axes before dim, or after it, do not merge into one evenly strided axis, or a stride is negative";
  }
  return "unknown softlight status";
}

int softlight_version(void) { return SOFTLIGHT_VERSION; }

int softlight_gpu_built(void) {
#ifdef SOFTLIGHT_WITH_GPU
  return 1;
#else
  return 0;
#endif
}

int softlight_dtype_size(softlight_dtype dtype) {
  int code;  // as above: any int the caller passed, read as an int
  std::memcpy(&code, &dtype, sizeof code);
  switch (code) {
    case SOFTLIGHT_FLOAT32: return 4;
    case SOFTLIGHT_FLOAT16: return 2;
    case SOFTLIGHT_BFLOAT16: return 2;
    case SOFTLIGHT_FLOAT64: return 8;
  }
  return 0;
}

}  // extern "C"
