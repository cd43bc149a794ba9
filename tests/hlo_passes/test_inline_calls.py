"""inline-calls: StableHLO text in -> changed? -> structure."""
from __future__ import annotations

from hlo_passes.passes import inline_calls
from hlo_passes.verifier import verify
from tests.hlo_passes.helpers import ERF_COMPOSITE, from_text, kinds

NESTED = """
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %0 = func.call @outer(%x) : (tensor<4xf32>) -> tensor<4xf32> loc("jit(f)/jit(outer)"("/u/model.py":7:3))
    %1 = func.call @outer(%0) : (tensor<4xf32>) -> tensor<4xf32>
    return %1 : tensor<4xf32>
  }
  func.func private @outer(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = func.call @inner(%a) : (tensor<4xf32>) -> tensor<4xf32> loc("jit(inner)")
    return %0 : tensor<4xf32>
  }
  func.func private @inner(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.tanh %a : tensor<4xf32> loc("tanh")
    return %0 : tensor<4xf32>
  }"""


def test_nested_calls_inlined_and_functions_dropped():
    module = from_text(NESTED)
    assert inline_calls.run(module)
    verify(module)
    assert kinds(module.main.body) == ["tanh", "tanh", "func.return"]
    assert list(module.functions) == ["main"]
    first, second = module.main.body.ops[:2]
    assert second.operands[0] is first.result


def test_inlined_ops_take_the_call_name_and_location():
    module = from_text(NESTED)
    inline_calls.run(module)
    first = module.main.body.ops[0]
    assert first.name == "jit(f)/jit(outer)/jit(inner)/tanh"
    assert first.loc == "/u/model.py:7"


def test_no_calls_not_changed():
    module = from_text("""
      func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
        return %x : tensor<4xf32>
      }""")
    assert not inline_calls.run(module)


def test_public_callee_kept_and_no_inline_respected():
    module = from_text("""
      func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
        %0 = func.call @body(%x) {no_inline} : (tensor<4xf32>) -> tensor<4xf32>
        return %0 : tensor<4xf32>
      }
      func.func private @body(%a: tensor<4xf32>) -> tensor<4xf32> {
        return %a : tensor<4xf32>
      }""")
    assert not inline_calls.run(module)
    assert kinds(module.main.body) == ["func.call", "func.return"]
    assert set(module.functions) == {"main", "body"}


def test_kept_composites_stay():
    module = from_text(ERF_COMPOSITE)
    assert not inline_calls.InlineCalls(keep_composites={"chlo.erf"}).run(module)
    assert kinds(module.main.body) == ["composite", "func.return"]
    assert "erf_impl" in module.functions


def test_regions_in_callee_are_cloned():
    module = from_text("""
      func.func @main(%x: tensor<4xf32>) -> (tensor<f32>, tensor<f32>) {
        %0 = func.call @total(%x) : (tensor<4xf32>) -> tensor<f32>
        %1 = func.call @total(%x) : (tensor<4xf32>) -> tensor<f32>
        return %0, %1 : tensor<f32>, tensor<f32>
      }
      func.func private @total(%x: tensor<4xf32>) -> tensor<f32> {
        %c = stablehlo.constant dense<0.0> : tensor<f32>
        %0 = stablehlo.reduce(%x init: %c) applies stablehlo.add across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
        return %0 : tensor<f32>
      }""")
    assert inline_calls.run(module)
    verify(module)
    reduces = [op for op in module.main.body.ops if op.kind == "reduce"]
    assert len(reduces) == 2
    assert reduces[0].regions[0].block is not reduces[1].regions[0].block
