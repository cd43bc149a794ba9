"""convert-into-reduce: an f32 reduction read through reshapes by a convert to bf16 is one
reduction with the bf16 result; anything else is left alone."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import hlo_passes
from hlo_passes.passes import convert_into_reduce
from hlo_passes.verifier import verify
from tests.hlo_passes.helpers import artifact_of, from_text, kinds

GAIN_GRAD = """
  func.func @main(%x: tensor<8x16xf32>) -> tensor<16xbf16> {
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [0]
        : (tensor<8x16xf32>, tensor<f32>) -> tensor<16xf32>
    %r = stablehlo.reshape %s : (tensor<16xf32>) -> tensor<1x16xf32>
    %q = stablehlo.reshape %r : (tensor<1x16xf32>) -> tensor<16xf32>
    %g = stablehlo.convert %q : (tensor<16xf32>) -> tensor<16xbf16>
    return %g : tensor<16xbf16>
  }"""


def test_reduce_reshapes_convert_become_one_reduce():
    m = from_text(GAIN_GRAD)
    assert convert_into_reduce.run(m)
    verify(m)
    assert kinds(m.main.body) == ["constant", "reduce", "func.return"]
    (red,) = [o for o in m.main.body.ops if o.kind == "reduce"]
    assert str(red.result.type) == "bfloat16[16]"
    assert m.main.body.terminator.operands == [red.result]


def test_a_reshape_to_another_shape_stays_one_reshape():
    m = from_text(GAIN_GRAD.replace("tensor<16xbf16>", "tensor<1x16xbf16>").replace(
        "%g = stablehlo.convert %q : (tensor<16xf32>)",
        "%g = stablehlo.convert %r : (tensor<1x16xf32>)").replace(
        "    %q = stablehlo.reshape %r : (tensor<1x16xf32>) -> tensor<16xf32>\n", ""))
    assert convert_into_reduce.run(m)
    verify(m)
    assert kinds(m.main.body) == ["constant", "reduce", "reshape", "func.return"]
    assert str(m.main.body.terminator.operands[0].type) == "bfloat16[1,16]"


def test_a_reduction_with_another_user_is_left_alone():
    m = from_text(GAIN_GRAD.replace("-> tensor<16xbf16> {", "-> (tensor<16xbf16>, tensor<16xf32>) {")
                  .replace("return %g : tensor<16xbf16>",
                           "return %g, %s : tensor<16xbf16>, tensor<16xf32>"))
    assert not convert_into_reduce.run(m)


def test_same_result_as_the_f32_sum_then_the_convert():
    """One rounding of the FP32 sum either way; against the CPU backend's f32 sum and
    convert (its own summation order: within bf16 rounding)."""
    x = np.random.default_rng(0).standard_normal((300, 48)).astype(np.float32)

    def f(x):
        return x.sum(0).reshape(1, 48).reshape(48).astype(jnp.bfloat16)
    code = artifact_of(f, x)
    fused = hlo_passes.compile_to_ir(code)
    plain = hlo_passes.compile_to_ir(code, disabled_passes={"convert-into-reduce"})
    assert len(fused.main.body.ops) < len(plain.main.body.ops)
    got = jax.jit(f)(jax.device_put(x, jax.devices("trn")[0]))
    want = jax.jit(f)(jax.device_put(x, jax.devices("cpu")[0]))
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=2 ** -8, atol=1e-6)
