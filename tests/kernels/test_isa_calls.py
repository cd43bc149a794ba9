"""Every `nisa` function of the kernel language, each checked against numpy on a small
kernel (standalone, Trn2; the MX instructions on Trn3)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from jax_trn import kernels
import jax_trn.kernels.isa as nisa
import jax_trn.kernels.language as nl

RNG = np.random.default_rng(1)


def _one(body, *arrays, system="trn2", **kw):
    """Runs kernel `body(*hbm, out)` writing a [128, F] float32 result."""
    @kernels.jit
    def k(*hbm, shape=(128, 8), dtype="float32"):
        out = nl.ndarray(shape, dtype=dtype, buffer=nl.shared_hbm)
        body(*hbm, out)
        return out
    return kernels.simulate(k, *arrays, system=system, **kw).outputs[0]


def test_elementwise_family():
    a, b = RNG.standard_normal((128, 8)).astype(np.float32), \
        RNG.standard_normal((128, 8)).astype(np.float32)

    def body(x, y, out):
        ta, tb = nl.load(x), nl.load(y)
        t = nisa.tensor_tensor(data1=ta, data2=tb, op=nl.maximum)            # max(a, b)
        t = nisa.tensor_scalar(data=t, op0=nl.multiply, operand0=2.0, op1=nl.add,
                               operand1=1.0)                                  # *2 + 1
        col = nisa.tensor_reduce(op=nl.add, data=ta, axis=1, keepdims=True)   # [128, 1]
        t = nisa.scalar_tensor_tensor(data=t, op0=nl.subtract, operand0=col,
                                      op1=nl.multiply, operand1=tb)          # (t - s) * b
        t = nisa.activation(op=nl.tanh, data=t, scale=0.5, bias=0.25)         # tanh(.5t+.25)
        s = nisa.tensor_copy(src=t, engine=nisa.gpsimd_engine)
        nisa.dma_copy(dst=out, src=s)
    got = _one(body, a, b)
    t = np.maximum(a, b) * 2 + 1
    t = (t - a.sum(1, keepdims=True)) * b
    np.testing.assert_allclose(got, np.tanh(0.5 * t + 0.25), rtol=2e-5, atol=2e-6)


def test_iota_select_affine_select_memset():
    def body(out):
        i = nl.ndarray((128, 8), dtype=nl.int32, buffer=nl.sbuf)
        nisa.iota(i, pattern=[[1, 8]], offset=3, channel_multiplier=10)       # 3 + 10p + f
        f = nisa.tensor_copy(src=i, dtype=nl.float32)
        odd = nisa.tensor_scalar(data=i, op0=nl.bitwise_and, operand0=1, dtype=nl.float32)
        z = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(z, -1.0)
        sel = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.select(dst=sel, pred=odd, on_true=f, on_false=z)                 # odd ? v : -1
        tri = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.affine_select(dst=tri, on_true_tile=sel, on_false_value=0.0,
                           pattern=[[-1, 8]], channel_multiplier=1, cmp_op="is_ge")
        nisa.dma_copy(dst=out, src=tri)
    got = _one(body)
    p, f = np.meshgrid(np.arange(128), np.arange(8), indexing="ij")
    v = 3 + 10 * p + f
    want = np.where(v % 2 == 1, v, -1.0)
    np.testing.assert_array_equal(got, np.where(p - f >= 0, want, 0.0))


def test_transposes_partition_reduce_scan_and_dma_transpose():
    x = RNG.standard_normal((128, 8)).astype(np.float32)
    y = RNG.standard_normal((32, 16)).astype(ml_dtypes.bfloat16)

    def body(a, b, out):
        t = nl.load(a)
        tp = nisa.nc_transpose(data=t, engine=nisa.tensor_engine)              # [8, 128] PSUM
        back = nisa.nc_transpose(data=nl.copy(tp), engine=nisa.tensor_engine)  # [128, 8]
        r = nisa.tensor_partition_reduce(op=nl.add, data=nl.copy(back))        # [1, 8]
        sc = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor_scan(dst=sc, data0=nl.copy(back), data1=t, initial=0.0,
                                op0=nl.multiply, op1=nl.add)                   # x*prev + x
        bt = nl.ndarray((16, 32), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=bt, src=b)
        vt = nisa.nc_transpose(data=nl.copy(bt[0:16, 0:16]), engine=nisa.vector_engine)
        res = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=sc)
        nisa.tensor_copy(dst=res[0:1, :], src=r)
        nisa.tensor_copy(dst=res[32:48, 0:8], src=vt[:, 0:8])
        nisa.dma_copy(dst=out, src=res)
    got = _one(body, x, y)
    sc = np.zeros((128, 8), np.float32)
    prev = np.zeros(128, np.float32)
    for i in range(8):
        prev = x[:, i] * prev + x[:, i]
        sc[:, i] = prev
    want = sc.copy()
    want[0] = x.sum(0)
    want[32:48, :] = y.astype(np.float32).T[0:16, 0:16].T[:, 0:8]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_max8_find_index8_match_replace8():
    x = RNG.permutation(128 * 32).reshape(128, 32).astype(np.float32)

    def body(a, out):
        t = nl.load(a)
        top = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.max8(dst=top, src=t)
        idx = nl.ndarray((128, 8), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.nc_find_index8(dst=idx, data=t, vals=top)
        rep = nl.ndarray((128, 32), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_match_replace8(dst=rep, data=t, vals=top, imm=-1.0)
        res = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        # top values + index + (count of replaced entries in the row) in one result
        nisa.tensor_tensor(dst=res, data1=top, data2=nl.copy(idx, dtype=nl.float32),
                           op=nl.subtract)
        nisa.dma_copy(dst=out, src=res)
        cnt = nisa.tensor_reduce(op=nl.minimum, data=rep, axis=1)
        nisa.dma_copy(dst=out[:, 0:1], src=cnt)
    got = _one(body, x)
    order = np.argsort(-x, axis=1)[:, :8]
    want = np.take_along_axis(x, order, 1) - order
    want[:, 0] = -1.0
    np.testing.assert_array_equal(got, want)


def test_scatter_and_indirect_gather():
    table = RNG.standard_normal((200, 16)).astype(np.float32)
    idx = RNG.permutation(200)[:128].reshape(128, 1).astype(np.int32)

    @kernels.jit
    def scatter(tab, ids):
        out = nl.ndarray((200, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        for r in nl.affine_range(2):                    # copy the table (2 x 100 rows)
            nisa.dma_copy(dst=out[r * 100:(r + 1) * 100, :], src=tab[r * 100:(r + 1) * 100, :])
        i = nl.load(ids)
        rows = nl.ndarray((128, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=tab[i, :])
        neg = nl.multiply(rows, -1.0)
        nisa.dma_copy(dst=out[i, :], src=neg)          # rows idx become their negatives
        return out
    got = kernels.simulate(scatter, table, idx, system="trn2").outputs[0]
    want = table.copy()
    want[idx[:, 0]] *= -1
    np.testing.assert_array_equal(got, want)


def test_exponential_on_trn3():
    x = RNG.standard_normal((128, 64)).astype(np.float32)

    def body(a, out):
        t = nl.load(a)
        e = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.exponential(dst=e, src=t, max_value=1.0, reduce_res=s)
        res = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=e[:, 0:8])
        nisa.tensor_copy(dst=res[:, 7:8], src=s)
        nisa.dma_copy(dst=out, src=res)
    got = _one(body, x, system="trn3")
    e = np.exp(x - 1.0)
    want = e[:, 0:8].copy()
    want[:, 7] = e.sum(1)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    with pytest.raises(kernels.KernelError, match="exponential"):
        _one(body, x, system="trn2")


def test_quantize_mx_and_mx_matmul_on_trn3():
    """A^T B over K = 512 in MXFP8: quantize_mx packs 4 values of a partition's row
    (A[(p, i), m] = src[p, 4m + i]) with one E8M0 scale per 8 partitions x 4 values."""
    from jax_trn.hw import mx as hw_mx
    a = RNG.standard_normal((512, 32)).astype(np.float32)
    b = RNG.standard_normal((512, 64)).astype(np.float32)

    def packed(m):                      # [K=512, F] -> [128, 4F] rows as quantize_mx reads
        return m.reshape(128, 4, -1).transpose(0, 2, 1).reshape(128, -1).astype(
            ml_dtypes.bfloat16)

    rows = hw_mx.scale_partitions(128)

    @kernels.jit
    def mx_mm(sa, sb):
        out = nl.ndarray((32, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        qa = nl.ndarray((128, 32), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        qb = nl.ndarray((128, 64), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        ca = nl.ndarray((rows, 32), dtype=nl.uint8, buffer=nl.sbuf)
        cb = nl.ndarray((rows, 64), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.quantize_mx(dst=qa, src=nl.load(sa), dst_scale=ca)
        nisa.quantize_mx(dst=qb, src=nl.load(sb), dst_scale=cb)
        acc = nl.ndarray((32, 64), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul_mx(acc, qa, qb, ca, cb, accumulate=False)
        nl.store(out, nl.copy(acc))
        return out
    got = kernels.simulate(mx_mm, packed(a), packed(b), system="trn3").outputs[0]
    want = a.astype(ml_dtypes.bfloat16).astype(np.float32).T @ \
        b.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.08
