"""dce: StableHLO text in -> changed? -> structure."""
from __future__ import annotations

from hlo_passes.passes import dce
from hlo_passes.verifier import verify
from tests.hlo_passes.helpers import from_text, kinds


def run(text: str):
    module = from_text(text)
    changed = dce.run(module)
    verify(module)
    return changed, module


def test_removes_unused_chain():
    changed, m = run("""
      func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
        %0 = stablehlo.exponential %x : tensor<4xf32>
        %1 = stablehlo.add %0, %0 : tensor<4xf32>
        %2 = stablehlo.negate %x : tensor<4xf32>
        return %2 : tensor<4xf32>
      }""")
    assert changed
    assert kinds(m.main.body) == ["negate", "func.return"]


def test_all_used_not_changed():
    changed, m = run("""
      func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
        %0 = stablehlo.negate %x : tensor<4xf32>
        return %0 : tensor<4xf32>
      }""")
    assert not changed
    assert kinds(m.main.body) == ["negate", "func.return"]


def test_side_effects_kept():
    changed, m = run("""
      func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
        %0 = stablehlo.custom_call @log(%x) {has_side_effect = true} : (tensor<4xf32>) -> tensor<4xf32>
        %1 = stablehlo.custom_call @pure(%x) : (tensor<4xf32>) -> tensor<4xf32>
        return %x : tensor<4xf32>
      }""")
    assert changed
    assert [op.attrs.get("call_target_name") for op in m.main.body.ops[:-1]] == ["log"]


def test_unused_region_op_and_its_outer_operands_removed():
    changed, m = run("""
      func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
        %c = stablehlo.constant dense<0.0> : tensor<f32>
        %one = stablehlo.constant dense<1.0> : tensor<f32>
        %0 = stablehlo.reduce(%x init: %c) across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
          reducer(%a: tensor<f32>, %b: tensor<f32>) {
            %s = stablehlo.add %a, %b : tensor<f32>
            %t = stablehlo.add %s, %one : tensor<f32>
            stablehlo.return %t : tensor<f32>
          }
        return %x : tensor<4xf32>
      }""")
    assert changed
    assert kinds(m.main.body) == ["func.return"]


def test_dead_op_inside_region_removed():
    changed, m = run("""
      func.func @main(%x: tensor<4xf32>) -> tensor<f32> {
        %c = stablehlo.constant dense<0.0> : tensor<f32>
        %0 = stablehlo.reduce(%x init: %c) across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
          reducer(%a: tensor<f32>, %b: tensor<f32>) {
            %dead = stablehlo.multiply %a, %b : tensor<f32>
            %s = stablehlo.add %a, %b : tensor<f32>
            stablehlo.return %s : tensor<f32>
          }
        return %0 : tensor<f32>
      }""")
    assert changed
    assert kinds(m.main.body.ops[1].regions[0].block) == ["add", "return"]
