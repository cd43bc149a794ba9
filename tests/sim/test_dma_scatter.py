"""Truth tables for the indirect DMA scatter, overwrite and read-modify-write add (§3.4,
§6.2): rows in index order, duplicates combining in that order, out-of-bounds rows."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from jax_trn.hw import DramAP, IsaError, Kernel, isa
from tests.sim.helpers import core, tile

TABLE = np.arange(15, dtype=np.float32).reshape(5, 3) + 0.5      # 5 rows of 3


def scatter(indices, values, rmw_op=None, oob_mode="error", dtype="float32",
            table=TABLE, src_dtype="float32"):
    """Runs one DmaScatter of `values` [p, n*3] into a copy of `table`; returns it."""
    idx = np.asarray(indices, np.int32)
    p, n = idx.shape
    it, s = tile((p, n), "int32"), tile((p, n * 3), src_dtype)
    c = core()
    c.mem(it).write(it, idx)
    c.mem(s).write(s, np.asarray(values).astype(s.dtype if src_dtype == "float32"
                                               else ml_dtypes.bfloat16).reshape(p, n * 3))
    dram = {"table": np.asarray(table).astype(np.dtype(getattr(ml_dtypes, dtype, dtype)))
            .reshape(-1).copy()}
    rows = dram["table"].size // 3
    instr = isa.DmaScatter(dst=DramAP("table", 0, ((3, rows), (1, 3)), dtype), src=s,
                           indices=it, rmw_op=rmw_op, oob_mode=oob_mode, dma_queue=1)
    c.run(Kernel("k", [instr], {}), dram)
    return dram["table"].reshape(rows, 3)


def test_scatter_overwrites_rows():
    vals = -np.arange(6, dtype=np.float32).reshape(2, 3)
    out = scatter([[4], [1]], vals)
    expected = TABLE.copy()
    expected[[4, 1]] = vals
    np.testing.assert_array_equal(out, expected)


def test_scatter_duplicates_last_write_wins_in_index_order():
    vals = np.array([[1, 1, 1, 2, 2, 2], [3, 3, 3, 4, 4, 4]], np.float32)
    out = scatter([[2, 2], [0, 2]], vals)       # order: (0,0), (0,1), (1,0), (1,1)
    np.testing.assert_array_equal(out[2], [4, 4, 4])
    np.testing.assert_array_equal(out[0], [3, 3, 3])
    np.testing.assert_array_equal(out[[1, 3, 4]], TABLE[[1, 3, 4]])


def test_scatter_add_accumulates_duplicates_in_fp32():
    vals = np.ones((3, 3), np.float32)
    out = scatter([[1], [1], [3]], vals, rmw_op="add")
    expected = TABLE.copy()
    expected[1] += 2
    expected[3] += 1
    np.testing.assert_array_equal(out, expected)


def test_scatter_add_bf16_rounds_after_each_write():
    # 256 + 1 rounds back to 256 in bf16 (8 bits of mantissa), twice: the order of
    # writes is visible, as on the hardware that serialises duplicate offsets.
    table = np.full((2, 3), 256.0, np.float32)
    out = scatter([[0], [0]], np.ones((2, 3), np.float32), rmw_op="add", dtype="bfloat16",
                  table=table)
    np.testing.assert_array_equal(out[0].astype(np.float32), [256.0] * 3)


def test_scatter_out_of_bounds_error_and_skip():
    with pytest.raises(IsaError, match="index 5 outside the 5 rows"):
        scatter([[1], [5]], np.zeros((2, 3), np.float32))
    out = scatter([[5], [-1], [0]], np.full((3, 3), 9.0, np.float32), oob_mode="skip")
    expected = TABLE.copy()
    expected[0] = 9
    np.testing.assert_array_equal(out, expected)
    out = scatter([[7], [0]], np.full((2, 3), 1.0, np.float32), rmw_op="add",
                  oob_mode="skip")
    np.testing.assert_array_equal(out[0], TABLE[0] + 1)


def test_scatter_casts_through_fp32():
    out = scatter([[0]], np.array([[1.5, -2.25, 3.0]], np.float32), dtype="int32",
                  table=np.zeros((2, 3)))
    assert out.dtype == np.int32 and out[1].tolist() == [0, 0, 0]


def test_scatter_constraints_and_cost():
    it, s = tile((4, 2), "int32"), tile((4, 6), "bfloat16")
    table = DramAP("t", 0, ((3, 10), (1, 3)), "bfloat16")
    sc = isa.DmaScatter(dst=table, src=s, indices=it, rmw_op="add", dma_queue=5)
    assert (sc.engine, sc.queue, sc.dge_mode, sc.descriptor_engine) == (
        "dma", "dma5", "swdge", "gpsimd")
    assert (sc.nbytes, sc.chunk_bytes, sc.hbm_bytes) == (48, 6, 96)    # RMW reads too
    assert isinstance(sc, isa.DmaCopy)
    with pytest.raises(IsaError, match="only add"):
        isa.DmaScatter(dst=table, src=s, indices=it, rmw_op="max")
    with pytest.raises(IsaError, match="does not hold"):
        isa.DmaScatter(dst=table, src=tile((4, 5), "bfloat16"), indices=it)
    with pytest.raises(IsaError, match="int32/uint32"):
        isa.DmaScatter(dst=table, src=s, indices=tile((4, 2), "float32"))


def test_scatter_orders_after_earlier_dma_to_the_table():
    """The sync pass sees the whole table as written: a later read of the table waits."""
    it, s, d = tile((2, 1), "int32"), tile((2, 3)), tile((2, 3))
    table = DramAP("table", 0, ((3, 5), (1, 3)), "float32")
    c = core()
    c.mem(it).write(it, np.array([[4], [0]], np.int32))
    c.mem(s).write(s, np.full((2, 3), 7.0, np.float32))
    sc = isa.DmaScatter(dst=table, src=s, indices=it, dma_queue=1)
    rd = isa.DmaCopy(dst=d, src=DramAP("table", 12, ((-12, 2), (1, 3)), "float32"),
                     dma_queue=2)
    from jax_trn.hw.sync import insert_semaphores
    instrs = insert_semaphores([sc, rd])
    assert instrs[1].waits == (("dma1", 1),)
    dram = {"table": TABLE.reshape(-1).copy()}
    c.run(Kernel("k", instrs, {}), dram)
    np.testing.assert_array_equal(np.array(c.mem(d).read(d)), [[7] * 3, [7] * 3])   # rows 4, 0
