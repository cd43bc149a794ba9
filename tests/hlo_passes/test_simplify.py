"""simplify: StableHLO text in -> changed? -> structure."""
from __future__ import annotations

import pytest

from hlo_passes.passes import simplify
from hlo_passes.verifier import verify
from tests.hlo_passes.helpers import from_text, kinds

NO_OPS = {
        "reshape": "stablehlo.reshape %x : (tensor<2x3xf32>) -> tensor<2x3xf32>",
        "convert": "stablehlo.convert %x : tensor<2x3xf32>",
        "transpose": "stablehlo.transpose %x, dims = [0, 1] : (tensor<2x3xf32>) -> tensor<2x3xf32>",
        "broadcast_in_dim": "stablehlo.broadcast_in_dim %x, dims = [0, 1] : (tensor<2x3xf32>) -> tensor<2x3xf32>",
}
REAL_OPS = {
        "reshape": "stablehlo.reshape %x : (tensor<2x3xf32>) -> tensor<3x2xf32>",
        "convert": "stablehlo.convert %x : (tensor<2x3xf32>) -> tensor<2x3xbf16>",
        "transpose": "stablehlo.transpose %x, dims = [1, 0] : (tensor<2x3xf32>) -> tensor<3x2xf32>",
        "broadcast_in_dim": "stablehlo.broadcast_in_dim %x, dims = [1, 2] : (tensor<2x3xf32>) -> tensor<4x2x3xf32>",
}


def program(op_text: str) -> str:
    result = op_text.rsplit("-> ", 1)[-1] if "->" in op_text else "tensor<2x3xf32>"
    return f"""
      func.func @main(%x: tensor<2x3xf32>) -> {result} {{
        %0 = {op_text}
        %1 = stablehlo.negate %0 : {result}
        return %1 : {result}
      }}"""


def run(text: str):
    module = from_text(text)
    changed = simplify.run(module)
    verify(module)
    return changed, module


@pytest.mark.parametrize("kind", sorted(NO_OPS))
def test_no_op_removed(kind):
    changed, m = run(program(NO_OPS[kind]))
    assert changed
    assert kinds(m.main.body) == ["negate", "func.return"]
    assert m.main.body.ops[0].operands[0] is m.main.args[0]


@pytest.mark.parametrize("kind", sorted(REAL_OPS))
def test_real_op_kept(kind):
    changed, m = run(program(REAL_OPS[kind]))
    assert not changed
    assert kinds(m.main.body) == [kind, "negate", "func.return"]


def test_chain_of_no_ops_collapses_to_the_argument():
    changed, m = run("""
      func.func @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
        %0 = stablehlo.reshape %x : (tensor<2x3xf32>) -> tensor<2x3xf32>
        %1 = stablehlo.convert %0 : tensor<2x3xf32>
        return %1 : tensor<2x3xf32>
      }""")
    assert changed
    assert m.main.body.ops[-1].operands[0] is m.main.args[0]
