"""Each instruction set's CPU kernels (src/cpu/simd.hpp: generic, AVX2 + FMA + F16C), forced in
turn through the tuning interface (tuning builds only) on every set this CPU can run, against the
float64 references of the tests they reuse. A default build runs only the widest set, in the other
test files."""
import platform

import pytest
from hypothesis import HealthCheck, given, settings

import gpu_util
import test_axis_cpu
import test_consumers
import test_cpu_backend
import test_differential

KERNEL_SETS = {"generic": 0, "avx2": 1}  # softlight_tuning.cpu_kernels
NEEDS = {"generic": set(), "avx2": {"avx2", "fma", "f16c"}}


def _cpu_flags():
    """The CPU's feature flags as Linux lists them, or None where it does not."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def _runs(name):
    if name == "generic":
        return True
    flags = _cpu_flags()
    if flags is None:
        return None
    return platform.machine() in ("x86_64", "AMD64") and NEEDS[name] <= flags


def test_forcing_follows_the_cpu(force):
    """A set is taken where the CPU has its instructions and refused (status 11, nothing changed)
    where it does not."""
    for name, code in KERNEL_SETS.items():
        runs = _runs(name)
        if runs is None:
            pytest.skip("the CPU's features are not listed in /proc/cpuinfo here")
        assert (gpu_util.planner.force({"cpu_kernels": code}) == 0) == runs, name
        gpu_util.planner.force({})
    with pytest.raises(KeyError):
        gpu_util.planner.force({"cpu_kernel": 0})
    force = gpu_util.planner.force
    assert force({"cpu_kernels": len(KERNEL_SETS)}) == 11 and force({"cpu_kernels": -2}) == 11


@pytest.mark.parametrize("name", list(KERNEL_SETS))
def test_each_set_matches_float64(force, rng, name):
    if not _runs(name):
        pytest.skip(f"this CPU cannot run the {name} kernels")
    force(cpu_kernels=KERNEL_SETS[name])
    for layout in test_cpu_backend.LAYOUTS:
        for dtype in ("float32", "float64", "bfloat16", "float16"):
            test_cpu_backend.test_vector_layouts_match_float64(rng, *layout, dtype)
    test_cpu_backend.test_float16_conversions_exactly_as_numpy()
    for cols in (1, 7, 64, 1000):
        for dtype in ("float32", "float64", "float16"):
            test_cpu_backend.test_special_values_random(rng, cols, dtype)
    for shape, d in (((5, 7), -1), ((3, 1000), 1), ((2, 70000), -1), ((4, 9, 6), 1)):
        for dtype in test_axis_cpu.NP_DTYPES:
            test_axis_cpu.test_backward_matches_float64(rng, shape, d, dtype)
    for dtype in test_consumers.CODES:
        for shape in ((9, 7), (17, 1000), (3, 70000)):
            test_consumers.test_row_stats_match_float64(rng, dtype, shape, 2)
        test_consumers.test_row_stats_backward_matches_float64(rng, dtype, (17, 1000), False)
        test_consumers.test_cross_entropy_matches_float64(rng, dtype, "mean", (33, 1000))


@pytest.mark.parametrize("name", list(KERNEL_SETS))
def test_each_set_on_generated_long_axes(name):
    """test_differential's long axes (sizes on each side of the blocks, pieces, tiles and spans)."""
    if not gpu_util.TUNING:
        pytest.skip(gpu_util.NO_TUNING)
    if not _runs(name):
        pytest.skip(f"this CPU cannot run the {name} kernels")

    @settings(max_examples=200, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(test_differential.long_problems())
    def run(case):
        test_differential.check_forward(case, long_axes=True)

    assert gpu_util.planner.force({"cpu_kernels": KERNEL_SETS[name]}) == 0
    try:
        run()
    finally:
        gpu_util.planner.force({})
