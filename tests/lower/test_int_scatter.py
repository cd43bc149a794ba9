"""Integer scatter-add (intscatter.py): byte planes DMA-added exactly, then the touched
rows (or, for a small table, the whole table) recomputed on GpSimd."""
from __future__ import annotations

import numpy as np
import pytest

from jax_trn.hw import isa

from .irbuild import FnBuilder, combiner
from .runner import run


def scatter_add(table, n, dtype, width=1, updates=None):
    """x.at[idx].add(v) for a [table, width] (width 1: [table]) x and n indices; the
    updates an argument, or a constant."""
    b = FnBuilder()
    shape = (table,) if width == 1 else (table, width)
    x, idx = b.arg(shape, dtype), b.arg((n, 1), "int32")
    ushape = (n,) if width == 1 else (n, width)
    v = b.arg(ushape, dtype) if updates is None else b.const(updates, dtype)
    dn = {"update_window_dims": () if width == 1 else (1,), "inserted_window_dims": (0,),
          "input_batching_dims": (), "scatter_indices_batching_dims": (),
          "scatter_dims_to_operand_dims": (0,), "index_vector_dim": 1}
    r = b.op("scatter", [x, idx, v], shape, dtype, regions=[combiner("add", dtype)],
             scatter_dimension_numbers=dn, unique_indices=False, indices_are_sorted=False)
    return b.ret(r)


def reference(x, idx, v):
    out = x.copy()
    with np.errstate(over="ignore"):
        np.add.at(out, idx.reshape(-1), v)
    return out


def full_range(shape, dtype, seed):
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max, shape, dtype=dtype,
                                                endpoint=True)


def counts(res):
    ins = [i for k in res.program.kernels for i in k.instructions]
    return (sum(isinstance(i, isa.DmaScatter) and i.rmw_op == "add" for i in ins),
            sum(isinstance(i, isa.DmaGather) for i in ins))


@pytest.mark.parametrize("dtype", ["int8", "uint16", "int32", "uint32"])
@pytest.mark.parametrize("table, n, width", [(1000, 300, 1), (10, 3000, 1), (40, 200, 33)])
def test_exact_and_wrapping(dtype, table, n, width):
    shape = (table,) if width == 1 else (table, width)
    x, v = full_range(shape, dtype, 1), full_range((n,) + shape[1:], dtype, 2)
    idx = np.random.default_rng(3).integers(0, table, (n, 1)).astype(np.int32)
    res = run(scatter_add(table, n, dtype, width), x, idx, v)
    np.testing.assert_array_equal(res.outputs[0], reference(x, idx, v))


def test_big_table_gathers_its_touched_rows_small_table_is_recomputed_whole():
    idx = np.arange(300, dtype=np.int32).reshape(-1, 1) % 7
    big = run(scatter_add(100000, 300, "int32"), np.zeros(100000, np.int32), idx,
              np.ones(300, np.int32))
    small = run(scatter_add(7, 300, "int32"), np.zeros(7, np.int32), idx,
                np.ones(300, np.int32))
    tiles = 2                                        # 300 positions: 128 x 2, then 44
    assert counts(big) == (tiles, 2 * tiles)         # 4 interleaved byte planes; x
    assert counts(small) == (tiles, 0)
    np.testing.assert_array_equal(small.outputs[0], np.bincount(idx.reshape(-1), minlength=7))


def test_constant_updates_add_only_their_nonzero_bytes():
    idx = np.arange(300, dtype=np.int32).reshape(-1, 1) % 7
    res = run(scatter_add(7, 300, "int32", updates=np.full(300, 3)), np.zeros(7, np.int32),
              idx)
    digits = [i for k in res.program.kernels for i in k.instructions
              if isinstance(i, isa.TensorScalar) and i.op1 == "bitwise_and"]
    assert len(digits) == 2                          # byte 0 only, one per tile
    np.testing.assert_array_equal(res.outputs[0], 3 * np.bincount(idx.reshape(-1), minlength=7))


def test_64_bit_planes_go_in_two_tables():
    """Eight byte planes: two interleaved tables of four (16-byte strides, §3.1)."""
    x, v = full_range(50, "int64", 4), full_range(200, "int64", 5)
    idx = np.random.default_rng(6).integers(0, 50, (200, 1)).astype(np.int32)
    res = run(scatter_add(50, 200, "int64"), x, idx, v)
    np.testing.assert_array_equal(res.outputs[0], reference(x, idx, v))
    assert counts(res)[0] == 2 * 2
