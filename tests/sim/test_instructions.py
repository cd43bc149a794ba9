"""Truth tables: one instruction, a few input rows, the expected output rows."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from jax_trn.hw import DramAP, isa
from tests.sim.helpers import col, core, run1, tile

NAN, INF = float("nan"), float("inf")


def tt(op, a, b, dtype="float32", out="float32", engine="vector"):
    a, b = np.asarray(a), np.asarray(b)
    x, y, d = tile((1, a.size), dtype), tile((1, a.size), dtype), tile((1, a.size), out)
    instr = isa.TensorTensor(dst=d, data1=x, data2=y, op=op, engine=engine)
    return run1(instr, {x: a.reshape(1, -1), y: b.reshape(1, -1)})[0]


@pytest.mark.parametrize("op, a, b, expected", [
    ("add", [1, 2.5], [2, -1], [3, 1.5]),
    ("subtract", [1, 2], [3, -1], [-2, 3]),
    ("multiply", [3, -2], [4, 0.5], [12, -1]),
    ("divide", [1, 1, -1], [4, 0, 0], [0.25, INF, -INF]),
    ("max", [1, NAN], [2, 0], [2, NAN]),
    ("min", [1, -3], [2, 0], [1, -3]),
    ("pow", [2, 9], [10, 0.5], [1024, 3]),
    ("is_equal", [1, 2], [1, 3], [1, 0]),
    ("not_equal", [1, 2], [1, 3], [0, 1]),
    ("is_lt", [1, 2, 3], [2, 2, 2], [1, 0, 0]),
    ("is_le", [1, 2, 3], [2, 2, 2], [1, 1, 0]),
    ("is_gt", [1, 2, 3], [2, 2, 2], [0, 0, 1]),
    ("is_ge", [1, 2, 3], [2, 2, 2], [0, 1, 1]),
    ("logical_and", [0, 1, 2], [1, 0, 3], [0, 0, 1]),
    ("logical_or", [0, 0, 2], [0, 1, 0], [0, 1, 1]),
    ("logical_xor", [0, 1, 2], [0, 0, 3], [0, 1, 0]),
    ("remainder", [7, -7, 5.5], [3, 3, 2], [1, -1, 1.5]),
    ("abs_max", [-5, 1], [2, -3], [5, 3]),
    ("abs_min", [-5, 1], [2, -3], [2, 1]),
    ("bypass", [4, 5], [9, 9], [4, 5]),
])
def test_tensor_tensor_float(op, a, b, expected):
    np.testing.assert_array_equal(tt(op, a, b), np.asarray(expected, np.float32))


I32_MIN = -2 ** 31


@pytest.mark.parametrize("op, a, b, expected", [
    ("add", [2 ** 31 - 1, 5], [1, -7], [I32_MIN, -2]),              # wraps
    ("multiply", [65536, -3], [65536, 7], [0, -21]),
    ("divide", [7, -7, 5, I32_MIN], [2, 2, 0, -1], [3, -3, -1, I32_MIN]),   # XLA rules
    ("remainder", [7, -7, 5], [2, 2, 0], [1, -1, 5]),
    ("bitwise_and", [12, -1], [10, 7], [8, 7]),
    ("bitwise_or", [12, 0], [10, 0], [14, 0]),
    ("bitwise_xor", [12, -1], [10, 0], [6, -1]),
    ("shift_left", [1, 1, 3], [31, 33, 1], [I32_MIN, 0, 6]),
    ("shift_right_logical", [-8, -8, 16], [1, 40, 2], [2147483644, 0, 4]),
    ("shift_right_arithmetic", [-8, -8, 16], [1, 40, 2], [-4, -1, 4]),
    ("max", [2 ** 30 + 1, -5], [2 ** 30, -6], [2 ** 30 + 1, -5]),   # exact: no FP32
    ("is_lt", [16777217, 1], [16777216, 2], [0, 1]),
    ("pow", [2, -1, 2, 1], [3, -3, -1, -5], [8, -1, 0, 1]),
])
def test_tensor_tensor_int32(op, a, b, expected):
    out = tt(op, a, b, "int32", "int32", "gpsimd")
    np.testing.assert_array_equal(out, np.asarray(expected, np.int32))


def test_tensor_tensor_uint8_wraps():
    np.testing.assert_array_equal(tt("add", [250, 3], [10, 4], "uint8", "uint8"), [4, 7])


def test_tensor_tensor_bf16_rounds_once():
    out = tt("add", [1.0], [2 ** -8 + 2 ** -9], "bfloat16", "bfloat16")
    assert float(out[0]) == 1.0078125            # exact sum rounded once to bf16


def ts(data, dtype="float32", out=None, **kw):
    data = np.asarray(data)
    x, d = tile((data.shape[0], data.shape[1]), dtype), tile(data.shape, out or dtype)
    return run1(isa.TensorScalar(dst=d, data=x, **kw), {x: data})


@pytest.mark.parametrize("kw, expected", [
    (dict(op0="multiply", operand0=2.0), [[2, -4]]),
    (dict(op0="subtract", operand0=1.0, reverse0=True), [[0, 3]]),
    (dict(op0="add", operand0=1.0, op1="max", operand1=0.0), [[2, 0]]),
    (dict(op0="divide", operand0=2.0, op1="subtract", operand1=1.0, reverse1=True),
     [[0.5, 2]]),
])
def test_tensor_scalar(kw, expected):
    np.testing.assert_array_equal(ts([[1, -2]], **kw), np.float32(expected))


def test_tensor_scalar_per_partition_operand():
    x, d, s = tile((3, 2)), tile((3, 2)), tile((3, 1))
    out = run1(isa.TensorScalar(dst=d, data=x, op0="add", operand0=s),
               {x: np.ones((3, 2)), s: col([10, 20, 30])})
    np.testing.assert_array_equal(out, [[11, 11], [21, 21], [31, 31]])


def test_tensor_scalar_int_float_operand_goes_through_fp32():
    out = ts([[7, -7]], "int32", op0="multiply", operand0=0.5, engine="gpsimd")
    np.testing.assert_array_equal(out, [[3, -3]])       # 3.5 -> 3, truncated


@pytest.mark.parametrize("func, x, expected", [
    ("copy", [1.5, -2], [1.5, -2]),
    ("exp", [0, 1], [1, np.e]),
    ("relu", [-1, 2], [0, 2]),
    ("sigmoid", [0, 100], [0.5, 1]),
    ("tanh", [0, 100], [0, 1]),
    ("square", [3, -2], [9, 4]),
    ("sqrt", [4, 9], [2, 3]),
    ("rsqrt", [4, 0.25], [0.5, 2]),
    ("reciprocal", [4, -0.5], [0.25, -2]),
    ("abs", [-3, 2], [3, 2]),
    ("sign", [-3, 0], [-1, 0]),
    ("gelu", [0, 10], [0, 10]),
    ("silu", [0, 20], [0, 20]),
    ("softplus", [0, 100], [np.log(2), 100]),
    ("log", [1, np.e], [0, 1]),
    ("erf", [0, 10], [0, 1]),
])
def test_activation(func, x, expected):
    x = np.float32([x])
    t, d = tile((1, 2)), tile((1, 2))
    out = run1(isa.Activation(dst=d, data=t, func=func), {t: x})
    np.testing.assert_allclose(out[0], np.float32(expected), rtol=1e-6, atol=1e-7)


def test_activation_scale_bias_reduce():
    t, d, b, r = tile((2, 3)), tile((2, 3)), tile((2, 1)), tile((2, 1))
    out, total = run1(isa.Activation(dst=d, data=t, func="copy", scale=2.0, bias=b,
                                     reduce_res=r),
                      {t: [[1, 2, 3], [0, 0, 1]], b: col([1, -1])})
    np.testing.assert_array_equal(out, [[3, 5, 7], [-1, -1, 1]])
    np.testing.assert_array_equal(total, [[15], [-1]])


@pytest.mark.parametrize("op, axis, negate, expected", [
    ("add", (-1,), False, [[6, 15]]),
    ("max", (-1,), True, [[-3, -6]]),
    ("min", (2,), False, [[1, 4]]),
    ("add", (1, 2), False, [[21]]),
    ("add", (1,), False, [[5, 7, 9]]),
])
def test_tensor_reduce(op, axis, negate, expected):
    t = tile((1, 2, 3))
    d = tile((1, np.size(expected)))
    out = run1(isa.TensorReduce(dst=d, data=t, op=op, axis=axis, negate=negate),
               {t: [[[1, 2, 3], [4, 5, 6]]]})
    np.testing.assert_array_equal(out, np.float32(expected))


def test_tensor_reduce_int_is_exact():
    t, d = tile((1, 2), "int32"), tile((1, 1), "int32")
    out = run1(isa.TensorReduce(dst=d, data=t, op="add"), {t: [[2 ** 30, 2 ** 30 + 1]]})
    assert out[0, 0] == -(2 ** 31) + 1                       # wraps like XLA


@pytest.mark.parametrize("src_dtype, dst_dtype, x, expected", [
    ("float32", "bfloat16", [1 + 2 ** -8, 1 + 3 * 2 ** -8], [1, 1 + 2 ** -6]),  # RNE
    ("float32", "int32", [2.7, -2.7, NAN, 3e9, -INF], [2, -2, 0, 2 ** 31 - 1, -2 ** 31]),
    ("float32", "uint8", [-1, 300, 7.9], [0, 255, 7]),
    ("int32", "int8", [127, 128, -129], [127, -128, 127]),         # wraps
    ("int32", "float32", [16777217, 3], [16777216, 3]),            # the FP32 path
    ("float32", "bool", [0, -0.5, 2], [False, True, True]),
])
def test_tensor_copy(src_dtype, dst_dtype, x, expected):
    s, d = tile((1, len(x)), src_dtype), tile((1, len(x)), dst_dtype)
    engine = "gpsimd" if src_dtype == dst_dtype == "int32" else "vector"
    out = run1(isa.TensorCopy(dst=d, src=s, engine=engine), {s: [x]})
    np.testing.assert_array_equal(out[0].astype(np.float64), np.float64(expected))


def test_tensor_copy_same_dtype_is_bit_exact():
    s, d = tile((1, 2), "float32"), tile((1, 2), "float32")
    nan = np.array([0x7FC12345, 0xFF800001], np.uint32).view(np.float32)
    out = run1(isa.TensorCopy(dst=d, src=s), {s: [nan]})
    np.testing.assert_array_equal(out.view(np.uint32), [[0x7FC12345, 0xFF800001]])


@pytest.mark.parametrize("dtype, value, expected", [
    ("float32", 1.5, 1.5), ("bfloat16", 1 / 3, 0.333984375), ("int32", 2 ** 40 + 3, 3),
    ("int64", 2 ** 40 + 3, 2 ** 40 + 3), ("int32", -2.5, -2),
])
def test_memset(dtype, value, expected):
    out = run1(isa.Memset(dst=tile((2, 3), dtype), value=value), {})
    assert out.shape == (2, 3) and (out.astype(np.float64) == expected).all()


def test_iota():
    out = run1(isa.Iota(dst=tile((3, 2, 2), "int32"), pattern=((10, 2), (1, 2)), offset=5,
                        channel_multiplier=100), {})
    np.testing.assert_array_equal(out, [[[5, 6], [15, 16]], [[105, 106], [115, 116]],
                                        [[205, 206], [215, 216]]])


def test_select():
    p, a, b, d = tile((1, 3), "uint8"), tile((1, 3)), tile((1, 3)), tile((1, 3))
    out = run1(isa.Select(dst=d, pred=p, on_true=a, on_false=b),
               {p: [[1, 0, 7]], a: [[1, 2, 3]], b: [[-1, -2, -3]]})
    np.testing.assert_array_equal(out, [[1, -2, 3]])


@pytest.mark.parametrize("engine, mem", [("tensor", "psum"), ("vector", "sbuf")])
def test_transpose(engine, mem):
    x, d = tile((2, 3)), tile((3, 2), mem=mem)
    out = run1(isa.NcTranspose(dst=d, data=x, engine=engine), {x: [[1, 2, 3], [4, 5, 6]]})
    np.testing.assert_array_equal(out, [[1, 4], [2, 5], [3, 6]])


def test_vector_transpose_may_write_another_quadrant():
    """§2.3: a VectorE instruction touching <= 32 partitions may move data across
    quadrants (matmul_quarters.py transposes row quadrant c into quadrant q)."""
    x, d = tile((32, 32), start=32), tile((32, 32), start=96)
    a = np.arange(32 * 32, dtype=np.float32).reshape(32, 32)
    out = run1(isa.NcTranspose(dst=d, data=x, engine="vector"), {x: a})
    np.testing.assert_array_equal(out, a.T)


def test_matmul_overwrite_then_accumulate():
    k, m, n = 4, 2, 3
    st, mv = tile((k, m), "bfloat16"), tile((k, n), "bfloat16")
    d = tile((m, n), "float32", mem="psum")
    a = np.arange(k * m, dtype=np.float32).reshape(k, m)
    b = np.arange(k * n, dtype=np.float32).reshape(k, n)
    c = core()
    inputs = {st: a.astype(ml_dtypes.bfloat16), mv: b.astype(ml_dtypes.bfloat16)}
    out = run1(isa.NcMatmul(dst=d, stationary=st, moving=mv), inputs, c=c)
    np.testing.assert_array_equal(out, a.T @ b)
    out = run1(isa.NcMatmul(dst=d, stationary=st, moving=mv, accumulate=True), {}, c=c)
    np.testing.assert_array_equal(out, 2 * (a.T @ b))


def test_matmul_double_row_contracts_both_rows():
    st, mv = tile((2, 2, 3), "float8_e4m3"), tile((2, 2, 4), "float8_e5m2")
    d = tile((3, 4), "float32", mem="psum")
    a = np.arange(12, dtype=np.float32).reshape(2, 2, 3) / 4
    b = np.ones((2, 2, 4), np.float32)
    out = run1(isa.NcMatmul(dst=d, stationary=st, moving=mv, perf_mode="double_row"),
               {st: a.astype(ml_dtypes.float8_e4m3), mv: b.astype(ml_dtypes.float8_e5m2)})
    np.testing.assert_array_equal(out, a.reshape(4, 3).T @ b.reshape(4, 4))


def test_matmul_tf32_rounds_operands():
    st, mv, d = tile((1, 1)), tile((1, 1)), tile((1, 1), mem="psum")
    x = np.float32(1 + 2 ** -12)                   # below TF32's 10 mantissa bits
    ins = {st: [[x]], mv: [[1.0]]}
    assert run1(isa.NcMatmul(dst=d, stationary=st, moving=mv), ins)[0, 0] == x
    out = run1(isa.NcMatmul(dst=d, stationary=st, moving=mv, precision="tf32"), ins)
    assert out[0, 0] == 1.0


def test_dma_dram_to_sbuf_transposed_and_broadcast():
    src = np.arange(6, dtype=np.float32)                     # a [2, 3] matrix
    t = tile((3, 2))
    ap = DramAP("x", 0, ((1, 3), (3, 2)), "float32")         # its transpose
    out = run1(isa.DmaCopy(dst=t, src=ap), {}, dram={"x": src})
    np.testing.assert_array_equal(out, [[0, 3], [1, 4], [2, 5]])
    bcast = DramAP("x", 1, ((0, 3), (1, 2)), "float32")      # stride 0: row repeated
    out = run1(isa.DmaCopy(dst=t, src=bcast), {}, dram={"x": src})
    np.testing.assert_array_equal(out, [[1, 2]] * 3)


def test_dma_sbuf_to_dram_reshape_and_cast():
    t = tile((2, 2, 2), "float32")
    dst = np.zeros(8, ml_dtypes.bfloat16)
    ap = DramAP("y", 0, ((4, 2), (1, 4)), "bfloat16")
    run1(isa.DmaCopy(dst=ap, src=t), {t: np.float32([[[1, 2], [3, 4]], [[5, 6], [7, 1 / 3]]])},
         dram={"y": dst})
    np.testing.assert_array_equal(dst.astype(np.float32),
                                  [1, 2, 3, 4, 5, 6, 7, np.float32(ml_dtypes.bfloat16(1 / 3))])


def test_matmul_double_row_full_size_contracts_k_256():
    """[128, 2, 128] x [128, 2, 512] FP8 (E4 x E5 mixed): K = 256 (§2.2)."""
    rng = np.random.default_rng(0)
    a = rng.normal(size=(128, 2, 128)).astype(ml_dtypes.float8_e4m3)
    b = rng.normal(size=(128, 2, 512)).astype(ml_dtypes.float8_e5m2)
    st, mv = tile((128, 2, 128), "float8_e4m3"), tile((128, 2, 512), "float8_e5m2")
    d = tile((128, 512), "float32", mem="psum")
    ins = isa.NcMatmul(dst=d, stationary=st, moving=mv, perf_mode="double_row")
    out = run1(ins, {st: a, mv: b})
    ref = a.astype(np.float64).reshape(256, 128).T @ b.astype(np.float64).reshape(256, 512)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)
    assert (ins.rows, ins.m, ins.n) == (256, 128, 512)
