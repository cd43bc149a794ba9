"""The attention-fusion pass turns softmax(mask(q @ k^T * scale)) @ v into one "attention"
fusion (the pattern: hlo_passes/attention_pattern.py), folding an iota-built mask into a
constant."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import hlo_passes
from hlo_passes.fusion_policy import FusionPolicy
from hlo_passes.passes import dce
from hlo_passes.passes.attention_fusion import AttentionFusion
from hlo_passes.verifier import verify

from .helpers import artifact_of, kinds

ARG = jnp.zeros((1, 2, 64, 32), jnp.bfloat16)


def causal(q, k, v):
    s = q.shape[-2]
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) * 0.25
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -jnp.inf)
    p = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(q.dtype)
    return jnp.einsum("bhqk,bhkd->bhqd", p, v)


def _attention_ops(module):
    return [op for op in module.main.body.ops
            if op.kind == "fusion" and op.attrs["fusion_kind"] == "attention"]


def test_causal_attention_is_one_fusion_with_a_constant_mask():
    module = hlo_passes.compile_to_ir(artifact_of(causal, ARG, ARG, ARG))
    assert kinds(module.main.body) == ["constant", "fusion", "func.return"]
    (op,) = _attention_ops(module)
    assert op.attrs["attention_scale"] == 0.25 and op.attrs["attention_mask"]
    mask = op.operands[3].type
    assert (mask.shape, mask.dtype) == ((64, 64), "bool")
    const = module.main.body.ops[0].attrs["value"]
    np.testing.assert_array_equal(const, np.tril(np.ones((64, 64), bool)))
    assert "50% masked" not in op.attrs["decisions"][0]
    assert op.attrs["decisions"][0].startswith("attention: softmax(q @ k^T * 0.25, "
                                               "compile-time mask")
    region_kinds = {o.kind for o in op.regions[0].block.ops}
    assert {"dot_general", "reduce", "exponential", "divide", "select"} <= region_kinds


def test_unscaled_unmasked_attention_matches():
    def f(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k)
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)
    (op,) = _attention_ops(hlo_passes.compile_to_ir(artifact_of(f, ARG, ARG, ARG)))
    assert op.attrs["attention_scale"] == 1.0 and not op.attrs["attention_mask"]


def test_scores_used_elsewhere_do_not_fuse_as_attention():
    def f(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k)
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v), s
    assert not _attention_ops(hlo_passes.compile_to_ir(artifact_of(f, ARG, ARG, ARG)))


def test_policy_can_forbid_attention():
    module = hlo_passes.compile_to_ir(artifact_of(causal, ARG, ARG, ARG), fuse=False)
    assert not AttentionFusion(FusionPolicy(attention=False)).run(module)
    assert not _attention_ops(module)
    assert AttentionFusion().run(module)
    verify(module)
    assert len(_attention_ops(module)) == 1


def test_the_policy_given_to_the_pipeline_decides():
    module = hlo_passes.compile_to_ir(artifact_of(causal, ARG, ARG, ARG), fuse=False)
    hlo_passes.default_pipeline(policy=FusionPolicy(attention=False)).run(module)
    assert not _attention_ops(module)
    assert "fusion" in kinds(module.main.body)          # loop / reduction fusions still


def test_the_pass_leaves_valid_ir_and_dead_views_for_dce():
    """Views of the pattern's inner values go with it; views of what stays (the scale
    and -inf broadcasts) stay for the fusion pass to count, as before, and dce."""
    module = hlo_passes.compile_to_ir(artifact_of(causal, ARG, ARG, ARG), fuse=False)
    assert AttentionFusion().run(module)
    verify(module)
    body = kinds(module.main.body)
    assert body.count("fusion") == 1 and "broadcast_in_dim" in body
    dce.run(module)
    assert kinds(module.main.body) == ["constant", "fusion", "func.return"]


def test_disabled_by_its_own_name_not_by_fusion():
    """Was: JAX_TRN_DISABLE_PASSES=fusion disabled attention fusion too."""
    code = artifact_of(causal, ARG, ARG, ARG)
    module = hlo_passes.compile_to_ir(code, disabled_passes={"fusion"})
    assert kinds(module.main.body) == ["constant", "fusion", "func.return"]
    module = hlo_passes.compile_to_ir(code, disabled_passes={"attention-fusion"})
    assert not _attention_ops(module) and "fusion" in kinds(module.main.body)
    module = hlo_passes.compile_to_ir(code, disabled_passes={"attention-fusion", "fusion"})
    assert "fusion" not in kinds(module.main.body)


def test_two_layers_sharing_the_mask_both_fuse():
    """CSE shares the mask (and scale) broadcasts between layers: each region clones
    them and the originals stay for the other."""
    def two(q, k, v):
        return causal(causal(q, k, v), k, v)
    module = hlo_passes.compile_to_ir(artifact_of(two, ARG, ARG, ARG))
    assert len(_attention_ops(module)) == 2
