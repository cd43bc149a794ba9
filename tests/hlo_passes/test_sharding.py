"""hlo_passes.sharding: Shardy attribute text -> data, and mesh device arithmetic."""
from __future__ import annotations

import numpy as np
import pytest

from hlo_passes.sharding import (AxisRef, Mesh, block_offsets, even_prefix, local_shape,
                                 padded_dims, valid_counts,
                                 parse_all_to_all_params, parse_axis_list, parse_axis_lists,
                                 parse_per_value, parse_sharding)

MESH = Mesh("mesh", (("x", 4), ("y", 2)))


def test_parse_shardings_with_sub_axes_and_replicated():
    s = parse_sharding('#sdy.sharding<@mesh, [{"y", "x":(2)2}, {"x":(1)2}, {}], '
                       'replicated={"z"}>')
    assert s.dims == ((AxisRef("y"), AxisRef("x", 2, 2)), (AxisRef("x", 1, 2),), ())
    assert s.replicated == (AxisRef("z"),)
    assert str(s) == '<@mesh, [{"y", "x":(2)2}, {"x":(1)2}, {}]>'
    two = parse_per_value('#sdy.sharding_per_value<[<@mesh, [{"y"}]>, <@mesh, []>]>')
    assert [t.dims for t in two] == [((AxisRef("y"),),), ()]


def test_parse_collective_axes():
    assert parse_axis_lists('#sdy<list_of_axis_ref_lists[{"x"}, {}]>') == ((AxisRef("x"),), ())
    assert parse_axis_list('#sdy<axis_ref_list{"y"}>') == (AxisRef("y"),)
    (p,) = parse_all_to_all_params('#sdy<all_to_all_param_list[{"x":(2)2}: 0->1]>')
    assert (p.axes, p.src_dim, p.tgt_dim) == ((AxisRef("x", 2, 2),), 0, 1)


def test_groups_are_row_major_and_ordered_by_block():
    assert MESH.groups((AxisRef("x"),)) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert MESH.groups((AxisRef("y"),)) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert MESH.groups((AxisRef("x", 2, 2),)) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert MESH.groups((AxisRef("y"), AxisRef("x"))) == [[0, 2, 4, 6, 1, 3, 5, 7]]


def test_device_ids_permute_partitions():
    mesh = Mesh("m", (("x", 2),), device_ids=(1, 0))
    assert mesh.groups((AxisRef("x"),)) == [[1, 0]]


def test_local_shapes_and_block_offsets():
    s = parse_sharding('#sdy.sharding<@mesh, [{"y", "x":(2)2}, {"x":(1)2}]>')
    assert local_shape((16, 32), s, MESH) == (4, 16)
    table = block_offsets((16, 32), s, MESH)
    # position 1 = (x=0, y=1): dim 0 block 1*2+0 = 2 -> row 8; x major part 0 -> col 0
    assert table[1].tolist() == [8, 0] and table[4].tolist() == [0, 16]
    assert sorted(map(tuple, table.tolist())) == sorted(
        (r, c) for r in (0, 4, 8, 12) for c in (0, 16))
    assert np.array_equal(block_offsets((4,), parse_sharding("<@mesh, [{}]>"), MESH),
                          np.zeros((8, 1), np.int32))


def test_uneven_dims_are_padded_to_ceil_blocks():
    s = parse_sharding('<@mesh, [{"x", "y"}, {"x"}]>')
    assert local_shape((13, 2), s, MESH) == (2, 1)
    assert padded_dims((13, 2), s, MESH) == [0, 1] and padded_dims((16, 4), s, MESH) == []
    # 13 rows in blocks of 2: six full, one with a row, one of padding only
    assert sorted(valid_counts((13, 2), s, MESH)[:, 0].tolist()) == [0, 1, 2, 2, 2, 2, 2, 2]
    assert valid_counts((13, 2), s, MESH)[:, 1].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]


def test_even_prefix_keeps_the_axes_that_divide():
    s = parse_sharding('<@mesh, [{"x", "y"}, {"y"}]>')
    assert str(even_prefix((12, 3), s, MESH)) == '<@mesh, [{"x"}, {}]>'
    assert str(even_prefix((13, 4), s, MESH)) == '<@mesh, [{}, {"y"}]>'
    assert even_prefix((16, 4), s, MESH) is s
