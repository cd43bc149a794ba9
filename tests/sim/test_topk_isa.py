"""max8 / nc_find_index8 / nc_match_replace8 (§6.2): the documented behaviour (8 largest
descending, first occurrences, duplicates paired ascending / descending, the all-ones
sentinel), our choices where the docs are silent (NaN, -0.0), constraints and cost."""
from __future__ import annotations

import numpy as np
import pytest

from jax_trn.hw import CHIPS, IsaError
from jax_trn.hw.isa_vector import FindIndex8, MatchReplace8, Max8
from tests.sim.helpers import core, run1, tile

TRN2 = CHIPS["trn2"].core


def max8(x, dtype="float32", out="float32"):
    x = np.asarray(x)
    src, dst = tile(x.shape, dtype), tile((x.shape[0], 8), out)
    return run1(Max8(dst=dst, src=src), {src: x})


def find8(data, vals, out="uint32"):
    data, vals = np.float32(data), np.float32(vals)
    d, v, o = tile(data.shape), tile(vals.shape), tile((data.shape[0], 8), out)
    return run1(FindIndex8(dst=o, data=d, vals=v), {d: data, v: vals})


def replace8(data, vals, imm, dtype="float32"):
    data, vals = np.asarray(data), np.float32(vals)
    d, v = tile(data.shape, dtype), tile(vals.shape)
    o, i = tile(data.shape, dtype), tile((data.shape[0], 8), "uint32")
    c = core()
    values = run1(MatchReplace8(dst=o, data=d, vals=v, imm=imm, dst_idx=i), {d: data, v: vals},
                  c=c)
    return values, np.array(c.mem(i).read(i))


def test_max8_descending_per_partition_with_duplicates():
    x = np.float32([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [0, -1, -2, -3, -4, -5, -6, -7, -8,
                                                        -9, -10]])
    out = max8(x)
    np.testing.assert_array_equal(out[0], [9, 6, 5, 5, 5, 4, 3, 3])
    np.testing.assert_array_equal(out[1], [0, -1, -2, -3, -4, -5, -6, -7])


def test_max8_converts_through_fp32_and_casts_out():
    x = np.int32([[2 ** 24 + 1, 7, 6, 5, 4, 3, 2, 1]])     # 2^24 + 1 is not an FP32
    assert max8(x, "int32", "int32")[0, 0] == 2 ** 24
    out = max8(np.float32([[1.00390625, 0, 0, 0, 0, 0, 0, 0]]), out="bfloat16")
    assert float(out[0, 0]) in (1.0, 1.0078125)              # rounded to bf16


def test_max8_nan_ranks_above_inf_signed_zeros_tie():
    x = np.float32([[1, np.inf, np.nan, -0.0, 0.0, -np.inf, 2, 3, -1]])
    out = max8(x)
    assert np.isnan(out[0, 0]) and out[0, 1] == np.inf
    np.testing.assert_array_equal(out[0, 2:], [3, 2, 1, 0, 0, -1])
    assert np.signbit(out[0, 5]) and not np.signbit(out[0, 6])   # position order


def test_find_index8_first_occurrences_duplicates_ascending_sentinel():
    data = [[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8]]
    out = find8(data, [[3, 8, 8, 8, 8, 8, 8, 8]])
    np.testing.assert_array_equal(out, [[2, 4, 5, 6, 7, 8, 9, 10]])
    out = find8(data, [[4, 7, 1, np.nan, 2, 3, 8, 8]], out="uint16")
    np.testing.assert_array_equal(out, [[3, 0xFFFF, 0, 0xFFFF, 1, 2, 4, 5]])
    assert find8([[-0.0] + [1] * 7], [[0.0] * 8])[0, 0] == 0      # FP32 equality


def test_match_replace8_replaces_first_occurrences_indices_descending():
    data = np.float32([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8]])
    values, idx = replace8(data, [[3, 8, 8, 8, 8, 8, 8, 8]], -np.inf)
    np.testing.assert_array_equal(values, [[1, 2, -np.inf, 4] + [-np.inf] * 7])
    np.testing.assert_array_equal(idx, [[2, 10, 9, 8, 7, 6, 5, 4]])   # the docs' example


def test_match_replace8_missing_value_is_ignored():
    values, idx = replace8(np.float32([[5, 5, 1, 2, 3, 4, 6, 7, 9]]),
                           [[5, 42, 9, 9, 7, 6, 4, 3]], -1.0)
    np.testing.assert_array_equal(values, [[-1, 5, 1, 2, -1, -1, -1, -1, -1]])
    np.testing.assert_array_equal(idx[0, :2], [0, 0xFFFFFFFF])
    assert idx[0, 2] == 0xFFFFFFFF or idx[0, 3] == 0xFFFFFFFF    # one 9 only


def test_constraints_and_cost():
    with pytest.raises(IsaError):
        Max8(dst=tile((4, 8)), src=tile((4, 7)))                      # < 8 elements
    with pytest.raises(IsaError):
        Max8(dst=tile((4, 8)), src=tile((4, 16385)))
    with pytest.raises(IsaError):
        FindIndex8(dst=tile((4, 8), "int32"), data=tile((4, 9)), vals=tile((4, 8)))
    with pytest.raises(IsaError):
        MatchReplace8(dst=tile((4, 9)), data=tile((4, 9)), vals=tile((3, 8)), imm=0.0)
    assert Max8(dst=tile((4, 8)), src=tile((4, 1000))).cycles(TRN2) == 1000
    assert FindIndex8(dst=tile((4, 8), "uint32"), data=tile((4, 20)),
                      vals=tile((4, 8))).cycles(TRN2) == TRN2.min_ii
    ins = MatchReplace8(dst=tile((4, 900)), data=tile((4, 900)), vals=tile((4, 8)), imm=0.0,
                        dst_idx=tile((4, 8), "uint32"))
    assert ins.cycles(TRN2) == 900 and len(ins.outputs()) == 2
