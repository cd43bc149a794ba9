"""rank0-windows: StableHLO text in -> changed? -> structure (issue 13: a convolution
with no spatial dims and a rank-0 reduce_window leaked `tuple index out of range`)."""
from __future__ import annotations

from hlo_passes.passes import rank0_windows
from hlo_passes.verifier import verify
from tests.hlo_passes.helpers import from_text, kinds

CONV_0D = """
  func.func @main(%l: tensor<4x3xf32>, %r: tensor<4x3xf32>) -> tensor<2x4xf32> {
    %0 = stablehlo.convolution(%l, %r) dim_numbers = [b, f]x[o, i]->[b, f],
         window = {} {batch_group_count = 2 : i64, feature_group_count = 1 : i64}
         : (tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<2x4xf32>
    return %0 : tensor<2x4xf32>
  }"""

CONV_1D = """
  func.func @main(%l: tensor<1x3x8xf32>, %r: tensor<2x3x3xf32>) -> tensor<1x2x6xf32> {
    %0 = stablehlo.convolution(%l, %r) dim_numbers = [b, f, 0]x[o, i, 0]->[b, f, 0],
         window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64}
         : (tensor<1x3x8xf32>, tensor<2x3x3xf32>) -> tensor<1x2x6xf32>
    return %0 : tensor<1x2x6xf32>
  }"""

REDUCE_WINDOW_0D = """
  func.func @main(%x: tensor<f32>) -> tensor<f32> {
    %c = stablehlo.constant dense<0.0> : tensor<f32>
    %0 = "stablehlo.reduce_window"(%x, %c) <{window_dimensions = array<i64>}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<f32>, tensor<f32>) -> tensor<f32>
    return %0 : tensor<f32>
  }"""


def test_conv_without_spatial_dims_gets_one_of_extent_1():
    module = from_text(CONV_0D)
    result = module.main.body.ops[0].result
    assert rank0_windows.run(module)
    verify(module)
    assert kinds(module.main.body) == ["reshape", "reshape", "convolution", "reshape",
                                       "func.return"]
    conv = module.main.body.ops[2]
    assert [v.shape for v in conv.operands] == [(4, 3, 1), (4, 3, 1)]
    assert conv.result.shape == (2, 4, 1) and conv.attrs["batch_group_count"] == 2
    assert conv.attrs["dimension_numbers"]["output_spatial_dimensions"] == (2,)
    assert conv.attrs["window_strides"] == (1,) and conv.attrs["padding"] == ((0, 0),)
    assert module.main.body.ops[3].result is result


def test_conv_with_spatial_dims_unchanged():
    assert not rank0_windows.run(from_text(CONV_1D))


def test_rank0_reduce_window_runs_on_one_element():
    module = from_text(REDUCE_WINDOW_0D)
    assert rank0_windows.run(module)
    verify(module)
    assert kinds(module.main.body) == ["constant", "reshape", "reduce_window", "reshape",
                                       "func.return"]
    rw = module.main.body.ops[2]
    assert [v.shape for v in rw.operands] == [(1,), ()]
    assert rw.attrs["window_dimensions"] == (1,) and rw.result.shape == (1,)
