"""Matrix multiplication out[M, N] = lhsT[K, M].T @ rhs[K, N] in the kernel language,
twice: as one first writes it, and as fast as TensorE allows.

TensorE contracts over the partitions: `nc_matmul(stationary=[K, M], moving=[K, N])`
gives [M, N] in PSUM, K <= 128, M <= 128, N <= 512 (§2.2). So both operands come
with K first: the lhs is passed transposed (lhsT), as NKI's matmul tutorial does,
and no transpose is needed on chip. Shapes: K and M multiples of 128, N of 512.

`matmul_basic` computes each [128, 512] output tile on its own: for each k-tile it
loads a [128, 128] lhsT tile (256-byte DMA descriptors) and a [128, 512] rhs tile,
then one matmul. TensorE mostly waits for the DMAs (4096^3 on Trn2: ~10% of peak).

`matmul_fast` (4096^3 on Trn2: >90% of peak, benchmarks/kernels.py) reuses what it
loads:
- a block of rhs, all K rows x `N_BLOCK` columns (128 KiB per partition at 2048
  columns, fewer columns where SBUF is smaller: Trn1), stays in SBUF while every row tile of the output passes it (rhs is read
  from HBM once; rows of 4 KiB: full-rate descriptors, §3.4);
- lhsT is loaded as strips of `M_STRIP` columns per k-tile (1 KiB descriptors), two
  strips in flight (the second loads while TensorE works on the first);
- each [128, N_BLOCK] output row accumulates over K in `N_BLOCK / 512` PSUM banks,
  and the PSUM tiles rotate through two sets (8 banks), so evacuating one row (a
  copy to bf16 on VectorE / ScalarE) overlaps the matmuls of the next;
- k outer, the 512-column pieces inner: each stationary lhsT tile serves 4 matmuls.
"""
from __future__ import annotations

from jax_trn import kernels
import jax_trn.kernels.isa as nisa
import jax_trn.kernels.language as nl

N_BLOCK = 2048        # rhs columns resident in SBUF
M_STRIP = 512         # lhsT columns (output rows) per strip load


@kernels.jit
def matmul_basic(lhsT, rhs):
    k_dim, m_dim = lhsT.shape
    _, n_dim = rhs.shape
    out = nl.ndarray((m_dim, n_dim), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(m_dim // 128):
        for n in nl.affine_range(n_dim // 512):
            acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(k_dim // 128):
                a = nl.load(lhsT[k * 128:(k + 1) * 128, m * 128:(m + 1) * 128])
                b = nl.load(rhs[k * 128:(k + 1) * 128, n * 512:(n + 1) * 512])
                acc += nisa.nc_matmul(a, b)
            res = nl.copy(acc, dtype=out.dtype)
            nl.store(out[m * 128:(m + 1) * 128, n * 512:(n + 1) * 512], value=res)
    return out


@kernels.jit
def matmul_fast(lhsT, rhs):
    k_dim, m_dim = lhsT.shape
    _, n_dim = rhs.shape
    kt, ms = k_dim // 128, min(M_STRIP, m_dim)
    nb = min(N_BLOCK, n_dim)
    item = 2 if lhsT.dtype in (nl.bfloat16, nl.float16) else 4
    while nb > 512 and item * kt * (nb + 2 * ms) + 2 * item * nb > \
            nl.tile_size.total_available_sbuf_size - 1024:
        nb //= 2                      # Trn1's SBUF takes a 1024-column block
    out = nl.ndarray((m_dim, n_dim), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    block = nl.ndarray((128, kt, nb), dtype=rhs.dtype, buffer=nl.sbuf)
    for n0 in nl.sequential_range(0, n_dim, nb):
        for k in nl.affine_range(kt):                        # rhs block: once per block
            nisa.dma_copy(dst=block[:, k, :], src=rhs[k * 128:(k + 1) * 128, n0:n0 + nb])
        for m0 in nl.affine_range(0, m_dim, ms):
            strip = nl.ndarray((128, kt, ms), dtype=lhsT.dtype, buffer=nl.sbuf)
            for k in nl.affine_range(kt):
                nisa.dma_copy(dst=strip[:, k, :], src=lhsT[k * 128:(k + 1) * 128, m0:m0 + ms])
            for mt in nl.affine_range(ms // 128):
                acc = nl.ndarray((128, nb // 512, 512), dtype=nl.float32, buffer=nl.psum)
                for k in nl.affine_range(kt):
                    for j in nl.affine_range(nb // 512):
                        nisa.nc_matmul(dst=acc[:, j, :],
                                       stationary=strip[:, k, mt * 128:(mt + 1) * 128],
                                       moving=block[:, k, j * 512:(j + 1) * 512],
                                       accumulate=k > 0)
                res = nl.ndarray((128, nb), dtype=out.dtype, buffer=nl.sbuf)
                half = nb // 2
                nisa.tensor_copy(dst=res[:, :half], src=acc.reshape((128, nb))[:, :half],
                                 engine=nisa.vector_engine)
                nisa.tensor_copy(dst=res[:, half:], src=acc.reshape((128, nb))[:, half:],
                                 engine=nisa.scalar_engine)
                row = m0 + mt * 128
                nisa.dma_copy(dst=out[row:row + 128, n0:n0 + nb], src=res)
    return out
