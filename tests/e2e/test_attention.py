"""Causal attention written in plain JAX, on trn against the CPU backend: the
attention-fusion pass (hlo_passes/passes/attention_fusion.py) makes it one "attention"
fusion, lowered as a flash-attention kernel (jax_trn/lower/attention.py)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_close


def causal_attention(q, k, v):
    import jax
    import jax.numpy as jnp
    s = q.shape[-2]
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) * (q.shape[-1] ** -0.5)
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -jnp.inf)
    p = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(q.dtype)
    return jnp.einsum("bhqk,bhkd->bhqd", p, v)


def plain_attention(q, k, v):
    import jax
    import jax.numpy as jnp
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / 8.0
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)


def _args(shape, seed, dtype="bfloat16"):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32).astype(np.dtype(dtype))
            for _ in range(3)]


def _both(jax, trn, cpu, f, args):
    g = jax.jit(f)
    out = g(*(jax.device_put(a, trn) for a in args))
    ref = g(*(jax.device_put(a, cpu) for a in args))
    return np.asarray(out), np.asarray(ref)


def _kernels(jax, trn, f, args):
    import jax_trn
    g = jax.jit(f)
    with jax_trn.profile() as prof:
        g(*(jax.device_put(a, trn) for a in args)).block_until_ready()
    return prof.executions[-1].kernels


@pytest.mark.parametrize("shape", [(1, 2, 256, 128), (1, 1, 384, 64), (2, 1, 200, 32)])
def test_causal_attention_matches_cpu(jax, trn, cpu, shape):
    import ml_dtypes  # noqa: F401
    args = _args(shape, 0)
    out, ref = _both(jax, trn, cpu, causal_attention, args)
    assert out.dtype == ref.dtype
    assert_close(out, ref, "bfloat16")


def test_causal_attention_is_one_kernel(jax, trn):
    import ml_dtypes  # noqa: F401
    args = _args((1, 2, 256, 128), 1)
    kernels = _kernels(jax, trn, causal_attention, args)
    assert len(kernels) == 1, [k.name for k in kernels]
    assert "fusion" in kernels[0].name


def test_unmasked_attention_multi_chunk_matches_cpu(jax, trn, cpu):
    """Sk = 1280 > one 1024-key chunk: the online softmax rescales across chunks."""
    import ml_dtypes  # noqa: F401
    args = _args((1, 1, 256, 64), 2)
    args[1] = np.random.default_rng(3).standard_normal((1, 1, 1280, 64)).astype(args[0].dtype)
    args[2] = np.random.default_rng(4).standard_normal((1, 1, 1280, 64)).astype(args[0].dtype)
    out, ref = _both(jax, trn, cpu, plain_attention, args)
    assert_close(out, ref, "bfloat16")


def test_float32_attention_falls_back_and_matches_cpu(jax, trn, cpu):
    """f32 q/k/v: no 16-bit dma_transpose path; the region's ops run one by one."""
    args = _args((1, 1, 128, 32), 5, "float32")
    with jax.default_matmul_precision("highest"):
        out, ref = _both(jax, trn, cpu, causal_attention, args)
    assert_close(out, ref, "float32", rtol=1e-4, atol=1e-5)


def test_two_causal_layers_match_cpu(jax, trn, cpu):
    """Two attention fusions sharing the mask and scale broadcasts."""
    import ml_dtypes  # noqa: F401
    args = _args((1, 2, 128, 64), 6)
    f = lambda q, k, v: causal_attention(causal_attention(q, k, v), k, v)  # noqa: E731
    out, ref = _both(jax, trn, cpu, f, args)
    assert_close(out, ref, "bfloat16")
    assert len(_kernels(jax, trn, f, args)) == 2
