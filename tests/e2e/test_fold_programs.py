"""Fused elementwise regions in the idioms users write (folding.py's folds fire in each):
an optax.adamw update (per-row TensorScalar operands, ScalarTensorTensor), jax.nn.gelu's
backward, log_softmax and its gradient (exp(x - max) as one Activation, converts), in
f32 and bf16, against the CPU backend."""
from __future__ import annotations

import numpy as np
import pytest

TOL = {"float32": dict(rtol=2e-5, atol=3e-5), "bfloat16": dict(rtol=2e-2, atol=2e-2)}


def _both(jax, trn, cpu, f, *args):
    f = jax.jit(f)
    got = f(*[jax.device_put(a, trn) for a in args])
    want = f(*[jax.device_put(a, cpu) for a in args])
    return jax.tree.map(lambda a: np.asarray(a).astype(np.float32), (got, want))



@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_optax_adamw_update(jax, trn, cpu, dtype):
    import optax
    rng = np.random.default_rng(0)
    p = {"w": rng.standard_normal((300, 256)).astype(dtype)}
    g = {"w": rng.standard_normal((300, 256)).astype(dtype)}
    opt = optax.adamw(1e-3, weight_decay=1e-4)
    state = opt.init(p)

    def step(p, g, state):
        for _ in range(2):              # bias corrections != 1, as after a few steps
            updates, state = opt.update(g, state, p)
            p = optax.apply_updates(p, updates)
        return p, state
    got, want = _both(jax, trn, cpu, step, p, g, state)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, **TOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gelu_backward(jax, trn, cpu, dtype):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((256, 512)) * 2).astype(dtype)
    dy = rng.standard_normal((256, 512)).astype(dtype)

    def f(x, dy):
        return jax.vjp(jax.nn.gelu, x)[1](dy)[0]
    got, want = _both(jax, trn, cpu, f, x, dy)
    # bf16: a few elements 2-3 ulp apart at |x| ~ 3 (the CPU backend keeps the chain in
    # f32; the same before the folds, which keep each bf16 step's rounding here)
    tol = TOL[dtype] if dtype == "float32" else dict(rtol=2e-2, atol=0.1)
    np.testing.assert_allclose(got, want, **tol)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_log_softmax_and_its_gradient(jax, trn, cpu, dtype):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((384, 1000)) * 3).astype(dtype)
    labels = rng.integers(0, 1000, 384)

    def f(x, labels):
        def loss(x):
            lp = jax.nn.log_softmax(x.astype("float32"), axis=-1)
            return -np.float32(1 / 384) * jax.numpy.take_along_axis(
                lp, labels[:, None], axis=-1).sum()
        return jax.nn.log_softmax(x, axis=-1), jax.grad(loss)(x)
    (lp, dx), (lp_cpu, dx_cpu) = _both(jax, trn, cpu, f, x, labels)
    np.testing.assert_allclose(lp, lp_cpu, **TOL[dtype])
    np.testing.assert_allclose(dx, dx_cpu, rtol=TOL[dtype]["rtol"], atol=1e-4)
