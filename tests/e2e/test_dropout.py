"""Dropout as users write it: the random bits are made where they are used.

JAX's threefry hash (integer HLO ops, its counters an element's linear index: one flat
iota, hlo_passes linear-iota) fuses into the elementwise region that consumes the bits
(the uniform's mantissa bitcast, the compare with keep_prob, the select and scale, and
what follows), so the bits never reach HBM; the masks are bit-identical to the CPU
backend. Under `jax.grad` the forward kernel that computes a mask also writes it out
as bool (one byte per element) and the backward reads it.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_close

SHAPES = [(2, 128, 256), (3, 7, 129), (1000,)]


def _dropout(jax, rate):
    jnp = jax.numpy

    def f(key, x):
        keep = jax.random.bernoulli(key, 1 - rate, x.shape)
        return jnp.where(keep, x / (1 - rate), 0) + x
    return f


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_bernoulli_where_matches_cpu(jax, trn, cpu, shape):
    x = (np.random.default_rng(0).standard_normal(shape) + 4).astype("bfloat16")  # no 0s
    f = jax.jit(_dropout(jax, 0.1))
    key = jax.random.key(3)
    got = np.asarray(f(jax.device_put(key, trn), jax.device_put(x, trn)))
    want = np.asarray(f(jax.device_put(key, cpu), jax.device_put(x, cpu)))
    np.testing.assert_array_equal(got == x, want == x)          # the mask, exactly
    assert_close(got, want, "bfloat16")


def test_the_bits_stay_on_chip(jax, trn):
    """The hash, the threshold, the select and the residual add are one kernel: it reads
    x and writes the result (2 + 2 bytes per element), not 4-byte bits twice more."""
    import jax_trn
    x = jax.device_put(np.ones((4, 256, 512), "bfloat16"), trn)
    f = jax.jit(_dropout(jax, 0.1))
    key = jax.device_put(jax.random.key(0), trn)
    with jax_trn.profile() as prof:
        f(key, x).block_until_ready()
    ex = prof.executions[-1]
    big = [k for k in ex.kernels if k.hbm_bytes >= x.nbytes]
    assert len(big) == 1, [(k.name, k.hbm_bytes) for k in ex.kernels]
    assert big[0].hbm_bytes <= 2.1 * x.nbytes, big[0].hbm_bytes
    decisions = [n for n in big[0].kernel.notes if "bitcast_convert" in n]
    assert decisions and all("forbidden" not in n for n in decisions), decisions


def test_linen_dropout_under_grad_matches_cpu(jax, trn, cpu):
    """flax linen: Dense -> Dropout -> residual -> LayerNorm, twice, in a training step
    (`jax.grad`); the forward's masks exactly, the gradients within bf16 tolerance."""
    import flax.linen as nn
    jnp = jax.numpy

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, train):
            for _ in range(2):
                h = nn.Dense(256, dtype=jnp.bfloat16)(x)
                h = nn.Dropout(0.1, deterministic=not train)(h)
                x = nn.LayerNorm(dtype=jnp.bfloat16)(x + h)
            return x

    m = Block()
    x = np.random.default_rng(1).standard_normal((2, 64, 256)).astype("bfloat16")
    params = m.init(jax.random.key(0), x, False)
    w = np.random.default_rng(2).standard_normal(x.shape).astype("float32")

    def dropped(p, x, key):      # the first Dense's output after its Dropout
        h = nn.Dense(256, dtype=jnp.bfloat16).apply({"params": p["params"]["Dense_0"]}, x)
        return nn.Dropout(0.1).apply({}, h, deterministic=False, rngs={"dropout": key})

    def step(p, x, key):
        def loss(p):
            out = m.apply(p, x, True, rngs={"dropout": key}).astype(jnp.float32)
            return (out * w).sum()
        return jax.value_and_grad(loss)(p)
    key = jax.random.key(5)
    run = {d: jax.tree.map(lambda a: jax.device_put(a, d), (params, x, key))
           for d in (trn, cpu)}
    got, want = (np.asarray(jax.jit(dropped)(*run[d])) for d in (trn, cpu))
    np.testing.assert_array_equal(got == 0, want == 0)
    (gl, gg), (wl, wg) = (jax.jit(step)(*run[d]) for d in (trn, cpu))
    assert_close(gl, wl, "bfloat16")
    # bf16 gradients summed over 128 rows: ~1% in norm, as much as without the dropout
    for a, b in zip(jax.tree.leaves(gg), jax.tree.leaves(wg)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.linalg.norm(a - b) <= 2e-2 * np.linalg.norm(b)
