"""More whole programs on trn vs JAX's CPU backend: a small CNN training step (conv,
pooling, their gradients), a scan RNN forward and backward, causal attention, and
sorting / top-k as a user would write them."""
from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def highest(jax):
    with jax.default_matmul_precision("highest"):
        yield


def _check(jax, trn, f, *args, rtol=1e-5, atol=1e-5):
    out_t = jax.jit(f)(*jax.device_put(args, trn))
    out_c = jax.jit(f)(*args)
    for t, c in zip(jax.tree.leaves(out_t), jax.tree.leaves(out_c)):
        assert t.shape == c.shape and t.dtype == c.dtype
        assert t.devices() == {trn}
        scale = max(1.0, float(np.abs(np.asarray(c, np.float64)).max()))
        np.testing.assert_allclose(np.asarray(t, np.float64), np.asarray(c, np.float64),
                                   rtol=rtol, atol=atol * scale)
    return out_t


def test_cnn_training_step(jax, trn, highest):
    jnp, lax = jax.numpy, jax.lax
    rng = np.random.default_rng(0)
    params = {"c1": rng.normal(size=(3, 3, 3, 8)).astype(np.float32) / 5,
              "c2": rng.normal(size=(3, 3, 8, 16)).astype(np.float32) / 8,
              "d": rng.normal(size=(16, 10)).astype(np.float32) / 4}
    x = rng.normal(size=(4, 16, 16, 3)).astype(np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 4)]
    dn = ("NHWC", "HWIO", "NHWC")

    def loss(p, x, y):
        h = jax.nn.relu(lax.conv_general_dilated(x, p["c1"], (1, 1), "SAME", dimension_numbers=dn))
        h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        h = jax.nn.relu(lax.conv_general_dilated(h, p["c2"], (2, 2), "SAME", dimension_numbers=dn))
        logits = h.mean(axis=(1, 2)) @ p["d"]
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * y, -1))

    def step(p, x, y):
        l, g = jax.value_and_grad(loss)(p, x, y)
        return l, jax.tree.map(lambda p, g: p - 0.1 * g, p, g)

    _check(jax, trn, step, params, x, y, rtol=1e-4, atol=1e-5)


def test_scan_rnn_forward_and_backward(jax, trn, highest):
    jnp = jax.numpy
    rng = np.random.default_rng(1)
    T, B, D, H = 8, 4, 16, 32
    xs = rng.normal(size=(T, B, D)).astype(np.float32)
    w = rng.normal(size=(D, H)).astype(np.float32) / 4
    u = rng.normal(size=(H, H)).astype(np.float32) / 6

    def rnn(w, u, xs):
        def cell(h, x):
            h = jnp.tanh(x @ w + h @ u)
            return h, h.sum()
        h, sums = jax.lax.scan(cell, jnp.zeros((B, H), jnp.float32), xs)
        return jnp.sum(h ** 2) + sums.sum()

    _check(jax, trn, jax.value_and_grad(rnn, argnums=(0, 1)), w, u, xs, rtol=1e-4)


def test_causal_attention_bf16(jax, trn):
    jnp = jax.numpy
    rng = np.random.default_rng(2)
    S, H, D = 128, 2, 32
    q, k, v = (rng.normal(size=(H, S, D)).astype(jnp.bfloat16) for _ in range(3))

    def attention(q, k, v):
        s = jnp.einsum("hqd,hkd->hqk", q, k, preferred_element_type=jnp.float32) / np.sqrt(D)
        s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -jnp.inf)
        p = jax.nn.softmax(s, axis=-1).astype(jnp.bfloat16)
        return jnp.einsum("hqk,hkd->hqd", p, v, preferred_element_type=jnp.float32)

    # bf16 operands, FP32 accumulation on both sides; p rounds to bf16 in both
    _check(jax, trn, attention, q, k, v, rtol=2e-2, atol=2e-2)


def test_sorting_and_top_k(jax, trn):
    jnp = jax.numpy
    rng = np.random.default_rng(3)
    scores = rng.normal(size=(32, 200)).astype(np.float32)
    labels = rng.integers(0, 5, 200).astype(np.int32)

    def ranking(scores, labels):
        vals, idx = jax.lax.top_k(scores, 5)
        order = jnp.argsort(labels, stable=True)
        by_label = jnp.sort(scores, axis=-1, descending=True)
        return vals, idx, order, by_label[:, :3], jnp.median(scores, axis=-1)

    out = _check(jax, trn, ranking, scores, labels, rtol=0, atol=0)
    assert np.array_equal(np.asarray(out[1]), np.argsort(-scores, axis=-1, kind="stable")[:, :5])
