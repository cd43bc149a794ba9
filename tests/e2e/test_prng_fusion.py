"""JAX's default PRNG (threefry) as it compiles on trn: the counters (iotas) are generated
inside the fused region instead of being written to HBM, the key words and rotation
amounts are scalars inside it, and the whole hash is one kernel (regions of up to 256
ops), with results bit-identical to the CPU backend; buffer assignment keeps the
temporaries of a large draw to a few arrays."""
from __future__ import annotations

import numpy as np
import pytest

SHAPES = [(2, 1000), (3, 7, 129), (100_000,), (1,), (257, 3)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_random_draws_match_cpu(jax, trn, cpu, shape):
    def f(key):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        return (jax.random.bits(k1, shape), jax.random.uniform(k2, shape),
                jax.random.bernoulli(k3, 0.3, shape), jax.random.normal(k4, shape))
    key = jax.random.key(7)
    got = jax.jit(f)(jax.device_put(key, trn))
    want = jax.jit(f)(jax.device_put(key, cpu))
    for a, b in zip(got[:3], want[:3]):          # integer and bit-built draws: exact
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # normal = sqrt(2) * erf_inv(u): same u, erf_inv within a few float32 ulps
    np.testing.assert_allclose(np.asarray(got[3]), np.asarray(want[3]), rtol=4e-6, atol=4e-6)


def test_iota_and_threefry_fuse_into_one_kernel(jax, trn):
    """No kernel of the draw is a bare iota or a broadcast; one kernel holds the hash."""
    import jax_trn
    f = jax.jit(lambda k: jax.random.bits(k, (2, 50_000)))
    key = jax.device_put(jax.random.key(0), trn)
    with jax_trn.profile() as prof:
        f(key).block_until_ready()
    names = [k.name for k in prof.executions[-1].kernels]
    assert not [n for n in names if n.startswith(("iota", "broadcast_in_dim"))], names
    assert len(names) <= 6, names


def test_a_large_draw_needs_few_temporaries(jax, trn, cpu):
    """bernoulli of 10^7 samples (mode='high', two words per sample): the temporaries
    are a few arrays the size of the draw, as on the CPU backend (each of 57 once)."""
    f = lambda k: jax.random.bernoulli(k, 1e-10, shape=10**7, mode="high").sum()  # noqa
    temps = jax.jit(f).lower(jax.device_put(jax.random.key(0), trn)).compile() \
        .memory_analysis().temp_size_in_bytes
    cpu_temps = jax.jit(f).lower(jax.device_put(jax.random.key(0), cpu)).compile() \
        .memory_analysis().temp_size_in_bytes
    assert temps <= 2 * cpu_temps, (temps, cpu_temps)
