"""GpSimd's integer modes of tensor_reduce and tensor_tensor_scan (§2.5: a 32-bit integer
ALU; VectorE computes in FP32, §2.3): exact, wrapping like XLA, no PSUM, priced like
GpSimd's other compute (start-up + N per input, costs.py)."""
from __future__ import annotations

import numpy as np
import pytest

from jax_trn.hw import CHIPS, IsaError, isa
from jax_trn.hw.isa_vector import TensorTensorScan
from tests.sim.helpers import run1, tile

TRN2 = CHIPS["trn2"].core


def test_gpsimd_reduce_is_exact_and_wraps():
    t, d = tile((2, 3), "int32"), tile((2, 1), "int32")
    x = [[2 ** 24 + 1, 1, 0], [2 ** 30, 2 ** 30, 5]]
    out = run1(isa.TensorReduce(dst=d, data=t, op="add", engine="gpsimd"), {t: x})
    np.testing.assert_array_equal(out, np.int32([[2 ** 24 + 2], [-(2 ** 31) + 5]]))
    out = run1(isa.TensorReduce(dst=d, data=t, op="max", engine="gpsimd"),
               {t: [[16777217, 16777216, 0], [-5, -7, -6]]})
    np.testing.assert_array_equal(out, np.int32([[16777217], [-5]]))


def test_gpsimd_scan_is_exact_and_wraps():
    x = np.int32([[2 ** 24 + 1, 1, 2 ** 30, 2 ** 30]])
    a, b, d = tile(x.shape, "int32"), tile(x.shape, "int32"), tile(x.shape, "int32")
    out = run1(TensorTensorScan(dst=d, data0=a, data1=b, initial=0, op0="add", op1="add",
                                engine="gpsimd"), {a: np.zeros_like(x), b: x})
    np.testing.assert_array_equal(out, np.int32([[2 ** 24 + 1, 2 ** 24 + 2,
                                                  2 ** 30 + 2 ** 24 + 2,
                                                  -(2 ** 31) + 2 ** 24 + 2]]))


def test_gpsimd_modes_cannot_touch_psum():
    with pytest.raises(IsaError, match="PSUM"):
        isa.TensorReduce(dst=tile((4, 1), "int32"), data=tile((4, 8), "float32", "psum"),
                         op="add", engine="gpsimd")
    p = tile((4, 8), "float32", "psum")
    with pytest.raises(IsaError, match="PSUM"):
        TensorTensorScan(dst=tile((4, 8)), data0=tile((4, 8)), data1=p, initial=0.0,
                         op0="add", op1="add", engine="gpsimd")
    with pytest.raises(IsaError, match="cannot run on"):
        isa.TensorReduce(dst=tile((4, 1)), data=tile((4, 8)), op="add", engine="scalar")


def test_gpsimd_costs_start_up_plus_n_per_input():
    red = isa.TensorReduce(dst=tile((128, 1), "int32"), data=tile((128, 512), "int32"),
                           op="add", engine="gpsimd")
    assert red.cycles(TRN2) == TRN2.gpsimd_startup + 512
    scan = TensorTensorScan(dst=tile((4, 1000), "int32"), data0=tile((4, 1000), "int32"),
                            data1=tile((4, 1000), "int32"), initial=0, op0="add",
                            op1="add", engine="gpsimd")
    assert scan.cycles(TRN2) == TRN2.gpsimd_startup + 2000
    vector = isa.TensorReduce(dst=tile((128, 1), "int32"), data=tile((128, 512), "int32"),
                              op="add")
    assert vector.engine == "vector" and vector.cycles(TRN2) == 512
