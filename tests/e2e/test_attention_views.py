"""Attention on q, k, v split from one fused projection (GPT-2's c_attn, a transformer
block's wqkv): the flash kernels read the projection in place through the views
(hlo_passes/passes/attention_views.py), forward and backward, and the backward writes
dq, dk, dv into the projection's gradient in place of their concatenate; no copy
kernels; results against the CPU backend."""
from __future__ import annotations

import numpy as np
import pytest

B, T, H, D = 2, 128, 4, 64


def _gpt(jax, w, x):
    import jax.numpy as jnp
    q, k, v = jnp.split(x @ w, 3, axis=-1)
    q, k, v = (t.reshape(B, T, H, D) for t in (q, k, v))
    return jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(B, T, H * D)


def _heads_first(jax, w, x):
    """[S, 3, H, D] -> [3, H, S, D] -> q, k, v by index, as benchmarks/compiler.py's
    transformer block splits its wqkv projection."""
    import jax.numpy as jnp
    qkv = (x[0] @ w).reshape(T, 3, H, D).transpose(1, 2, 0, 3)
    q, k, v = qkv[0][None], qkv[1][None], qkv[2][None]
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * D ** -0.5
    s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
    p = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(q.dtype)
    a = jnp.einsum("bhqk,bhkd->bhqd", p, v)[0].transpose(1, 0, 2).reshape(T, H * D)
    return a @ w[:, :H * D]             # the output projection (wo) follows


@pytest.mark.parametrize("form", [_gpt, _heads_first])
@pytest.mark.parametrize("grad", [False, True])
def test_split_projection_is_read_in_place(jax, trn, cpu, form, grad):
    import jax.numpy as jnp
    import jax_trn
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((H * D, 3 * H * D)) * 0.05, jnp.bfloat16)
    x = jnp.asarray(rng.standard_normal((B, T, H * D)), jnp.bfloat16)
    f = (lambda w, x: form(jax, w, x))
    if grad:
        f = jax.grad(lambda w, x: form(jax, w, x).astype(jnp.float32).sum(), argnums=(0, 1))
    f = jax.jit(f)
    with jax_trn.profile() as prof:
        got = jax.tree.leaves(f(jax.device_put(w, trn), jax.device_put(x, trn)))
    kernels = prof.executions[-1].kernels
    kinds = [n for k in kernels for n in k.kernel.notes if n.startswith("fusion_kind: att")]
    assert "fusion_kind: attention" in kinds
    if grad:
        assert "fusion_kind: attention_bwd" in kinds
    assert not [n for k in kernels for n in k.kernel.notes if n.startswith("fallback")]
    views = [k for k in kernels if k.name.startswith("trn.view")]
    assert all("squeeze" in str(k.ops) for k in views)      # x[0] only, never q, k, v
    if form is _gpt:        # the split's slices and its gradient's concatenate are gone
        assert {k.name.split(".")[0] for k in kernels} <= {
            "dot_general", "dot_general_fusion", "convert_fusion"}
    want = jax.tree.leaves(f(jax.device_put(w, cpu), jax.device_put(x, cpu)))
    for a, b in zip(got, want):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        np.testing.assert_allclose(a, b, rtol=3e-2, atol=3e-2 * np.abs(b).max())
