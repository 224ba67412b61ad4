import os

import numpy as np
import pytest

# JAX takes most of the GPU's memory when it first runs unless told not to; the GPU tests share
# the device between torch, CuPy and JAX.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


@pytest.fixture
def force():
    """force(name=value, ...): values the library's planner takes on this thread until the test
    ends (its tuning interface, tuning builds only: elsewhere the test is skipped)."""
    import gpu_util
    if not gpu_util.TUNING:
        pytest.skip(gpu_util.NO_TUNING)

    def set_values(**values):
        gpu_util.FORCED.update(values)
        assert gpu_util.planner.force(gpu_util.FORCED) == 0, gpu_util.FORCED

    yield set_values
    gpu_util.FORCED.clear()
    gpu_util.planner.force({})


@pytest.fixture
def rng():
    """A generator with a fresh seed, printed so that a failure can be replayed."""
    seed = np.random.SeedSequence().entropy % (2**32)
    print(f"seed={seed}")
    return np.random.default_rng(seed)
