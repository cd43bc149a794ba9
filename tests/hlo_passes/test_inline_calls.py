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


# jnp.nanmax(x, where=...) of a (3, 0) array: @_where_0 returns its argument, which is
# the result of the call just inlined before it (issue 13).
IDENTITY_AFTER_CALL = """
  func.func @main(%x: tensor<f16>) -> tensor<3x0xf16> {
    %0 = func.call @fill(%x) : (tensor<f16>) -> tensor<3x0xf16>
    %1 = func.call @same(%0) : (tensor<3x0xf16>) -> tensor<3x0xf16>
    %2 = func.call @same(%1) : (tensor<3x0xf16>) -> tensor<3x0xf16>
    return %2 : tensor<3x0xf16>
  }
  func.func private @fill(%a: tensor<f16>) -> tensor<3x0xf16> {
    %0 = stablehlo.broadcast_in_dim %a, dims = [] : (tensor<f16>) -> tensor<3x0xf16>
    return %0 : tensor<3x0xf16>
  }
  func.func private @same(%a: tensor<3x0xf16>) -> tensor<3x0xf16> {
    return %a : tensor<3x0xf16>
  }"""


def test_call_returning_its_argument_after_an_inlined_call():
    module = from_text(IDENTITY_AFTER_CALL)
    assert inline_calls.run(module)
    verify(module)
    bcast, ret = module.main.body.ops
    assert bcast.kind == "broadcast_in_dim" and ret.operands == [bcast.result]


# grad of a checkpointed scan body with unroll=2: two calls in a while body, the second
# fed by the first's forwarded argument (issue 13).
FORWARDED_IN_WHILE = """
  func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0:2 = stablehlo.while(%i = %c, %v = %x) : tensor<i32>, tensor<3xf32>
    cond {
      %n = stablehlo.constant dense<2> : tensor<i32>
      %p = stablehlo.compare LT, %i, %n, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    } do {
      %1:2 = func.call @step(%v) : (tensor<3xf32>) -> (tensor<3xf32>, tensor<3xf32>)
      %2:2 = func.call @step(%1#1) : (tensor<3xf32>) -> (tensor<3xf32>, tensor<3xf32>)
      %3 = stablehlo.broadcast_in_dim %2#1, dims = [1] : (tensor<3xf32>) -> tensor<1x3xf32>
      %4 = stablehlo.reshape %3 : (tensor<1x3xf32>) -> tensor<3xf32>
      %one = stablehlo.constant dense<1> : tensor<i32>
      %j = stablehlo.add %i, %one : tensor<i32>
      stablehlo.return %j, %4 : tensor<i32>, tensor<3xf32>
    }
    return %0#1 : tensor<3xf32>
  }
  func.func private @step(%a: tensor<3xf32>) -> (tensor<3xf32>, tensor<3xf32>) {
    %0 = stablehlo.sine %a : tensor<3xf32>
    return %0, %a : tensor<3xf32>, tensor<3xf32>
  }"""


def test_forwarded_argument_chain_inside_a_while_body():
    module = from_text(FORWARDED_IN_WHILE)
    assert inline_calls.run(module)
    verify(module)
    body = module.main.body.ops[1].regions[1].block
    sines = [op for op in body.ops if op.kind == "sine"]
    bcast = next(op for op in body.ops if op.kind == "broadcast_in_dim")
    assert len(sines) == 2 and bcast.operands[0] is body.args[1]
