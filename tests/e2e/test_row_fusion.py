"""Row fusions against the CPU backend: LayerNorm (as written by hand and flax's), RMSNorm
and softmax, forward and backward, in f32 and bf16; a LayerNorm's forward is one kernel
that reads its input once (hlo_passes/fusion_rows.py, jax_trn/lower/rows.py)."""
from __future__ import annotations

import numpy as np
import pytest


def _ln(jax, h, g, b):
    import jax.numpy as jnp
    h32 = h.astype(jnp.float32)
    mu = h32.mean(-1, keepdims=True)
    var = ((h32 - mu) ** 2).mean(-1, keepdims=True)
    return ((h32 - mu) * jax.lax.rsqrt(var + 1e-5) * g + b).astype(h.dtype)


def _rms(jax, h, g, b):
    import jax.numpy as jnp
    h32 = h.astype(jnp.float32)
    return (h32 * jax.lax.rsqrt((h32 * h32).mean(-1, keepdims=True) + 1e-6) * g).astype(h.dtype)


def _softmax(jax, h, g, b):
    return jax.nn.softmax(h * g, axis=-1) + b


def _flax_ln(jax, h, g, b):
    import flax.linen as nn
    ln = nn.LayerNorm(dtype=h.dtype)
    return ln.apply({"params": {"scale": g, "bias": b}}, h)


FORMS = {"layernorm": _ln, "rmsnorm": _rms, "softmax": _softmax, "flax LayerNorm": _flax_ln}


def _args(dtype, shape=(3, 40, 96)):
    rng = np.random.default_rng(1)
    x = (2 * rng.standard_normal(shape) + 0.5).astype(np.float32).astype(dtype)
    g = (1 + 0.2 * rng.standard_normal(shape[-1])).astype(np.float32).astype(dtype)
    b = (0.1 * rng.standard_normal(shape[-1])).astype(np.float32).astype(dtype)
    w = rng.standard_normal(shape).astype(np.float32)
    return x, g, b, w


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("form", list(FORMS))
def test_value_and_grads_match_cpu(jax, trn, cpu, form, dtype):
    import jax.numpy as jnp
    import ml_dtypes
    norm = FORMS[form]
    x, g, b, w = _args(np.float32 if dtype == "float32" else ml_dtypes.bfloat16)

    def loss(x, g, b, w):
        return (norm(jax, x, g, b).astype(jnp.float32) * w).sum()
    f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))

    def run(dev):
        out = f(*(jax.device_put(a, dev) for a in (x, g, b, w)))
        return [np.asarray(o, np.float32) for o in jax.tree.leaves(out)]
    got, want = run(trn), run(cpu)
    tol = 2e-5 if dtype == "float32" else 2e-2
    for a, r in zip(got, want):
        np.testing.assert_allclose(a, r, rtol=tol, atol=tol * max(1.0, np.abs(r).max()))


def test_layernorm_forward_is_one_kernel(jax, trn):
    import jax_trn
    x, g, b, _ = _args(np.float32)
    f = jax.jit(lambda x, g, b: _ln(jax, x, g, b))
    args = [jax.device_put(a, trn) for a in (x, g, b)]
    with jax_trn.profile() as prof:
        jax.block_until_ready(f(*args))
    kernels = prof.executions[-1].kernels
    assert len(kernels) == 1
    (k,) = kernels
    assert "fusion_kind: rows" in k.kernel.notes
    reads = [i for i in k.kernel.instructions if type(i).__name__ == "DmaCopy"
             and getattr(i.src, "tensor", None) == "arg0"]
    assert sum(i.dst.free_size * i.dst.num_partitions for i in reads) == x.size
    # the sum of squares is ScalarE's: one Activation(square) adding up each row
    squares = [i for i in k.kernel.instructions if type(i).__name__ == "Activation"
               and i.func == "square" and i.reduce_res is not None]
    assert len(squares) == -(-x.size // x.shape[-1] // 128)


def test_rows_of_one_partition_tile_and_a_tail(jax, trn, cpu):
    """300 rows: two full tiles of 128 and one of 44; one row per partition each."""
    x, g, b, w = _args(np.float32, (300, 50))
    f = jax.jit(lambda x, g, b: _ln(jax, x, g, b))
    got = np.asarray(f(*(jax.device_put(a, trn) for a in (x, g, b))))
    want = np.asarray(f(*(jax.device_put(a, cpu) for a in (x, g, b))))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_rows_too_long_for_sbuf_fall_back_to_loop_and_reduction_kernels(jax, trn, cpu):
    """A LayerNorm backward over rows of 8192 FP32 values keeps too many of them live
    for SBUF: the row fusion is re-fused without rows (a dozen kernels), not lowered
    one op per kernel (65), and the result is the same."""
    import jax.numpy as jnp
    import jax_trn
    x = np.random.default_rng(2).standard_normal((130, 8192)).astype(np.float32)
    w = jnp.arange(8192.0)
    f = jax.jit(jax.grad(lambda x: ((x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(
        x.var(-1, keepdims=True) + 1e-5) * w).sum()))
    with jax_trn.profile() as prof:
        got = np.asarray(f(jax.device_put(x, trn)))
    kernels = prof.executions[-1].kernels
    assert any(n.startswith("fallback: rows of 8192") for k in kernels for n in k.kernel.notes)
    assert len(kernels) < 20
    np.testing.assert_allclose(got, np.asarray(f(jax.device_put(x, cpu))), rtol=1e-4,
                               atol=1e-4 * 8192)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_library_softmax_is_one_kernel(jax, trn, cpu, dtype):
    """jax.nn.softmax as the library writes it (max with an -inf initial, a bf16 input's
    sum in f32 converted back): one row kernel. In bf16 the rewrites before fusion left
    a dead convert that counted as a second user of the sum (5 kernels)."""
    import jax.numpy as jnp
    import jax_trn
    x = jnp.asarray(np.random.default_rng(3).standard_normal((2, 3, 50)), dtype)
    f = jax.jit(lambda x: jax.nn.softmax(x, -1))
    with jax_trn.profile() as prof:
        got = np.asarray(f(jax.device_put(x, trn)), np.float32)
    assert len(prof.executions[-1].kernels) == 1
    want = np.asarray(f(jax.device_put(x, cpu)), np.float32)
    tol = 1e-6 if dtype == "float32" else 1e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
