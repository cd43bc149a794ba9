"""Row softmax of x [R, C] (R a multiple of 128, C up to ~16k in FP32): rows on the
partitions, one row tile at a time, the steps of a numerically safe softmax each one
instruction:

    VectorE  m = max(x) per row                         tensor_reduce
    VectorE  -m                                         tensor_scalar
    ScalarE  e = exp(x - m), s = sum(e) per row         activation + reduce_res
    VectorE  1 / s                                      reciprocal (activation)
    VectorE  y = e * (1 / s)                            tensor_scalar, per-row operand

Loads of row tile i+1 overlap the work on row tile i: every tile allocated in the
`affine_range` body comes from a ring of two buffers.
"""
from __future__ import annotations

from jax_trn import kernels
import jax_trn.kernels.isa as nisa
import jax_trn.kernels.language as nl


@kernels.jit
def softmax_kernel(x):
    rows, cols = x.shape
    out = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(rows // 128):
        t = nl.load(x[i * 128:(i + 1) * 128, :], dtype=nl.float32)
        neg_max = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=neg_max, op=nl.maximum, data=t, axis=1, negate=True)
        e = nl.ndarray((128, cols), dtype=nl.float32, buffer=nl.sbuf)
        total = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=t, bias=neg_max, reduce_res=total)
        inv = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=inv, op=nl.reciprocal, data=total)
        y = nl.ndarray((128, cols), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=e, op0=nl.multiply, operand0=inv)
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=y)
    return out
