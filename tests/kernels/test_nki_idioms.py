"""NKI idioms a ported kernel uses (a helper ported 19 public NKI kernels and listed
what blocked them): tile assignment and arithmetic, nl.ds, broadcasts, masks, numpy
ufuncs as ops, block tiles (par_dim), grid launches, calling a kernel on numpy arrays."""
from __future__ import annotations

import numpy as np
import pytest

from jax_trn import kernels
import jax_trn.kernels.isa as nisa
import jax_trn.kernels.language as nl
from jax_trn.kernels import typing as nt

RNG = np.random.default_rng(2)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_assignment_and_operators():
    @kernels.jit
    def k(a: nt.tensor, b: nt.tensor):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        ta = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        ta[...] = nl.load(a)                         # a loaded tile, copied in
        tb = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        tb[...] = b[0:128, 0:64]                     # an HBM view: a DMA
        y = (ta + tb) * 2.0 - ta / 4.0               # tensor_tensor / tensor_scalar
        y += 1.0
        y[:, 0:8] = 5.0                              # memset of a view
        col = nl.sum(ta, axis=1, keepdims=True)      # [128, 1]
        z = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        z[...] = y - col                             # per-partition operand
        nl.store(out, z)
        return out
    a, b = _x(128, 64), _x(128, 64)
    want = (a + b) * 2 - a / 4 + 1
    want[:, 0:8] = 5.0
    want = want - a.sum(1, keepdims=True)
    np.testing.assert_allclose(k(a, b), want, rtol=1e-5, atol=1e-5)   # numpy in: NKI-style


def test_ds_numpy_ops_positional_reciprocal_and_psum_store():
    @kernels.jit
    def k(a, b):
        out = nl.ndarray((128, 32), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a[nl.ds(128, 128), :])
        u = nisa.tensor_tensor(t, nl.load(b), op=np.multiply)        # positional + keyword
        r = nisa.reciprocal(data=nisa.activation(op=np.exp, data=u))
        s = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        v = nisa.tensor_scalar_reduce(data=r, op0=np.add, operand0=1.0, reduce_op=np.add,
                                      reduce_res=s)
        ps = nl.matmul(nl.load(a[0:128, :]), v, transpose_x=True)     # [32, 32] in PSUM
        nl.store(out[0:32, :], ps)                                   # through SBUF
        nl.store(out[32:128, 0:1], s[32:128, :])
        return out
    a, b = _x(256, 32), _x(128, 32)
    v = 1 / np.exp(a[128:] * b) + 1
    got = kernels.simulate_kernel(k, a, b, system="trn2")
    np.testing.assert_allclose(got[0:32], a[0:128].T @ v, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(got[32:128, 0], v.sum(1)[32:128], rtol=1e-5)


def test_psum_iadd_of_nl_matmul_and_broadcasts():
    @kernels.jit
    def k(a, w, c):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 64), nl.float32, buffer=nl.psum)
        for i in nl.affine_range(2):
            acc += nl.matmul(nl.load(a[i * 128:(i + 1) * 128, :]),
                             nl.load(w[i * 128:(i + 1) * 128, :]), transpose_x=True)
        row = nl.load(c.reshape((1, 64)))                            # [1, 64]
        t = nl.copy(acc) + row.broadcast_to((128, 64))               # partition broadcast
        s = nl.sum(t, axis=1, keepdims=True)
        t2 = t * s.broadcast_to((128, 64))                           # free broadcast
        nl.store(out, t2)
        return out
    a, w, c = _x(256, 128), _x(256, 64), _x(64)
    t = a.T @ w + c
    want = t * t.sum(1, keepdims=True)
    np.testing.assert_allclose(kernels.simulate_kernel(k, a, w, c, system="trn2"), want,
                               rtol=1e-4, atol=1e-2)


def test_masks_on_a_partial_tile():
    @kernels.jit
    def k(x):
        rows, cols = x.shape
        out = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.arange(128)[:, None], nl.arange(cols)[None, :]
        for i in nl.affine_range((rows + 127) // 128):
            m = (i * 128 + i_p < rows)
            t = nl.load(x[i * 128 + i_p, i_f], mask=m)
            nl.store(out[i * 128 + i_p, i_f], value=nl.exp(t, mask=m), mask=m)
        return out
    x = _x(250, 16)                                   # a last tile of 122 rows
    np.testing.assert_allclose(k(x), np.exp(x), rtol=1e-6)


def test_block_tiles_with_par_dim_and_3d_index_grids():
    @kernels.jit
    def k(x):
        out = nl.ndarray((256, 32), dtype=x.dtype, buffer=nl.shared_hbm)
        blocks = nl.ndarray((2, nl.par_dim(128), 32), dtype=x.dtype, buffer=nl.sbuf)
        for b in nl.affine_range(2):
            nisa.dma_copy(dst=blocks[b], src=x[b * 128:(b + 1) * 128, :])
        for b in nl.affine_range(2):
            nl.store(out[b * 128:(b + 1) * 128, :], nl.multiply(blocks[b], float(b + 1)))
        return out
    x = _x(256, 32)
    got = k(x)
    np.testing.assert_allclose(got[:128], x[:128], rtol=1e-6)
    np.testing.assert_allclose(got[128:], 2 * x[128:], rtol=1e-6)
    i = nl.arange(4)[None, :, None]
    assert (i.ndim, i.dim) == (3, 1)


def test_grid_launch_with_program_id():
    @kernels.jit
    def add(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        i, j = nl.program_id(0), nl.program_id(1)
        rows, cols = a.shape[0] // nl.num_programs(0), a.shape[1] // nl.num_programs(1)
        sl = (slice(i * rows, (i + 1) * rows), slice(j * cols, (j + 1) * cols))
        nl.store(out[sl], nl.add(nl.load(a[sl]), nl.load(b[sl])))
        return out
    a, b = _x(256, 64), _x(256, 64)
    np.testing.assert_allclose(add[2, 2](a, b), a + b, rtol=1e-6)


def test_errors_from_indexing_name_the_kernel_line():
    @kernels.jit
    def k(x):
        nl.load(x[nl.arange(128)[:, None] + 300, nl.arange(4)[None, :]])
        return x
    with pytest.raises(kernels.KernelError, match=r"kernel k at test_nki_idioms.py:\d+: axis 0"):
        kernels.simulate(k, _x(256, 8), system="trn2")

    @kernels.jit
    def bad_shapes(x):
        out = nl.ndarray((128, 64), dtype=x.dtype, buffer=nl.shared_hbm)
        a = nl.load(x[0:128, 0:64])
        b = nl.load(x[0:64, 0:64])
        nl.store(out, nisa.tensor_tensor(data1=a, data2=b, op=nl.add))
        return out
    with pytest.raises(kernels.KernelError, match=r"data2: shape \(64, 64\) does not match "
                                                   r"\(128, 64\)"):
        kernels.simulate(bad_shapes, _x(128, 64), system="trn2")

    @kernels.jit
    def psum_dma(x):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 64), nl.float32, buffer=nl.psum)
        acc += nisa.nc_matmul(nl.load(x[0:128, 0:128]), nl.load(x[0:128, 0:64]))
        nisa.dma_copy(dst=out, src=acc)
        return out
    with pytest.raises(kernels.KernelError, match=r"copy the tile to SBUF first"):
        kernels.simulate(psum_dma, _x(128, 128), system="trn2")


def test_bn_stats_bn_aggr_layernorm_statistics():
    @kernels.jit
    def stats(x):
        out = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        parts = nl.ndarray((128, 2 * 6), dtype=nl.float32, buffer=nl.sbuf)
        for c in nl.affine_range(2):                 # two 512-element chunks
            nisa.bn_stats(dst=parts[:, c * 6:(c + 1) * 6], data=t[:, c * 512:(c + 1) * 512])
        mv = nisa.bn_aggr(data=parts)
        nl.store(out, mv)
        return out
    x = _x(128, 1024) * 3 + 1
    got = kernels.simulate_kernel(stats, x, system="trn2")
    np.testing.assert_allclose(got[:, 0], x.mean(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[:, 1], x.var(1), rtol=1e-4)

    @kernels.jit
    def too_long(x):
        nisa.bn_stats(data=nl.load(x))
        return x
    with pytest.raises(kernels.KernelError, match="at most 512"):
        kernels.simulate(too_long, _x(128, 1024), system="trn2")


def test_is_transpose_shared_constant_placement_and_jit_options():
    import jax_trn.kernels as nki

    @nki.compiler.skip_middle_end_transformations
    @nki.jit(additional_compile_opt="--anything", mode="simulation")
    def k(x):
        out = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        ident = nl.load(nl.shared_constant(np.identity(128, dtype=np.int8), dtype=nl.float32))
        xs = nl.ndarray((128, 64), dtype=nl.float32,
                        buffer=nki.compiler.sbuf.mod_alloc(base_addr=0))
        xs[...] = nl.load(x)
        ps = nl.ndarray((2, nl.par_dim(64), 128), dtype=nl.float32,
                        buffer=nki.compiler.psum.mod_alloc(base_bank=1, num_bank_tiles=(2,)))
        ps[0] = nisa.nc_matmul(xs, ident, is_transpose=True)       # x^T, bit-exact (v3+)
        ps[1] = nisa.nc_matmul(xs, ident)                          # x^T via the PE array
        for i in nl.sequential_range(1, directives=nki.compiler.no_reorder()):
            nl.store(out, nl.copy(ps[0]) + nl.copy(ps[1]))
        return out
    x = _x(128, 64)
    assert k.options == {"additional_compile_opt": "--anything", "mode": "simulation"}
    np.testing.assert_allclose(k(x), 2 * x.T, rtol=1e-6)
    with pytest.raises(kernels.KernelError, match="is_transpose needs NeuronCore-v3"):
        kernels.simulate(k, x, system="trn1")


def test_assigning_a_fresh_result_writes_it_in_place():
    """`t[...] = nl.exp(x)` makes the exp write t (no copy), unless the result is read
    again afterwards (then it is computed, and copied)."""
    @kernels.jit
    def once(x):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        t[...] = nl.exp(nl.load(x))
        nl.store(out, t)
        return out

    @kernels.jit
    def reused(x):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        e = nl.exp(nl.load(x))
        t[...] = e
        nl.store(out, nl.add(t, e))
        return out
    x = _x(128, 64)
    run = kernels.simulate(once, x, system="trn2")
    np.testing.assert_allclose(run.outputs[0], np.exp(x), rtol=1e-6)
    assert [k.opcode for k in run.execution.instructions].count("TensorCopy") == 0
    assert [k.opcode for k in run.execution.instructions].count("DmaCopy") == 2
    run = kernels.simulate(reused, x, system="trn2")
    np.testing.assert_allclose(run.outputs[0], 2 * np.exp(x), rtol=1e-6)
    assert [k.opcode for k in run.execution.instructions].count("TensorCopy") == 1


def test_index_sums_over_grid_axes_and_masks_of_higher_rank_grids():
    """`t[i_p, i_f1 * n2 + i_f2]` makes one view axis per grid axis (a transpose by two
    views iterated alike); a mask of a 4-D grid cuts the axes a [P, F] tile lines up
    with; a bool mask keeps all or nothing."""
    @kernels.jit
    def transpose_blocks(x):                    # rows of [4 x 8] -> rows of [8 x 4]
        out = nl.ndarray((128, 32), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        r = nl.ndarray((128, 32), dtype=x.dtype, buffer=nl.sbuf)
        i_p = nl.arange(128)[:, None, None]
        i_a = nl.arange(4)[None, :, None]
        i_b = nl.arange(8)[None, None, :]
        r[i_p, i_b * 4 + i_a] = nl.copy(t[i_p, i_a * 8 + i_b])
        nl.store(out, r)
        return out
    x = _x(128, 32)
    want = x.reshape(128, 4, 8).transpose(0, 2, 1).reshape(128, 32)
    np.testing.assert_array_equal(transpose_blocks(x), want)

    @kernels.jit
    def rows4d(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        i_q = nl.arange(x.shape[2])[None, None, :, None]
        for i in range(2):
            t = nl.zeros((128, x.shape[3]), x.dtype)
            t[...] = nl.load(x[0, 0, i * 128:(i + 1) * 128, :],
                             mask=(i * 128 + i_q < x.shape[2]))
            nl.store(out[0, 0, i * 128:(i + 1) * 128, :], value=nl.exp(t),
                     mask=(i * 128 < x.shape[2]))
            nl.store(out[0, 0, 0:1, :], value=t[0:1, :], mask=False)   # never issued
        return out
    x = _x(1, 1, 256, 16)
    np.testing.assert_allclose(rows4d(x), np.exp(x), rtol=1e-6)
