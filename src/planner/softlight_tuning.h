/*
 * The tuning interface of softlight's tuning builds (-DSOFTLIGHT_TUNING=ON); a default build has
 * none of it. Not installed: tests and tuning scripts only. One field a knob (knobs.h says what
 * each forces); -1 leaves the planner's choice.
 */
#ifndef SOFTLIGHT_TUNING_H
#define SOFTLIGHT_TUNING_H

#include <stdint.h>

#include "knobs.h"
#include "softlight/softlight.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SOFTLIGHT_TUNING_FIELD(name, type, unset) int64_t name;
typedef struct softlight_tuning {
  SOFTLIGHT_KNOBS(SOFTLIGHT_TUNING_FIELD)
} softlight_tuning;
#undef SOFTLIGHT_TUNING_FIELD

/* Forces `t` on the calling thread's later calls (NULL: back to the planner's choices).
 * SOFTLIGHT_ERROR_INVALID_ARGUMENT, with nothing changed, where a value is out of its range. */
SOFTLIGHT_API softlight_status softlight_tuning_force(const softlight_tuning* t);

#ifdef __cplusplus
}
#endif

#endif /* SOFTLIGHT_TUNING_H */
