"""Elementwise ops lowered and run on the simulated NeuronCore, against numpy."""
from __future__ import annotations

import numpy as np
import pytest

from hlo_passes import ir

from . import reference as ref
from .irbuild import FnBuilder, binary, unary
from .runner import run

SHAPES = [(), (0,), (7,), (128,), (130, 3), (3, 5, 7)]
BIG = (256, 512)
FLOAT_UNARY = ["negate", "abs", "exponential", "log", "tanh", "logistic", "sqrt", "rsqrt",
               "sign"]
FLOAT_BINARY = ["add", "subtract", "multiply", "divide", "maximum", "minimum", "power",
                "remainder"]
INT_UNARY = ["negate", "abs", "not"]
INT_BINARY = ["add", "subtract", "multiply", "divide", "maximum", "minimum", "power",
              "and", "or", "xor", "shift_left", "shift_right_logical",
              "shift_right_arithmetic"]
POSITIVE = {"log", "sqrt", "rsqrt", "power"}


def make(shape, dtype: str, kind: str = "", seed: int = 0, role: int = 0) -> np.ndarray:
    """Inputs suited to `kind`: positive for log/sqrt, nonzero divisors, small powers."""
    rng = np.random.default_rng(seed + 7 * role)
    if ir.is_float(dtype):
        x = rng.standard_normal(shape).astype(np.float32) * 2
        if kind in POSITIVE and role == 0:
            x = np.abs(x) + 0.25
        if kind in ("divide", "remainder") and role == 1:
            x = np.where(np.abs(x) < 0.5, 1.5, x)
        if kind == "power" and role == 1:
            x = np.clip(x, -2, 2)
        return x.astype(ir.np_dtype(dtype))
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    lo, hi = ((-5, 6) if role == 0 else (0, 6)) if kind == "power" else (-1000, 1000)
    if kind.startswith("shift") and role == 1:
        lo, hi = 0, 40
    x = rng.integers(lo, hi, shape)
    if kind == "divide" and role == 1:
        x = np.where(x == 0, 3, x)
    return x.astype(ir.np_dtype(dtype))


def check_unary(kind, shape, dtype):
    x = make(shape, dtype, kind)
    out = run(unary(kind, shape, dtype), x).outputs[0]
    ref.assert_close(out, ref.elementwise(kind, dtype, x), dtype)


def check_binary(kind, shape, dtype):
    x, y = make(shape, dtype, kind, role=0), make(shape, dtype, kind, role=1)
    out = run(binary(kind, shape, dtype), x, y).outputs[0]
    ref.assert_close(out, ref.elementwise(kind, dtype, x, y), dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", FLOAT_UNARY)
def test_float_unary(kind, dtype, shape):
    check_unary(kind, shape, dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", FLOAT_BINARY)
def test_float_binary(kind, dtype, shape):
    check_binary(kind, shape, dtype)


@pytest.mark.parametrize("shape", [(), (7,), (130, 3), (3, 5, 7)])
@pytest.mark.parametrize("kind", INT_UNARY)
def test_int_unary(kind, shape):
    check_unary(kind, shape, "int32")


@pytest.mark.parametrize("shape", [(), (7,), (130, 3), (3, 5, 7)])
@pytest.mark.parametrize("kind", INT_BINARY)
def test_int_binary(kind, shape):
    check_binary(kind, shape, "int32")


@pytest.mark.parametrize("kind", ["and", "or", "xor", "maximum", "minimum"])
def test_bool_binary(kind):
    check_binary(kind, (130, 3), "bool")


def test_bool_not():
    check_unary("not", (130, 3), "bool")


@pytest.mark.parametrize("kind,dtype", [("add", "float32"), ("exponential", "bfloat16"),
                                        ("multiply", "int32"), ("divide", "float32")])
def test_large(kind, dtype):
    (check_binary if kind in FLOAT_BINARY + INT_BINARY else check_unary)(kind, BIG, dtype)


def test_int_divide_truncates_toward_zero():
    x = np.array([-7, 7, -8, 5, -1], np.int32)
    y = np.array([2, -2, 3, 3, 5], np.int32)
    out = run(binary("divide", (5,), "int32"), x, y).outputs[0]
    np.testing.assert_array_equal(out, [-3, -3, -2, 1, 0])


def test_bf16_add_rounds_once():
    """bf16 add is bf16(f32(a) + f32(b)): one rounding, like XLA on CPU."""
    a = np.array([1.0, 256.0], ir.np_dtype("bfloat16"))
    b = np.array([2.0 ** -8, 1.0], ir.np_dtype("bfloat16"))
    out = run(binary("add", (2,), "bfloat16"), a, b).outputs[0]
    np.testing.assert_array_equal(out, (a.astype(np.float32) + b.astype(np.float32))
                                  .astype(ir.np_dtype("bfloat16")))


# --- compare / select / convert / clamp ---------------------------------------------------

@pytest.mark.parametrize("shape", [(), (7,), (130, 3), (3, 5, 7)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
@pytest.mark.parametrize("direction", list(ref.COMPARE_REF))
def test_compare(direction, dtype, shape):
    x = make(shape, dtype, seed=1)
    y = np.where(make(shape, "bool", seed=2), x, make(shape, dtype, seed=3))
    m = binary("compare", shape, dtype, out_dtype="bool", comparison_direction=direction,
               compare_type="FLOAT" if ir.is_float(dtype) else "SIGNED")
    out = run(m, x, y).outputs[0]
    np.testing.assert_array_equal(out, ref.COMPARE_REF[direction](x, y))


@pytest.mark.parametrize("shape", [(), (0,), (7,), (130, 3)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32", "bool"])
def test_select(dtype, shape):
    b = FnBuilder()
    p, x, y = b.arg(shape, "bool"), b.arg(shape, dtype), b.arg(shape, dtype)
    m = b.ret(b.op("select", [p, x, y], shape, dtype))
    args = make(shape, "bool", seed=5), make(shape, dtype, seed=6), make(shape, dtype, seed=7)
    out = run(m, *args).outputs[0]
    np.testing.assert_array_equal(out, np.where(*args))


CONVERTS = [("float32", "bfloat16"), ("bfloat16", "float32"), ("float32", "int32"),
            ("int32", "float32"), ("int32", "bfloat16"), ("float32", "bool"),
            ("int32", "bool"), ("bool", "float32"), ("bool", "int32"), ("int32", "int8"),
            ("float32", "float16"), ("uint8", "int32")]


@pytest.mark.parametrize("shape", [(), (7,), (130, 3)])
@pytest.mark.parametrize("src,dst", CONVERTS)
def test_convert(src, dst, shape):
    x = make(shape, src, seed=4) * (3 if src != "bool" else 1)
    out = run(unary("convert", shape, src, out_dtype=dst), x).outputs[0]
    with np.errstate(invalid="ignore"):
        expected = x.astype(np.float32).astype(ir.np_dtype(dst)) if ir.is_float(src) \
            and ir.is_int(dst) else x.astype(ir.np_dtype(dst))
    np.testing.assert_array_equal(out, expected)


def test_convert_float_to_int_saturates_and_zeroes_nan():
    x = np.array([1.7, -1.7, np.nan, 3e10, -3e10], np.float32)
    out = run(unary("convert", (5,), "float32", out_dtype="int32"), x).outputs[0]
    np.testing.assert_array_equal(out, [1, -1, 0, 2**31 - 1, -2**31])


@pytest.mark.parametrize("scalar_bounds", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_clamp(dtype, scalar_bounds):
    shape = (130, 3)
    bshape = () if scalar_bounds else shape
    b = FnBuilder()
    lo, x, hi = b.arg(bshape, dtype), b.arg(shape, dtype), b.arg(bshape, dtype)
    m = b.ret(b.op("clamp", [lo, x, hi], shape, dtype))
    lo_v = np.full(bshape, -300, ir.np_dtype(dtype))
    hi_v = np.full(bshape, 400, ir.np_dtype(dtype))
    x_v = make(shape, dtype) * (300 if ir.is_float(dtype) else 1)
    out = run(m, lo_v, x_v, hi_v).outputs[0]
    np.testing.assert_array_equal(out, np.clip(x_v, lo_v, hi_v))


def test_fp32_tiles_spread_over_vector_and_gpsimd(monkeypatch):
    """spread.py: consecutive tiles of a compute-bound FP32 loop fusion alternate between
    VectorE and GpSimd (same FP32 arithmetic, §2.3/§2.5): faster than VectorE alone,
    the same bits."""
    import jax
    import hlo_passes
    from jax_trn.lower import lower_module, spread
    from tests.hlo_passes.helpers import artifact_of
    from .runner import SPEC, run_program

    def f(x, y):
        return ((x * y - x) * (y + 3.0) - x * x) * (x - y) + y * y
    x, y = (np.random.default_rng(s).standard_normal((512, 1024)).astype(np.float32)
            for s in (1, 2))
    code = artifact_of(f, x, y)

    def go():
        program = lower_module(hlo_passes.compile_to_ir(code, fuse=True), SPEC)
        return program, run_program(program, [x, y])
    program, spread_run = go()
    engines = {i.engine for k in program.kernels for i in k.instructions
               if type(i).__name__ == "TensorTensor"}
    assert engines == {"vector", "gpsimd"}
    cpu = np.asarray(jax.jit(f)(*(jax.device_put(a, jax.devices("cpu")[0]) for a in (x, y))))
    np.testing.assert_allclose(spread_run.outputs[0], cpu, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(spread.Spreader, "after_tile", lambda self, first: None)
    _, alone = go()
    np.testing.assert_array_equal(spread_run.outputs[0], alone.outputs[0])
    assert spread_run.ns < 0.8 * alone.ns


def test_bf16_fast_mode_tiles_stay_on_vector():
    """A BF16 SBUF multiply runs in VectorE's fast mode (§2.3): GpSimd would take ~4x
    longer per tile and share the bus, so no tile moves."""
    x = np.ones((1024, 1024), ir.np_dtype("bfloat16"))
    res = run(binary("multiply", (1024, 1024), "bfloat16"), x, x)
    assert {i.engine for k in res.program.kernels for i in k.instructions
            if type(i).__name__ == "TensorTensor"} == {"vector"}


def test_a_gelu_epilogue_spreads_over_three_engines(monkeypatch):
    """spread.ListSpreader: a matmul epilogue's chunk cannot move whole (its first step
    reads PSUM), so its instructions are list-scheduled over VectorE, GpSimd and
    ScalarE (tensor_scalar multiply / add, §6.2): the same bits, sooner than VectorE
    alone. The program is jax.nn.gelu's forward and gradient as value_and_grad
    leaves them next to a dot."""
    import jax
    import ml_dtypes
    import hlo_passes
    from jax_trn.lower import lower_module, spread
    from tests.hlo_passes.helpers import artifact_of
    from .runner import SPEC, run_program

    def f(x, w):
        y, vjp = jax.vjp(jax.nn.gelu, x @ w)
        return y, vjp(y)[0]
    rng = np.random.default_rng(0)
    x, w = ((rng.standard_normal(s) * 0.1).astype(ml_dtypes.bfloat16)
            for s in ((256, 256), (256, 1024)))
    code = artifact_of(f, x, w)

    def go():
        program = lower_module(hlo_passes.compile_to_ir(code, fuse=True), SPEC)
        return program, run_program(program, [x, w])
    program, spread_run = go()
    (kernel,) = [k for k in program.kernels if "dot_general" in k.name]
    engines = {i.engine for i in kernel.instructions
               if type(i).__name__ in ("TensorTensor", "TensorScalar")}
    assert {"vector", "scalar"} <= engines
    monkeypatch.setattr(spread.ListSpreader, "after_tile", lambda self, first: None)
    _, alone = go()
    for a, b in zip(spread_run.outputs, alone.outputs):
        np.testing.assert_array_equal(a, b)
    assert spread_run.ns < alone.ns
