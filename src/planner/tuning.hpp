// Forcing the planner's choices, for tests and tuning builds only.
//
// A default build plans every call with Tuning{} and holds no way to change that. A build configured
// with -DSOFTLIGHT_TUNING=ON also exports softlight_tuning_force (softlight_tuning.h, not installed),
// which sets the values the calling thread's later calls plan with, each checked by tuning_valid
// (plan.hpp) before it is taken.
#pragma once

#include "planner/plan.hpp"

namespace softlight {

#ifdef SOFTLIGHT_TUNING
Tuning forced_tuning();  // the calling thread's forced values (tuning.cpp)
#else
inline Tuning forced_tuning() { return Tuning{}; }
#endif

}  // namespace softlight
