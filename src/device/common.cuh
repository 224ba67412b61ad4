// Device code shared by the kernel families, by tier: numerics.cuh (types, exp and log, the
// (max, sum) algebra), packs.cuh (16-byte packs and a thread's reductions over them),
// reductions.cuh (lanes, warps, CTAs), dispatch.cuh (a plan's choices to template parameters);
// hopper.cuh holds the Hopper primitives of the cluster families.
#pragma once

#include "device/dispatch.cuh"
#include "device/numerics.cuh"
#include "device/packs.cuh"
#include "device/reductions.cuh"
