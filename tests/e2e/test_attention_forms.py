"""Attention as libraries write it, on trn against the CPU backend on the same program:
jax.nn.dot_product_attention ([B, S, N, H], GQA, causal / mask= / bias= / local window),
flax linen MultiHeadDotProductAttention with a padding mask, a hand-written
`jnp.where(tril, s, -1e9)` / `s / sqrt(d)` form, gemma's grouped einsums. Each must
become the one flash-attention kernel (checked by its note), not only match numbers."""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_close

B, S, N, K, H = 1, 256, 4, 2, 64
FLASH = "attention: flash-attention kernel (attention.py)"


def _rand(shape, seed, dtype):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(np.float32).astype(np.dtype(dtype))


def _run(jax, trn, cpu, f, args):
    """(trn result, cpu result, [kernels' notes])."""
    import jax_trn
    g = jax.jit(f)
    with jax_trn.profile() as prof:
        out = g(*jax.device_put(args, trn))
        out.block_until_ready()
    ref = g(*jax.device_put(args, cpu))
    notes = [k.kernel.notes for k in prof.executions[-1].kernels]
    return np.asarray(out), np.asarray(ref), notes


def _flash(notes) -> int:
    return sum(FLASH in n for n in notes)


def _qkv(dtype, kv_heads=N, seed=0):
    return [_rand((B, S, N, H), seed, dtype), _rand((B, S, kv_heads, H), seed + 1, dtype),
            _rand((B, S, kv_heads, H), seed + 2, dtype)]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_heads", [N, K, 1])
def test_dot_product_attention_is_one_flash_kernel(jax, trn, cpu, causal, kv_heads):
    """[B, S, N, H] layout, q with a unit group dim, v as the lhs of the second dot,
    -0.7 * finfo.max fill from iota comparisons; MHA, GQA and MQA."""
    import ml_dtypes  # noqa: F401
    f = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    out, ref, notes = _run(jax, trn, cpu, f, _qkv("bfloat16", kv_heads))
    assert len(notes) == 1 and _flash(notes) == 1, notes
    assert_close(out, ref, "bfloat16")


def test_dot_product_attention_with_a_mask_input(jax, trn, cpu):
    """mask= [B, 1, S, S] (broadcast over heads) read per tile, with fully masked rows:
    XLA's finite fill gives them a uniform softmax, and so must the kernel."""
    import ml_dtypes  # noqa: F401
    mask = np.random.default_rng(7).random((B, 1, S, S)) < 0.7
    mask[:, :, :5] = False                                  # five fully masked rows
    f = lambda q, k, v, m: jax.nn.dot_product_attention(q, k, v, mask=m)  # noqa: E731
    out, ref, notes = _run(jax, trn, cpu, f, _qkv("bfloat16") + [mask])
    assert len(notes) == 1 and _flash(notes) == 1, notes
    assert_close(out, ref, "bfloat16")


def test_dot_product_attention_with_a_bias(jax, trn, cpu):
    import ml_dtypes  # noqa: F401
    bias = _rand((B, N, S, S), 9, "bfloat16")
    f = lambda q, k, v, b: jax.nn.dot_product_attention(q, k, v, bias=b,  # noqa: E731
                                                         is_causal=True)
    out, ref, notes = _run(jax, trn, cpu, f, _qkv("bfloat16") + [bias])
    assert len(notes) == 1 and _flash(notes) == 1, notes
    assert_close(out, ref, "bfloat16")


def test_dot_product_attention_local_window(jax, trn, cpu):
    import ml_dtypes  # noqa: F401
    f = lambda q, k, v: jax.nn.dot_product_attention(  # noqa: E731
        q, k, v, is_causal=True, local_window_size=(64, 0))
    out, ref, notes = _run(jax, trn, cpu, f, _qkv("bfloat16"))
    assert _flash(notes) == 1, notes
    assert_close(out, ref, "bfloat16")


def test_float32_dot_product_attention_matches_cpu(jax, trn, cpu):
    """f32 q/k/v: the pass fuses, the kernel (16-bit only) declines, the region's ops
    run one by one with the same results."""
    f = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    with jax.default_matmul_precision("highest"):
        out, ref, notes = _run(jax, trn, cpu, f, _qkv("float32"))
    assert _flash(notes) == 0
    assert_close(out, ref, "float32", rtol=1e-4, atol=1e-5)


def hand_written(q, k, v):
    import jax
    import jax.numpy as jnp
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -1e9)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)


def test_hand_written_finite_mask_and_divide(jax, trn, cpu):
    """f32 softmax (np.sqrt promotes), v converted to f32 for p @ v: read as bf16."""
    import ml_dtypes  # noqa: F401
    out, ref, notes = _run(jax, trn, cpu, hand_written, _qkv("bfloat16"))
    assert len(notes) == 1 and _flash(notes) == 1, notes
    assert out.dtype == ref.dtype == np.float32
    assert_close(out, ref, "bfloat16")


@pytest.mark.parametrize("fill", [-1e9, -1e10, "min"])
def test_fully_masked_rows_with_a_finite_fill_are_uniform(jax, trn, cpu, fill):
    """Strictly-lower mask: row 0 has no key. XLA: uniform softmax (mean of v)."""
    import jax.numpy as jnp
    import ml_dtypes  # noqa: F401

    def f(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k).astype(jnp.float32) * 0.125
        value = jnp.finfo(jnp.float32).min if fill == "min" else fill
        s = jnp.where(jnp.tril(jnp.ones((S, S), bool), -1), s, value)
        p = jax.nn.softmax(s, axis=-1).astype(q.dtype)
        return jnp.einsum("bhqk,bhkd->bhqd", p, v)
    args = [_rand((B, N, S, H), i, "bfloat16") for i in range(3)]
    out, ref, notes = _run(jax, trn, cpu, f, args)
    assert _flash(notes) == 1, notes
    np.testing.assert_allclose(ref[0, 0, 0].astype(np.float32),
                               args[2][0, 0].astype(np.float32).mean(0), atol=1e-2)
    assert_close(out, ref, "bfloat16")


def test_fully_masked_runtime_rows_with_minus_inf_are_nan(jax, trn, cpu):
    """A -inf fill: XLA's softmax of a row of -inf is NaN; the kernel gives NaN too."""
    import jax.numpy as jnp
    import ml_dtypes  # noqa: F401

    def f(q, k, v, m):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * 0.125
        s = jnp.where(m, s, -jnp.inf)
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)
    mask = np.random.default_rng(3).random((B, 1, S, S)) < 0.5
    mask[0, 0, 3] = False
    args = [_rand((B, N, S, H), i, "bfloat16") for i in range(3)] + [mask]
    out, ref, notes = _run(jax, trn, cpu, f, args)
    assert _flash(notes) == 1, notes
    np.testing.assert_array_equal(np.isnan(out.astype(np.float32)),
                                  np.isnan(ref.astype(np.float32)))
    assert np.isnan(ref.astype(np.float32)[0, :, 3]).all()
    keep = ~np.isnan(ref.astype(np.float32))
    assert_close(out[keep], ref[keep], "bfloat16")


def gemma_gqa(q, key, value):
    import jax
    import jax.numpy as jnp
    qg = q.reshape(B, S, K, N // K, H) * H ** -0.5
    logits = jnp.einsum("BTKGH,BSKH->BKGTS", qg, key).astype(jnp.float32)
    logits = jnp.where(jnp.tril(jnp.ones((S, S), bool)), logits, -jnp.inf)
    probs = jax.nn.softmax(logits, axis=-1).astype(q.dtype)
    return jnp.einsum("BKGTS,BSKH->BTKGH", probs, value).reshape(B, S, N, H)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gemma_grouped_einsums(jax, trn, cpu, dtype):
    import ml_dtypes  # noqa: F401
    with jax.default_matmul_precision("highest"):
        out, ref, notes = _run(jax, trn, cpu, gemma_gqa, _qkv(dtype, K))
    if dtype == "bfloat16":
        assert len(notes) == 1 and _flash(notes) == 1, notes
        assert_close(out, ref, dtype)
    else:
        assert_close(out, ref, dtype, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_flax_linen_attention_with_a_padding_mask(jax, trn, cpu, dtype):
    """linen: q divided by sqrt(d), einsums, a boolean padding mask from an input
    broadcast over heads, finfo.min via jnp.where, a bf16 softmax; padded queries'
    rows are fully masked (uniform, as XLA gives)."""
    import flax.linen as nn
    import jax.numpy as jnp
    import ml_dtypes  # noqa: F401
    layer = nn.MultiHeadDotProductAttention(num_heads=N, qkv_features=N * H,
                                            dtype=jnp.dtype(dtype))
    x = _rand((B, S, N * H), 4, dtype)
    params = jax.jit(layer.init, backend="cpu")(jax.random.key(0), x, x)
    valid = np.arange(S)[None] < 200

    def f(params, x, valid):
        return layer.apply(params, x, x, mask=nn.make_attention_mask(valid, valid))
    with jax.default_matmul_precision("highest"):
        out, ref, notes = _run(jax, trn, cpu, f, (params, x, valid))
    if dtype == "bfloat16":
        assert _flash(notes) == 1, notes
        assert_close(out, ref, dtype)
    else:
        assert_close(out, ref, dtype, rtol=1e-4, atol=1e-4)


def test_self_attention_with_one_array_for_q_k_v_and_a_bias(jax, trn, cpu):
    """dot_product_attention(x, x, x, bias=, mask=) as JAX's nn_test writes it: one value
    is q, k and v (the fusion's block arguments were one value defined three times, which
    the verifier refused at compile time)."""
    jnp = jax.numpy
    kx, kb = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (1, 128, 4, 32), jnp.bfloat16)
    bias = jax.random.normal(kb, (1, 4, 128, 128), jnp.bfloat16)
    mask = jnp.ones((1, 1, 128), jnp.bool_)
    f = jax.jit(lambda x, b, m: jax.nn.dot_product_attention(x, x, x, bias=b, mask=m))
    got = np.asarray(f(*jax.device_put((x, bias, mask), trn)), np.float32)
    want = np.asarray(f(*jax.device_put((x, bias, mask), cpu)), np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


def dropout_attention(jax, form, causal=False):
    """Hand-written attention ([B, S, N, H]) with a dropout on the softmax (HF-style):
    nn.Dropout's / jnp.where's select(keep, p / keep_prob, 0), the scaling after the
    select, or p * (keep / keep_prob) as flax's dot_product_attention multiplies it;
    keep drawn over [B, N, S, S]. test_attention_bwd.py takes its gradients."""
    jnp = jax.numpy

    def f(q, k, v, key):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / np.sqrt(q.shape[-1])
        if causal:
            s = jnp.where(jnp.tril(jnp.ones(s.shape[-2:], bool)), s, -1e9)
        p = jax.nn.softmax(s, axis=-1).astype(q.dtype)
        keep = jax.random.bernoulli(key, 0.9, p.shape)
        if form == "select":
            p = jnp.where(keep, p / 0.9, 0)
        elif form == "select-then-scale":    # the scaling after the select
            p = jnp.where(keep, p, 0) / jnp.asarray(0.9, p.dtype)
        else:
            p = p * (keep.astype(p.dtype) / jnp.asarray(0.9, p.dtype))
        return jnp.einsum("bhqk,bkhd->bqhd", p, v)
    return f


@pytest.mark.parametrize("form, causal", [("select", False), ("multiply", True),
                                         ("select-then-scale", False)])
def test_dropout_on_the_probabilities_is_in_the_flash_kernel(jax, trn, cpu, form, causal):
    """The keep mask comes from its own kernel (the threefry hash fused with the compare,
    tests/e2e/test_dropout.py), the flash kernel multiplies each P tile by its block
    after the row sums. A mask read at the wrong offset would be far off (checked: the
    result of another key differs by more than the tolerance)."""
    f = dropout_attention(jax, form, causal)
    args = _qkv("bfloat16") + [jax.random.key(3)]
    out, ref, notes = _run(jax, trn, cpu, f, args)
    assert _flash(notes) == 1, notes
    assert any("dropout: P *" in n for kn in notes for n in kn), notes
    assert_close(out, ref, "bfloat16")
    other = np.asarray(jax.jit(f)(*jax.device_put(args[:3] + [jax.random.key(4)], cpu)))
    assert np.abs(other.astype(np.float32) - ref.astype(np.float32)).max() > 0.2


def test_flax_dot_product_attention_with_broadcast_dropout(jax, trn, cpu):
    """flax's nn.dot_product_attention(dropout_rate=0.1, broadcast_dropout=True): one
    [1, 1, S, S] draw of keep / keep_prob (bf16) shared by every batch index and head,
    read per tile with stride 0 along them."""
    import flax.linen as nn

    def f(q, k, v, key):
        return nn.dot_product_attention(q, k, v, dropout_rng=key, dropout_rate=0.1,
                                        deterministic=False)
    out, ref, notes = _run(jax, trn, cpu, f, _qkv("bfloat16") + [jax.random.key(5)])
    assert _flash(notes) == 1, notes
    assert_close(out, ref, "bfloat16")
