"""top_k reaches our IR as one `top_k` op (hlo_passes/mlir_passes.py): from the
`chlo.top_k` composite JAX serializes, from chlo.top_k in text, and from approx_max_k's
ApproxTopK fallback; cases the trn rule does not take stay a sort + slice."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from hlo_passes import importer, mlir_passes
from tests.hlo_passes.helpers import all_kinds, artifact_of


def _imported(code):
    _, module = importer.deserialize(code)
    mlir_passes.run_mlir_passes(module)
    return importer.import_module(module)


def _top_k_ops(module):
    fn = module.functions[module.entry]
    return [op for op in fn.body.ops if op.kind == "top_k"]


@pytest.mark.parametrize("dtype", [np.float32, jax.numpy.bfloat16, np.int32, np.uint8])
def test_top_k_composite_becomes_one_op(dtype):
    x = np.zeros((4, 100), dtype)
    module = _imported(artifact_of(lambda x: jax.lax.top_k(x, 5), x))
    op, = _top_k_ops(module)
    assert op.attrs == {"k": 5} and [r.type.shape for r in op.results] == [(4, 5), (4, 5)]
    assert [r.type.dtype for r in op.results][1] == "int32"


def test_chlo_top_k_text_and_approx_max_k():
    text = """
      func.func @main(%x: tensor<3x40xf32>) -> (tensor<3x7xf32>, tensor<3x7xi32>) {
        %v, %i = chlo.top_k(%x, k = 7) : tensor<3x40xf32> -> (tensor<3x7xf32>, tensor<3x7xi32>)
        return %v, %i : tensor<3x7xf32>, tensor<3x7xi32>
      }"""
    assert _top_k_ops(_imported(text))[0].attrs == {"k": 7}
    x = np.zeros((2, 3, 50), np.float32)
    module = _imported(artifact_of(lambda x: jax.lax.approx_max_k(x, 4), x))
    assert _top_k_ops(module)[0].attrs == {"k": 4}
    module = _imported(artifact_of(lambda x: jax.lax.approx_min_k(x, 4), x))
    assert not _top_k_ops(module) and "custom_call" in all_kinds(module)


def test_cases_the_rule_does_not_take_stay_a_sort():
    long = np.zeros((2, mlir_passes.TOP_K_MAX_LEN + 1), np.float32)
    big_k = np.zeros((2, 100), np.float32)
    for x, k in ((long, 3), (big_k, mlir_passes.TOP_K_MAX_K + 1)):
        module = _imported(artifact_of(lambda x: jax.lax.top_k(x, k), x))
        assert not _top_k_ops(module)
    with jax.enable_x64(True):
        module = _imported(artifact_of(lambda x: jax.lax.top_k(x, 3), np.zeros(9, np.int64)))
    assert not _top_k_ops(module)
    mlir_passes.KEEP_TOP_K = False
    try:
        module = _imported(artifact_of(lambda x: jax.lax.top_k(x, 3), big_k))
    finally:
        mlir_passes.KEEP_TOP_K = True
    assert not _top_k_ops(module)
