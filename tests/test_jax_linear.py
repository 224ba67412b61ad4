"""softlight.jax.linear_cross_entropy under jax.jit and jax.grad: every option against a float64
reference in JAX, in token windows of every size (the last one moved back over an earlier one's rows),
and from bfloat16 inputs no worse than the plain computation (bf16 matmul, float32 loss). Where
softlight was built without JAX's handlers, skipped, saying how to build it."""
import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed")
import jax.numpy as jnp  # noqa: E402

try:
    import softlight.jax as slj
except ImportError as e:  # built without JAX's headers
    pytest.skip(str(e), allow_module_level=True)

from softlight import _jax_linear  # noqa: E402


def reference(h, w, t, b=None, *, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None, temperature=1.0,
              reduction="mean", shift=False):
    if shift:
        h, t = h[..., :-1, :], t[..., 1:]
    z = h @ w.T
    if b is not None:
        z = z + b
    z = z.astype(jnp.float64 if z.dtype == jnp.float64 else jnp.float32)
    if softcap is not None:
        z = softcap * jnp.tanh(z / softcap)
    z = z / temperature
    z2, t2 = z.reshape(-1, z.shape[-1]), t.reshape(-1)
    keep = t2 != ignore_index
    lse = jax.nn.logsumexp(z2, -1)
    picked = jnp.take_along_axis(z2, jnp.where(keep, t2, 0)[:, None], -1)[:, 0]
    rows = (1 - label_smoothing) * (lse - picked) + label_smoothing * (lse - z2.mean(-1)) + z_loss * lse ** 2
    rows = jnp.where(keep, rows, 0)
    if reduction == "none":
        return rows.reshape(t.shape)
    return rows.sum() / keep.sum() if reduction == "mean" else rows.sum()


def _inputs(dtype, seed=0, lead=(3, 13), vocab=301, d=16):
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    h = jax.random.normal(k[0], lead + (d,), jnp.float32).astype(dtype)
    w = (jax.random.normal(k[1], (vocab, d), jnp.float32) / 4).astype(dtype)
    b = jax.random.normal(k[2], (vocab,), jnp.float32).astype(dtype)
    t = jax.random.randint(k[3], lead, 0, vocab).reshape(-1).at[2].set(-100).reshape(lead)
    return h, w, b, t


OPTIONS = [dict(), dict(reduction="sum"), dict(reduction="none"),
           dict(label_smoothing=0.1, z_loss=1e-3, temperature=0.7), dict(softcap=2.0, shift=True),
           dict(shift=True, reduction="none")]


@pytest.mark.parametrize("memory", ["speed", "low_memory"])
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_float64_equals_the_reference(opts, memory, monkeypatch):
    jax.config.update("jax_enable_x64", True)
    try:
        monkeypatch.setattr(_jax_linear, "_LOW_MEMORY_CHUNK_BYTES", 301 * 8 * 5)  # windows of 5 of the 39 tokens
        h, w, b, t = _inputs(jnp.float64)
        got = jax.jit(jax.value_and_grad(
            lambda h, w, b: (slj.linear_cross_entropy(h, w, t, bias=b, memory=memory, **opts) * 1.3).sum(),
            argnums=(0, 1, 2)))(h, w, b)
        want = jax.value_and_grad(lambda h, w, b: (reference(h, w, t, b, **opts) * 1.3).sum(), argnums=(0, 1, 2))(
            h, w, b)
        for a, r in zip((got[0],) + got[1], (want[0],) + want[1]):
            np.testing.assert_allclose(np.asarray(a), np.asarray(r), rtol=1e-10, atol=1e-12)
    finally:
        jax.config.update("jax_enable_x64", False)


@pytest.mark.parametrize("memory", ["speed", "low_memory"])
def test_bfloat16_no_worse_than_the_plain_computation(memory, monkeypatch):
    """Max |error| against float64 from the same bf16 inputs, summed over eight draws, of the loss and
    the three gradients: at most 1.1 x the plain computation's (bf16 matmul, float32 loss)."""
    monkeypatch.setattr(_jax_linear, "_LOW_MEMORY_CHUNK_BYTES", 1000 * 2 * 64)
    ours, plain = np.zeros(4), np.zeros(4)
    jax.config.update("jax_enable_x64", True)
    try:
        for seed in range(8):
            h, w, b, t = _inputs(jnp.bfloat16, seed, lead=(256,), vocab=1000, d=64)
            f = jax.value_and_grad(lambda h, w, b: slj.linear_cross_entropy(h, w, t, bias=b, memory=memory),
                                   argnums=(0, 1, 2))
            g = jax.value_and_grad(lambda h, w, b: reference(h, w, t, b), argnums=(0, 1, 2))
            exact = g(*(jnp.asarray(x, jnp.float64) for x in (h, w, b)))
            for acc, res in ((ours, jax.jit(f)(h, w, b)), (plain, g(h, w, b))):
                for i, (a, x) in enumerate(zip((res[0],) + res[1], (exact[0],) + exact[1])):
                    acc[i] += float(np.abs(np.asarray(a, np.float64) - np.asarray(x, np.float64)).max())
    finally:
        jax.config.update("jax_enable_x64", False)
    assert (ours <= 1.1 * plain).all(), (ours, plain)


def test_bad_arguments_are_refused_by_name():
    from softlight import InvalidArgumentError
    h, w, b, t = _inputs(jnp.float32)
    for kw in (dict(memory="fast"), dict(reduction="avg"), dict(softcap=-1.0), dict(label_smoothing=2.0)):
        with pytest.raises(InvalidArgumentError):
            slj.linear_cross_entropy(h, w, t, **kw)
    with pytest.raises(InvalidArgumentError):
        slj.linear_cross_entropy(h, w[:, :-1], t)
