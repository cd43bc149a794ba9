"""hlo_passes.sharding: Shardy attribute text -> data, and mesh device arithmetic."""
from __future__ import annotations

import numpy as np
import pytest

from hlo_passes.sharding import (AxisRef, Mesh, block_offsets, local_shape,
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
