"""mx_quantize (jax_trn/lower/mx_quantize.py), JAX's MX quantization as one kernel, run
on the simulated core: bit-exact with JAX's `quantize` on the CPU backend, including
all-zero, tiny (scale byte 0), huge, Inf and NaN blocks."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hlo_passes import ir
from jax_trn.hw.spec import CHIPS
from tests.lower import runner
from tests.lower.irbuild import FnBuilder


def _reference(x: np.ndarray, data: str):
    import jax
    from jax._src.cudnn.scaled_matmul_stablehlo import BlockScaleConfig, quantize
    cfg = BlockScaleConfig(mode="mxfp8", block_size=32, data_type=getattr(ml_dtypes, data),
                           scale_type=ml_dtypes.float8_e8m0fnu, global_scale=None,
                           infer_only=False)
    cpu = jax.devices("cpu")[0]
    q, s = jax.jit(lambda a: quantize(a, cfg))(jax.device_put(x, cpu))
    return np.asarray(q), np.asarray(s)


def _operand(shape, dtype: str, seed: int = 0, special: bool = False) -> np.ndarray:
    """Rows at scales 2**-100 .. 2**100, an all-zero block (scale byte 0), +-Inf and
    blocks near FP32's max. `special`: also NaN and FP32 subnormals, where XLA:CPU
    differs from IEEE (it flushes subnormals to zero, and its max ignores NaN in an
    order-dependent way), so those are compared with the device's unfused ops."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-100, 100, shape[:-1] + (1,)))
    x = x.astype(np.float32)
    flat = x.reshape(-1, shape[-1])
    flat[0, :32] = 0
    flat[2, 3], flat[4, 7] = np.inf, -np.inf
    flat[5, :32] = np.float32(3e38)
    if special:
        flat[1, :32] = np.float32(1e-39)
        flat[3, 40], flat[6, 0] = np.nan, np.float32(2e-40)
    return x.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else x


def _run(x: np.ndarray, data: str, chip: str = "trn3"):
    """The op alone: (q, s) from the simulated core."""
    fb = FnBuilder()
    a = fb.arg(x.shape, str(x.dtype))
    q = ir.Value(ir.TensorType(x.shape, data))
    s = ir.Value(ir.TensorType(x.shape[:-1] + (x.shape[-1] // 32,), "float8_e8m0fnu"))
    fb.ops.append(ir.Op("mx_quantize", [a], [q, s], {"block": 32}))
    res = runner.run(fb.ret(q, s), x, spec=CHIPS[chip].core)
    return res


def _bits(a) -> np.ndarray:
    """The bytes, every NaN of a float8 array as one pattern (NaN payloads and signs
    are not specified by XLA)."""
    a = np.asarray(a)
    bits = a.view(np.uint8).copy()
    if "float8" in str(a.dtype) and "e8m0" not in str(a.dtype):
        bits[np.isnan(a.astype(np.float32))] = 0xFF
    return bits


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("data", ["float8_e4m3fn", "float8_e5m2"])
def test_bit_exact_with_jax(dtype, data):
    """Against XLA:CPU. In bf16 the all-zero block is left out: its scale 2**-127 is a
    bf16 subnormal, which XLA:CPU flushes to zero (0 / 0 = NaN there; 0 here and in
    the device's unfused ops, test_same_as_the_unfused_ops)."""
    x = _operand((2, 136, 96), dtype)
    if dtype == "bfloat16":
        x.reshape(-1, 96)[0, :32] = 1
    want_q, want_s = _reference(x, data)
    got_q, got_s = _run(x, data).outputs
    np.testing.assert_array_equal(_bits(got_s), _bits(want_s))
    np.testing.assert_array_equal(_bits(got_q), _bits(want_q))


def test_long_rows_in_chunks_trn2():
    """K over one chunk (CHUNK values per partition per step) on a core without MX."""
    x = _operand((40, 4160), "float32", seed=1)
    want_q, want_s = _reference(x, "float8_e4m3fn")
    got_q, got_s = _run(x, "float8_e4m3fn", chip="trn2").outputs
    np.testing.assert_array_equal(_bits(got_s), _bits(want_s))
    np.testing.assert_array_equal(_bits(got_q), _bits(want_q))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_same_as_the_unfused_ops(dtype):
    """JAX's quantize compiled with and without the mx-quantize pass: one kernel
    instead of ~10, the same bits, NaN, subnormals and zero blocks included."""
    import jax
    import hlo_passes
    from jax._src.cudnn.scaled_matmul_stablehlo import quantize
    from jax_trn.lower import lower_module
    from tests.hlo_passes.helpers import artifact_of
    cfg = jax.nn.get_scaled_dot_general_config("mxfp8")
    x = _operand((1, 136, 96), dtype, seed=2, special=True)
    code = artifact_of(lambda a: quantize(a, cfg), x)
    outs = []
    for disabled in ((), ("mx-quantize",)):
        module = hlo_passes.compile_to_ir(code, disabled_passes=disabled)
        program = lower_module(module, CHIPS["trn3"].core)
        res = runner.run_program(program, [x], CHIPS["trn3"].core)
        outs.append((len(program.kernels), [_bits(o) for o in res.outputs]))
    (n_fused, fused), (n_ops, unfused) = outs
    assert n_fused == 1 and n_ops > 5   # (~10: row fusion joins each block's amax and its uses)
    for a, b in zip(fused, unfused):
        np.testing.assert_array_equal(a, b)
