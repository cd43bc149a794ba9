"""The attention-bwd-fusion pass: the joint forward + backward graph of an attention
under jax.vjp / jax.grad becomes a forward fusion returning (o, logsumexp) and one
"attention_bwd" fusion returning (dq, dk, dv); a graph that is close but not the
pattern gets a recorded decision."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import hlo_passes
from hlo_passes.fusion_policy import FusionPolicy
from hlo_passes.passes.attention_bwd_fusion import DECISIONS, AttentionBwdFusion
from hlo_passes.verifier import verify

from .helpers import artifact_of, kinds
from .test_attention_fusion import causal

ARG = jnp.zeros((1, 2, 64, 32), jnp.bfloat16)
SCALE = 0.25


def _vjp(f):
    def g(q, k, v, do):
        o, vjp = jax.vjp(f, q, k, v)
        return (o,) + vjp(do)
    return g


def _fusions(module, kind):
    return [op for op in module.main.body.ops
            if op.kind == "fusion" and op.attrs["fusion_kind"] == kind]


def _compile(f, nargs=4, **kw):
    return hlo_passes.compile_to_ir(artifact_of(f, *(ARG,) * nargs), **kw)


def test_vjp_of_causal_attention_is_two_fusions():
    module = _compile(_vjp(causal))
    assert kinds(module.main.body) == ["constant", "fusion", "fusion", "func.return"]
    (fwd,), (bwd,) = _fusions(module, "attention"), _fusions(module, "attention_bwd")
    o, lse = fwd.results
    assert lse.type.shape == (1, 2, 64) and lse.dtype == "float32"
    assert bwd.operands[3:5] == [o, lse] and bwd.operands[5] is module.main.args[3]
    assert bwd.attrs["attention_scale"] == SCALE and bwd.attrs["attention_mask"]
    assert bwd.operands[6] is fwd.operands[3]           # the folded causal mask
    assert [r.type.shape for r in bwd.results] == [(1, 2, 64, 32)] * 3
    assert "writes row logsumexp" in fwd.attrs["decisions"][0]
    assert bwd.attrs["decisions"][0].startswith("attention-bwd: dq, dk, dv")
    assert module.main.body.ops[-1].operands == [o, *bwd.results]
    assert DECISIONS not in module.attrs


def test_grad_with_dead_output_still_fuses():
    """jax.grad of sum(o): the program has no p @ v; the forward fusion makes o."""
    def loss(q, k, v):
        return causal(q, k, v).astype(jnp.float32).sum()
    module = _compile(jax.grad(loss, argnums=(0, 1, 2)), 3)
    assert len(_fusions(module, "attention")) == 1
    (bwd,) = _fusions(module, "attention_bwd")
    assert module.main.body.ops[-1].operands == list(bwd.results)


def test_forward_only_is_left_to_attention_fusion():
    module = _compile(causal, 3)
    assert not _fusions(module, "attention_bwd")
    (fwd,) = _fusions(module, "attention")
    assert len(fwd.results) == 1
    assert DECISIONS not in module.attrs


def _custom(ds_of):
    """Causal attention with a hand-written backward whose ds is ds_of(p32, dp32)."""
    def fwd(q, k, v):
        s = q.shape[-2]
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) * SCALE
        scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -jnp.inf)
        p = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(q.dtype)
        return jnp.einsum("bhqk,bhkd->bhqd", p, v), (q, k, v, p)

    def bwd(res, do):
        q, k, v, p = res
        dv = jnp.einsum("bhqk,bhqd->bhkd", p, do)
        dp = jnp.einsum("bhqd,bhkd->bhqk", do, v).astype(jnp.float32)
        ds = ds_of(p.astype(jnp.float32), dp).astype(q.dtype) * SCALE
        return (jnp.einsum("bhqk,bhkd->bhqd", ds, k), jnp.einsum("bhqk,bhqd->bhkd", ds, q),
                dv)

    f = jax.custom_vjp(lambda q, k, v: fwd(q, k, v)[0])
    f.defvjp(fwd, bwd)
    return f


def test_a_hand_written_backward_of_another_form_fuses():
    """ds = p * (dp - rowsum(p * dp)), the custom-JVP form, not the quotient rule."""
    f = _custom(lambda p, dp: p * (dp - (p * dp).sum(-1, keepdims=True)))
    module = _compile(_vjp(f))
    assert len(_fusions(module, "attention_bwd")) == 1


def test_a_wrong_softmax_vjp_is_not_fused_and_says_why():
    """ds = p * dp (the rowsum term missing): same ops, wrong values."""
    module = _compile(_vjp(_custom(lambda p, dp: p * dp)))
    assert not _fusions(module, "attention_bwd") and not _fusions(module, "attention")
    (note,) = module.attrs[DECISIONS]
    assert note.startswith("attention-bwd: not fused at ")
    assert note.endswith("ds is not p * (dp - rowsum(dp * p))")


def test_p_used_outside_is_not_fused_and_says_why():
    def f(q, k, v, do):
        def attn(q, k, v):
            s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * SCALE
            p = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(q.dtype)
            return jnp.einsum("bhqk,bhkd->bhqd", p, v), p
        o, vjp, p = jax.vjp(attn, q, k, v, has_aux=True)
        return (o, p) + vjp(do)
    module = _compile(f)
    assert not _fusions(module, "attention_bwd")
    (note,) = module.attrs[DECISIONS]
    assert "is also used outside" in note


def test_the_policy_can_forbid_it_and_says_so():
    module = _compile(_vjp(causal), fuse=False)
    assert not AttentionBwdFusion(FusionPolicy(attention=False)).run(module)
    assert module.attrs[DECISIONS] == ("attention-bwd: not fused at " +
                                       module.attrs[DECISIONS][0].split(" at ", 1)[1],)
    assert "forbidden: attention fusion is off" in module.attrs[DECISIONS][0]
    assert AttentionBwdFusion().run(module)
    verify(module)


def test_disabled_by_its_own_name():
    module = _compile(_vjp(causal), disabled_passes={"attention-bwd-fusion"})
    assert not _fusions(module, "attention_bwd") and not _fusions(module, "attention")
    assert "attention-bwd-fusion" in hlo_passes.pass_names()


def test_the_mask_constant_is_the_causal_mask():
    module = _compile(_vjp(causal))
    const = module.main.body.ops[0].attrs["value"]
    np.testing.assert_array_equal(const, np.tril(np.ones((64, 64), bool)))


def test_forward_pass_keeps_p_read_by_a_hand_written_backward():
    """Was: attention-fusion shared p's convert (a "view") with the custom backward that
    reads it, removed the divide under it, and dropped everything downstream (the
    function's return too: "block has no terminator")."""
    f = _custom(lambda p, dp: p * (dp - (p * dp).sum(-1, keepdims=True)))
    module = _compile(_vjp(f), disabled_passes={"attention-bwd-fusion"})
    verify(module)
    assert not _fusions(module, "attention")
    assert module.main.body.ops[-1].kind == "func.return"


def test_a_backward_masked_by_another_mask_is_not_fused():
    """ds zeroed where the forward's mask is not: not this attention's gradient."""
    def ds_of(p, dp):
        s = p.shape[-1]
        ds = p * (dp - (p * dp).sum(-1, keepdims=True))
        return jnp.where(jnp.triu(jnp.ones((s, s), bool)), ds, 0.0)
    module = _compile(_vjp(_custom(ds_of)))
    assert not _fusions(module, "attention_bwd")
    (note,) = module.attrs[DECISIONS]
    assert note.startswith("attention-bwd: not fused at ")


def test_output_written_through_views_is_the_programs_layout():
    """The forward fusion writes o through the transposes after p @ v (attention_axes)
    and the backward reads it with the forward's strides: no transpose is left (was:
    the fusion returned p @ v's [b.., Sq, Dv] and the transpose stayed)."""
    def f(q, k, v):
        return causal(q, k, v).transpose(0, 2, 1, 3)
    do = jnp.zeros((1, 64, 2, 32), jnp.bfloat16)
    module = hlo_passes.compile_to_ir(artifact_of(_vjp(f), ARG, ARG, ARG, do))
    (fwd,), (bwd,) = _fusions(module, "attention"), _fusions(module, "attention_bwd")
    assert fwd.results[0].type.shape == (1, 64, 2, 32)
    assert bwd.operands[3] is fwd.results[0]
    assert not [u for u in module.main.body.ops if u.kind == "transpose"]
    assert DECISIONS not in module.attrs
    verify(module)


def _strides(fusion) -> dict:
    """{role: strides} of a fusion's attention_layout (one axis per role here)."""
    return {role: strides for role, _, strides in fusion.attrs["attention_layout"]}


def test_library_layout_fuses_with_its_strides():
    """jax.nn.dot_product_attention's [B, S, N, H] vjp: one backward fusion reading q,
    k, v, o, do and writing dq, dk, dv in that layout (was: a near miss, "the backward
    kernel reads no other layout yet")."""
    def f(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True)
    arg = jnp.zeros((1, 64, 2, 32), jnp.bfloat16)
    module = hlo_passes.compile_to_ir(artifact_of(_vjp(f), *(arg,) * 4))
    (bwd,) = _fusions(module, "attention_bwd")
    assert DECISIONS not in module.attrs
    assert [r.type.shape for r in bwd.results] == [(1, 64, 2, 32)] * 3
    st = _strides(bwd)          # q k v o mask bias do dq dk dv
    assert st["batch"] == (32, 32, 32, 32, 0, 0, 32, 32, 32, 32)
    assert st["sq"] == (64, 0, 0, 64, 64, 0, 64, 64, 0, 0)
    assert st["sk"] == (0, 64, 64, 0, 1, 0, 0, 0, 64, 64)
    assert not [u for u in module.main.body.ops if u.kind == "transpose"]
    verify(module)


def test_a_runtime_mask_fuses():
    """A mask that is an input of the program: the backward fusion reads it (operand
    6, strides of the forward's mask); was a near miss, "a mask computed at run time"."""
    def f(q, k, v, mask, do):
        def attn(q, k, v):
            s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * SCALE
            s = jnp.where(mask, s, -jnp.inf)
            p = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(q.dtype)
            return jnp.einsum("bhqk,bhkd->bhqd", p, v)
        o, vjp = jax.vjp(attn, q, k, v)
        return (o,) + vjp(do)
    mask = jnp.ones((64, 64), bool)
    module = hlo_passes.compile_to_ir(artifact_of(f, ARG, ARG, ARG, mask, ARG))
    (bwd,) = _fusions(module, "attention_bwd")
    assert bwd.operands[6] is module.main.args[3]
    assert _strides(bwd)["sq"][4] == 64 and _strides(bwd)["sk"][4] == 1
    assert DECISIONS not in module.attrs


def test_a_mask_varying_along_batch_fuses_with_its_batch_stride():
    """A compile-time mask that differs per head is stored with its head dim (the
    kernel reads it per head, as a runtime mask); was a near miss."""
    def f(q, k, v, do):
        def attn(q, k, v):
            s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * SCALE
            h, i = jnp.arange(2)[:, None, None], jnp.arange(64)
            mask = (i[None, :] <= i[:, None] + 8 * h)[None]     # a window per head
            s = jnp.where(mask, s, -jnp.inf)
            p = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(q.dtype)
            return jnp.einsum("bhqk,bhkd->bhqd", p, v)
        o, vjp = jax.vjp(attn, q, k, v)
        return (o,) + vjp(do)
    module = _compile(f)
    (bwd,) = _fusions(module, "attention_bwd")
    assert bwd.operands[6].type.shape == (2, 64, 64)
    assert _strides(bwd)["batch"][4] == 64 * 64
    assert DECISIONS not in module.attrs


def test_a_bias_gradient_is_a_near_miss():
    """jax.grad w.r.t. the bias too: its gradient is ds, which the kernel does not
    write; the decision names the value used outside."""
    def loss(q, k, v, bias):
        return jax.nn.dot_product_attention(q, k, v, bias).astype(jnp.float32).sum()
    arg = jnp.zeros((1, 64, 2, 32), jnp.bfloat16)
    bias = jnp.zeros((1, 2, 64, 64), jnp.bfloat16)
    module = hlo_passes.compile_to_ir(artifact_of(jax.grad(loss, argnums=(0, 1, 2, 3)),
                                                  arg, arg, arg, bias))
    assert not _fusions(module, "attention_bwd")
    (note,) = module.attrs[DECISIONS]
    assert "is also used outside" in note


def test_grad_of_library_attention_fuses():
    """jax.grad of dot_product_attention: o is dead, the dots batch along non-leading
    dims, 5-D unit group dims, f32 dq / dk dots, the quotient-rule softmax VJP: dq, dk
    and dv come from one backward fusion (was: a near miss, "the backward kernel reads
    no other layout yet")."""
    def loss(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True).astype(
            jnp.float32).sum()
    arg = jnp.zeros((1, 64, 2, 32), jnp.bfloat16)
    module = hlo_passes.compile_to_ir(artifact_of(jax.grad(loss, argnums=(0, 1, 2)),
                                                  arg, arg, arg))
    (bwd,) = _fusions(module, "attention_bwd")
    assert DECISIONS not in module.attrs
    assert module.main.body.ops[-1].operands == list(bwd.results)
    assert bwd.attrs["attention_mask"]
    # q is read in place through its unit reshape, which the qk and dk dots both read
    # (was: the fusions read the reshape's result, a copy kernel of its own)
    assert bwd.operands[:3] == module.main.args[:3]
    assert not [op for op in module.main.body.ops if op.kind == "reshape"]
    verify(module)


def test_row_max_reduced_before_a_transpose_gives_lse_in_the_sums_layout():
    """Non-causal jax.nn.dot_product_attention: XLA reduces the row max before a
    transpose and the row sum after it; the forward fusion's logsumexp is computed in
    the sum's layout (was: add of [1, 2, 64, 1] and [1, 1, 2, 64], refused by the
    verifier), and the softmax VJP is evaluated from the scores before the transpose
    (was: a near miss, "the softmax VJP could not be evaluated")."""
    def loss(q, k, v):
        return jax.nn.dot_product_attention(q, k, v).astype(jnp.float32).sum()
    arg = jnp.zeros((1, 64, 2, 32), jnp.bfloat16)
    module = hlo_passes.compile_to_ir(artifact_of(jax.grad(loss, argnums=(0, 1, 2)),
                                                  arg, arg, arg))
    (fwd,), (bwd,) = _fusions(module, "attention"), _fusions(module, "attention_bwd")
    assert DECISIONS not in module.attrs
    assert fwd.results[1].type.shape == (1, 1, 2, 64)
    verify(module)


def test_scale_by_division_on_the_scores_fuses():
    """s / sqrt(d) on f32 scores: the backward divides ds by the same constant."""
    def loss(q, k, v):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
        p = jax.nn.softmax(s / np.sqrt(32.0), axis=-1).astype(q.dtype)
        return jnp.einsum("bhqk,bkhd->bqhd", p, v).astype(jnp.float32).sum()
    arg = jnp.zeros((1, 64, 2, 32), jnp.bfloat16)
    module = hlo_passes.compile_to_ir(artifact_of(jax.grad(loss, argnums=(0, 1, 2)),
                                                  arg, arg, arg))
    (bwd,) = _fusions(module, "attention_bwd")
    assert abs(bwd.attrs["attention_scale"] - 32 ** -0.5) < 1e-6
    assert DECISIONS not in module.attrs


def test_gqa_backward_sums_dk_dv_over_the_group():
    """dot_product_attention with 4 q heads on 2 kv heads: the group axis has q, o,
    do, dq strides and none for k, v, dk, dv (their dot contracts it: the sum over
    the group's q heads); was a near miss, "grouped (GQA) heads"."""
    def loss(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True).astype(
            jnp.float32).sum()
    q, kv = jnp.zeros((1, 64, 4, 32), jnp.bfloat16), jnp.zeros((1, 64, 2, 32), jnp.bfloat16)
    module = hlo_passes.compile_to_ir(artifact_of(jax.grad(loss, argnums=(0, 1, 2)),
                                                  q, kv, kv))
    (bwd,) = _fusions(module, "attention_bwd")
    assert DECISIONS not in module.attrs
    st = _strides(bwd)          # q k v o mask bias do dq dk dv (o: the forward's own)
    assert st["batch"][:3] + st["batch"][4:] == (64, 32, 32, 0, 0, 64, 64, 32, 32)
    assert st["group"][:3] + st["group"][4:] == (32, 0, 0, 0, 0, 32, 32, 0, 0)
    assert [r.type.shape for r in bwd.results] == [(1, 64, 4, 32), (1, 64, 2, 32),
                                                   (1, 64, 2, 32)]
