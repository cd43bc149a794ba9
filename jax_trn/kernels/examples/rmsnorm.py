"""RMSNorm of x [R, D] with a gain w [D]: y = x / sqrt(mean(x^2) + eps) * w, rows on
the partitions:

    ScalarE  x^2, summed per row into ss                activation(square) + reduce_res
    ScalarE  r = 1 / sqrt(ss / D + eps)                 activation(rsqrt, scale, bias)
    VectorE  y = (x * r) * w                            scalar_tensor_tensor

w is loaded once into all 128 partitions (a broadcast access pattern: stride 0 over
the partitions), before the row loop.
"""
from __future__ import annotations

from jax_trn import kernels
import jax_trn.kernels.isa as nisa
import jax_trn.kernels.language as nl


@kernels.jit
def rmsnorm_kernel(x, w, eps=1e-6):
    rows, d = x.shape
    out = nl.ndarray((rows, d), dtype=x.dtype, buffer=nl.shared_hbm)
    gain = nl.ndarray((128, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=gain, src=w.reshape((1, d)).broadcast_to((128, d)))
    for i in nl.affine_range(rows // 128):
        t = nl.load(x[i * 128:(i + 1) * 128, :], dtype=nl.float32)
        sq = nl.ndarray((128, d), dtype=nl.float32, buffer=nl.sbuf)
        ss = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=sq, op=nl.square, data=t, reduce_res=ss)
        r = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=r, op=nl.rsqrt, data=ss, scale=1.0 / d, bias=eps)
        y = nl.ndarray((128, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=y, data=t, op0=nl.multiply, operand0=r,
                                  op1=nl.multiply, operand1=gain)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=y)
    return out
