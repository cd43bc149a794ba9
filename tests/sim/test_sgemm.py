"""The simulator's FP32 GEMM (jax_trn/hw/sgemm.py): products agree with a float64
reference to FP32 rounding, any operand strides give the same bits as contiguous
operands, accumulating (beta = 1) gives the bits of `out + a @ b` for every K a TensorE
product has (<= 256 rows), special values included, and the library is our own copy
on one thread."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from jax_trn.hw import sgemm

rng = np.random.default_rng(11)


def _bf16_values(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(ml_dtypes.bfloat16).astype(np.float32)


def test_library_is_our_own_on_one_thread():
    name = sgemm.library()
    assert name == "numpy.matmul" or ("scipy-openblas32" in name and "1 thread" in name)


@pytest.mark.parametrize("m,k,n", [(128, 128, 512), (128, 128, 128), (1, 128, 512),
                                   (128, 128, 1), (3, 7, 5), (64, 256, 512), (2, 1, 2)])
def test_product_close_to_float64_and_stride_independent(m, k, n):
    st, mv = _bf16_values(k, m), _bf16_values(k, n)
    got = sgemm.matmul(st.T, mv)                               # transposed operand
    want = st.T.astype(np.float64) @ mv.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * k)
    again = sgemm.matmul(np.ascontiguousarray(st.T), mv)       # row-major operand
    np.testing.assert_array_equal(got.view(np.uint32), again.view(np.uint32))
    wide = np.zeros((m, n + 9), np.float32)                    # strided output rows
    sgemm.matmul(st.T, mv, wide[:, 3:3 + n])
    np.testing.assert_array_equal(wide[:, 3:3 + n].view(np.uint32), got.view(np.uint32))
    assert not wide[:, :3].any() and not wide[:, 3 + n:].any()
    odd = np.zeros((n, m), np.float32).T                       # column-major output
    sgemm.matmul(st.T, mv, odd)
    np.testing.assert_array_equal(odd.view(np.uint32), got.view(np.uint32))


@pytest.mark.parametrize("k", [1, 2, 64, 100, 127, 128, 256])
def test_accumulate_is_product_then_add(k):
    """`out += a @ b` in one GEMM equals the product rounded, then added: the
    interpreter and the compiled plans both accumulate this way, and PSUM's sum of
    FP32 partial products is that (§2.2)."""
    for trial in range(12):
        st = _bf16_values(k, 128, scale=np.float32(10.0 ** int(rng.integers(-20, 20))))
        mv = _bf16_values(k, 512)
        if trial % 3 == 0:
            mv[0, :5] = [np.inf, -np.inf, np.nan, 0.0, -0.0]
        acc = (rng.standard_normal((128, 512)) * 10.0 ** int(rng.integers(-4, 4))).astype(
            np.float32)
        if trial % 2:
            acc[:, :9] = -0.0
        want = np.add(sgemm.matmul(st.T, mv), acc)
        psum = np.zeros((128, 2048), np.float32)
        out = psum[:, 512:1024]
        out[...] = acc
        sgemm.matmul(st.T, mv, out, accumulate=True)
        same = (out.view(np.uint32) == want.view(np.uint32)) | (np.isnan(out) & np.isnan(want))
        assert same.all(), (k, trial, np.argwhere(~same)[:5])
        assert not psum[:, :512].any() and not psum[:, 1024:].any()


def test_k_zero_and_empty():
    out = np.full((4, 3), 7.0, np.float32)
    sgemm.matmul(np.zeros((4, 0), np.float32), np.zeros((0, 3), np.float32), out)
    assert not out.any()
    out[...] = 7.0
    sgemm.matmul(np.zeros((4, 0), np.float32), np.zeros((0, 3), np.float32), out, True)
    assert (out == 7.0).all()
    assert sgemm.matmul(np.zeros((0, 5), np.float32), np.zeros((5, 2), np.float32)).shape == (0, 2)
