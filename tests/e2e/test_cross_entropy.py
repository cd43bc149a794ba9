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


def _instrs(jax, f, *args):
    import jax_trn
    with jax_trn.profile() as prof:
        out = jax.block_until_ready(f(*args))
    return out, [i for k in prof.executions[-1].kernels for i in k.kernel.instructions]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sum_exp_minus_row_max_is_one_activation(jax, trn, cpu, dtype):
    """sum(exp(x - m)) along rows: ScalarE Activations with bias -m and reduce_res,
    no VectorE TensorReduce over the elements (lower/folding_reduce.py)."""
    import jax.numpy as jnp
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((300, 2100)), getattr(jnp, dtype))
    f = jax.jit(lambda x: jnp.sum(jnp.exp(x - x.max(-1, keepdims=True)).astype(
        jnp.float32), -1))
    got, instrs = _instrs(jax, f, jax.device_put(x, trn))
    folded = [i for i in instrs if getattr(i, "reduce_res", None) is not None]
    assert folded and all(i.func == "exp" and i.bias is not None for i in folded)
    assert not [i for i in instrs if type(i).__name__ == "TensorReduce"
                and i.data.free_size > 1 and i.data.num_partitions > 1
                and i.op == "add"]
    want = np.asarray(f(jax.device_put(x, cpu)))
    tol = 1e-6 if dtype == "float32" else 1e-2
    np.testing.assert_allclose(np.asarray(got), want, rtol=tol)


def test_other_sums_of_exp_are_not_folded(jax, trn, cpu):
    import jax.numpy as jnp
    x = np.random.default_rng(2).standard_normal((130, 700)).astype(np.float32)
    f = jax.jit(lambda x: jnp.sum(jnp.exp(x) - x.max(-1, keepdims=True), -1))
    got, instrs = _instrs(jax, f, jax.device_put(x, trn))
    assert not [i for i in instrs if getattr(i, "reduce_res", None) is not None]
    np.testing.assert_allclose(np.asarray(got), np.asarray(f(jax.device_put(x, cpu))),
                               rtol=1e-5)


def test_sum_of_widened_bf16_reads_it_directly(jax, trn, cpu):
    """sum(x.astype(f32)) of bf16 rows: the TensorReduce widens, no TensorCopy."""
    import jax.numpy as jnp
    x = jnp.asarray(np.random.default_rng(3).standard_normal((260, 3000)), jnp.bfloat16)
    f = jax.jit(lambda x: x.astype(jnp.float32).sum(-1))
    got, instrs = _instrs(jax, f, jax.device_put(x, trn))
    assert not [i for i in instrs if type(i).__name__ == "TensorCopy"]
    np.testing.assert_allclose(np.asarray(got), np.asarray(f(jax.device_put(x, cpu))),
                               rtol=1e-5, atol=1e-4)


def test_folds_are_noted(jax, trn):
    """Each fold says so in its kernel's notes (as fusion decisions do)."""
    import jax.numpy as jnp
    import jax_trn
    x = jnp.asarray(np.random.default_rng(4).standard_normal((130, 700)), jnp.bfloat16)
    f = jax.jit(lambda x: (jnp.exp(x - x.max(-1, keepdims=True)).astype(jnp.float32).sum(-1),
                           x.astype(jnp.float32).sum(-1)))
    with jax_trn.profile() as prof:
        jax.block_until_ready(f(jax.device_put(x, trn)))
    notes = [n for k in prof.executions[-1].kernels for n in k.kernel.notes]
    assert any("Activation(exp, bias=-m, reduce_res)" in n for n in notes)
    assert any("reads x directly" in n for n in notes)
