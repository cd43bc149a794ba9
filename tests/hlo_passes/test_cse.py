"""cse: StableHLO text in -> changed? -> structure."""
from __future__ import annotations

import numpy as np

from hlo_passes.passes import cse
from hlo_passes.verifier import verify
from tests.hlo_passes.helpers import from_text, kinds


def run(text: str):
    module = from_text(text)
    changed = cse.run(module)
    verify(module)
    return changed, module


def test_identical_ops_merged_transitively():
    changed, m = run("""
      func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
        %0 = stablehlo.exponential %x : tensor<4xf32>
        %1 = stablehlo.exponential %x : tensor<4xf32>
        %2 = stablehlo.negate %0 : tensor<4xf32>
        %3 = stablehlo.negate %1 : tensor<4xf32>
        %4 = stablehlo.add %2, %3 : tensor<4xf32>
        return %4 : tensor<4xf32>
      }""")
    assert changed
    assert kinds(m.main.body) == ["exponential", "negate", "add", "func.return"]
    add = m.main.body.ops[2]
    assert add.operands[0] is add.operands[1] is m.main.body.ops[1].result


def test_different_attrs_or_constants_not_merged():
    changed, m = run("""
      func.func @main(%x: tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>, tensor<2xf32>, tensor<2xf32>) {
        %0 = stablehlo.transpose %x, dims = [1, 0] : (tensor<4x4xf32>) -> tensor<4x4xf32>
        %1 = stablehlo.transpose %x, dims = [0, 1] : (tensor<4x4xf32>) -> tensor<4x4xf32>
        %2 = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
        %3 = stablehlo.constant dense<[1.0, 3.0]> : tensor<2xf32>
        return %0, %1, %2, %3 : tensor<4x4xf32>, tensor<4x4xf32>, tensor<2xf32>, tensor<2xf32>
      }""")
    assert not changed
    assert len(m.main.body.ops) == 5


def test_equal_constants_merged():
    changed, m = run("""
      func.func @main() -> (tensor<2xf32>, tensor<2xf32>) {
        %0 = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
        %1 = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
        return %0, %1 : tensor<2xf32>, tensor<2xf32>
      }""")
    assert changed
    assert kinds(m.main.body) == ["constant", "func.return"]
    np.testing.assert_array_equal(m.main.body.ops[0].attrs["value"], [1.0, 2.0])


def test_region_reuses_outer_op_but_not_the_reverse():
    changed, m = run("""
      func.func @main(%x: tensor<4xf32>) -> (tensor<f32>, tensor<f32>) {
        %c = stablehlo.constant dense<0.0> : tensor<f32>
        %0 = stablehlo.reduce(%x init: %c) across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
          reducer(%a: tensor<f32>, %b: tensor<f32>) {
            %z = stablehlo.constant dense<0.0> : tensor<f32>
            %s = stablehlo.add %a, %b : tensor<f32>
            %t = stablehlo.add %s, %z : tensor<f32>
            stablehlo.return %t : tensor<f32>
          }
        %1 = stablehlo.reduce(%x init: %c) across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
          reducer(%a: tensor<f32>, %b: tensor<f32>) {
            %s = stablehlo.add %a, %b : tensor<f32>
            stablehlo.return %s : tensor<f32>
          }
        return %0, %1 : tensor<f32>, tensor<f32>
      }""")
    assert changed
    body = m.main.body.ops[1].regions[0].block
    assert kinds(body) == ["add", "add", "return"]
    assert body.ops[1].operands[1] is m.main.body.ops[0].result
    assert kinds(m.main.body) == ["constant", "reduce", "reduce", "func.return"]


def test_side_effects_not_merged():
    changed, _ = run("""
      func.func @main(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
        %0 = stablehlo.custom_call @io(%x) {has_side_effect = true} : (tensor<4xf32>) -> tensor<4xf32>
        %1 = stablehlo.custom_call @io(%x) {has_side_effect = true} : (tensor<4xf32>) -> tensor<4xf32>
        return %0, %1 : tensor<4xf32>, tensor<4xf32>
      }""")
    assert not changed
