"""Softmax cross-entropy as users write it, value and gradient against the CPU backend:
optax.softmax_cross_entropy with one-hot and smoothed one-hot labels,
optax.softmax_cross_entropy_with_integer_labels, flax's
-sum(one_hot * log_softmax(logits)); f32 and bf16 logits. The one-hot forms go through
the onehot-contract pass (labels gathered, not summed over the vocabulary); labels out
of range (-1, V) give one-hot rows of zeros, as on the CPU backend."""
from __future__ import annotations

import numpy as np
import pytest

V = 300


def _losses(jax):
    import jax.numpy as jnp
    import optax
    return {
        "optax one-hot": lambda x, t: optax.softmax_cross_entropy(
            x, jax.nn.one_hot(t, V)).mean(),
        "optax smoothed": lambda x, t: optax.softmax_cross_entropy(
            x, optax.smooth_labels(jax.nn.one_hot(t, V), 0.1)).mean(),
        "optax integer labels": lambda x, t: optax.softmax_cross_entropy_with_integer_labels(
            x, jnp.clip(t, 0, V - 1)).mean(),
        "flax one-hot": lambda x, t: -jnp.sum(
            jax.nn.one_hot(t, V) * jax.nn.log_softmax(x), -1).mean(),
    }


NAMES = ["optax one-hot", "optax smoothed", "optax integer labels", "flax one-hot"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", NAMES)
def test_value_and_grad_match_cpu(jax, trn, cpu, name, dtype):
    import jax.numpy as jnp
    rng = np.random.default_rng(0)
    x = (3 * rng.standard_normal((2, 37, V))).astype(np.float32)
    t = rng.integers(0, V, (2, 37)).astype(np.int32)
    t[0, :2] = (-1, V)                  # out of range: a zero one-hot row
    f = jax.jit(jax.value_and_grad(_losses(jax)[name]))
    xs = jnp.asarray(x, getattr(jnp, dtype))

    def run(dev):
        v, g = f(jax.device_put(xs, dev), jax.device_put(t, dev))
        return np.asarray(v, np.float32), np.asarray(g, np.float32)

    (v, g), (v_ref, g_ref) = run(trn), run(cpu)
    tol = 1e-5 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(v, v_ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(g, g_ref, rtol=tol, atol=tol * np.abs(g_ref).max())
