// The tuning builds' forced values (tuning.hpp): a thread's own, checked when they are set.
#include "planner/tuning.hpp"

#include <climits>
#include <cstdint>

#include "cpu/parallel.hpp"
#include "planner/softlight_tuning.h"

namespace softlight {
namespace {

thread_local Tuning forced;

// -1 (the planner's choice) maps to the knob's own unset value; anything else must fit the knob's type.
bool take(int64_t v, int unset, int* out) {
  if (v == -1) {
    *out = unset;
    return true;
  }
  if (v < 0 || v > INT_MAX) return false;
  *out = static_cast<int>(v);
  return true;
}

bool take(int64_t v, int64_t unset, int64_t* out) {
  if (v < -1) return false;
  *out = v == -1 ? unset : v;
  return true;
}

}  // namespace

Tuning forced_tuning() { return forced; }

}  // namespace softlight

extern "C" softlight_status softlight_tuning_force(const softlight_tuning* t) {
  using namespace softlight;
  if (t == nullptr) {
    forced = Tuning{};
    return SOFTLIGHT_SUCCESS;
  }
  Tuning k;
  bool ok = true;
#define SOFTLIGHT_TAKE(name, type, unset) ok = ok && take(t->name, type{unset}, &k.name);
  SOFTLIGHT_KNOBS(SOFTLIGHT_TAKE)
#undef SOFTLIGHT_TAKE
  if (!ok || !tuning_valid(k) || (k.cpu_kernels >= 0 && !cpu::cpu_runs(k.cpu_kernels)))
    return SOFTLIGHT_ERROR_INVALID_ARGUMENT;
  forced = k;
  return SOFTLIGHT_SUCCESS;
}
