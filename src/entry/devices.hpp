// What the library's CUDA runtime sees, for the Python package (which needs no CUDA package of its
// own to tell whether there is a GPU).
#pragma once

#include "planner/plan.hpp"  // SOFTLIGHT_INTERNAL

namespace softlight {

// The CUDA devices visible to the library: 0 without a driver or a device (no error left pending).
SOFTLIGHT_INTERNAL int visible_device_count();

}  // namespace softlight
