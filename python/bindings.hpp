// What bindings.cpp shares with torch_entry.cpp: the two calls of the C ABI's N-d entries, as the
// Python module makes them.
#pragma once

#include <Python.h>

#include <cstdint>
#include <vector>

namespace softlight_py {

using Dims = std::vector<int64_t>;

// A Python sequence of ints into `out`; false with a Python exception set.
bool dims_of(PyObject* o, Dims* out);

// The strides (in elements) of a C-contiguous array of `shape`; false with a Python exception set.
bool contiguous(const Dims& shape, Dims* out);

// The forward of one array along dim: y (ys strides; the shape is x's) = log_softmax(x / t), lse
// optional. gpu: queued on `stream`; else on the CPU's threads. Returns a C ABI status, or -5 where
// the strides' lengths differ from the shape's (bindings.cpp). Releases the GIL around the C ABI's call.
int forward(uintptr_t x, const Dims& shape, const Dims& xs, uintptr_t y, const Dims& ys, int64_t dim, int dtype,
            bool gpu, uintptr_t stream, double temperature, uintptr_t lse);

// The backward along dim: dx = dy - exp(y) * sum(dy), arrays of one shape.
int backward(uintptr_t dy, const Dims& shape, const Dims& dys, uintptr_t y, const Dims& ys, uintptr_t dx,
             const Dims& dxs, int64_t dim, int dtype, bool gpu, uintptr_t stream);

// Adds torch_entry.cpp's functions to the module; false with a Python exception set.
bool add_torch_entries(PyObject* module);

}  // namespace softlight_py
