"""Sums over a small batch axis that keep a large space, as gradients of broadcast
parameters are (a position embedding's gradient: [4, 1023, 1024] summed over the batch,
a LayerNorm's input scaled by per-row statistics first): the reduce streams [P, F]
blocks of the kept space and combines the batch entries elementwise (reduce.py's
stream tiling), with no TensorE transposes; numerics as on the CPU backend."""
from __future__ import annotations

import numpy as np
import pytest


def _transposes(jax, f, *args) -> int:
    import jax_trn
    with jax_trn.profile() as prof:
        jax.block_until_ready(f(*args))
    return sum(type(i).__name__ == "NcTranspose" for k in prof.executions[-1].kernels
               for i in k.kernel.instructions)


CASES = {
    "plain": lambda x, s: x.sum(0),
    "scaled by a row statistic": lambda x, s: (x * s[:, :, None] + 1.0).sum(0),
    "max over batch": lambda x, s: (x - s[:, :, None]).max(0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_batch_sum_streams_and_matches_cpu(jax, trn, cpu, name):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 300, 130)).astype(np.float32)
    s = rng.standard_normal((4, 300)).astype(np.float32)
    f = jax.jit(CASES[name])
    args = [jax.device_put(a, trn) for a in (x, s)]
    assert _transposes(jax, f, *args) == 0
    got = np.asarray(f(*args))
    want = np.asarray(f(*[jax.device_put(a, cpu) for a in (x, s)]))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_integer_batch_sum_is_exact(jax, trn, cpu):
    x = np.random.default_rng(1).integers(-2**30, 2**30, (3, 200, 90)).astype(np.int32)
    f = jax.jit(lambda x: (x * 3).sum(0))
    np.testing.assert_array_equal(np.asarray(f(jax.device_put(x, trn))),
                                  np.asarray(f(jax.device_put(x, cpu))))
