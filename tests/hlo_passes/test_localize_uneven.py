"""Uneven shardings in the SPMD localization (hlo_passes/localize_pad.py): padded
per-device shapes, masks before what sums the padding up, the even shardings a
program's boundary keeps, and nothing of it in programs whose shardings divide.
Numerics against the CPU mesh: tests/multichip/test_uneven.py."""
from __future__ import annotations

import numpy as np
import pytest

import hlo_passes
from hlo_passes import ir
from hlo_passes.passes import localize
from hlo_passes.verifier import verify
from tests.hlo_passes.helpers import from_text


@pytest.fixture(scope="module")
def mesh(jax, trn_devices):
    return jax.make_mesh((4,), ("x",), devices=trn_devices[:4],
                         axis_types=(jax.sharding.AxisType.Auto,))


def _localize(jax, mesh, f, *specs):
    from jax.sharding import NamedSharding, PartitionSpec as P
    args = [jax.ShapeDtypeStruct(shape, np.float32,
                                 sharding=None if spec is None else NamedSharding(mesh, P(*spec)))
            for shape, spec in specs]
    with jax.set_mesh(mesh):
        text = jax.jit(f).lower(*args).as_text()
    return hlo_passes.compile_to_ir(text, fuse=False)


def _wsc(jax, mesh, x, *spec):
    from jax.sharding import NamedSharding, PartitionSpec as P
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(*spec)))


def _ops(module, kind):
    return [op for op in ir.walk(module.main.body) if op.kind == kind]


def test_blocks_are_cut_from_a_zero_padded_whole(jax, mesh):
    m = _localize(jax, mesh, lambda a: jax.numpy.tanh(_wsc(jax, mesh, a, "x")),
                  ((13, 7), ()))
    (pad,) = _ops(m, "pad")
    assert pad.result.shape == (16, 7) and pad.attrs["edge_padding_high"] == (3, 0)
    assert _ops(m, "tanh")[0].result.shape == (4, 7)
    # the result's sharding does not divide: it leaves gathered, padding sliced off
    assert m.main.result_types[0].shape == (13, 7)
    assert [op.result.shape for op in _ops(m, "all_gather")] == [(16, 7)]
    assert m.attrs["trn.spmd"].result_shardings[0].is_replicated


def test_size_1_over_4_shards(jax, mesh):
    m = _localize(jax, mesh, lambda a: _wsc(jax, mesh, a, None, "x") * 2, ((32, 1), ()))
    assert _ops(m, "multiply")[0].result.shape == (32, 1)
    assert [op.result.shape for op in _ops(m, "all_gather")] == [(32, 4)]
    assert m.main.result_types[0].shape == (32, 1)


def test_reduce_over_a_padded_dim_reads_its_identity_in_the_padding(jax, mesh):
    m = _localize(jax, mesh, lambda a: _wsc(jax, mesh, a, "x").max(0), ((13, 7), ()))
    (reduce,) = _ops(m, "reduce")
    select = next(op for op in _ops(m, "select") if op.result is reduce.operands[0])
    fill = select.operands[2]
    assert next(op for op in _ops(m, "broadcast_in_dim") if op.result is fill
                ).operands[0] is reduce.operands[1]
    # the mask: rows below this partition's count of data rows (4, 4, 4, 1)
    tables = [op.attrs["value"] for op in _ops(m, "constant") if op.result.shape == (4, 2)]
    assert any(t[:, 0].tolist() == [4, 4, 4, 1] for t in tables)


def test_dot_masks_both_operands_on_a_padded_contracting_dim(jax, mesh):
    f = lambda a, b: _wsc(jax, mesh, a, None, "x") @ _wsc(jax, mesh, b, "x")  # noqa: E731
    m = _localize(jax, mesh, f, ((6, 13), ()), ((13, 5), ()))
    (dot,) = _ops(m, "dot_general")
    assert [v.shape for v in dot.operands] == [(6, 4), (4, 5)]
    selects = {op.result for op in _ops(m, "select")}
    assert all(v in selects for v in dot.operands)


def test_programs_whose_shardings_divide_get_no_padding_ops(jax, mesh):
    f = lambda a, b: (_wsc(jax, mesh, a, "x").sum(0), a @ b)  # noqa: E731
    m = _localize(jax, mesh, f, ((16, 8), ()), ((8, 4), ("x",)))
    assert not _ops(m, "pad") and not _ops(m, "select") and not _ops(m, "iota")
    assert not m.attrs["trn.spmd"].notes


BOUNDARY = """
module @m attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=4, "y"=2]>
  func.func public @main(%a: tensor<12x6xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x", "y"}, {}]>})
      -> (tensor<12x6xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x", "y"}, {}]>}) {
    %0 = stablehlo.tanh %a {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"x", "y"}, {}]>]>} : tensor<12x6xf32>
    return %0 : tensor<12x6xf32>
  }
}"""


def test_boundary_keeps_the_even_prefix_of_an_uneven_sharding():
    """A [12, 6] parameter and result sharded {x, y} over a 4x2 mesh: 12 does not
    divide into 8, into 4 it does. XLA reports {x} for both and so do we (Shardy's
    propagation never puts such a sharding on a boundary; a program may say so)."""
    m = from_text(BOUNDARY)
    assert localize.run(m)
    verify(m)
    spmd = m.attrs["trn.spmd"]
    assert [str(s) for s in spmd.arg_shardings + spmd.result_shardings] == [
            '<@mesh, [{"x"}, {}]>'] * 2
    assert m.main.args[0].shape == (3, 6) and m.main.result_types[0].shape == (3, 6)
    assert _ops(m, "tanh")[0].result.shape == (2, 6)
    assert len([n for n in spmd.notes if "does not divide" in n]) == 2


def test_reshape_merging_a_padded_dim_runs_on_global_shapes(jax, mesh):
    m = _localize(jax, mesh, lambda a: _wsc(jax, mesh, a, "x").reshape(91) * 2,
                  ((13, 7), ()))
    assert any(op.kind == "reshape" and op.result.shape == (91,)
               for op in ir.walk(m.main.body))
    assert any(n.startswith("stablehlo.reshape(float32[13,7])") for n in
               m.attrs["trn.spmd"].notes)


def test_reshape_adding_a_unit_dim_stays_local(jax, mesh):
    m = _localize(jax, mesh, lambda a: _wsc(jax, mesh, a, "x")[:, None] * 2, ((13, 7), ()))
    shapes = [op.result.shape for op in _ops(m, "reshape") + _ops(m, "broadcast_in_dim")]
    assert (4, 1, 7) in shapes and (13, 1, 7) not in shapes


def test_dynamic_slice_over_a_whole_sharded_dim_has_local_sizes(jax, mesh):
    f = lambda a, i: jax.lax.dynamic_slice(a, (0, i), (16, 4))  # noqa: E731
    from jax.sharding import NamedSharding, PartitionSpec as P
    with jax.set_mesh(mesh):
        text = jax.jit(f).lower(
            jax.ShapeDtypeStruct((16, 32), np.float32, sharding=NamedSharding(mesh, P("x"))),
            jax.ShapeDtypeStruct((), np.int32, sharding=NamedSharding(mesh, P()))).as_text()
    m = hlo_passes.compile_to_ir(text, fuse=False)
    (ds,) = [op for op in _ops(m, "dynamic_slice") if op.result.shape == (4, 4)]
    assert ds.attrs["slice_sizes"] == (4, 4)


REDUCE_SCATTER = """
module @m attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=4]>
  func.func public @main(%a: tensor<13x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"x"}]>},
                         %b: tensor<16x5xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>})
      -> (tensor<13x5xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}) {
    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{}, {}]>]>} : (tensor<13x16xf32>, tensor<16x5xf32>) -> tensor<13x5xf32>
    %1 = sdy.reduce_scatter [{"x"}, {}] %0 out_sharding=<@mesh, [{"x"}, {}]> : tensor<13x5xf32>
    %2 = stablehlo.tanh %1 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"x"}, {}]>]>} : tensor<13x5xf32>
    return %2 : tensor<13x5xf32>
  }
}"""


def test_reduce_scatter_onto_a_padded_dim_pads_the_partial_sums():
    """(The Shardy in jaxlib 0.10.2 writes all_reduce + all_slice where it could
    reduce-scatter; the localization takes sdy.reduce_scatter all the same.)"""
    m = from_text(REDUCE_SCATTER)
    assert localize.run(m)
    verify(m)
    (pad,) = _ops(m, "pad")
    (rs,) = _ops(m, "reduce_scatter")
    assert pad.result.shape == (16, 5) and rs.operands[0] is pad.result
    assert rs.result.shape == (4, 5)
    assert m.main.result_types[0].shape == (13, 5)     # {x} does not divide: gathered


# --- sub-axes: Shardy shards a dim that does not divide on the part of the axis that does

def test_sub_axis_lists_compare_as_pieces_of_the_axis():
    from hlo_passes.sharding import AxisRef, Mesh, axes_after, axes_before, join_axes
    m = Mesh("mesh", (("x", 4), ("y", 2)))
    x, y, hi, lo = AxisRef("x"), AxisRef("y"), AxisRef("x", 1, 2), AxisRef("x", 2, 2)
    assert axes_after(m, (x,), (hi,)) == (lo,)
    assert axes_after(m, (x, y), (hi,)) == (lo, y)
    assert axes_after(m, (x,), (x,)) == () and axes_after(m, (x,), ()) == (x,)
    assert axes_after(m, (x,), (lo,)) is None and axes_after(m, (hi,), (x,)) is None
    assert axes_after(m, (y, x), (x,)) is None
    assert axes_before(m, (x,), (lo,)) == (hi,) and axes_before(m, (x, y), (y,)) == (x,)
    assert axes_before(m, (x,), (hi,)) is None and axes_before(m, (hi,), (x,)) is None
    assert join_axes(m, (hi,), (lo,)) == (x,) and join_axes(m, (hi,), (y,)) == (hi, y)


SUB_AXIS = """
module @m attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=4]>
  func.func public @main(%a: tensor<16x12xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"x"}]>})
      -> (tensor<16x12xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"x"}]>}) {
    %0 = sdy.all_gather [{}, {"x":(2)2}] %a out_sharding=<@mesh, [{}, {"x":(1)2}]> : tensor<16x12xf32>
    %1 = stablehlo.tanh %0 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{}, {"x":(1)2}]>]>} : tensor<16x12xf32>
    %2 = sdy.all_slice [{}, {"x":(2)2}] %1 out_sharding=<@mesh, [{}, {"x"}]> : tensor<16x12xf32>
    return %2 : tensor<16x12xf32>
  }
}"""


def test_even_sub_axis_gathers_and_slices_stay_local():
    """{"x"} -> {"x":(1)2} gathers over the minor half of x, {"x":(1)2} -> {"x"} slices
    the block in two (both used to be refused: the lists compared element by element)."""
    m = from_text(SUB_AXIS)
    assert localize.run(m)
    verify(m)
    (ag,) = _ops(m, "all_gather")
    assert ag.result.shape == (16, 6) and ag.attrs["replica_groups"] == ((0, 1), (2, 3))
    assert _ops(m, "tanh")[0].result.shape == (16, 6)
    assert m.main.result_types[0].shape == (16, 3)
    assert not _ops(m, "pad")


def test_propagation_onto_a_sub_axis_of_a_padded_dim(jax, mesh):
    """A [16, 10] activation constrained to {x} (10 does not divide into 4): Shardy
    shards relu's result and the next matmul's contracting dim on {"x":(1)2} (5 per
    half, no padding) and reshards to {x} and back (fsdp_odd_shapes in tests/programs
    failed with "cannot slice a tensor sharded <@mesh, [{}, {"x":(1)2}]> to <@mesh,
    [{}, {"x"}]>")."""
    f = lambda h, w: _wsc(jax, mesh, jax.nn.relu(_wsc(jax, mesh, h, None, "x")) @ w,  # noqa: E731
                          "x")
    m = _localize(jax, mesh, f, ((16, 10), None), ((10, 3), None))
    (dot,) = _ops(m, "dot_general")
    assert [v.shape for v in dot.operands] == [(16, 5), (5, 3)]
