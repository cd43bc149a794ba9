"""Causal flash-attention forward in the kernel language:
out[s, h] = softmax(q[s, h] . k[:s+1, h]^T * scale) @ v[:s+1, h], for q, k, v [S, H, D]
(the layout of `jax.nn.dot_product_attention` for one batch element), bf16, D = 128.

The [S, S] scores never leave the chip. Per q-tile of 128 queries and per head, the
live keys (causal: up to the diagonal) are cut into chunks of `CHUNK` keys, and each
chunk runs three stages (online softmax, as in FlashAttention):

  A  S = Q K^T on TensorE into PSUM (stationary Q^T [D, 128 q], moving K^T [D, keys]);
     the diagonal 128 x 128 block gets the causal mask as an additive bias by one more
     matmul, S += I @ bias (cheaper on TensorE than a select on GpSimd); -m = -rowmax
     on VectorE; the running max, alpha = exp(scale (m_old - m_new)) and
     P = exp(scale S - scale m_new) with its row sums on ScalarE (one activation with an
     add-reduction, §2.4);
  T  P^T per 128-key block by TensorE transposes, copied to SBUF as bf16 (VectorE and
     ScalarE in turn);
  B  l = l * alpha + rowsum (here, not in A: VectorE runs its queue in order, and in A
     it would wait for the exp); O_chunk = P V accumulated in PSUM (stationary P^T
     [keys, q], moving V [keys, D]); O = O * alpha + O_chunk; after the last chunk
     O / l is stored.

The stages are software-pipelined by hand: stage A of job n, the transposes of job
n - LAG_T and stage B of job n - LAG_B are emitted together, so each engine's queue
(run in program order, §2.1) always has work that does not wait on the others. The
buffers between stages are explicit rings sized from the lags.

K^T and Q^T of every head come by `dma_transpose` (§3.4, NeuronCore-v3+) and stay in
SBUF with V (96 KiB per partition at S = 2048, H = 8).
"""
from __future__ import annotations

import math

from jax_trn import kernels
import jax_trn.kernels.isa as nisa
import jax_trn.kernels.language as nl

CHUNK = 1024         # keys per softmax chunk (two PSUM banks of FP32 scores, §3.2)
BANK = 512           # FP32 columns of one PSUM bank; one score matmul each (§2.2)
LAG_T, LAG_B = 2, 4  # the transposes of job n - LAG_T, stage B of job n - LAG_B after A(n)
NEG = -3.0e38        # the masked scores' bias (exp gives 0)


def _jobs(s: int, heads: int):
    """(q-tile, head, chunk, first key, keys, last chunk?) in order: heads outer, so
    the first jobs need one head's Q^T and K^T, not every head's."""
    for h in range(heads):
        for i in range(s // 128):
            live = (i + 1) * 128
            starts = list(range(0, live, CHUNK))
            for c, k0 in enumerate(starts):
                yield i, h, c, k0, min(CHUNK, live - k0), c == len(starts) - 1


@kernels.jit
def flash_fwd(q, k, v):
    s, heads, d = q.shape
    scale = 1.0 / math.sqrt(d)
    out = nl.ndarray((s, heads, d), dtype=q.dtype, buffer=nl.shared_hbm)

    # Resident: Q^T and K^T per head [D, S], V as 128-key tiles [keys, tile, H, D].
    qT = nl.ndarray((d, heads, s), dtype=q.dtype, buffer=nl.sbuf)
    kT = nl.ndarray((d, heads, s), dtype=k.dtype, buffer=nl.sbuf)
    vt = nl.ndarray((128, s // 128, heads, d), dtype=v.dtype, buffer=nl.sbuf)
    for h in nl.static_range(heads):          # in the order the jobs need them
        nisa.dma_transpose(dst=qT[:, h, :], src=q[:, h, :])
        nisa.dma_transpose(dst=kT[:, h, :], src=k[:, h, :])
        if h == 0:                            # V rows of all heads: 2 KiB descriptors
            for j in nl.static_range(s // 128):
                nisa.dma_copy(dst=vt[:, j, :, :], src=v[j * 128:(j + 1) * 128, :, :])
    # The identity (for S += I @ bias) and the causal bias of a diagonal block.
    ones = nl.full((128, 128), 1.0, dtype=nl.bfloat16)
    ident = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.affine_select(dst=ident, on_true_tile=ones, on_false_value=0.0,
                       pattern=[[-1, 128]], channel_multiplier=1, cmp_op="is_equal")
    zeros = nl.zeros((128, 128), dtype=nl.bfloat16)
    bias = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.affine_select(dst=bias, on_true_tile=zeros, on_false_value=NEG,
                       pattern=[[-1, 128]], channel_multiplier=1, cmp_op="is_ge")

    for h in nl.static_range(heads):          # Q^T * scale, on the otherwise idle GpSimd
        nisa.tensor_scalar(dst=qT[:, h, :], data=qT[:, h, :], op0=nl.multiply,
                           operand0=scale, engine=nisa.gpsimd_engine)


    # Rings between the stages.
    depth = LAG_B + 2
    s_ps = [nl.ndarray((128, CHUNK), dtype=nl.float32, buffer=nl.psum) for _ in range(2)]
    pT_ps = [nl.ndarray((128, BANK), dtype=nl.float32, buffer=nl.psum) for _ in range(2)]
    o_ps = [nl.ndarray((128, d), dtype=nl.float32, buffer=nl.psum) for _ in range(2)]
    p_sb = [nl.ndarray((128, CHUNK), dtype=q.dtype, buffer=nl.sbuf) for _ in range(depth)]
    pT_sb = [nl.ndarray((128, CHUNK // 128, 128), dtype=q.dtype, buffer=nl.sbuf)
             for _ in range(depth)]
    alpha = [nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf) for _ in range(depth)]
    small = [nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf) for _ in range(depth)]
    # Per (q-tile, head) in flight (at most one per job in flight): -m, l, O (FP32).
    state_n = 2 * (LAG_B + 2)
    neg_m = [nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.sbuf) for _ in range(state_n)]
    rows = [nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf) for _ in range(state_n)]
    acc = [nl.ndarray((128, d), dtype=nl.float32, buffer=nl.sbuf) for _ in range(state_n)]
    out_sb = [nl.ndarray((128, d), dtype=q.dtype, buffer=nl.sbuf) for _ in range(depth)]

    jobs = list(_jobs(s, heads))
    units = {}                       # (q-tile, head) -> its state slot
    for n, (i, h, c, _, _, _) in enumerate(jobs):
        if c == 0:
            units[(i, h)] = len(units) % state_n

    def stage_a(n):
        i, h, c, k0, w, last = jobs[n]
        u, sp, t = units[(i, h)], s_ps[n % 2], small[n % depth]
        for c0 in range(0, w, BANK):
            c1 = min(w, c0 + BANK)
            nisa.nc_matmul(dst=sp[:, c0:c1], stationary=qT[:, h, i * 128:(i + 1) * 128],
                           moving=kT[:, h, k0 + c0:k0 + c1], accumulate=False)
        if last:                                     # the diagonal block is the last
            nisa.nc_matmul(dst=sp[:, w - 128:w], stationary=ident, moving=bias,
                           accumulate=True)
        # -m of this chunk's running max in column c % 2 of neg_m (the previous one in
        # the other): no copies
        m_new, m_old = neg_m[u][:, c % 2:c % 2 + 1], neg_m[u][:, 1 - c % 2:2 - c % 2]
        m_chunk = m_new if c == 0 else t[:, 0:1]
        nisa.tensor_reduce(dst=m_chunk, op=nl.maximum, data=sp[:, :w], axis=1, negate=True)
        if c > 0:                                    # -m = min(-m_old, -m_chunk)
            nisa.tensor_tensor(dst=m_new, data1=m_chunk, data2=m_old, op=nl.minimum)
            nisa.activation(dst=alpha[n % depth], op=nl.exp, data=m_old, scale=-1.0,
                            bias=m_new)              # exp(m_old - m_new)
        total = rows[u] if c == 0 else t[:, 3:4]
        nisa.activation(dst=p_sb[n % depth][:, :w], op=nl.exp, data=sp[:, :w],
                        bias=m_new, reduce_res=total)

    def stage_t(n):
        w = jobs[n][4]
        ps = pT_sb[n % depth]
        for g, c0 in enumerate(range(0, w, BANK)):       # a PSUM bank of 4 blocks
            blocks = (min(w, c0 + BANK) - c0) // 128
            pt = pT_ps[(2 * n + g) % 2]
            for b in range(blocks):
                nisa.nc_transpose(dst=pt[:, b * 128:(b + 1) * 128],
                                  data=p_sb[n % depth][:, c0 + b * 128:c0 + (b + 1) * 128],
                                  engine=nisa.tensor_engine)
            b0 = c0 // 128
            nisa.tensor_copy(dst=ps[:, b0:b0 + blocks, :].reshape((128, blocks * 128)),
                             src=pt[:, :blocks * 128],
                             engine=nisa.vector_engine if g % 2 else nisa.scalar_engine)

    def stage_b(n):
        i, h, c, k0, w, last = jobs[n]
        first = c == 0
        u, op = units[(i, h)], o_ps[n % 2]
        if not first:       # l = l * alpha + rowsum, here: VectorE never waits for the exp
            nisa.scalar_tensor_tensor(dst=rows[u], data=rows[u], op0=nl.multiply,
                                      operand0=alpha[n % depth], op1=nl.add,
                                      operand1=small[n % depth][:, 3:4])
        for b in range(w // 128):
            nisa.nc_matmul(dst=op, stationary=pT_sb[n % depth][:, b, :],
                           moving=vt[:, k0 // 128 + b, h, :], accumulate=b > 0)
        if first:
            nisa.tensor_copy(dst=acc[u], src=op)
        else:
            nisa.scalar_tensor_tensor(dst=acc[u], data=acc[u], op0=nl.multiply,
                                      operand0=alpha[n % depth], op1=nl.add, operand1=op)
        if last:
            ob = out_sb[n % depth]
            nisa.tensor_scalar(dst=ob, data=acc[u], op0=nl.divide, operand0=rows[u],
                               engine=nisa.gpsimd_engine)
            nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, h, :], src=ob)

    total = len(jobs)
    for n in nl.static_range(total + LAG_B):
        if n < total:
            stage_a(n)
        if 0 <= n - LAG_T < total:
            stage_t(n - LAG_T)
        if 0 <= n - LAG_B < total:
            stage_b(n - LAG_B)
    return out
