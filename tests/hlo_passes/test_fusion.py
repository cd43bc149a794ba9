"""fusion: StableHLO text in -> changed? -> fusion ops, their regions and recorded reasons."""
from __future__ import annotations

import jax.numpy as jnp
import pytest

import hlo_passes
from hlo_passes import ir
from hlo_passes.errors import VerifyError
from hlo_passes.fusion_policy import FusionDecision, FusionPolicy
from hlo_passes.passes import fusion
from hlo_passes.verifier import verify
from tests.hlo_passes.helpers import all_kinds, artifact_of, from_text, kinds


def run(text: str, policy: FusionPolicy | None = None):
    module = from_text(text)
    changed = fusion.Fusion(policy).run(module)
    verify(module)
    return changed, module


def fusions(module: ir.Module) -> list[ir.Op]:
    return [op for op in module.main.body.ops if op.kind == "fusion"]


def body(op: ir.Op) -> list[str]:
    return kinds(op.regions[0].block)


def decision(op: ir.Op, producer: str) -> str:
    """The recorded reason for the producer kind `producer` (exactly one)."""
    (d,) = [d for d in op.attrs["decisions"] if d.startswith(producer + " ")]
    return d.split(": ", 1)[1]


CHAIN = """
  func.func @main(%x: tensor<8x4xf32>, %y: tensor<8x4xf32>) -> tensor<8x4xf32> {
    %c = stablehlo.constant dense<2.0> : tensor<f32>
    %b = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<8x4xf32>
    %0 = stablehlo.multiply %x, %b : tensor<8x4xf32>
    %1 = stablehlo.tanh %0 : tensor<8x4xf32>
    %2 = stablehlo.multiply %1, %y : tensor<8x4xf32>
    return %2 : tensor<8x4xf32>
  }"""


def test_elementwise_chain_becomes_one_loop_fusion():
    changed, m = run(CHAIN)
    assert changed
    assert kinds(m.main.body) == ["fusion", "func.return"]
    (f,) = fusions(m)
    assert f.attrs["fusion_kind"] == "loop"
    assert body(f) == ["constant", "broadcast_in_dim", "multiply", "tanh", "multiply",
                       "return"]
    assert f.operands == m.main.args                       # x and y, read once each
    assert decision(f, "tanh") == "elementwise: fused"
    assert decision(f, "broadcast_in_dim") == "broadcast of scalar: fused"
    assert decision(f, "constant") == "splat constant: fused"
    assert m.main.body.terminator.operands == f.results


def test_region_is_isolated_from_above():
    _, m = run(CHAIN)
    (f,) = fusions(m)
    block = f.regions[0].block
    defined = set(block.args) | {v for op in block.ops for v in op.results}
    assert all(v in defined for op in block.ops for v in op.operands)


def test_nothing_to_fuse_is_unchanged():
    changed, m = run("""
      func.func @main(%x: tensor<4xf32>, %y: tensor<4xf32>) -> tensor<4xf32> {
        %0 = stablehlo.add %x, %y : tensor<4xf32>
        return %0 : tensor<4xf32>
      }""")
    assert not changed
    assert kinds(m.main.body) == ["add", "func.return"]


def test_transpose_is_forbidden_and_says_why():
    changed, m = run("""
      func.func @main(%x: tensor<4x8xf32>) -> tensor<8x4xf32> {
        %0 = stablehlo.transpose %x, dims = [1, 0] : (tensor<4x8xf32>) -> tensor<8x4xf32>
        %1 = stablehlo.exponential %0 : tensor<8x4xf32>
        return %1 : tensor<8x4xf32>
      }""")
    assert changed                      # a one-op fusion that records the decision
    assert kinds(m.main.body) == ["transpose", "fusion", "func.return"]
    (f,) = fusions(m)
    assert body(f) == ["exponential", "return"]
    assert decision(f, "transpose") == "forbidden: transpose changes layout"


def test_function_results_are_extra_outputs():
    changed, m = run("""
      func.func @main(%x: tensor<4xf32>, %y: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
        %0 = stablehlo.exponential %x : tensor<4xf32>
        %1 = stablehlo.add %0, %y : tensor<4xf32>
        return %1, %0 : tensor<4xf32>, tensor<4xf32>
      }""")
    assert changed
    (f,) = fusions(m)
    assert len(f.results) == 2
    assert m.main.body.terminator.operands == [f.results[0], f.results[1]]
    assert decision(f, "exponential") == "fused; also a function result (extra output)"


SOFTMAX = """
  func.func @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %e = stablehlo.exponential %x : tensor<8x16xf32>
    %s = stablehlo.reduce(%e init: %z) applies stablehlo.add across dimensions = [1]
        : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>
    %b = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<8xf32>) -> tensor<8x16xf32>
    %r = stablehlo.divide %e, %b : tensor<8x16xf32>
    return %r : tensor<8x16xf32>
  }"""


def test_exp_is_duplicated_into_the_reduction_and_the_divide():
    changed, m = run(SOFTMAX, FusionPolicy(max_row=0))      # no row fusion
    assert changed
    assert kinds(m.main.body) == ["fusion", "fusion", "func.return"]
    red, loop = fusions(m)
    assert red.attrs["fusion_kind"] == "reduction"
    assert body(red) == ["constant", "exponential", "reduce", "return"]
    assert loop.attrs["fusion_kind"] == "loop"
    assert body(loop) == ["exponential", "broadcast_in_dim", "divide", "return"]
    assert decision(loop, "exponential").startswith("duplicated: recomputed here for 1")
    assert decision(loop, "reduce") == ("forbidden: reduce result feeds the region "
                                        "(needs the whole reduction first)")
    assert decision(red, "exponential") == "elementwise: fused"
    assert "exponential" not in kinds(m.main.body)        # the original is gone


def test_no_duplication_without_budget():
    _, m = run(SOFTMAX, FusionPolicy(dup_budget=1.0, max_row=0))
    assert kinds(m.main.body) == ["exponential", "fusion", "fusion", "func.return"]
    loop = fusions(m)[1]
    assert "duplication budget is spent" in decision(loop, "exponential")


LAYER = """
  func.func @main(%x: tensor<16x32xbf16>, %w: tensor<32x8xbf16>, %b: tensor<8xbf16>)
      -> tensor<16x8xbf16> {
    %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0]
        : (tensor<16x32xbf16>, tensor<32x8xbf16>) -> tensor<16x8xbf16>
    %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<8xbf16>) -> tensor<16x8xbf16>
    %a = stablehlo.add %d, %bb : tensor<16x8xbf16>
    %t = stablehlo.tanh %a : tensor<16x8xbf16>
    return %t : tensor<16x8xbf16>
  }"""


def test_dot_bias_activation_is_a_matmul_epilogue():
    changed, m = run(LAYER)
    assert changed
    (f,) = fusions(m)
    assert kinds(m.main.body) == ["fusion", "func.return"]
    assert f.attrs["fusion_kind"] == "matmul_epilogue"
    assert body(f) == ["dot_general", "broadcast_in_dim", "add", "tanh", "return"]
    assert f.operands == m.main.args
    assert decision(f, "dot_general").startswith("matmul epilogue")
    assert decision(f, "broadcast_in_dim") == "broadcast of vector along dim 1: fused"


def test_dot_with_another_user_stays_outside():
    _, m = run(LAYER.replace("return %t : tensor<16x8xbf16>",
                             "return %t, %d : tensor<16x8xbf16>, tensor<16x8xbf16>")
               .replace("-> tensor<16x8xbf16> {", "-> (tensor<16x8xbf16>, tensor<16x8xbf16>) {"))
    assert kinds(m.main.body) == ["dot_general", "fusion", "func.return"]
    (f,) = fusions(m)
    assert f.attrs["fusion_kind"] == "loop"
    assert decision(f, "dot_general") == ("forbidden: dot_general result has 1 user "
                                          "outside the epilogue")


def test_squared_deviation_fuses_into_its_reduction():
    changed, m = run("""
      func.func @main(%x: tensor<8x16xf32>, %mean: tensor<8xf32>) -> tensor<8xf32> {
        %z = stablehlo.constant dense<0.0> : tensor<f32>
        %mb = stablehlo.broadcast_in_dim %mean, dims = [0] : (tensor<8xf32>) -> tensor<8x16xf32>
        %d = stablehlo.subtract %x, %mb : tensor<8x16xf32>
        %q = stablehlo.multiply %d, %d : tensor<8x16xf32>
        %s = stablehlo.reduce(%q init: %z) applies stablehlo.add across dimensions = [1]
            : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>
        return %s : tensor<8xf32>
      }""")
    assert changed
    (f,) = fusions(m)
    assert f.attrs["fusion_kind"] == "reduction"
    assert body(f) == ["constant", "broadcast_in_dim", "subtract", "multiply", "reduce",
                       "return"]
    assert decision(f, "broadcast_in_dim") == "broadcast of vector along dim 0: fused"


def test_scalar_of_another_shape_is_forbidden():
    _, m = run("""
      func.func @main(%x: tensor<4xf32>, %s: tensor<f32>) -> tensor<4xf32> {
        %lo = stablehlo.exponential %s : tensor<f32>
        %hi = stablehlo.constant dense<3.0> : tensor<f32>
        %0 = stablehlo.clamp %lo, %x, %hi : (tensor<f32>, tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
        return %0 : tensor<4xf32>
      }""")
    f = fusions(m)[-1]
    assert decision(f, "exponential") == "forbidden: shape float32[] differs from the region [4]"
    assert decision(f, "constant") == "splat constant: fused"


def test_a_full_region_stops_growing():
    _, m = run(CHAIN, FusionPolicy(max_ops=2))
    (f,) = fusions(m)[-1:]
    assert body(f) == ["tanh", "multiply", "return"]
    assert decision(f, "multiply") == "forbidden: region is full (2 ops)"


def test_a_full_region_still_takes_splats_and_scalar_broadcasts():
    """They cost nothing inside; left out, a scalar broadcast would be written to HBM at
    the region's full shape (threefry's rotation amounts: 80 MB each for 10^7 samples)."""
    _, m = run(CHAIN, FusionPolicy(max_ops=3))
    (f,) = fusions(m)[-1:]
    assert body(f) == ["constant", "broadcast_in_dim", "multiply", "tanh",
                                         "multiply", "return"]
    assert decision(f, "broadcast_in_dim") == "broadcast of scalar: fused"


def test_no_cycles_through_an_unfused_op():
    """add(exp(x), dot(exp(x), w)): the dot and the add are one epilogue; exp is a dot
    operand, read from memory, so it stays out (and the region reads it)."""
    _, m = run("""
      func.func @main(%x: tensor<4x4xf32>, %w: tensor<4x4xf32>) -> tensor<4x4xf32> {
        %e = stablehlo.exponential %x : tensor<4x4xf32>
        %d = stablehlo.dot_general %e, %w, contracting_dims = [1] x [0]
            : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
        %a = stablehlo.add %e, %d : tensor<4x4xf32>
        return %a : tensor<4x4xf32>
      }""")
    assert kinds(m.main.body) == ["exponential", "fusion", "func.return"]
    (f,) = fusions(m)
    assert f.attrs["fusion_kind"] == "matmul_epilogue"
    assert decision(f, "exponential") == ("forbidden: dot_general reads its operands "
                                          "from memory")
    assert f.operands[0] is m.main.body.ops[0].result


def test_no_cycles_through_an_unfused_user():
    """exp feeds the add directly and through a transpose (not fusible): fusing exp
    would make the region both produce and consume the transpose's input."""
    _, m = run("""
      func.func @main(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
        %e = stablehlo.exponential %x : tensor<4x4xf32>
        %t = stablehlo.transpose %e, dims = [1, 0] : (tensor<4x4xf32>) -> tensor<4x4xf32>
        %a = stablehlo.add %e, %t : tensor<4x4xf32>
        return %a : tensor<4x4xf32>
      }""")
    assert kinds(m.main.body) == ["exponential", "transpose", "fusion", "func.return"]
    (f,) = fusions(m)
    assert decision(f, "exponential") == "forbidden: producer has 1 user outside the region"
    assert decision(f, "transpose") == "forbidden: transpose changes layout"


def test_decisions_are_in_the_ir_dump():
    _, m = run(CHAIN)
    text = ir.format_module(m)
    assert "fusion(%" in text and "fusion_kind='loop'" in text
    assert "// decision: tanh %" in text and "elementwise: fused" in text


def test_verifier_rejects_a_fusion_reading_from_outside():
    _, m = run(CHAIN)
    (f,) = fusions(m)
    inner = f.regions[0].block.ops[2]
    inner.operands[0] = m.main.args[0]           # the outer %x, not the block argument
    with pytest.raises(VerifyError, match="from outside its region"):
        verify(m)


def test_policy_forbids_wide_broadcasts():
    m = from_text("""
      func.func @main(%x: tensor<2x3xf32>) -> tensor<4x2x3xf32> {
        %0 = stablehlo.broadcast_in_dim %x, dims = [1, 2] : (tensor<2x3xf32>) -> tensor<4x2x3xf32>
        %1 = stablehlo.exponential %0 : tensor<4x2x3xf32>
        return %1 : tensor<4x2x3xf32>
      }""")
    bcast, exp = m.main.body.ops[:2]

    class Region:
        shape, kind, size, dup_cost = (4, 2, 3), "loop", 1, 0.0

        def outside_users(self, op):
            return []

        def inside_users(self, op):
            return [exp]

        def settled(self, op):
            return False
    d = FusionPolicy().should_fuse(bcast, exp, Region())
    assert d == FusionDecision(False, "forbidden: broadcast of float32[2,3] (only "
                                      "scalars, vectors, rows of >= 64 and columns fuse)")


def test_compile_to_ir_fuses_and_can_be_disabled():
    code = artifact_of(lambda x: jnp.tanh(x * 2.0) + 1.0, jnp.ones((8, 4)))
    assert kinds(hlo_passes.compile_to_ir(code).main.body) == ["fusion", "func.return"]
    module = hlo_passes.compile_to_ir(code, disabled_passes={"fusion"})
    assert "fusion" not in all_kinds(module)


@pytest.mark.parametrize("src,out,dims,why", [
        ("8x128", "4x64x8x128", "[2, 3]", "broadcast of rows of 1024: fused"),
        ("4x63x1", "4x63x320", "[0, 1, 2]", "broadcast of a column: fused"),
        ("4x63", "4x63x320", "[0, 1]", "broadcast of a column: fused")])
def test_policy_fuses_broadcasts_read_as_rows_or_columns(src, out, dims, why):
    """A bias over [heads, head_dim] or a per-row statistic over the vocabulary merges
    into long rows / one value per row: fused, not materialized in HBM."""
    m = from_text(f"""
      func.func @main(%x: tensor<{src}xf32>) -> tensor<{out}xf32> {{
        %0 = stablehlo.broadcast_in_dim %x, dims = {dims} : (tensor<{src}xf32>) -> tensor<{out}xf32>
        %1 = stablehlo.exponential %0 : tensor<{out}xf32>
        return %1 : tensor<{out}xf32>
      }}""")
    bcast, exp = m.main.body.ops[:2]

    class Region:
        shape, kind, size, dup_cost = tuple(exp.result.shape), "loop", 1, 0.0

        def outside_users(self, op):
            return []

        def inside_users(self, op):
            return [exp]

        def settled(self, op):
            return False
    assert FusionPolicy().should_fuse(bcast, exp, Region()) == FusionDecision(True, why)


UPDATE = """
  func.func @main(%g: tensor<16x32xbf16>, %x: tensor<16x8xbf16>, %p: tensor<32x8xf32>,
                  %m: tensor<32x8xf32>, %v: tensor<32x8xf32>) -> tensor<32x8xf32> {
    %d = stablehlo.dot_general %g, %x, contracting_dims = [0] x [0] : (tensor<16x32xbf16>, tensor<16x8xbf16>) -> tensor<32x8xbf16>
    %df = stablehlo.convert %d : (tensor<32x8xbf16>) -> tensor<32x8xf32>
    %a = stablehlo.add %m, %df : tensor<32x8xf32>
    %s = stablehlo.multiply %df, %df : tensor<32x8xf32>
    %b = stablehlo.add %v, %s : tensor<32x8xf32>
    %q = stablehlo.sqrt %b : tensor<32x8xf32>
    %r = stablehlo.divide %a, %q : tensor<32x8xf32>
    %u = stablehlo.subtract %p, %r : tensor<32x8xf32>
    return %u : tensor<32x8xf32>
  }"""


def test_an_optimizer_update_is_not_a_matmul_epilogue():
    """An update reading params and two moments (AdamW's shape) stays out of the
    gradient's matmul: streamed through its SBUF they made it DMA-bound."""
    _, m = run(UPDATE)
    assert kinds(m.main.body) == ["dot_general", "fusion", "func.return"]
    (f,) = fusions(m)
    assert f.attrs["fusion_kind"] == "loop"
    assert decision(f, "dot_general").startswith("forbidden: the epilogue reads 3 "
                                                 "full-size inputs")
    _, m = run(UPDATE.replace("%u = stablehlo.subtract %p, %r", "%u = stablehlo.negate %r")
               .replace("%b = stablehlo.add %v, %s", "%b = stablehlo.abs %s"))
    (f,) = fusions(m)
    assert f.attrs["fusion_kind"] == "matmul_epilogue"


def test_a_value_read_by_a_later_kernel_is_an_extra_output():
    """GELU's forward as autodiff leaves it: tanh's result is read by the backward's
    kernel (after this region), so the chain is one fusion writing it out too, not a
    kernel per shared value."""
    changed, m = run("""
      func.func @main(%x: tensor<8x16xf32>, %w: tensor<16x16xf32>)
          -> (tensor<8x16xf32>, tensor<8x16xf32>) {
        %c = stablehlo.constant dense<0.5> : tensor<8x16xf32>
        %t = stablehlo.tanh %x : tensor<8x16xf32>
        %y = stablehlo.multiply %t, %c : tensor<8x16xf32>
        %d = stablehlo.dot_general %y, %w, contracting_dims = [1] x [0]
            : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
        %g = stablehlo.dot_general %t, %w, contracting_dims = [1] x [0]
            : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
        return %d, %g : tensor<8x16xf32>, tensor<8x16xf32>
      }""")
    assert changed
    (f,) = fusions(m)
    assert f.attrs["fusion_kind"] == "loop" and len(f.results) == 2
    assert decision(f, "tanh") == ("elementwise; also written out for 1 later user "
                                   "(extra output)")
