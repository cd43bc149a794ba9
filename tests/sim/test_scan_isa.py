"""tensor_tensor_scan (§6.2): the recurrence along the free axis, FP32 carry, integer
operands natively, per-partition initial values, constraints and cost (§6.3)."""
from __future__ import annotations

import numpy as np
import pytest

from jax_trn.hw import CHIPS, IsaError
from jax_trn.hw.isa_vector import TensorTensorScan
from tests.sim.helpers import col, run1, tile

TRN2 = CHIPS["trn2"].core


def scan(data0, data1, initial=0.0, dtype="float32", out="float32", **kw):
    data0, data1 = np.asarray(data0), np.asarray(data1)
    a, b, d = tile(data0.shape, dtype), tile(data1.shape, dtype), tile(data1.shape, out)
    ins = {a: data0, b: data1}
    if isinstance(initial, np.ndarray):
        s = tile((data1.shape[0], 1), dtype)
        ins[s], initial = initial, s
    return run1(TensorTensorScan(dst=d, data0=a, data1=b, initial=initial, **kw), ins)


def test_cumsum_is_a_sequential_fp32_sum():
    x = np.float32([[1e8, 1.0, -1e8, 1.0]])
    out = scan(np.zeros_like(x), x, op0="add", op1="add")
    np.testing.assert_array_equal(out, np.float32([[1e8, 1e8, 0.0, 1.0]]))


def test_running_max_and_product_with_per_partition_initial():
    x = np.float32([[1, 3, 2, 5], [-1, -2, -3, -4]])
    out = scan(np.full_like(x, -np.inf), x, initial=col([0, -10]), op0="max", op1="max")
    np.testing.assert_array_equal(out, np.float32([[1, 3, 3, 5], [-1, -1, -1, -1]]))
    out = scan(np.ones_like(x), x, initial=1.0, op0="multiply", op1="multiply")
    np.testing.assert_array_equal(out, np.float32([[1, 3, 6, 30], [-1, 2, -6, 24]]))


def test_integer_scan_is_exact_and_wraps():
    x = np.int32([[2 ** 30, 2 ** 30, 1, 2 ** 24 + 1]])
    out = scan(np.zeros_like(x), x, 0, "int32", "int32", op0="add", op1="add")
    np.testing.assert_array_equal(out, np.int32([[2 ** 30, -2 ** 31, -2 ** 31 + 1,
                                                  -2 ** 31 + 2 ** 24 + 2]]))


def test_bf16_output_rounds_once_carry_stays_fp32():
    x = np.float32([[1.0] + [2 ** -9] * 4])
    out = scan(np.zeros_like(x), x, out="bfloat16", op0="add", op1="add")
    # bf16 has 8 bits: 1 + 4 * 2^-9 = 1.0078125 exactly; a bf16 carry would stay at 1.0
    assert float(out[0, -1]) == 1.0078125


def test_constraints_and_cost():
    a, b = tile((4, 8)), tile((4, 8))
    with pytest.raises(IsaError):
        TensorTensorScan(dst=tile((4, 8)), data0=a, data1=b, initial=0.0, op0="bitwise_and",
                         op1="add")
    with pytest.raises(IsaError):
        TensorTensorScan(dst=tile((4, 8)), data0=tile((4, 7)), data1=b, initial=0.0,
                         op0="add", op1="add")
    ins = TensorTensorScan(dst=tile((4, 1000)), data0=tile((4, 1000)), data1=tile((4, 1000)),
                           initial=0.0, op0="add", op1="add")
    assert ins.cycles(TRN2) == 2000.0
    small = TensorTensorScan(dst=tile((4, 8)), data0=a, data1=b, initial=0.0, op0="add",
                             op1="add")
    assert small.cycles(TRN2) == TRN2.min_ii
