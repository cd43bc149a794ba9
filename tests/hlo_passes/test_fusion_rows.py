"""Row fusion (hlo_passes/fusion_rows.py): reductions along the trailing axes fused with
the ops that use their results, statistics written out for later kernels."""
from __future__ import annotations

from hlo_passes.fusion_policy import FusionPolicy
from tests.hlo_passes.helpers import kinds
from tests.hlo_passes.test_fusion import SOFTMAX, body, decision, fusions, run


def test_softmax_is_one_row_fusion():
    changed, m = run(SOFTMAX)
    assert changed
    assert kinds(m.main.body) == ["fusion", "func.return"]
    (f,) = fusions(m)
    assert f.attrs["fusion_kind"] == "rows" and f.attrs["row_axes"] == 1
    assert body(f) == ["constant", "exponential", "reduce", "broadcast_in_dim", "divide",
                       "return"]
    assert decision(f, "reduce") == "row reduction: rows of 16 on chip: fused"
    assert decision(f, "broadcast_in_dim") == "broadcast of vector along dim 0: fused"


LAYERNORM = """
  func.func @main(%x: tensor<4x8x32xf32>) -> (tensor<4x8x32xf32>, tensor<4x8x1xf32>) {
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %n = stablehlo.constant dense<32.0> : tensor<4x8x1xf32>
    %e = stablehlo.constant dense<1.0e-5> : tensor<4x8x1xf32>
    %s = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [2]
        : (tensor<4x8x32xf32>, tensor<f32>) -> tensor<4x8xf32>
    %s1 = stablehlo.reshape %s : (tensor<4x8xf32>) -> tensor<4x8x1xf32>
    %mu = stablehlo.divide %s1, %n : tensor<4x8x1xf32>
    %mb = stablehlo.broadcast_in_dim %mu, dims = [0, 1, 2]
        : (tensor<4x8x1xf32>) -> tensor<4x8x32xf32>
    %xc = stablehlo.subtract %x, %mb : tensor<4x8x32xf32>
    %sq = stablehlo.multiply %xc, %xc : tensor<4x8x32xf32>
    %v = stablehlo.reduce(%sq init: %z) applies stablehlo.add across dimensions = [2]
        : (tensor<4x8x32xf32>, tensor<f32>) -> tensor<4x8xf32>
    %v1 = stablehlo.reshape %v : (tensor<4x8xf32>) -> tensor<4x8x1xf32>
    %var = stablehlo.divide %v1, %n : tensor<4x8x1xf32>
    %ve = stablehlo.add %var, %e : tensor<4x8x1xf32>
    %r = stablehlo.rsqrt %ve : tensor<4x8x1xf32>
    %rb = stablehlo.broadcast_in_dim %r, dims = [0, 1, 2]
        : (tensor<4x8x1xf32>) -> tensor<4x8x32xf32>
    %y = stablehlo.multiply %xc, %rb : tensor<4x8x32xf32>
    return %y, %r : tensor<4x8x32xf32>, tensor<4x8x1xf32>
  }"""


def test_layernorm_is_one_row_fusion_returning_its_statistic():
    changed, m = run(LAYERNORM)
    assert changed
    assert kinds(m.main.body) == ["fusion", "func.return"]
    (f,) = fusions(m)
    assert f.attrs["fusion_kind"] == "rows" and f.attrs["row_axes"] == 1
    assert body(f).count("reduce") == 2
    assert decision(f, "rsqrt") == "fused; also a function result (extra output)"
    assert m.main.body.terminator.operands == list(f.results)


def test_rows_longer_than_max_row_are_not_fused():
    _, m = run(LAYERNORM, FusionPolicy(max_row=16))
    assert all(f.attrs["fusion_kind"] != "rows" for f in fusions(m))
    assert len(fusions(m)) > 1


def test_a_reduce_over_leading_axes_is_not_a_row_reduction():
    _, m = run("""
      func.func @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
        %z = stablehlo.constant dense<0.0> : tensor<f32>
        %s = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [0]
            : (tensor<8x16xf32>, tensor<f32>) -> tensor<16xf32>
        %b = stablehlo.broadcast_in_dim %s, dims = [1] : (tensor<16xf32>) -> tensor<8x16xf32>
        %r = stablehlo.divide %x, %b : tensor<8x16xf32>
        return %r : tensor<8x16xf32>
      }""")
    assert [f.attrs["fusion_kind"] for f in fusions(m)] == ["reduction", "loop"]


LATER_AND_EARLIER = """
  func.func @main(%x: tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8xf32>) {
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [1]
        : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>
    %u = stablehlo.multiply %s, %s : tensor<8xf32>
    %b = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<8xf32>) -> tensor<8x16xf32>
    %r = stablehlo.divide %x, %b : tensor<8x16xf32>
    return %r, %u : tensor<8x16xf32>, tensor<8xf32>
  }"""


def test_a_statistic_read_before_the_region_is_not_written_out():
    """%u comes before the row fusion's root: the fusion's output would come too late
    for it, so the reduce stays a kernel of its own (no cycle, no use before def)."""
    _, m = run(LATER_AND_EARLIER)
    rows = [f for f in fusions(m) if f.attrs["fusion_kind"] == "rows"]
    assert not rows
    loop = fusions(m)[-1]
    assert decision(loop, "reduce") == "forbidden: reduce result has 1 user(s) before " \
                                       "the region"


def test_a_statistic_read_after_the_region_is_written_out():
    text = LATER_AND_EARLIER.replace(
        """    %u = stablehlo.multiply %s, %s : tensor<8xf32>
    %b""", "    %b").replace(
        """    return %r, %u""", """    %u = stablehlo.multiply %s, %s : tensor<8xf32>
    return %r, %u""")
    _, m = run(text)
    rows = [f for f in fusions(m) if f.attrs["fusion_kind"] == "rows"]
    assert len(rows) == 1 and len(rows[0].results) == 2
    assert "also written out for 1 later user (extra output)" in decision(rows[0], "reduce")


ROW_AND_COLUMN = """
  func.func @main(%v: tensor<4xf32>, %a: tensor<4xf32>) -> tensor<4x4xf32> {
    %m = stablehlo.multiply %v, %a : tensor<4xf32>
    %c = stablehlo.broadcast_in_dim %m, dims = [0] : (tensor<4xf32>) -> tensor<4x4xf32>
    %r = stablehlo.broadcast_in_dim %m, dims = [1] : (tensor<4xf32>) -> tensor<4x4xf32>
    %o = stablehlo.multiply %c, %r : tensor<4x4xf32>
    return %o : tensor<4x4xf32>
  }"""


def test_a_row_value_also_read_along_the_row_is_not_computed_in_the_region():
    """v (x) v for a computed v: v on [P, 1] serves the column broadcast, but the row
    broadcast would need it re-laid out along the free axis. It was fused through the
    column edge anyway, and the row view read the [P, 1] values: a wrong outer product
    (lax.linalg.tridiagonal's rank-2 update was off by O(1))."""
    _, m = run(ROW_AND_COLUMN)
    f = fusions(m)[-1]
    assert "multiply" not in body(f)[:-2]
    assert any("computed values are not re-laid out" in d for d in f.attrs["decisions"])
