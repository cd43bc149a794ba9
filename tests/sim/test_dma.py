"""Truth tables for the indirect DMA gather and dma_transpose (§3.4, §6.2)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from jax_trn.hw import DramAP, IsaError, Kernel, Tile, isa
from tests.sim.helpers import core, run1, tile

TABLE = np.arange(15, dtype=np.float32).reshape(5, 3) + 0.5      # 5 rows of 3


def table_ap(dtype="float32"):
    return DramAP("table", 0, ((3, 5), (1, 3)), dtype)


def gather(indices, dst_dtype="float32", oob_mode="error", prefill=None):
    idx = np.asarray(indices, np.int32)
    p, n = idx.shape
    it, d = tile((p, n), "int32"), tile((p, n * 3), dst_dtype)
    ins = {it: idx}
    if prefill is not None:
        ins[d] = np.full((p, n * 3), prefill)
    instr = isa.DmaGather(dst=d, src=table_ap(), indices=it, oob_mode=oob_mode, dma_queue=2)
    return run1(instr, ins, dram={"table": TABLE.reshape(-1).copy()})


def test_gather_rows_into_partitions():
    out = gather([[3], [0], [4], [3]])
    np.testing.assert_array_equal(out, TABLE[[3, 0, 4, 3]])


def test_gather_several_rows_per_partition_with_cast():
    out = gather([[1, 2], [4, 0]], "bfloat16")
    expected = TABLE[[[1, 2], [4, 0]]].reshape(2, 6).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(out, expected)


def test_gather_out_of_bounds_error_and_skip():
    with pytest.raises(IsaError, match="index 5 outside the 5 rows"):
        gather([[1], [5]])
    with pytest.raises(IsaError, match="index -1"):
        gather([[-1], [0]])
    out = gather([[1], [5], [-2]], oob_mode="skip", prefill=-7.0)
    np.testing.assert_array_equal(out, [TABLE[1], [-7] * 3, [-7] * 3])


def test_gather_is_a_dma_on_swdge():
    it = tile((4, 1), "int32")
    g = isa.DmaGather(dst=tile((4, 3)), src=table_ap(), indices=it, dma_queue=3)
    assert (g.engine, g.queue, g.dge_mode, g.descriptor_engine) == ("dma", "dma3", "swdge",
                                                                     "gpsimd")
    assert (g.nbytes, g.hbm_bytes, g.chunk_bytes, g.efficiency) == (48, 48, 12, 1.0)
    assert isinstance(g, isa.DmaCopy)


def test_dma_transpose_from_dram_is_bit_exact():
    x = np.array([0x7FC1, 0x3F80, 0xFF81, 0x0001, 0x4000, 0x8000], np.uint16)   # NaNs, denormal
    src = DramAP("x", 0, ((3, 2), (1, 3)), "bfloat16")                          # [2, 3]
    d = tile((3, 2), "bfloat16")
    out = run1(isa.DmaTranspose(dst=d, src=src), {}, dram={"x": x.view(ml_dtypes.bfloat16)})
    np.testing.assert_array_equal(out.view(np.uint16), x.reshape(2, 3).T)


def test_dma_transpose_sbuf_to_sbuf_fp32():
    s, d = tile((2, 4), "float32"), tile((4, 2), "float32")
    out = run1(isa.DmaTranspose(dst=d, src=s), {s: [[1, 2, 3, 4], [5, 6, 7, 8]]})
    np.testing.assert_array_equal(out, [[1, 5], [2, 6], [3, 7], [4, 8]])


def test_dma_transpose_efficiency():
    d = tile((4, 2), "bfloat16")
    hbm = isa.DmaTranspose(dst=d, src=DramAP("x", 0, ((4, 2), (1, 4)), "bfloat16"))
    sbuf = isa.DmaTranspose(dst=d, src=tile((2, 4), "bfloat16"))
    assert (hbm.efficiency, sbuf.efficiency) == (0.9, 0.5)          # §3.4
    assert hbm.hbm_bytes == 16 and sbuf.hbm_bytes == 0


def test_dma_transpose_needs_trn2():
    ins = isa.DmaTranspose(dst=tile((4, 2), "bfloat16"), src=tile((2, 4), "bfloat16"))
    with pytest.raises(IsaError, match="dma_transpose needs NC-v3"):
        core("trn1").run(Kernel("k", [ins], {}), {})
    core("trn2").run(Kernel("k", [ins], {}), {})


def test_a_strided_sbuf_side_prices_its_contiguous_runs():
    """A DMA into an SBUF access pattern (§3.1) moves descriptors of its contiguous runs
    (§3.4), not of the partition's whole span."""
    from jax_trn.hw import costs
    strided = Tile("sbuf", 0, 128, 0, (2, 64), "float32", strides=(128, 1))
    assert costs._run_bytes(strided) == 256
    assert costs._run_bytes(strided.with_(strides=None)) == 512
    assert costs._run_bytes(Tile("sbuf", 0, 128, 0, (64,), "uint8", strides=(2,))) == 1
