"""The mx-quantize pass (hlo_passes/passes/mx_quantize.py): JAX's MX quantization,
as `jax.nn.scaled_dot_general` and `quantize` emit it, becomes one `mx_quantize` op;
anything that differs from the definition stays as it is."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import hlo_passes
from tests.hlo_passes.helpers import artifact_of, bytecode, serialize

DN = (((2,), (2,)), ((0,), (0,)))


def _kinds(f, *args, platform: str = "cpu") -> list[str]:
    if platform == "cpu":
        code = artifact_of(f, *args)
    else:                       # scaled_matmul lowers for trn only (jax_trn/jax_mx.py)
        jax.devices("trn")
        code = serialize(bytecode(jax.jit(f).trace(*args).lower(
            lowering_platforms=(platform,)).compiler_ir("stablehlo")))
    module = hlo_passes.compile_to_ir(code)
    return [op.kind for op in module.functions[module.entry].body.ops]


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_scaled_dot_general_operands(dtype):
    cfg = jax.nn.get_scaled_dot_general_config("mxfp8")
    a, b = np.zeros((2, 64, 128), dtype), np.zeros((2, 32, 128), dtype)
    kinds = _kinds(lambda a, b: jax.nn.scaled_dot_general(a, b, DN, configs=[cfg] * 3), a, b,
                   platform="trn")
    assert kinds.count("mx_quantize") == 2 and "mx_matmul" in kinds
    assert "reduce" not in kinds and "fusion" not in kinds


def test_quantize_alone_e5m2():
    from jax._src.cudnn.scaled_matmul_stablehlo import BlockScaleConfig, quantize
    cfg = BlockScaleConfig(mode="mxfp8", block_size=32, data_type=ml_dtypes.float8_e5m2,
                           scale_type=ml_dtypes.float8_e8m0fnu, global_scale=None,
                           infer_only=False)
    kinds = _kinds(lambda x: quantize(x, cfg), np.zeros((4, 256), np.float32))
    assert kinds == ["mx_quantize", "func.return"]


def _variant(x, clip=448.0, half=0x400000, block=32):
    """JAX's mxfp8 quantize written out, with knobs that change its meaning."""
    x4 = x.reshape(x.shape[:-1] + (x.shape[-1] // block, block))
    d = jnp.max(jnp.abs(x4), axis=-1, keepdims=True) / jnp.float32(448)
    b = d.view(np.uint32)
    e, m = b >> 23, b & 0x7FFFFF
    up = ((m > 0) & (e != 0xFE)) & ~((e == 0) & (m <= half))
    s = jnp.where(up, e + 1, e).astype(np.uint8)
    f = (s.astype(np.uint32) << 23).view(np.float32)
    f = jnp.where(f == 0, jnp.float32(2.0 ** -127), f)
    q = jnp.clip(x4 / f, -clip, clip).astype(ml_dtypes.float8_e4m3fn).reshape(x.shape)
    return q, s.reshape(s.shape[:-1]).view(ml_dtypes.float8_e8m0fnu)


@pytest.mark.parametrize("knobs,found", [({}, True), ({"clip": 100.0}, False),
                                         ({"half": 0x300000}, False), ({"block": 16}, False)])
def test_only_the_definition_is_replaced(knobs, found):
    kinds = _kinds(lambda x: _variant(x, **knobs), np.zeros((4, 256), np.float32))
    assert ("mx_quantize" in kinds) == found, kinds


def test_nvfp4_scaled_dot_general_operands():
    """nvfp4's quantization (mx_quantize_nv.py) is one op per operand, its
    optimization_barrier gone with it."""
    cfg = jax.nn.get_scaled_dot_general_config("nvfp4")
    a, b = np.zeros((2, 64, 128), np.float32), np.zeros((2, 32, 128), np.float32)
    kinds = _kinds(lambda a, b: jax.nn.scaled_dot_general(a, b, DN, configs=[cfg] * 3), a, b,
                   platform="trn")
    assert kinds.count("mx_quantize") == 2 and "mx_matmul" in kinds, kinds
    assert "optimization_barrier" not in kinds and "reduce" not in kinds, kinds


def test_nvfp4_with_a_traced_global_scale_stays():
    """A global scale that is a runtime value is not the pattern (the op takes a
    compile-time constant): the program stays as written."""
    from jax._src.cudnn.scaled_matmul_stablehlo import BlockScaleConfig, quantize

    def f(x, gs):
        cfg = BlockScaleConfig(mode="nvfp4", block_size=16, data_type=jnp.float4_e2m1fn,
                               scale_type=jnp.float8_e4m3fn, global_scale=gs,
                               infer_only=False)
        return quantize(x, cfg)
    kinds = _kinds(f, np.zeros((4, 256), np.float32), np.ones((1,), np.float32))
    assert "mx_quantize" not in kinds and "optimization_barrier" in kinds, kinds
