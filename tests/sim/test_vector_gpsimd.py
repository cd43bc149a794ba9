"""Truth tables for scalar_tensor_tensor, exponential, tensor_partition_reduce and
affine_select (§2.3, §2.5, §6.2), and their costs (§6.3)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from jax_trn.hw import CHIPS, isa
from tests.sim.helpers import col, run1, tile

NINF = float("-inf")
TRN2, TRN3 = CHIPS["trn2"].core, CHIPS["trn3"].core


def stt(data, operand1, dtype="float32", out="float32", operand0=1.0, **kw):
    data, operand1 = np.asarray(data), np.asarray(operand1)
    x, y, d = tile(data.shape, dtype), tile(data.shape, dtype), tile(data.shape, out)
    ins = {x: data, y: operand1}
    if isinstance(operand0, np.ndarray):
        s = tile((data.shape[0], 1))
        ins[s], operand0 = operand0, s
    return run1(isa.ScalarTensorTensor(dst=d, data=x, operand0=operand0, operand1=y, **kw), ins)


@pytest.mark.parametrize("kw, expected", [
    (dict(op0="subtract", op1="multiply"), [[0, 4]]),                   # (x - 1) * y
    (dict(op0="subtract", op1="multiply", reverse0=True), [[0, -4]]),   # (1 - x) * y
    (dict(op0="multiply", operand0=2.0, op1="subtract", reverse1=True), [[1, 0]]),  # y - 2x
    (dict(op0="add", operand0=col([10]), op1="max"), [[11, 12]]),       # per-partition operand0
])
def test_scalar_tensor_tensor(kw, expected):
    np.testing.assert_array_equal(stt([[1, 2]], [[3, 4]], **kw), np.float32(expected))


def test_scalar_tensor_tensor_rounds_once_to_bf16():
    out = stt([[1.0]], [[2 ** -9]], "bfloat16", "bfloat16", operand0=2 ** -8, op0="add", op1="add")
    assert float(out[0, 0]) == 1.0078125    # 1 + 0.75 ulp -> 1 + 1 ulp; rounding after op0
    #                                         (1 + 0.5 ulp, a tie -> 1) would give 1.0


@pytest.mark.parametrize("dtype, n, op0, op1, cycles", [
    ("bfloat16", 512, "subtract", "multiply", 512),     # §6.3: N
    ("bfloat16", 511, "subtract", "multiply", 1022),    # odd N: 2N
    ("float32", 512, "subtract", "multiply", 1024),
    ("bfloat16", 512, "add", "multiply", 1024),
    ("bfloat16", 8, "subtract", "multiply", 64),        # MIN_II
])
def test_scalar_tensor_tensor_cost(dtype, n, op0, op1, cycles):
    t = tile((128, n), dtype)
    ins = isa.ScalarTensorTensor(dst=t, data=t, op0=op0, operand0=1.0, op1=op1, operand1=t)
    assert ins.cycles(TRN2) == cycles


def exp_run(x, max_value=0.0, out="float32", reduce=True, reduce_init=0.0):
    x = np.float32(x)
    s, d = tile(x.shape), tile(x.shape, out)
    r = tile((x.shape[0], 1)) if reduce else None
    ins = {s: x}
    if isinstance(max_value, np.ndarray):
        m = tile((x.shape[0], 1))
        ins[m], max_value = max_value, m
    return run1(isa.Exponential(dst=d, src=s, max_value=max_value, reduce_res=r,
                                reduce_init=reduce_init), ins, gen="trn3")


def test_exponential_subtracts_max_and_sums():
    out, total = exp_run([[0, 1, 2]], max_value=2.0)
    np.testing.assert_allclose(out, np.exp(np.float32([[-2, -1, 0]])), rtol=1e-7)
    np.testing.assert_allclose(total, [[np.exp(-2) + np.exp(-1) + 1]], rtol=1e-6)


def test_exponential_per_partition_max_and_reduce_init():
    out, total = exp_run([[1, 1], [3, NINF]], max_value=col([1, 3]), reduce_init=10.0)
    np.testing.assert_array_equal(out, [[1, 1], [1, 0]])
    np.testing.assert_array_equal(total, [[12], [11]])


def test_exponential_bf16_output_rounds_the_fp32_result():
    out = exp_run([[1.0]], out="bfloat16", reduce=False)
    assert out[0, 0] == np.float32(np.e).astype(ml_dtypes.bfloat16)


def test_exponential_cost_is_4x_scalar_exp():
    t = tile((128, 2048))
    act = isa.Activation(dst=t, data=t, func="exp")
    ex = isa.Exponential(dst=t, src=t)
    assert ex.cycles(TRN3) * 4 == act.cycles(TRN3) == 2048     # same clocks on Trn3
    assert isa.Exponential(dst=tile((128, 8)), src=tile((128, 8))).cycles(TRN3) == 64


@pytest.mark.parametrize("op, dtype, data, expected", [
    ("add", "float32", [[1, 2], [3, -4], [5, 6]], [[9, 4]]),
    ("max", "float32", [[1, 2], [3, -4], [5, 6]], [[5, 6]]),
    ("add", "int32", [[2 ** 31 - 1, 1], [1, 2]], [[-2 ** 31, 3]]),     # wraps, exact
    ("bitwise_or", "int32", [[1, 8], [2, 8], [4, 1]], [[7, 9]]),
    ("bitwise_and", "int32", [[7, 12], [6, 10]], [[6, 8]]),
])
def test_tensor_partition_reduce(op, dtype, data, expected):
    data = np.asarray(data)
    x, d = tile(data.shape, dtype), tile((1, data.shape[1]), dtype)
    out = run1(isa.TensorPartitionReduce(dst=d, data=x, op=op), {x: data})
    np.testing.assert_array_equal(out, np.asarray(expected).astype(out.dtype))


def test_tensor_partition_reduce_cost():
    ins = isa.TensorPartitionReduce(dst=tile((1, 512)), data=tile((128, 512)), op="add")
    # 150 start-up + 16 partitions x 512 x 4 B at 64 B/cycle + log2(8) x 512 x 4 B / 64 B
    assert ins.cycles(TRN2) == 150 + 512 + 3 * 32


def test_affine_select_causal_mask():
    x, d = tile((4, 4)), tile((4, 4))
    ins = isa.AffineSelect(dst=d, on_true_tile=x, on_false_value=NINF, pattern=((-1, 4),),
                           channel_multiplier=1, cmp_op="is_ge")      # p - f >= 0
    out = run1(ins, {x: np.full((4, 4), 7.0)})
    np.testing.assert_array_equal(out, np.where(np.tril(np.ones((4, 4))) > 0, 7.0, NINF))


@pytest.mark.parametrize("cmp_op, offset, expected", [
    ("is_equal", 0, [[1, -1, -1], [-1, 5, -1]]),      # the diagonal: p == f
    ("not_equal", -1, [[1, 2, 3], [-1, 5, 6]]),       # p - f - 1 != 0
    ("is_lt", 0, [[-1, 2, 3], [-1, -1, 6]]),          # p - f < 0
])
def test_affine_select_predicates(cmp_op, offset, expected):
    x, d = tile((2, 3)), tile((2, 3))
    ins = isa.AffineSelect(dst=d, on_true_tile=x, on_false_value=-1.0, pattern=((-1, 3),),
                           offset=offset, channel_multiplier=1, cmp_op=cmp_op)
    out = run1(ins, {x: [[1, 2, 3], [4, 5, 6]]})
    np.testing.assert_array_equal(out, np.float32(expected))


def test_affine_select_casts_and_costs():
    x, d = tile((1, 4)), tile((1, 4), "bfloat16")
    ins = isa.AffineSelect(dst=d, on_true_tile=x, on_false_value=1 / 3, pattern=((1, 2), (2, 2)),
                           offset=-2, cmp_op="is_ge")    # i + 2j - 2 = [-2, 0, -1, 1]
    out = run1(ins, {x: [[1, 2 + 2 ** -8, 3, 4 + 2 ** -6]]})   # selected: RNE to bf16
    third = np.float32(ml_dtypes.bfloat16(1 / 3))
    np.testing.assert_array_equal(out.astype(np.float32), [[third, 2, third, 4]])
    assert ins.cycles(TRN2) == 150 + 4
