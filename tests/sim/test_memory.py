"""SBUF/PSUM tiles as byte views, and DRAM access patterns."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from jax_trn.hw import DramAP, IsaError, Tile
from jax_trn.hw.memory import OnChipMemory, ap_bounds, dram_read, dram_write


def test_tiles_are_typed_views_of_partition_bytes():
    mem = OnChipMemory("sbuf", 128, 1024)
    a = Tile("sbuf", 0, 2, 8, (2,), "float32")
    mem.write(a, np.float32([[1, 2], [3, 4]]))
    as_bytes = Tile("sbuf", 0, 2, 8, (8,), "uint8")
    np.testing.assert_array_equal(mem.read(as_bytes)[1].view(np.float32), [3, 4])
    bf = Tile("sbuf", 0, 1, 8, (2,), "bfloat16")           # the high half of 1.0f
    assert float(mem.read(bf)[0, 1]) == 1.0
    assert mem.data[2:].sum() == 0


def test_tile_bounds_and_dtype_are_checked():
    mem = OnChipMemory("psum", 128, 16384)
    with pytest.raises(IsaError, match="outside"):
        mem.read(Tile("psum", 0, 1, 16380, (2,), "float32"))
    with pytest.raises(TypeError):
        mem.write(Tile("psum", 0, 1, 0, (2,), "float32"), np.zeros((1, 2), np.float64))


def test_pattern_bounds_with_negative_stride():
    ap = DramAP("x", 5, ((-1, 6),), "float32")               # reversed
    assert ap_bounds(ap) == (0, 5)
    x = np.arange(6, dtype=np.float32)
    np.testing.assert_array_equal(dram_read(ap, {"x": x}), x[::-1])


def test_reads_are_read_only_views_and_writes_go_through():
    x = np.zeros(12, ml_dtypes.bfloat16)
    ap = DramAP("x", 1, ((4, 3), (2, 2)), "bfloat16")
    assert not dram_read(ap, {"x": x}).flags.writeable
    dram_write(ap, {"x": x}, np.ones((3, 2), ml_dtypes.bfloat16))
    np.testing.assert_array_equal(np.flatnonzero(x.astype(np.float32)), [1, 3, 5, 7, 9, 11])


def test_write_through_interleaved_but_disjoint_pattern():
    x = np.zeros(8, np.int32)
    ap = DramAP("x", 0, ((2, 3), (3, 2)), "int32")           # {0,3,2,5,4,7}: disjoint
    dram_write(ap, {"x": x}, np.arange(1, 7, dtype=np.int32).reshape(3, 2))
    np.testing.assert_array_equal(x, [1, 0, 3, 2, 5, 4, 0, 6])


@pytest.mark.parametrize("arrays, ap, match", [
    ({}, DramAP("x", 0, ((1, 2),), "float32"), "not allocated"),
    ({"x": np.zeros(4, np.int32)}, DramAP("x", 0, ((1, 2),), "float32"), "pattern says"),
    ({"x": np.zeros((2, 2), np.float32)}, DramAP("x", 0, ((1, 2),), "float32"), "flat"),
    ({"x": np.zeros(4, np.float32)}, DramAP("x", 3, ((1, 2),), "float32"), "outside"),
])
def test_bad_dram_access(arrays, ap, match):
    with pytest.raises(IsaError, match=match):
        dram_read(ap, arrays)


def test_writing_a_read_only_tensor_is_an_isa_error():
    x = np.zeros(4, np.float32)
    x.flags.writeable = False
    with pytest.raises(IsaError, match="read-only"):
        dram_write(DramAP("x", 0, ((1, 4),), "float32"), {"x": x}, np.ones(4, np.float32))
