"""Whole programs users write, on trn vs JAX's CPU backend: an MLP training step with
Adam written in plain JAX, a transformer block forward and backward, jax.random sampling.

Float32 matmuls compare tightly, so these run at `jax_default_matmul_precision="highest"`
(trn's DEFAULT is bf16 operands with FP32 accumulation, like the Neuron compiler);
`test_mlp_step_default_precision` checks the bf16 path at bf16 tolerance."""
from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def highest(jax):
    with jax.default_matmul_precision("highest"):
        yield


def _mlp_init(jax, sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(a, b)).astype(np.float32) / np.sqrt(a), np.zeros(b, np.float32))
            for a, b in zip(sizes[:-1], sizes[1:])]


def _mlp_loss(jax, ps, x, y):
    jnp = jax.numpy
    h = x
    for i, (w, b) in enumerate(ps):
        h = h @ w + b
        if i < len(ps) - 1:
            h = jax.nn.relu(h)
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(h) * y, axis=-1))


def _adam_step(jax, state, x, y, lr=1e-2):
    jnp = jax.numpy
    ps, m, v, t = state
    loss, g = jax.value_and_grad(lambda p: _mlp_loss(jax, p, x, y))(ps)
    t = t + 1
    m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
    v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
    ps = jax.tree.map(lambda p, m, v: p - lr * (m / (1 - 0.9 ** t))
                      / (jnp.sqrt(v / (1 - 0.999 ** t)) + 1e-8), ps, m, v)
    return (ps, m, v, t), loss


def _mlp_case(jax):
    rng = np.random.default_rng(1)
    ps = _mlp_init(jax, [64, 130, 128, 10])
    zeros = jax.tree.map(np.zeros_like, ps)
    state = (ps, zeros, zeros, np.float32(0))
    x = rng.normal(size=(32, 64)).astype(np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 32)]
    return state, x, y


def _train(jax, device, steps):
    state, x, y = _mlp_case(jax)
    step = jax.jit(lambda s, x, y: _adam_step(jax, s, x, y))
    state, x, y = jax.device_put((state, x, y), device)
    losses = []
    for _ in range(steps):
        state, loss = step(state, x, y)
        losses.append(float(loss))
    return state, losses


def test_mlp_adam_training_steps_match_cpu(jax, trn, cpu, highest):
    st_t, l_t = _train(jax, trn, 4)
    st_c, l_c = _train(jax, cpu, 4)
    np.testing.assert_allclose(l_t, l_c, rtol=1e-5)
    assert l_t[-1] < l_t[0]                     # it trains
    for a, b in zip(jax.tree.leaves(st_t), jax.tree.leaves(st_c)):
        assert a.devices() == {trn}
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_mlp_step_default_precision_is_bf16_close(jax, trn, cpu):
    _, l_t = _train(jax, trn, 2)
    with jax.default_matmul_precision("highest"):
        _, l_c = _train(jax, cpu, 2)
    np.testing.assert_allclose(l_t, l_c, rtol=2e-2)


D, S, H = 64, 32, 4


def _layernorm(jax, x, g, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(v + 1e-5) * g + b


def _block(jax, p, x):
    jnp = jax.numpy
    h = _layernorm(jax, x, p["g1"], p["b1"])
    q, k, v = jnp.split(h @ p["wqkv"], 3, axis=-1)
    heads = lambda t: t.reshape(S, H, D // H).transpose(1, 0, 2)  # noqa: E731
    q, k, v = heads(q), heads(k), heads(v)
    s = jnp.einsum("hqd,hkd->hqk", q, k) / np.sqrt(D // H)
    s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -jnp.inf)
    o = jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(s, axis=-1), v)
    x = x + o.transpose(1, 0, 2).reshape(S, D) @ p["wo"]
    h = _layernorm(jax, x, p["g2"], p["b2"])
    return x + jax.nn.gelu(h @ p["w1"]) @ p["w2"]


def test_transformer_block_forward_and_backward(jax, trn, cpu, highest):
    rng = np.random.default_rng(0)
    w = lambda *s: (rng.normal(size=s) / np.sqrt(s[0])).astype(np.float32)  # noqa: E731
    p = {"g1": np.ones(D, np.float32), "b1": np.zeros(D, np.float32),
         "g2": np.ones(D, np.float32), "b2": np.zeros(D, np.float32),
         "wqkv": w(D, 3 * D), "wo": w(D, D), "w1": w(D, 4 * D), "w2": w(4 * D, D)}
    x = rng.normal(size=(S, D)).astype(np.float32)
    f = jax.jit(jax.value_and_grad(lambda p, x: jax.numpy.sum(_block(jax, p, x) ** 2)))
    (l_t, g_t), (l_c, g_c) = f(*jax.device_put((p, x), trn)), f(p, x)
    np.testing.assert_allclose(float(l_t), float(l_c), rtol=1e-5)
    for k in g_c:
        scale = float(np.abs(g_c[k]).max())
        np.testing.assert_allclose(np.asarray(g_t[k]), g_c[k], rtol=1e-4, atol=1e-5 * scale,
                                   err_msg=k)


def test_random_sampling_matches_cpu(jax, trn, cpu):
    def sample(key):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        return (jax.random.uniform(k1, (300,)), jax.random.bernoulli(k2, 0.3, (257,)),
                jax.random.randint(k3, (129,), -5, 100), jax.random.normal(k4, (5, 7)))
    f = jax.jit(sample)
    key = jax.random.PRNGKey(42)
    out_t, out_c = f(jax.device_put(key, trn)), f(jax.device_put(key, cpu))
    for a, b in zip(out_t, out_c):
        assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(np.asarray(out_t[0]), np.asarray(out_c[0]))
    np.testing.assert_array_equal(np.asarray(out_t[1]), np.asarray(out_c[1]))
    np.testing.assert_array_equal(np.asarray(out_t[2]), np.asarray(out_c[2]))
    np.testing.assert_allclose(np.asarray(out_t[3]), np.asarray(out_c[3]), rtol=1e-6, atol=1e-6)
