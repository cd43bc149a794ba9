"""Dense layers as flax writes them (f32 parameters, `dtype=bfloat16` computation):
the per-call weight casts are folded into the matmul's operand loads (convert-into-dot),
the bias casts sink below their broadcasts into the matmul epilogue
(broadcast-before-convert), and a [heads, head_dim] bias broadcast over [B, S, heads,
head_dim] is read as rows by the epilogue (fusion policy) -- one kernel per layer,
numerics as on the CPU backend. (An f32 activation cast to bf16 keeps its convert: the
lhs is loaded transposed, and only a bf16 copy goes by dma_transpose.)"""
from __future__ import annotations

import numpy as np
import pytest


def _kernels(jax, f, *args):
    import jax_trn
    with jax_trn.profile() as prof:
        jax.block_until_ready(f(*args))
    return [k.name for k in prof.executions[-1].kernels]


def jnp_bf16(jax):
    return jax.numpy.bfloat16


def _dense_general(jax, x, w, b):
    """flax.linen.DenseGeneral(features=(8, 16), dtype=bf16): casts, dot, bias add."""
    import jax.numpy as jnp
    y = jax.lax.dot_general(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16),
                            (((x.ndim - 1,), (0,)), ((), ())))
    return y + jnp.reshape(b.astype(jnp.bfloat16), (1,) * (y.ndim - 2) + b.shape)


@pytest.mark.parametrize("precision", ["default", "highest"])
def test_dense_with_f32_params_and_bf16_compute_is_one_kernel(jax, trn, cpu, precision):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 64, 96)).astype(jnp_bf16(jax))   # activations: bf16
    w = rng.standard_normal((96, 8, 16)).astype(np.float32)
    b = rng.standard_normal((8, 16)).astype(np.float32)
    with jax.default_matmul_precision(precision):
        f = jax.jit(lambda x, w, b: _dense_general(jax, x, w, b))
        args = [jax.device_put(a, trn) for a in (x, w, b)]
        names = _kernels(jax, f, *args)
        got = np.asarray(f(*args)).astype(np.float32)
        want = np.asarray(f(*[jax.device_put(a, cpu) for a in (x, w, b)])).astype(np.float32)
    assert len(names) == 1 and names[0].startswith("dot_general"), names
    # bf16 operands (the program's own casts) at every precision, FP32 accumulation;
    # the result rounds to bf16 once on both backends
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=5e-2)


def test_a_cast_weight_with_another_user_keeps_its_convert(jax, trn, cpu):
    import jax.numpy as jnp
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    w = rng.standard_normal((96, 32)).astype(np.float32)

    def f(x, w):
        w16 = w.astype(jnp.bfloat16)
        return x.astype(jnp.bfloat16) @ w16, w16 * 2
    args = [jax.device_put(a, trn) for a in (x, w)]
    got = jax.jit(f)(*args)
    want = jax.jit(f)(*[jax.device_put(a, cpu) for a in (x, w)])
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
    np.testing.assert_allclose(np.asarray(got[0]).astype(np.float32),
                               np.asarray(want[0]).astype(np.float32), rtol=1e-2, atol=5e-2)


def test_flax_dense_general_layer_matches_cpu(jax, trn, cpu):
    nn = pytest.importorskip("flax.linen")
    import jax.numpy as jnp
    layer = nn.DenseGeneral(features=(8, 16), dtype=jnp.bfloat16)
    x = np.random.default_rng(2).standard_normal((2, 64, 96)).astype(jnp.bfloat16)
    with jax.default_device(cpu):
        params = layer.init(jax.random.key(0), x)
    f = jax.jit(layer.apply)
    names = _kernels(jax, f, jax.device_put(params, trn), jax.device_put(x, trn))
    got = np.asarray(f(jax.device_put(params, trn), jax.device_put(x, trn)))
    want = np.asarray(f(jax.device_put(params, cpu), jax.device_put(x, cpu)))
    assert len(names) == 1, names
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                               rtol=1e-2, atol=5e-2)


def test_vocabulary_gradient_with_deep_k_matches_cpu(jax, trn, cpu):
    """The input gradient of tied-embedding logits (`x @ E.T`, flax `Embed.attend`),
    taken with jax.vjp for a random cotangent: dlogits [T, V] @ E [V, D] contracts over a
    32000-word vocabulary, too deep for whole-K strips: K blocks summed in FP32 in SBUF
    (matmul_plan `sbuf_acc`), each operand read once. Same values as CPU to the bf16
    rounding of the result (both accumulate in FP32)."""
    import jax.numpy as jnp
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1024, 512)).astype(jnp.bfloat16)
    emb = (rng.standard_normal((32000, 512)) * 0.05).astype(jnp.bfloat16)
    ct = rng.standard_normal((1024, 32000)).astype(jnp.bfloat16)

    def dx(x, emb, ct):
        return jax.vjp(lambda x: x @ emb.T, x)[1](ct)[0]
    f = jax.jit(dx)
    got = np.asarray(f(*(jax.device_put(a, trn) for a in (x, emb, ct)))).astype(np.float32)
    want = np.asarray(f(*(jax.device_put(a, cpu) for a in (x, emb, ct)))).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
