"""Head dim 64 in the [B, S, N, H] layout on trn against the CPU backend, every head
checked on its own: the flash kernels move runs of adjacent heads per DMA there
(V loads and result stores in the forward, dq / dk / dv stores in the backward:
jax_trn/lower/attention_layout.HeadStores) and store the rows' logsumexp as rows
(`LseRows`), so a slot or offset slip gives head h another head's rows. 12 heads make
runs of 8 and 4; S = 200 a partial q-tile; bf16 and f16; causal and padding-masked;
value and gradient."""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_close
from tests.e2e.test_attention_bwd import _args, _fused, _notes, _run

N, H = 12, 64


def _per_head(out, ref, dtype):
    """Each [B, S, N, H] result compared head by head (the failing head named)."""
    for a, b in zip(out, ref):
        assert a.shape == b.shape and a.dtype == b.dtype
        scale = max(1.0, float(np.abs(b.astype(np.float32)).max()))
        for n in range(a.shape[2]):
            try:
                assert_close(a[:, :, n].astype(np.float32) / scale,
                             b[:, :, n].astype(np.float32) / scale, dtype)
            except AssertionError as e:
                raise AssertionError(f"head {n} of {a.shape}: {e}") from None


def _value_and_grads(f):
    import jax

    def g(q, k, v, do):
        o, vjp = jax.vjp(f, q, k, v)
        return (o,) + vjp(do)
    return g


def _causal(q, k, v):
    """Causal attention written on [B, S, N, H] (jax.nn.dot_product_attention's
    float16 dots ask CPU for an F16_F16_F32 precision it refuses)."""
    import jax
    import jax.numpy as jnp
    s = jnp.einsum("bqnh,bknh->bnqk", q, k) / np.float32(np.sqrt(H))
    s = jnp.where(jnp.tril(jnp.ones(s.shape[-2:], bool)), s, -jnp.inf)
    p = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(q.dtype)
    return jnp.einsum("bnqk,bknh->bqnh", p, v)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("b, s", [(2, 256), (1, 200)])
def test_causal_value_and_grads_every_head(jax, trn, cpu, b, s, dtype):
    import ml_dtypes  # noqa: F401
    shape = (b, s, N, H)
    out, ref, kernels = _run(jax, trn, cpu, _value_and_grads(_causal),
                             _args([shape] * 4, 11, dtype))
    assert _fused(kernels) == (True, True), _notes(kernels)
    _per_head(out, ref, dtype)


def _padded(q, k, v, valid):
    import jax
    mask = valid[:, None, None, :] & valid[:, None, :, None]
    return jax.nn.dot_product_attention(q, k, v, mask=mask)


def test_padding_masked_value_and_grads_every_head(jax, trn, cpu):
    """A per-batch padding mask (a runtime input) on bf16, value and gradient."""
    import jax.numpy as jnp
    import ml_dtypes  # noqa: F401
    shape = (2, 256, N, H)
    q, k, v, do = _args([shape] * 4, 12)
    valid = np.arange(256)[None] < np.array([[200], [256]])

    def f(q, k, v, do, valid):
        o, vjp = jax.vjp(lambda q, k, v: _padded(q, k, v, valid), q, k, v)
        return (o,) + vjp(do)
    out, ref, kernels = _run(jax, trn, cpu, f, [q, k, v, do, valid])
    assert _fused(kernels)[0], _notes(kernels)
    _per_head(out, ref, "bfloat16")
    assert jnp is not None


def test_linen_attention_grads_every_head(jax, trn, cpu):
    """The LM row's form (benchmarks/models.py): flax linen attention with
    make_causal_mask, gradient of the input and the parameters. The key projection's
    bias gets no gradient in exact arithmetic (softmax is shift-invariant along keys):
    both backends give rounding noise there, so it is checked against the scale of
    the query bias's gradient."""
    import flax.linen as nn
    import jax.numpy as jnp
    import ml_dtypes  # noqa: F401
    layer = nn.MultiHeadDotProductAttention(N, qkv_features=N * H, dtype=jnp.bfloat16)
    x = _args([(2, 256, N * H)], 13)[0]
    params = jax.jit(layer.init, backend="cpu")(jax.random.key(0), x, x)

    def f(p, x):
        mask = nn.make_causal_mask(jnp.zeros(x.shape[:2], jnp.int32))
        return layer.apply(p, x, x, mask=mask)

    def g(p, x):
        o, vjp = jax.vjp(f, p, x)
        dp, dx = vjp(o)
        kbias = dp["params"]["key"].pop("bias")
        return o, dx, dp, kbias, dp["params"]["query"]["bias"]
    out, ref, kernels = _run(jax, trn, cpu, g, [params, x])
    assert _fused(kernels) == (True, True), _notes(kernels)
    for a, b in zip(out[:-2], ref[:-2]):
        scale = max(1.0, float(np.abs(b.astype(np.float32)).max()))
        assert_close(a.astype(np.float32) / scale, b.astype(np.float32) / scale,
                     "bfloat16")
    scale = float(np.abs(ref[-1].astype(np.float32)).max())
    assert np.abs(out[-2].astype(np.float32)).max() < 0.05 * scale
