"""A padding mask made as rows & columns (flax's make_attention_mask) reaches the
attention fusion as its two vectors (hlo_passes/attention_outer.py): no [S, S] mask
value is computed outside the fusion, and the layout gives each vector's strides."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import hlo_passes

from .helpers import artifact_of

B, S, N, H = 2, 128, 4, 32
NAMES = ("q", "k", "v", "out", "mask", "bias", "mask_k")


def _attention(module):
    ops = [op for op in module.main.body.ops
           if op.kind == "fusion" and op.attrs["fusion_kind"] == "attention"]
    assert len(ops) == 1, [op.kind for op in module.main.body.ops]
    return ops[0]


def _f(q, k, v, vq, vk):
    s = jnp.einsum("bqnh,bknh->bnqk", q, k) * 0.125
    s = jnp.where(vq[:, None, :, None] & vk[:, None, None, :], s, -1e9)
    return jnp.einsum("bnqk,bknh->bqnh", jax.nn.softmax(s, axis=-1), v)


def _args(mask_shape=(B, S)):
    x = jnp.zeros((B, S, N, H), jnp.bfloat16)
    return x, x, x, jnp.zeros(mask_shape, bool), jnp.zeros(mask_shape, bool)


def test_outer_mask_fuses_as_two_vectors():
    module = hlo_passes.compile_to_ir(artifact_of(_f, *_args()))
    op = _attention(module)
    assert [v.type.shape for v in op.operands[3:]] == [(B, S), (B, S)]
    assert op.attrs["attention_mask_outer"] is True
    assert "mask = rows & columns" in op.attrs["decisions"][0]
    strides = {role: dict(zip(NAMES, s)) for role, _, s in op.attrs["attention_layout"]
               if role in ("sq", "sk")}
    assert strides["sq"]["mask"] == 1 and strides["sq"]["mask_k"] == 0
    assert strides["sk"]["mask"] == 0 and strides["sk"]["mask_k"] == 1
    batch = [dict(zip(NAMES, s)) for role, _, s in op.attrs["attention_layout"]
             if role == "batch"]
    assert sorted(b["mask"] for b in batch) == [0, S]      # per batch, shared by heads
    others = [o for o in module.main.body.ops if o.kind != "fusion" or
              o.attrs.get("fusion_kind") != "attention"]
    assert all(v.type.shape[-2:] != (S, S) for o in others for v in o.results), others


def test_a_whole_mask_input_stays_one_operand():
    """A mask given whole ([B, S, S] input) is read as before, no outer form."""
    def g(q, k, v, m):
        s = jnp.einsum("bqnh,bknh->bnqk", q, k) * 0.125
        s = jnp.where(m[:, None], s, -1e9)
        return jnp.einsum("bnqk,bknh->bqnh", jax.nn.softmax(s, axis=-1), v)
    q = jnp.zeros((B, S, N, H), jnp.bfloat16)
    op = _attention(hlo_passes.compile_to_ir(artifact_of(g, q, q, q,
                                                          np.zeros((B, S, S), bool))))
    assert len(op.operands) == 4 and "attention_mask_outer" not in op.attrs
