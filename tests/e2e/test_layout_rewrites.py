"""Programs pads-to-concat and compose-views rewrite (tests/hlo_passes/
test_layout_rewrites.py), against the CPU backend: the gradient of unstacking (q, k, v
= qkv[0], qkv[1], qkv[2]) and head splits of a fused q/k/v projection, written as
users write them, including the transformer block's."""
from __future__ import annotations

import numpy as np
import pytest


def _run(jax, f, args, device):
    return jax.jit(f)(*jax.device_put(args, device))


def _kinds(jax, f, args, device):
    import jax_trn
    with jax_trn.profile() as prof:
        jax.block_until_ready(_run(jax, f, args, device))
    return [k.name.rsplit(".", 1)[0] for k in prof.executions[-1].kernels]


UNSTACK = {
    "all pieces": lambda a: (a[0] * 2.0 + a[1] ** 2 + a[2]).sum(),
    "a gap": lambda a: (a[0] * 2.0 + a[2]).sum(),
    "split": lambda a: sum(p.sum() * (i + 1) for i, p in enumerate(np.split(a, 3, axis=1))),
}


@pytest.mark.parametrize("case", sorted(UNSTACK))
def test_gradient_of_unstacking(jax, trn, cpu, case):
    import jax.numpy as jnp
    f = UNSTACK[case]
    if case == "split":
        f = lambda a: sum(p.sum() * (i + 1) for i, p in enumerate(jnp.split(a, 3, axis=1)))  # noqa: E731
    g = jax.grad(lambda a: f(jnp.sin(a)))
    x = np.random.default_rng(0).standard_normal((3, 6, 16)).astype(np.float32)
    got, want = (np.asarray(_run(jax, g, (x,), d)) for d in (trn, cpu))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert "pad" not in _kinds(jax, g, (x,), trn)


def _heads(jax, x, w, heads=4):
    import jax.numpy as jnp
    s, d = x.shape
    qkv = (x @ w).reshape(s, 3, heads, d // heads).transpose(1, 2, 0, 3)
    q, k, v = qkv[0], qkv[1], qkv[2]
    p = jax.nn.softmax(jnp.einsum("hqd,hkd->hqk", q, k) / 8.0, axis=-1)
    return jnp.einsum("hqk,hkd->qhd", p, v).reshape(s, d)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_head_split_of_a_fused_projection_and_its_gradient(jax, trn, cpu, dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((256, 128)).astype(dtype)
    w = (rng.standard_normal((128, 384)) * 0.1).astype(dtype)
    loss = lambda x, w: _heads(jax, x, w).astype(np.float32).sum()     # noqa: E731
    fwd_bwd = jax.value_and_grad(loss, argnums=(0, 1))
    with jax.default_matmul_precision("highest"):
        got, want = (jax.tree.map(lambda a: np.asarray(a, np.float32),
                                  _run(jax, fwd_bwd, (x, w), d)) for d in (trn, cpu))
        kinds = _kinds(jax, fwd_bwd, (x, w), trn)
    tol = 1e-4 if dtype == "float32" else 5e-2
    for g, c in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, c, rtol=tol, atol=tol * max(1.0, np.abs(c).max()))
    assert "pad" not in kinds
    if dtype == "bfloat16":     # flash kernels read q, k, v in place (attention-views)
        assert "trn.view" not in kinds and "dot_general_fusion" in kinds
    else:                       # (f32: no flash kernel) one strided copy per head split
        assert "trn.view" in kinds


def test_transformer_block_gradient_matches_cpu(jax, trn, cpu):
    import sys
    import os
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    from compiler import transformer_block
    import ml_dtypes
    rng = np.random.default_rng(2)
    d, s = 128, 128
    shapes = {"g1": (d,), "b1": (d,), "g2": (d,), "b2": (d,), "wqkv": (d, 3 * d),
              "wo": (d, d), "w1": (d, 4 * d), "w2": (4 * d, d)}
    p = {k: (rng.standard_normal(v) * 0.05 + (1.0 if k[0] == "g" else 0.0)).astype(
        ml_dtypes.bfloat16) for k, v in shapes.items()}
    x = (rng.standard_normal((s, d)) * 0.5).astype(ml_dtypes.bfloat16)
    grad = jax.grad(lambda p, x: transformer_block(p, x, heads=4).astype(np.float32).sum(),
                    argnums=(0, 1))
    got, want = (jax.tree.map(lambda a: np.asarray(a, np.float32), _run(jax, grad, (p, x), d))
                 for d in (trn, cpu))
    for g, c in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, c, rtol=0.1, atol=0.05 * np.abs(c).max())


def test_composed_transposes_match_cpu(jax, trn, cpu):
    x = np.random.default_rng(3).standard_normal((4, 8, 16)).astype(np.float32)
    f = lambda x: jax.numpy.transpose(jax.numpy.transpose(x, (1, 2, 0)), (1, 0, 2)) * 2.0  # noqa: E731
    got, want = (np.asarray(_run(jax, f, (x,), d)) for d in (trn, cpu))
    np.testing.assert_array_equal(got, want)
