"""The degenerate-reduce pass turns a reduce over extent-1 dims into a reshape, as XLA
does (so it fuses: a reduce as a producer never does)."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import hlo_passes
from hlo_passes.passes import degenerate_reduce
from hlo_passes.verifier import verify

from .helpers import artifact_of, from_text, kinds

TEXT = """
  func.func @main(%x: tensor<3x1x2xf32>) -> tensor<3x2xf32> {
    %0 = stablehlo.constant dense<0.0> : tensor<f32>
    %1 = stablehlo.reduce(%x init: %0) applies stablehlo.add across dimensions = [1]
        : (tensor<3x1x2xf32>, tensor<f32>) -> tensor<3x2xf32>
    return %1 : tensor<3x2xf32>
  }"""


def _ops(module):
    from hlo_passes import ir
    return [o.kind for op in module.main.body.ops for o in
            ([op] + (list(ir.walk(op.regions[0].block)) if op.regions else []))]


def test_sum_over_size_one_dim_is_a_reshape():
    """init 0 is add's identity: no add at all (XLA keeps a -0.0 too)."""
    module = hlo_passes.compile_to_ir(artifact_of(lambda x: x.sum(0) * 2,
                                                  jnp.zeros((1, 8, 16), jnp.bfloat16)))
    kinds = _ops(module)
    assert "reduce" not in kinds and "add" not in kinds and "reshape" in kinds


def test_non_identity_init_is_ignored_like_xla(jax, trn, cpu):
    """XLA assumes init is the identity; its CPU backend drops it for extent-1 dims."""
    f = lambda x: jax.lax.reduce(x, np.float32(1.5), jax.lax.add, (1,))  # noqa: E731
    x = np.arange(6, dtype=np.float32).reshape(3, 1, 2)
    kinds = _ops(hlo_passes.compile_to_ir(artifact_of(f, x)))
    assert "reduce" not in kinds
    g = jax.jit(f)
    np.testing.assert_array_equal(np.asarray(g(jax.device_put(x, trn))),
                                  np.asarray(g(jax.device_put(x, cpu))))


def test_real_reductions_stay():
    module = hlo_passes.compile_to_ir(artifact_of(lambda x: x.sum(0),
                                                  jnp.zeros((2, 8), jnp.float32)))
    assert "reduce" in _ops(module)


def test_degenerate_sum_and_max_match_cpu(jax, trn, cpu):
    x = np.array([[[-0.0, 1.5, -2.0], [np.nan, np.inf, 3.0]]], np.float32)
    for f in (lambda x: x.sum(0), lambda x: x.max(0), lambda x: x.prod(0)):
        g = jax.jit(f)
        out = np.asarray(g(jax.device_put(x, trn)))
        ref = np.asarray(g(jax.device_put(x, cpu)))
        np.testing.assert_array_equal(out, ref)
        np.testing.assert_array_equal(np.signbit(out), np.signbit(ref))


def test_the_pass_alone():
    """The reduce becomes a reshape; its init, now unused, is left for dce."""
    module = from_text(TEXT)
    assert degenerate_reduce.run(module)
    verify(module)
    assert kinds(module.main.body) == ["constant", "reshape", "func.return"]
    assert module.main.body.ops[1].result.shape == (3, 2)
    assert not degenerate_reduce.run(module)


def test_disabled_by_its_own_name_not_by_fusion():
    """Was: only JAX_TRN_DISABLE_PASSES=fusion, which disabled fusion too."""
    code = artifact_of(lambda x: x.sum(0) * 2, jnp.zeros((1, 8, 16), jnp.bfloat16))
    assert "reduce" in _ops(hlo_passes.compile_to_ir(
        code, disabled_passes={"degenerate-reduce"}))
    kinds_ = _ops(hlo_passes.compile_to_ir(code, disabled_passes={"fusion"}))
    assert "reduce" not in kinds_ and "reshape" in kinds_ and "fusion" not in kinds_
