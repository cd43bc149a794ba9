"""Attention as libraries write it becomes one "attention" fusion whose layout attribute
says where each canonical axis lives (hlo_passes/attention_axes.py); near misses carry
a decision with their reason on the p @ v dot."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_passes
from hlo_passes.attention_layout import reshape_strides, row_major
from hlo_passes.fusion_policy import FusionPolicy
from hlo_passes.passes.attention_fusion import AttentionFusion

from .helpers import artifact_of

B, S, N, K, H = 1, 128, 4, 2, 32
Q = jnp.zeros((B, S, N, H), jnp.bfloat16)
KV = jnp.zeros((B, S, K, H), jnp.bfloat16)


def _compile(f, *args, **kw):
    return hlo_passes.compile_to_ir(artifact_of(f, *args), **kw)


def _attention(module):
    ops = [op for op in module.main.body.ops
           if op.kind == "fusion" and op.attrs["fusion_kind"] == "attention"]
    assert len(ops) == 1, [op.kind for op in module.main.body.ops]
    return ops[0]


def _axes(op) -> dict:
    """{role: [(size, {operand: stride})]} of the fusion's layout."""
    names = ("q", "k", "v", "out", "mask", "bias")
    out: dict = {}
    for role, size, strides in op.attrs["attention_layout"]:
        out.setdefault(role, []).append((size, dict(zip(names, strides))))
    return out


def _near_misses(module) -> list[str]:
    return [d for op in module.main.body.ops if op.kind == "dot_general"
            for d in op.attrs.get("decisions", ())]


@pytest.mark.parametrize("old, new", [((1, 256, 4, 64), (1, 256, 2, 2, 64)),
                                      ((2, 3, 4), (6, 4)), ((4, 1, 6), (2, 2, 6))])
def test_reshape_strides_of_a_row_major_buffer_match_numpy(old, new):
    expect = tuple(s // 8 for s in np.zeros(old).reshape(new).strides)
    got = reshape_strides(old, row_major(old), new)
    assert [g for g, n in zip(got, new) if n != 1] == [e for e, n in zip(expect, new) if n != 1]


def test_reshape_strides_refuse_a_transposed_merge():
    assert reshape_strides((3, 2, 4), (4, 12, 1), (3, 8)) is None


def test_dot_product_attention_reads_bsnh_in_place():
    module = _compile(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True),
                      Q, Q, Q)
    op = _attention(module)
    assert [o.kind for o in module.main.body.ops] == ["constant", "fusion", "func.return"]
    assert [v.type.shape for v in op.operands[:3]] == [(B, S, N, H)] * 3
    assert op.result.type.shape == (B, S, N, H)
    axes = _axes(op)
    assert axes["batch"] == [(N, {"q": H, "k": H, "v": H, "out": H, "mask": 0, "bias": 0})]
    assert axes["sq"][0][1]["q"] == N * H and axes["sk"][0][1]["k"] == N * H
    assert op.attrs["attention_scale"] == pytest.approx(H ** -0.5)
    assert op.attrs["attention_fill"] == pytest.approx(-0.7 * np.finfo(np.float32).max)
    const = next(o for o in module.main.body.ops if o.results and o.result is op.operands[3])
    mask = const.attrs["value"]                                 # the same for every head
    assert mask.shape in ((S, S), (1, 1, S, S))
    np.testing.assert_array_equal(mask.reshape(S, S), np.tril(np.ones((S, S), bool)))


def test_dot_product_attention_gqa_has_a_group_axis_k_and_v_lack():
    op = _attention(_compile(lambda q, k, v: jax.nn.dot_product_attention(q, k, v), Q, KV, KV))
    axes = _axes(op)
    (size, group), = axes["group"]
    assert size == N // K and group["q"] == H and group["k"] == group["v"] == 0
    assert axes["batch"][0][0] == K and axes["batch"][0][1]["k"] == H


def test_gemma_grouped_einsums_fold_the_scale_of_q():
    def gqa(q, key, value):
        qg = q.reshape(B, S, K, N // K, H) * H ** -0.5
        logits = jnp.einsum("BTKGH,BSKH->BKGTS", qg, key).astype(jnp.float32)
        logits = jnp.where(jnp.tril(jnp.ones((S, S), bool)), logits, -jnp.inf)
        probs = jax.nn.softmax(logits, axis=-1).astype(q.dtype)
        return jnp.einsum("BKGTS,BSKH->BTKGH", probs, value).reshape(B, S, N, H)
    op = _attention(_compile(gqa, Q, KV, KV))
    assert op.operands[0].type.shape == (B, S, N, H)           # q before reshape and scale
    assert op.attrs["attention_scale"] == pytest.approx(H ** -0.5, rel=1e-2)   # bf16
    assert op.attrs["attention_fill"] == -np.inf
    assert _axes(op)["group"][0][0] == N // K


def test_linen_attention_divides_by_sqrt_d_and_keeps_a_runtime_mask():
    import flax.linen as nn
    layer = nn.MultiHeadDotProductAttention(num_heads=N, qkv_features=N * H,
                                            dtype=jnp.bfloat16)
    x = jnp.zeros((B, S, N * H), jnp.bfloat16)
    params = jax.eval_shape(layer.init, jax.random.key(0), x, x)
    f = lambda p, x, valid: layer.apply(  # noqa: E731
        p, x, x, mask=nn.make_attention_mask(valid, valid))
    module = _compile(f, params, x, jnp.zeros((B, S), bool))
    op = _attention(module)
    assert op.attrs["attention_scale"] == pytest.approx(H ** -0.5, rel=1e-2)
    assert op.attrs["attention_fill"] == float(jnp.finfo(jnp.bfloat16).min)
    rows, cols = op.operands[3:5]   # make_attention_mask's `and` as its two vectors,
    assert op.attrs["attention_mask_outer"]                     # not its float round trip
    assert rows.type.dtype == cols.type.dtype == "bool"
    assert rows.type.shape == cols.type.shape == (B, S)
    assert "compare" not in [o.kind for o in module.main.body.ops]
    assert _axes(op)["batch"][0][1]["mask"] == 0               # broadcast over heads


def test_dot_product_attention_bias_is_an_operand():
    bias = jnp.zeros((B, N, S, S), jnp.bfloat16)
    op = _attention(_compile(lambda q, k, v, b: jax.nn.dot_product_attention(q, k, v, bias=b),
                             Q, Q, Q, bias))
    assert op.attrs["attention_bias"] and not op.attrs["attention_mask"]
    assert op.operands[3].type.shape == (B, N, S, S)
    assert _axes(op)["sk"][0][1]["bias"] == 1


def _einsum_attention(scores_fn):
    def f(q, k, v):
        s = scores_fn(jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32))
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1).astype(q.dtype), v)
    return f


def test_a_soft_cap_is_a_near_miss_with_its_reason():
    module = _compile(_einsum_attention(lambda s: 30 * jnp.tanh(s / 30)), Q, Q, Q)
    assert not any(op.kind == "fusion" and op.attrs["fusion_kind"] == "attention"
                   for op in module.main.body.ops)
    assert _near_misses(module) == ["attention: not fused: tanh before the softmax"]


def test_a_small_finite_fill_is_not_a_mask():
    """exp(-10 - max) is not 0: such a 'mask' changes the softmax; not fused, said why."""
    tril = jnp.tril(jnp.ones((S, S), bool))
    module = _compile(_einsum_attention(lambda s: jnp.where(tril, s, -10.0)), Q, Q, Q)
    assert _near_misses(module) == ["attention: not fused: the mask's fill is not -inf or "
                                    "a large negative constant"]


def test_a_bias_after_a_finite_fill_is_a_near_miss():
    tril = jnp.tril(jnp.ones((S, S), bool))

    def f(q, k, v, b):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32)
        s = jnp.where(tril, s, -1e9) + b
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1).astype(q.dtype), v)
    module = _compile(f, Q, Q, Q, jnp.zeros((B, N, S, S), jnp.float32))
    assert _near_misses(module) == ["attention: not fused: a bias added after a finite "
                                    "mask fill"]


def test_a_forbidding_policy_records_its_reason():
    f = lambda q, k, v: jax.nn.dot_product_attention(q, k, v)  # noqa: E731
    module = _compile(f, Q, Q, Q, fuse=False)
    assert not AttentionFusion(FusionPolicy(attention=False)).run(module)
    assert _near_misses(module) == ["attention: not fused: forbidden: attention fusion "
                                    "is off"]


def _dropout_attention(form):
    """Hand-written attention with a dropout on the softmax, as HF-style code and flax's
    nn.Dropout write it (`select`) or as flax's dot_product_attention does (`multiply`)."""
    def f(q, k, v, key):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32)
        p = jax.nn.softmax(s, axis=-1).astype(q.dtype)
        keep = jax.random.bernoulli(key, 0.9, p.shape)
        if form == "select":
            p = jnp.where(keep, p / 0.9, 0)
        else:
            p = p * (keep.astype(p.dtype) / jnp.asarray(0.9, p.dtype))
        return jnp.einsum("bhqk,bkhd->bqhd", p, v)
    return f


@pytest.mark.parametrize("form", ["select", "multiply"])
def test_dropout_on_the_probabilities_is_an_operand(form):
    """The multiplier (or the boolean keep, times 1 / keep_prob) is the last operand;
    its strides are the layout's "drop" column (after "mask_k")."""
    module = _compile(_dropout_attention(form), Q, Q, Q, jax.random.key(0))
    op = _attention(module)
    drop = op.operands[-1]
    assert drop.type.shape == (B, N, S, S)
    assert drop.dtype == ("bool" if form == "select" else "bfloat16")
    assert op.attrs["attention_dropout"] == pytest.approx(
        1 / float(jnp.bfloat16(0.9)) if form == "select" else 1.0)
    layout = op.attrs["attention_layout"]
    assert all(len(strides) == 8 for _, _, strides in layout)
    sk = [strides for role, _, strides in layout if role == "sk"][0]
    assert sk[7] == 1 and sk[6] == 0


def test_flax_attention_dropout_under_grad_is_both_flash_fusions():
    """flax MHA with dropout_rate under jax.grad: the forward and backward fusions both
    take the dropout operand (flax broadcasts one [S, S] draw: stride 0 along B, N)."""
    import flax.linen as nn
    layer = nn.MultiHeadDotProductAttention(num_heads=N, qkv_features=N * H,
                                            dtype=jnp.bfloat16, dropout_rate=0.1)
    x = jnp.zeros((B, S, N * H), jnp.bfloat16)
    params = layer.init(jax.random.key(0), x, x, deterministic=True)

    def step(p, x, key):
        return jax.grad(lambda p: layer.apply(p, x, x, deterministic=False,
                                              rngs={"dropout": key}).astype(
            jnp.float32).sum())(p)
    module = _compile(step, params, x, jax.random.key(1))
    fused = {op.attrs["fusion_kind"]: op for op in module.main.body.ops
             if op.kind == "fusion" and op.attrs["fusion_kind"].startswith("attention")}
    assert set(fused) == {"attention", "attention_bwd"}
    for op in fused.values():
        assert op.attrs["attention_dropout"] == 1.0
        assert op.operands[-1].type.shape == (1, 1, S, S)
    bwd = fused["attention_bwd"].attrs["attention_layout"]
    assert all(len(strides) == 11 for _, _, strides in bwd)
    assert [strides[10] for role, _, strides in bwd if role in ("sq", "sk")] == [S, 1]
