"""x * x runs as ScalarE's square inside fused regions (regions.py `_square`): GELU's
x^2 and x^3 leave VectorE. The same FP32 product rounded once: bit-equal to the CPU
backend's multiply in f32 and bf16."""
from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_square_is_scalar_and_exact(jax, trn, cpu, dtype):
    import jax.numpy as jnp
    import jax_trn
    x = jnp.asarray(np.random.default_rng(0).standard_normal((256, 300)) * 30, dtype)
    f = jax.jit(lambda x: (x * x * x, x * x))
    with jax_trn.profile() as prof:
        got = f(jax.device_put(x, trn))
    instrs = [i for k in prof.executions[-1].kernels for i in k.kernel.instructions]
    assert any(type(i).__name__ == "Activation" and i.func == "square" for i in instrs)
    want = f(jax.device_put(x, cpu))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_gelu_grad_matches_cpu(jax, trn, cpu):
    import jax.numpy as jnp
    x = jnp.asarray(np.random.default_rng(1).standard_normal((256, 512)) * 3, jnp.bfloat16)
    f = jax.jit(jax.grad(lambda x: jax.nn.gelu(x).astype(jnp.float32).sum()))
    got = np.asarray(f(jax.device_put(x, trn)), np.float32)
    want = np.asarray(f(jax.device_put(x, cpu)), np.float32)
    # ~12 bf16 ops per element (the CPU backend rounds each; folds keep some in FP32):
    # a few bf16 ulps of the gradient's scale near gelu'(x) = 0
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=4e-2)
