"""softlight.jax: the XLA FFI custom calls under jax.jit, jax.grad and jax.vmap, against
jax.nn.log_softmax and float64. Where softlight was built without JAX (the default pip install),
skipped, saying how to build it."""
import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed")
import jax.numpy as jnp  # noqa: E402

try:
    import softlight.jax as slj
except ImportError as e:  # built without JAX's headers
    pytest.skip(str(e), allow_module_level=True)

from reference import assert_matches, log_softmax_ref_axis  # noqa: E402


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape,axis", [((6, 50), -1), ((6, 50), 0), ((3, 7, 11), 1), ((5,), 0), ((2, 3, 4, 5), -2)])
def test_jit_against_float64(shape, axis, dtype):
    x = (jax.random.normal(jax.random.PRNGKey(len(shape) * 7 + axis), shape) * 3).astype(dtype)
    y = jax.jit(lambda t: slj.log_softmax(t, axis=axis))(x)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert_matches(np.asarray(y, np.float64), log_softmax_ref_axis(np.asarray(x, np.float64), axis), dtype)


def test_temperature_and_logsumexp():
    x = jax.random.normal(jax.random.PRNGKey(3), (4, 9)) * 3
    y = jax.jit(lambda t: slj.log_softmax(t, temperature=2.5))(x)
    np.testing.assert_allclose(y, jax.nn.log_softmax(x / 2.5), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(slj.logsumexp(x, axis=0, temperature=2.5),
                               jax.scipy.special.logsumexp(x / 2.5, axis=0), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("axis,temperature", [(-1, 1.0), (0, 1.0), (1, 0.7)])
def test_grad_equals_jaxs(axis, temperature):
    x = jax.random.normal(jax.random.PRNGKey(5), (5, 8)) * 2
    w = jax.random.normal(jax.random.PRNGKey(6), (5, 8))
    mine = jax.jit(jax.grad(lambda t: (slj.log_softmax(t, axis, temperature=temperature) * w).sum()))(x)
    ref = jax.grad(lambda t: (jax.nn.log_softmax(t / temperature, axis) * w).sum())(x)
    np.testing.assert_allclose(mine, ref, atol=1e-5, rtol=1e-5)


def test_vmap_adds_axes_in_front():
    x = jax.random.normal(jax.random.PRNGKey(7), (3, 4, 6))
    for axis in (0, -1):
        y = jax.jit(jax.vmap(lambda t: slj.log_softmax(t, axis=axis)))(x)
        want_axis = 1 if axis == 0 else -1
        np.testing.assert_allclose(y, jax.nn.log_softmax(x, axis=want_axis), atol=1e-6)
    g = jax.vmap(jax.grad(lambda t: slj.log_softmax(t)[0]))(x[0])
    np.testing.assert_allclose(g, jax.vmap(jax.grad(lambda t: jax.nn.log_softmax(t)[0]))(x[0]), atol=1e-6)


def test_a_jitted_training_step():
    """examples/jax/train_step.py: a jitted training step with softlight's log-softmax in its loss
    follows the same step with jax.nn.log_softmax, and learns."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "examples" / "jax" / "train_step.py"
    spec = importlib.util.spec_from_file_location("train_step", path)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    mine, ref = ex.curves(20)
    for a, b in zip(mine, ref):
        assert abs(a - b) <= 1e-4 * abs(b), (mine, ref)
    assert mine[-1] < mine[0]


def test_errors():
    with pytest.raises(IndexError):
        slj.log_softmax(jnp.ones((2, 3)), axis=2)
    with pytest.raises(TypeError):
        slj.log_softmax(jnp.ones((2, 3), jnp.int32))
