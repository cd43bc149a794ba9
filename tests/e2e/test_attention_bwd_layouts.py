"""Gradients of attention as libraries write it, on trn against the CPU backend:
jax.nn.dot_product_attention ([B, T, N, H], causal or not, GQA / MQA), gemma-style
grouped einsums, einsum-written attention in
[B, S, H, D] and [B, H, S, D], flax linen's MultiHeadDotProductAttention. Each fused
case is checked to run as the flash backward kernel (its kernel notes) with dq, dk, dv
read / written in the program's layout (no transpose kernel), runtime masks and biases
included; a gradient the kernel does not write (the bias's) is checked to be a
recorded near miss that still matches CPU op by op. Tolerances: bf16 inputs, f32
accumulation (tests/conftest.assert_close "bfloat16")."""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_close
from tests.e2e.test_attention_bwd import BWD_NOTE, _args, _fused, _notes, _run

SHAPE = (1, 256, 2, 64)         # [B, T, N, H]


def _grad(f, n=3):
    import jax
    import jax.numpy as jnp

    def loss(*a):
        *a, w = a
        return (f(*a).astype(jnp.float32) * w).sum()
    return jax.grad(loss, argnums=tuple(range(n)))


def _check(jax, trn, cpu, f, shapes, fused=True, seed=0):
    """Runs grad(f) (w.r.t. q, k, v) on trn and cpu; checks the kernels (fused or
    not) and the values."""
    import ml_dtypes  # noqa: F401
    args = _args(shapes, seed)
    out, ref, kernels = _run(jax, trn, cpu, _grad(f), args)
    assert _fused(kernels)[1] == fused, _notes(kernels)
    if fused:
        assert not [k for k in kernels if "transpose" in k.name], [k.name for k in kernels]
    for a, b in zip(out, ref):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert_close(a, b, "bfloat16")
    return kernels


@pytest.mark.parametrize("causal", [True, False])
def test_dot_product_attention_grad(jax, trn, cpu, causal):
    def f(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal)
    _check(jax, trn, cpu, f, [SHAPE] * 4)


def test_dot_product_attention_grad_cross_lengths(jax, trn, cpu):
    """Sq 200 against Sk 384: a partial q-tile; keys strided in [B, T, N, H]."""
    def f(q, k, v):
        return jax.nn.dot_product_attention(q, k, v)
    _check(jax, trn, cpu, f, [(1, 200, 2, 64), (1, 384, 2, 64), (1, 384, 2, 64),
                              (1, 200, 2, 64)], seed=1)


@pytest.mark.parametrize("heads", [(4, 2), (4, 1)])
def test_dot_product_attention_gqa_grad(jax, trn, cpu, heads):
    """GQA (4 q heads on 2 kv heads) and MQA (1 kv head): dk, dv summed over each kv
    head's group of q heads (was: a near miss, "grouped (GQA) heads")."""
    n, kv = heads

    def f(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True)
    t, h = 256, 64
    _check(jax, trn, cpu, f, [(1, t, n, h), (1, t, kv, h), (1, t, kv, h), (1, t, n, h)],
           seed=6)


def test_grouped_einsum_gqa_grad(jax, trn, cpu):
    """GQA as gemma writes it: q viewed [B, T, K, G, H] against k [B, S, K, H]."""
    import jax.numpy as jnp

    def f(q, k, v):
        b, t, n, h = q.shape
        kv = k.shape[2]
        qg = q.reshape(b, t, kv, n // kv, h)
        s = jnp.einsum("btkgh,bskh->bkgts", qg, k) * h ** -0.5
        p = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(q.dtype)
        return jnp.einsum("bkgts,bskh->btkgh", p, v).reshape(b, t, n, h)
    _check(jax, trn, cpu, f, [(1, 256, 4, 64), (1, 256, 2, 64), (1, 256, 2, 64),
                              (1, 256, 4, 64)], seed=7)


def test_einsum_attention_bshd_grad(jax, trn, cpu):
    """[B, S, H, D] einsums, f32 scores, a scale by division (sqrt(d))."""
    import jax.numpy as jnp

    def f(q, k, v):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
        p = jax.nn.softmax(s / np.sqrt(q.shape[-1]), axis=-1).astype(q.dtype)
        return jnp.einsum("bhqk,bkhd->bqhd", p, v)
    _check(jax, trn, cpu, f, [SHAPE] * 4, seed=2)


def test_einsum_attention_bhsd_grad(jax, trn, cpu):
    """[B, H, S, D] einsums, q scaled, a -1e9 causal fill, bf16 softmax."""
    import jax.numpy as jnp

    def f(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q * 0.125, k)
        n = s.shape[-1]
        s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -1e9)
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)
    _check(jax, trn, cpu, f, [(1, 2, 256, 64)] * 4, seed=3)


def test_flax_linen_attention_grads(jax, trn, cpu):
    """Gradients of flax linen MultiHeadDotProductAttention's parameters and input."""
    nn = pytest.importorskip("flax.linen")
    import jax.numpy as jnp
    import ml_dtypes  # noqa: F401
    layer = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=128,
                                            dtype=jnp.bfloat16)
    x = _args([(1, 256, 128)], 4)[0]
    with jax.default_device(cpu):
        params = jax.tree_util.tree_map(np.asarray, layer.init(jax.random.PRNGKey(0), x))

    def f(p, x):
        return jax.grad(lambda p, x: layer.apply(p, x).astype(jnp.float32).sum(),
                        argnums=(0, 1))(p, x)
    out, ref, kernels = _run(jax, trn, cpu, f, [params, x])
    assert _fused(kernels) == (True, True), _notes(kernels)
    _compare_grads(jax, (params, x), out, ref)


def _compare_grads(jax, tree, out, ref) -> None:
    """Gradients of a flax model against CPU, each scaled by its largest value."""
    paths = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(tree)]
    got = {path: (a.astype(np.float32), b.astype(np.float32))
           for path, a, b in zip(paths, out, ref)}
    for path, (a, b) in got.items():
        if "key" in path and "bias" in path:
            # softmax is invariant to q . bias_k (the same for every key): the exact
            # gradient is 0, both backends give rounding noise of a 256-term sum
            noise = 0.02 * np.abs(got[path.replace("bias", "kernel")][1]).max()
            assert np.abs(a).max() < noise and np.abs(b).max() < noise
            continue
        scale = max(1.0, float(np.abs(b).max()))
        assert_close(a / scale, b / scale, "bfloat16")


@pytest.mark.parametrize("form", ["bias", "mask", "both"])
def test_runtime_mask_and_bias_grads(jax, trn, cpu, form):
    """A runtime additive bias [B, N, T, S], a runtime boolean mask (computed from the
    input: a padded key tail, and query rows that see no key, whose softmax is uniform
    with the library's finite fill), or both: the backward kernel adds them to the
    recomputed scores per block and zeroes ds where the mask is false, as the program's
    select does (was: a near miss, "an additive bias" / "a mask computed at run
    time")."""
    import jax.numpy as jnp
    b, t, n, h = 1, 256, 2, 64
    shapes = [(b, t, n, h)] * 3 + [(b, n, t, t)] * (form != "mask") + [(b, t, n, h)]
    pad = np.arange(t) < 200

    def f(q, k, v, *bias):
        mask = None
        if form != "bias":      # depends on the input: computed at run time
            mask = (q[:, None, :, 0, :1] < 2.0) & pad   # ~2% of rows see no key
        return jax.nn.dot_product_attention(q, k, v, *bias, mask=mask)
    _check(jax, trn, cpu, f, shapes, seed=5)


def test_bias_gradient_is_a_recorded_near_miss(jax, trn, cpu):
    """jax.grad with respect to the bias too: its gradient is ds itself, an [S, S]
    tensor the backward kernel does not write; the pass says so, the program runs op
    by op and matches CPU."""
    import ml_dtypes  # noqa: F401
    import hlo_passes
    from hlo_passes.passes.attention_bwd_fusion import DECISIONS
    from tests.hlo_passes.helpers import artifact_of

    def f(q, k, v, bias):
        return jax.nn.dot_product_attention(q, k, v, bias)
    shapes = [(1, 128, 2, 32)] * 3 + [(1, 2, 128, 128), (1, 128, 2, 32)]
    args = _args(shapes, 8)
    module = hlo_passes.compile_to_ir(artifact_of(_grad(f, 4), *args))
    assert any("also used outside" in note for note in module.attrs[DECISIONS]), \
        module.attrs[DECISIONS]
    out, ref, kernels = _run(jax, trn, cpu, _grad(f, 4), args)
    assert not _fused(kernels)[1], _notes(kernels)
    for a, b in zip(out, ref):
        assert_close(a, b, "bfloat16")


def _two_layer_linen(jax):
    """Two flax linen attention layers sharing one causal mask (nn.make_causal_mask:
    one broadcast, `and`ed with all-true, read by both layers' scores)."""
    nn = pytest.importorskip("flax.linen")
    import jax.numpy as jnp

    class TwoLayers(nn.Module):
        @nn.compact
        def __call__(self, tokens, x):
            mask = nn.make_causal_mask(tokens)
            for _ in range(2):
                x = x + nn.MultiHeadDotProductAttention(
                    num_heads=2, qkv_features=128, dtype=jnp.bfloat16)(x, x, mask=mask)
            return x
    return TwoLayers()


def test_layers_sharing_a_mask_both_fuse(jax, trn, cpu):
    """The mask ops two layers share stay in the program for the other layer (they are
    cloned into each region): both layers' backward fuse (was: a near miss, "%v
    (broadcast_in_dim) is also used outside", as in benchmarks/models.py's lm row)."""
    import jax.numpy as jnp
    import ml_dtypes  # noqa: F401
    import hlo_passes
    from hlo_passes.passes.attention_bwd_fusion import DECISIONS
    from tests.hlo_passes.helpers import artifact_of
    model = _two_layer_linen(jax)
    tokens = np.ones((1, 256), np.int32)
    x = _args([(1, 256, 128)], 9)[0]
    with jax.default_device(cpu):
        params = jax.tree_util.tree_map(np.asarray, model.init(jax.random.PRNGKey(0),
                                                               tokens, x))

    def f(p, x):
        return jax.grad(lambda p, x: model.apply(p, tokens, x).astype(jnp.float32).sum(),
                        argnums=(0, 1))(p, x)
    module = hlo_passes.compile_to_ir(artifact_of(f, params, x))
    assert DECISIONS not in module.attrs, module.attrs[DECISIONS]
    assert [op.attrs["fusion_kind"] for op in module.main.body.ops if op.kind == "fusion"
            and op.attrs["fusion_kind"] == "attention_bwd"] == ["attention_bwd"] * 2
    out, ref, kernels = _run(jax, trn, cpu, f, [params, x])
    notes = _notes(kernels)
    assert sum(n.startswith(BWD_NOTE) for n in notes) == 2, notes
    _compare_grads(jax, (params, x), out, ref)
