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


def test_strided_tiles_are_access_patterns_over_partition_bytes():
    # §3.1: up to 4 (size, stride) free dims in elements, the same for every partition.
    mem = OnChipMemory("sbuf", 128, 1024)
    words = Tile("sbuf", 0, 2, 16, (4,), "uint16")
    mem.write(words, np.uint16([[0x0201, 0x0403, 0x0605, 0x0807], [0x1211, 0x1413, 0x1615, 0x1817]]))
    pairs = Tile("sbuf", 0, 2, 16, (2, 4), "uint8", strides=(1, 2))   # bytes [m, 2] read as [2, m]
    assert pairs.byte_range == (16, 24) and pairs.bytes_per_partition == 8
    np.testing.assert_array_equal(mem.read(pairs)[0], [[1, 3, 5, 7], [2, 4, 6, 8]])
    np.testing.assert_array_equal(mem.read(pairs)[1], [[0x11, 0x13, 0x15, 0x17], [0x12, 0x14, 0x16, 0x18]])
    fp8 = Tile("sbuf", 0, 1, 16, (2, 4), "float8_e5m2", strides=(1, 2))
    assert mem.read(fp8).dtype == ml_dtypes.float8_e5m2
    cols = Tile("sbuf", 0, 1, 512, (2, 3), "float32", strides=(8, 1))   # runs 32 bytes apart
    mem.write(cols, np.float32([[1, 2, 3], [4, 5, 6]]))
    assert cols.byte_range == (512, 556)
    np.testing.assert_array_equal(mem.read(Tile("sbuf", 0, 1, 512, (11,), "float32"))[0],
                                  [1, 2, 3, 0, 0, 0, 0, 0, 4, 5, 6])
    with pytest.raises(IsaError, match="outside"):
        mem.read(Tile("sbuf", 0, 1, 1000, (2, 3), "float32", strides=(8, 1)))
    back = Tile("sbuf", 0, 1, 512 + 40, (2, 3), "float32", strides=(-8, -1))  # from the end
    assert back.byte_range == (512, 556)
    np.testing.assert_array_equal(mem.read(back)[0], [[6, 5, 4], [3, 2, 1]])
    with pytest.raises(IsaError, match="outside"):
        mem.read(Tile("sbuf", 0, 1, 4, (3,), "float32", strides=(-1,)))


@pytest.mark.parametrize("free, strides, match", [
    ((2, 4), (1,), "one per free axis"),
    ((2, 4), (0, 1), "nonzero"),
    ((2, 4), (1 << 15, 1), "int16"),
    ((2, 4), (1, 5), "16 bytes"),          # 20-byte innermost stride: half bandwidth
])
def test_bad_strides_are_refused(free, strides, match):
    with pytest.raises(IsaError, match=match):
        Tile("sbuf", 0, 1, 0, free, "float32", strides=strides)


def test_dram_patterns_may_view_a_tensor_as_another_width():
    # NKI view(dtype) (§6.1): FP8 bytes read as 16-bit words, offsets in words.
    x = np.arange(8, dtype=np.uint8).view(ml_dtypes.float8_e5m2)
    w = dram_read(DramAP("x", 0, ((2, 2), (1, 2)), "uint16"), {"x": x})
    np.testing.assert_array_equal(w, [[0x0100, 0x0302], [0x0504, 0x0706]])
    np.testing.assert_array_equal(dram_read(DramAP("x", 1, ((1, 3),), "uint16"), {"x": x}),
                                  [0x0302, 0x0504, 0x0706])
    with pytest.raises(IsaError, match="pattern says"):            # 7 bytes: no whole words
        dram_read(DramAP("x", 0, ((1, 2),), "uint16"), {"x": x[:7]})


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
