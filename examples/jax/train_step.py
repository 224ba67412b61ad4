"""A jitted JAX training step whose loss takes softlight's log-softmax, beside the same step with
jax.nn.log_softmax: the two loss curves agree.

    python examples/jax/train_step.py [--steps 100]

softlight.jax needs softlight built where JAX is importable (README, "Use from Python").
"""
import argparse

import jax
import jax.numpy as jnp

import softlight.jax as slj


def make_problem(seed=0, features=16, classes=32, batch=64):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    params = {"w": jax.random.normal(k1, (features, classes)) * 0.1, "b": jnp.zeros(classes)}
    x = jax.random.normal(k2, (batch, features))
    labels = jax.random.randint(k3, (batch,), 0, classes)
    return params, x, labels


def loss(params, x, labels, log_softmax):
    logp = log_softmax(x @ params["w"] + params["b"], axis=-1)
    return -jnp.take_along_axis(logp, labels[:, None], axis=1).mean()


def make_step(log_softmax, lr=0.5):
    @jax.jit
    def step(params, x, labels):
        value, grads = jax.value_and_grad(loss)(params, x, labels, log_softmax)
        return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), value
    return step


def curves(steps, seed=0):
    """The losses of `steps` steps with softlight's log-softmax and with jax.nn's, from one start."""
    params, x, labels = make_problem(seed)
    out = []
    for log_softmax in (slj.log_softmax, jax.nn.log_softmax):
        step, p, losses = make_step(log_softmax), params, []
        for _ in range(steps):
            p, value = step(p, x, labels)
            losses.append(float(value))
        out.append(losses)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=100)
    mine, ref = curves(ap.parse_args().steps)
    for i in range(0, len(mine), max(1, len(mine) // 10)):
        print(f"step {i:4d}  softlight {mine[i]:.6f}  jax.nn {ref[i]:.6f}")
    print(f"largest relative difference: {max(abs(a - b) / abs(b) for a, b in zip(mine, ref)):.2e}")
