"""Padding masks made as the outer `and` of a query vector and a key vector (flax's
`nn.make_attention_mask(valid_q, valid_k)`, hand-written `vq[:, None] & vk[None, :]`):
on trn against the CPU backend, each run as the one flash kernel that takes the two
vectors (hlo_passes/attention_outer.py, jax_trn/lower/attention_outer.py), no [S, S]
mask kernel before it. Padded query rows (uniform over every key with a finite fill,
NaN with -inf) and a batch whose keys are all padding included."""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_close
from tests.e2e.test_attention_forms import FLASH, _rand, _run

B, S, N, H = 2, 256, 4, 64
OUTER = "mask = rows & columns"


def _outer_flash(notes) -> int:
    return sum(FLASH in n and any(OUTER in d for d in n) for n in notes)


def _valid():
    vq = np.arange(S)[None] < np.array([[200], [130]])     # per-batch padding
    vk = np.arange(S)[None] < np.array([[170], [256]])
    return vq, vk


def test_linen_attention_with_query_and_key_padding(jax, trn, cpu):
    """linen MHA, make_attention_mask(valid_q, valid_k) with different vectors per
    batch: one kernel for the attention, which takes the vectors."""
    import flax.linen as nn
    import jax.numpy as jnp
    layer = nn.MultiHeadDotProductAttention(num_heads=N, qkv_features=N * H,
                                            dtype=jnp.bfloat16)
    x = _rand((B, S, N * H), 4, "bfloat16")
    params = jax.jit(layer.init, backend="cpu")(jax.random.key(0), x, x)
    vq, vk = _valid()

    def f(params, x, vq, vk):
        return layer.apply(params, x, x, mask=nn.make_attention_mask(vq, vk))
    out, ref, notes = _run(jax, trn, cpu, f, (params, x, vq, vk))
    assert _outer_flash(notes) == 1, notes
    assert len(notes) == 5, notes           # q, k, v, out projections + attention
    assert_close(out, ref, "bfloat16")


def _hand_written(jax, fill):
    import jax.numpy as jnp

    def f(q, k, v, vq, vk):
        s = jnp.einsum("bqnh,bknh->bnqk", q, k) / np.sqrt(H).astype(np.float32)
        mask = vq[:, None, :, None] & vk[:, None, None, :]
        s = jnp.where(mask, s, fill)
        p = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(q.dtype)
        return jnp.einsum("bnqk,bknh->bqnh", p, v)
    return f


@pytest.mark.parametrize("fill, dtype", [(-1e9, "bfloat16"), (-np.inf, "bfloat16"),
                                         (-1e9, "float16")])
def test_hand_written_outer_mask(jax, trn, cpu, fill, dtype):
    """vq[:, None] & vk[None, :] in the scores' layout, an f32 softmax; a batch with
    every key padded: uniform rows with -1e9 (mean of v), NaN rows with -inf, as on
    CPU; float16 (the padded rows' mean added in FP32, not bf16)."""
    vq, vk = _valid()
    vk = vk.copy()
    vk[1] = False                                           # batch 1: no key at all
    args = [_rand((B, S, N, H), i, dtype) for i in range(3)] + [vq, vk]
    out, ref, notes = _run(jax, trn, cpu, _hand_written(jax, fill), args)
    assert len(notes) == 1 and _outer_flash(notes) == 1, notes
    assert np.array_equal(np.isnan(out), np.isnan(ref))
    if fill == -np.inf:
        assert np.isnan(ref).any()
    keep = ~np.isnan(ref)
    assert_close(out[keep], ref[keep], dtype)


def test_nnx_multi_head_attention_with_padding(jax, trn, cpu):
    """flax.nnx MultiHeadAttention with make_attention_mask: the same one kernel."""
    nnx = pytest.importorskip("flax.nnx")
    import jax.numpy as jnp
    layer = nnx.MultiHeadAttention(num_heads=N, in_features=N * H, qkv_features=N * H,
                                   dtype=jnp.bfloat16, decode=False, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(layer)
    state = jax.device_put(state, cpu)
    x = _rand((B, S, N * H), 5, "bfloat16")
    vq, vk = _valid()

    def f(state, x, vq, vk):
        model = nnx.merge(graphdef, state)
        return model(x, mask=nnx.make_attention_mask(vq, vk))
    out, ref, notes = _run(jax, trn, cpu, f, (state, x, vq, vk))
    assert _outer_flash(notes) == 1, notes
    assert_close(out, ref, "bfloat16")


def test_outer_mask_with_ragged_tiles_and_a_bias(jax, trn, cpu):
    """S = 200 (a partial q-tile and key tile), an additive bias under a -inf fill:
    the vectors still cover every row and key."""
    import jax.numpy as jnp
    s_len = 200
    vq = np.arange(s_len)[None] < np.array([[190], [77]])
    vk = np.arange(s_len)[None] < np.array([[150], [199]])
    bias = _rand((B, N, s_len, s_len), 9, "bfloat16")

    def f(q, k, v, vq, vk, bias):
        s = jnp.einsum("bqnh,bknh->bnqk", q, k) * 0.125 + bias
        s = jnp.where(vq[:, None, :, None] & vk[:, None, None, :], s, -jnp.inf)
        p = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(q.dtype)
        return jnp.einsum("bnqk,bknh->bqnh", p, v)
    args = [_rand((B, s_len, N, H), i, "bfloat16") for i in range(3)] + [vq, vk, bias]
    out, ref, notes = _run(jax, trn, cpu, f, args)
    assert len(notes) == 1 and _outer_flash(notes) == 1, notes
    assert np.array_equal(np.isnan(out), np.isnan(ref))
    keep = ~np.isnan(ref)
    assert_close(out[keep], ref[keep], "bfloat16")


def test_an_additive_bias_of_zeros_and_minus_inf(jax, trn, cpu):
    """`dot_product_attention(bias=where(m, 0, -inf))`: the bias is added to the scores
    as I @ bias on TensorE, where a -inf made 0 * -inf = NaN for the whole row block
    (the forward was all NaN); clamped to the masked-score bias, forward and gradient
    match CPU (every query row sees at least one key here). (float16: JAX's CPU
    backend refuses this dot_product_attention's precision.)"""
    import jax.numpy as jnp
    dtype = "bfloat16"
    import ml_dtypes  # noqa: F401
    rng = np.random.default_rng(4)
    q, k, v = (_rand((1, 128, 2, 32), s, dtype) for s in (1, 2, 3))
    bias = np.where(rng.random((1, 2, 128, 128)) < 0.5, 0, -np.inf).astype(np.dtype(dtype))
    bias[..., 0] = 0
    f = lambda q, k, v, b: jax.nn.dot_product_attention(q, k, v, bias=b)    # noqa: E731
    out, ref, notes = _run(jax, trn, cpu, f, (q, k, v, bias))
    assert any(FLASH in n for n in notes)
    assert not np.isnan(np.asarray(out, np.float32)).any()
    assert_close(out, ref, dtype)
    loss = lambda q, k, v, b: f(q, k, v, b).astype(jnp.float32).sum()      # noqa: E731
    g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    got, want = (g(*jax.device_put((q, k, v, bias), d)) for d in (trn, cpu))
    for a, b in zip(got, want):
        assert not np.isnan(np.asarray(a, np.float32)).any()
        assert_close(np.asarray(a, np.float32), np.asarray(b, np.float32), dtype)


@pytest.mark.parametrize("s", [96, 200])
def test_outer_mask_short_rows_every_batch_and_head(jax, trn, cpu, s):
    """Few jobs per V run (S <= 2 q-tiles, one key chunk, B6 N4 H64: runs of 4 heads
    with their own key vectors): the kernel's pipeline stage B reads a run's staged V,
    mean and key weights several runs after their loads were queued, so a staging
    ring shallower than the pipeline gives a batch another's V. Each (batch, head)
    checked on its own."""
    b = 6
    rng = np.random.default_rng(5)
    vq = np.arange(s)[None] < rng.integers(s // 2, s + 1, (b, 1))
    vk = np.arange(s)[None] < rng.integers(1, s + 1, (b, 1))
    args = [_rand((b, s, N, H), 20 + i, "bfloat16") for i in range(3)] + [vq, vk]
    out, ref, notes = _run(jax, trn, cpu, _hand_written(jax, -1e9), args)
    assert _outer_flash(notes) == 1, notes
    for i in range(b):
        for n in range(N):
            assert_close(out[i, :, n], ref[i, :, n], "bfloat16")
