"""The transposed-dot pass folds a transpose of a dot_general's result that swaps its
free dims into the dot itself: (a @ b).T = b.T @ a.T, operands swapped, no transpose
kernel."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import hlo_passes
from hlo_passes.passes import transposed_dot
from hlo_passes.verifier import verify

from .helpers import artifact_of, from_text, kinds, on_trn_and_cpu

TEXT = """
  func.func @main(%a: tensor<4x3xf32>, %b: tensor<3x5xf32>) -> tensor<5x4xf32> {
    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0]
        : (tensor<4x3xf32>, tensor<3x5xf32>) -> tensor<4x5xf32>
    %1 = stablehlo.transpose %0, dims = [1, 0] : (tensor<4x5xf32>) -> tensor<5x4xf32>
    return %1 : tensor<5x4xf32>
  }"""


def _dots(module):
    return [op for op in module.main.body.ops if op.kind == "dot_general"]


def test_transpose_of_matmul_is_a_swapped_matmul():
    a, b = jnp.zeros((64, 32), jnp.bfloat16), jnp.zeros((32, 48), jnp.bfloat16)
    module = hlo_passes.compile_to_ir(artifact_of(lambda a, b: (a @ b).T, a, b))
    assert "transpose" not in kinds(module.main.body)
    (dot,) = _dots(module)
    assert [v.shape for v in dot.operands] == [(32, 48), (64, 32)]
    assert dot.result.shape == (48, 64)


def test_other_transposes_stay():
    a = jnp.zeros((2, 8, 4), jnp.float32)
    f = lambda a: jnp.einsum("bij,bkj->bik", a, a).transpose(1, 0, 2)  # noqa: E731
    assert "transpose" in kinds(hlo_passes.compile_to_ir(artifact_of(f, a)).main.body)


@pytest.mark.parametrize("f", [
    lambda a, b: (a @ b).T,
    lambda a, b: jnp.einsum("bij,bjk->bik", a[None], b[None]).transpose(0, 2, 1),
    lambda a, b: jnp.dot(a, b, precision="highest").T,
])
def test_transposed_matmul_matches_cpu(jax, trn, cpu, f):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((96, 160)).astype(np.float32)
    b = rng.standard_normal((160, 72)).astype(np.float32)
    out, ref = on_trn_and_cpu(trn, cpu, f, a, b)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)


def test_the_pass_alone():
    module = from_text(TEXT)
    a, b = module.main.args
    assert transposed_dot.run(module)
    verify(module)
    (dot,) = _dots(module)
    assert kinds(module.main.body) == ["dot_general", "func.return"]
    assert dot.operands == [b, a] and dot.result.shape == (5, 4)
    assert dot.attrs["lhs_contracting_dimensions"] == (0,)
    assert dot.attrs["rhs_contracting_dimensions"] == (1,)
    assert not transposed_dot.run(module)


def test_a_dot_with_another_user_keeps_its_transpose():
    module = from_text(TEXT.replace("return %1 : tensor<5x4xf32>",
                                    "%2 = stablehlo.transpose %0, dims = [1, 0] : "
                                    "(tensor<4x5xf32>) -> tensor<5x4xf32>\n"
                                    "    return %2 : tensor<5x4xf32>"))
    assert not transposed_dot.run(module)


def test_disabled_by_its_own_name_not_by_fusion():
    """Was: only JAX_TRN_DISABLE_PASSES=fusion, which disabled fusion too."""
    a, b = jnp.zeros((64, 32), jnp.bfloat16), jnp.zeros((32, 48), jnp.bfloat16)
    code = artifact_of(lambda a, b: (a @ b).T, a, b)
    body = hlo_passes.compile_to_ir(code, disabled_passes={"transposed-dot"}).main.body
    assert "transpose" in kinds(body)
    body = hlo_passes.compile_to_ir(code, disabled_passes={"fusion"}).main.body
    assert kinds(body) == ["dot_general", "func.return"]
