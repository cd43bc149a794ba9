"""SPMD localization (passes/localize.py) after the Shardy passes, on programs JAX
lowers for a mesh of the 8 trn devices: per-device types, collectives with their
groups, replicated fallbacks, shard_map bodies. Numerics run end to end in tests/multichip."""
from __future__ import annotations

import numpy as np
import pytest

import hlo_passes
from hlo_passes import ir
from hlo_passes.errors import VerifyError


@pytest.fixture(scope="module")
def mesh(jax, trn_devices):
    return jax.make_mesh((4, 2), ("x", "y"), devices=trn_devices,
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _localize(jax, mesh, f, *specs):
    from jax.sharding import NamedSharding, PartitionSpec as P
    args = [jax.ShapeDtypeStruct(shape, np.float32, sharding=NamedSharding(mesh, P(*spec)))
            for shape, spec in specs]
    return hlo_passes.compile_to_ir(jax.jit(f).lower(*args).as_text(), fuse=False)


def _ops(module, kind):
    return [op for op in ir.walk(module.main.body) if op.kind == kind]


def test_elementwise_program_runs_on_local_shapes(jax, mesh):
    m = _localize(jax, mesh, lambda a: jax.numpy.tanh(a) * 2, ((16, 32), ("x", "y")))
    fn = m.main
    assert [a.shape for a in fn.args] == [(4, 16)]
    assert [t.shape for t in fn.result_types] == [(4, 16)]
    assert not [op for op in ir.walk(fn.body) if op.kind.startswith(("sdy.", "all_"))]
    spmd = m.attrs["trn.spmd"]
    assert spmd.num_partitions == 8 and spmd.arg_types[0].shape == (16, 32)
    assert str(spmd.arg_shardings[0]) == '<@mesh, [{"x"}, {"y"}]>'


def test_contracting_dim_sharded_gives_all_reduce_over_its_axis(jax, mesh):
    m = _localize(jax, mesh, lambda a, b: a @ b, ((16, 32), ("x", "y")), ((32, 8), ("y", None)))
    (ar,) = _ops(m, "all_reduce")
    assert ar.attrs["replica_groups"] == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert ar.regions[0].block.ops[0].kind == "add"
    (dot,) = _ops(m, "dot_general")
    assert dot.operands[0].shape == (4, 16) and dot.operands[1].shape == (16, 8)


def test_reshard_becomes_all_gather_along_the_gathered_axes(jax, mesh):
    from jax.sharding import NamedSharding, PartitionSpec as P
    f = lambda a: jax.lax.with_sharding_constraint(a * 2, NamedSharding(mesh, P()))  # noqa: E731
    m = _localize(jax, mesh, f, ((16, 32), ("x", "y")))
    gathers = _ops(m, "all_gather")
    assert {g.attrs["all_gather_dim"] for g in gathers} == {0, 1}
    assert m.main.result_types[0].shape == (16, 32)


def test_max_reduction_all_reduces_with_max(jax, mesh):
    m = _localize(jax, mesh, lambda a: a.max(axis=0), ((16, 32), ("x", "y")))
    (ar,) = _ops(m, "all_reduce")
    assert ar.regions[0].block.ops[0].kind == "maximum"
    assert ar.attrs["replica_groups"] == ((0, 2, 4, 6), (1, 3, 5, 7))


def test_position_dependent_ops_are_replicated_then_sliced(jax, mesh):
    m = _localize(jax, mesh, lambda a: a[1:9] * 2, ((16, 32), ("x", "y")))
    (sl,) = [op for op in _ops(m, "slice") if op.operands[0].shape == (16, 32)]
    assert sl.result.shape == (8, 32)
    (note,) = m.attrs["trn.spmd"].notes
    assert note.startswith("stablehlo.slice(float32[16,32]) -> (float32[8,32])") and "replicated" in note
    assert _ops(m, "partition_id")
    assert m.main.result_types[0].shape == (2, 16)


def test_argmax_over_a_sharded_dim_gathers_once(jax, mesh):
    m = _localize(jax, mesh, lambda a: jax.numpy.argmax(a, 0), ((16, 32), ("x", "y")))
    assert not _ops(m, "all_reduce")          # the variadic reduce runs on the whole axis
    gathered = [g.operands[0].dtype for g in _ops(m, "all_gather")]
    assert gathered.count("int32") == 0       # the iota is not sliced and re-gathered


def test_shard_map_body_is_inlined_with_its_collectives(jax, mesh):
    from jax import shard_map
    from jax.sharding import PartitionSpec as P
    body = lambda x: (jax.lax.psum(x, "x"), jax.lax.axis_index("y"))  # noqa: E731
    f = shard_map(body, mesh=mesh, in_specs=P("x", "y"), out_specs=(P("x", "y"), P()),
                  check_vma=False)
    m = _localize(jax, mesh, f, ((16, 32), ("x", "y")))
    (ar,) = _ops(m, "all_reduce")
    assert ar.attrs["replica_groups"] == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert _ops(m, "partition_id")
    assert not [op for op in ir.walk(m.main.body) if op.kind.startswith("sdy.")]


def test_gspmd_programs_get_a_clear_error():
    text = """
    module @jit_f attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
      func.func public @main(%arg0: tensor<8xf32> {mhlo.sharding = "{devices=[2]<=[2]}"})
          -> (tensor<8xf32> {mhlo.sharding = "{devices=[2]<=[2]}"}) {
        return %arg0 : tensor<8xf32>
      }
    }"""
    with pytest.raises(VerifyError, match="GSPMD.*jax_use_shardy_partitioner"):
        hlo_passes.compile_to_ir(text, fuse=False)


def test_single_device_programs_are_untouched(jax, trn):
    m = hlo_passes.compile_to_ir(jax.jit(lambda a: a + 1).lower(np.ones(4, np.float32)).as_text())
    assert "trn.spmd" not in m.attrs


@pytest.mark.parametrize("spec", [("x", "y"), ("y", None), (None, "x"), (("x", "y"), None),
                                  (("y", "x"), None), (None, None), ("x", None)])
def test_reported_op_shardings_are_jax_own(jax, mesh, spec):
    """What the Shardings extension reports equals the HloSharding JAX builds itself."""
    from jax.sharding import NamedSharding, PartitionSpec as P
    from jaxlib import xla_client as xc
    from pjrt_plugin._objects import op_sharding
    named = NamedSharding(mesh, P(*spec))
    m = _localize(jax, mesh, lambda a: a + 1, ((16, 32), spec))
    spmd = m.attrs["trn.spmd"]
    ours = xc.HloSharding.from_proto(op_sharding(spmd.arg_shardings[0], spmd.mesh, 2))
    assert ours == named._to_xla_hlo_sharding(2), (ours, named._to_xla_hlo_sharding(2))
