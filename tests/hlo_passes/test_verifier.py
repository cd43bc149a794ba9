"""verifier: valid programs pass; each broken invariant raises naming the op."""
from __future__ import annotations

import pytest

from hlo_passes import ir
from hlo_passes.errors import VerifyError
from hlo_passes.verifier import verify
from tests.hlo_passes.helpers import from_text

PROGRAM = """
  func.func @main(%x: tensor<4x8xf32>, %w: tensor<8x16xf32>) -> tensor<16xf32> {
    %c = stablehlo.constant dense<0.0> : tensor<f32>
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32> loc("/u/model.py":3:1)
    %1 = stablehlo.transpose %0, dims = [1, 0] : (tensor<4x16xf32>) -> tensor<16x4xf32>
    %2 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<16x4xf32>
    %3 = stablehlo.add %1, %2 : tensor<16x4xf32>
    %4 = stablehlo.reduce(%3 init: %c) across dimensions = [1] : (tensor<16x4xf32>, tensor<f32>) -> tensor<16xf32>
      reducer(%a: tensor<f32>, %b: tensor<f32>) {
        %s = stablehlo.add %a, %b : tensor<f32>
        %t = stablehlo.add %s, %c : tensor<f32>
        stablehlo.return %t : tensor<f32>
      }
    return %4 : tensor<16xf32>
  }"""


def program() -> ir.Module:
    return from_text(PROGRAM)


def op(module: ir.Module, kind: str) -> ir.Op:
    return next(o for o in ir.walk(module.main.body) if o.kind == kind)


def test_valid_program_with_outer_value_in_region():
    verify(program())


def test_use_before_definition():
    m = program()
    ops = m.main.body.ops
    ops[1], ops[2] = ops[2], ops[1]      # transpose before dot_general
    with pytest.raises(VerifyError, match=r"stablehlo.transpose.*not defined before"):
        verify(m)


def test_errors_name_values_as_the_dump_prints_them():
    m = program()
    ops = m.main.body.ops
    ops[1], ops[2] = ops[2], ops[1]
    undefined = ir.value_names(m)[ops[1].operands[0]]
    with pytest.raises(VerifyError, match=f"operand %{undefined} is not defined"):
        verify(m)
    assert f"%{undefined}:" in ir.format_module(m)        # defined, but later


def test_region_value_not_visible_outside():
    m = program()
    inner = op(m, "reduce").regions[0].block.ops[0].result
    m.main.body.ops[-1].operands = [inner]
    with pytest.raises(VerifyError, match="func.return.*not defined"):
        verify(m)


def test_missing_terminator():
    m = program()
    m.main.body.ops.pop()
    with pytest.raises(VerifyError, match="no terminator"):
        verify(m)


def test_return_type_mismatch():
    m = program()
    m.main.result_types = [ir.TensorType((4,), "float32")]
    with pytest.raises(VerifyError, match="returns"):
        verify(m)


def test_value_defined_twice():
    m = program()
    op(m, "add").results = [op(m, "transpose").result]
    with pytest.raises(VerifyError, match="defined twice"):
        verify(m)


def test_bad_elementwise_shapes():
    m = program()
    add = op(m, "add")
    add.operands = [add.operands[0], m.main.args[0]]
    with pytest.raises(VerifyError, match="stablehlo.add.*same shape"):
        verify(m)


def test_bad_broadcast_dims():
    m = program()
    op(m, "broadcast_in_dim").attrs["broadcast_dimensions"] = (0,)
    with pytest.raises(VerifyError, match="broadcast_dimensions"):
        verify(m)


def test_bad_dot_dims_names_the_location():
    m = program()
    op(m, "dot_general").attrs["lhs_contracting_dimensions"] = (0,)
    with pytest.raises(VerifyError, match=r"dot_general.*at /u/model.py:3.*contracting"):
        verify(m)


def test_bad_reduce_dims():
    m = program()
    op(m, "reduce").attrs["dimensions"] = (2,)
    with pytest.raises(VerifyError, match="out of range"):
        verify(m)


def test_bad_transpose_permutation():
    m = program()
    op(m, "transpose").attrs["permutation"] = (0, 0)
    with pytest.raises(VerifyError, match="not a permutation"):
        verify(m)


def test_constant_value_must_match_type():
    m = program()
    op(m, "constant").attrs["value"] = op(m, "constant").attrs["value"].reshape(1)
    with pytest.raises(VerifyError, match="constant.*value"):
        verify(m)
