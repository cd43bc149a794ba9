"""The dot-operand-transpose pass folds a transpose that feeds only dot_generals into
their dimension numbers (XLA's algebraic simplifier does the same): `x @ E.T` reads E
as it is, with no transpose kernel."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_passes
from hlo_passes.passes import dot_operand_transpose
from hlo_passes.verifier import verify

from .helpers import artifact_of, from_text, kinds, on_trn_and_cpu

TEXT = """
  func.func @main(%x: tensor<4x3xf32>, %e: tensor<5x3xf32>) -> tensor<4x5xf32> {
    %0 = stablehlo.transpose %e, dims = [1, 0] : (tensor<5x3xf32>) -> tensor<3x5xf32>
    %1 = stablehlo.dot_general %x, %0, contracting_dims = [1] x [0]
        : (tensor<4x3xf32>, tensor<3x5xf32>) -> tensor<4x5xf32>
    return %1 : tensor<4x5xf32>
  }"""


def _dots(module):
    return [op for op in module.main.body.ops if op.kind == "dot_general"]


def test_the_pass_alone():
    module = from_text(TEXT)
    x, e = module.main.args
    assert dot_operand_transpose.run(module)
    module.main.body.ops = [op for op in module.main.body.ops if op.kind != "transpose"]
    verify(module)
    (dot,) = _dots(module)
    assert dot.operands == [x, e] and dot.result.shape == (4, 5)
    assert dot.attrs["rhs_contracting_dimensions"] == (1,)
    assert not dot_operand_transpose.run(module)


def test_a_transpose_with_another_user_stays():
    module = from_text(TEXT.replace("return %1 : tensor<4x5xf32>",
                                    "return %1, %0 : tensor<4x5xf32>, tensor<3x5xf32>")
                       .replace("-> tensor<4x5xf32> {", "-> (tensor<4x5xf32>, tensor<3x5xf32>) {"))
    assert not dot_operand_transpose.run(module)


def test_tied_embedding_logits_have_no_transpose():
    x, e = jnp.zeros((64, 32), jnp.bfloat16), jnp.zeros((96, 32), jnp.bfloat16)
    module = hlo_passes.compile_to_ir(artifact_of(lambda x, e: x @ e.T, x, e))
    assert "transpose" not in kinds(module.main.body)
    (dot,) = _dots(module)
    assert [v.shape for v in dot.operands] == [(64, 32), (96, 32)]


def test_a_transpose_reordering_free_dims_stays():
    """b [N1, N2, K] read as [K, N2, N1]: the dot's free dims would come out in the other
    order, so the copy stays."""
    a, b = jnp.zeros((8, 16), jnp.float32), jnp.zeros((3, 5, 16), jnp.float32)
    f = lambda a, b: jnp.einsum("mk,knj->mnj", a, b.transpose(2, 1, 0))  # noqa: E731
    assert "transpose" in kinds(hlo_passes.compile_to_ir(artifact_of(f, a, b)).main.body)


@pytest.mark.parametrize("f", [
    lambda x, e: x @ e.T,
    lambda x, e: e.T.T @ x.T,
    lambda x, e: jnp.einsum("bd,vd->bv", x, e),
    lambda x, e: jax.vjp(lambda x: x @ e.T, x)[1](jnp.ones((96, 200), x.dtype))[0] @ e.T,
])
def test_folded_transposes_match_cpu(jax, trn, cpu, f):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 160)).astype(np.float32)
    e = rng.standard_normal((200, 160)).astype(np.float32)
    out, ref = on_trn_and_cpu(trn, cpu, f, x, e)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-3)


def test_disabled_by_its_own_name():
    x, e = jnp.zeros((64, 32), jnp.bfloat16), jnp.zeros((96, 32), jnp.bfloat16)
    code = artifact_of(lambda x, e: x @ e.T, x, e)
    body = hlo_passes.compile_to_ir(code, disabled_passes={"dot-operand-transpose"}).main.body
    assert "transpose" in kinds(body)
