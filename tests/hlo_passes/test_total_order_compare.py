"""total-order-compare: float compares in total order become signed integer compares
of the order-preserving keys; comparator bodies are left to their lowerings."""
from __future__ import annotations

import numpy as np

from hlo_passes.passes import total_order_compare
from hlo_passes.verifier import verify
from tests.hlo_passes.helpers import from_text, kinds

LT_TO = """
  func.func @main(%x: tensor<8xbf16>, %y: tensor<8xbf16>) -> tensor<8xi1> {
    %c = stablehlo.compare LT, %x, %y, TOTALORDER : (tensor<8xbf16>, tensor<8xbf16>) -> tensor<8xi1>
    return %c : tensor<8xi1>
  }"""

SORT = """
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
    %s = "stablehlo.sort"(%x) ({
      ^bb0(%a: tensor<f32>, %b: tensor<f32>):
        %c = stablehlo.compare LT, %a, %b, TOTALORDER : (tensor<f32>, tensor<f32>) -> tensor<i1>
        stablehlo.return %c : tensor<i1>
    }) {dimension = 0 : i64, is_stable = true} : (tensor<8xf32>) -> tensor<8xf32>
    return %s : tensor<8xf32>
  }"""


def test_a_total_order_compare_compares_integer_keys():
    m = from_text(LT_TO)
    assert total_order_compare.run(m)
    verify(m)
    ops = m.main.body.ops
    assert kinds(m.main.body).count("bitcast_convert") == 2
    (cmp,) = [op for op in ops if op.kind == "compare"]
    assert cmp.attrs["compare_type"] == "SIGNED" and cmp.operands[0].dtype == "int16"


def test_keys_order_like_total_order():
    """The key formula itself, on the values of JAX's searchsorted NaN test."""
    x = np.array([-np.nan, -np.inf, -1.0, -0.0, 0.0, 1.0, np.inf, np.nan], np.float32)
    x[0] = -np.abs(x[0])
    i = x.view(np.int32)
    key = i ^ ((i >> 31) & np.int32(np.iinfo(np.int32).max))
    assert (np.diff(key) > 0).all()


def test_sort_comparators_are_left_alone():
    m = from_text(SORT)
    assert not total_order_compare.run(m)
