"""split-reductions: StableHLO text in -> changed? -> structure (issue 13: a variadic
reduce / reduce_window that is not an argmax was a compile error)."""
from __future__ import annotations

from hlo_passes.passes import split_reductions
from hlo_passes.verifier import verify
from tests.hlo_passes.helpers import from_text, kinds

PAIR = """
  func.func @main(%x: tensor<3x4xf32>, %y: tensor<3x4xf32>) -> (tensor<3xf32>, tensor<3xf32>) {
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %o = stablehlo.constant dense<1.0> : tensor<f32>
    %0:2 = stablehlo.reduce(%x init: %z), (%y init: %o) across dimensions = [1]
        : (tensor<3x4xf32>, tensor<3x4xf32>, tensor<f32>, tensor<f32>) -> (tensor<3xf32>, tensor<3xf32>)
      reducer(%a0: tensor<f32>, %b0: tensor<f32>) (%a1: tensor<f32>, %b1: tensor<f32>) {
        %s = stablehlo.add %a0, %b0 : tensor<f32>
        %p = stablehlo.multiply %a1, %b1 : tensor<f32>
        stablehlo.return %s, %p : tensor<f32>, tensor<f32>
      }
    return %0#0, %0#1 : tensor<3xf32>, tensor<3xf32>
  }"""

ARGMAX = """
  func.func @main(%x: tensor<4xf32>, %i: tensor<4xi32>) -> (tensor<f32>, tensor<i32>) {
    %m = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %z = stablehlo.constant dense<0> : tensor<i32>
    %0:2 = stablehlo.reduce(%x init: %m), (%i init: %z) across dimensions = [0]
        : (tensor<4xf32>, tensor<4xi32>, tensor<f32>, tensor<i32>) -> (tensor<f32>, tensor<i32>)
      reducer(%a0: tensor<f32>, %b0: tensor<f32>) (%a1: tensor<i32>, %b1: tensor<i32>) {
        %gt = stablehlo.compare GT, %a0, %b0 : (tensor<f32>, tensor<f32>) -> tensor<i1>
        %v = stablehlo.select %gt, %a0, %b0 : tensor<i1>, tensor<f32>
        %k = stablehlo.select %gt, %a1, %b1 : tensor<i1>, tensor<i32>
        stablehlo.return %v, %k : tensor<f32>, tensor<i32>
      }
    return %0#0, %0#1 : tensor<f32>, tensor<i32>
  }"""


def test_separable_pair_becomes_two_reduces():
    module = from_text(PAIR)
    results = module.main.body.ops[2].results
    assert split_reductions.run(module)
    verify(module)
    assert kinds(module.main.body) == ["constant", "constant", "reduce", "reduce",
                                       "func.return"]
    add, mul = module.main.body.ops[2:4]
    assert [add.result, mul.result] == results
    assert kinds(add.regions[0].block) == ["add", "return"]
    assert kinds(mul.regions[0].block) == ["multiply", "return"]
    assert add.operands[1] is module.main.body.ops[0].result
    assert mul.operands[1] is module.main.body.ops[1].result


def test_argmax_body_is_not_separable():
    module = from_text(ARGMAX)
    assert not split_reductions.run(module)
    assert kinds(module.main.body).count("reduce") == 1
