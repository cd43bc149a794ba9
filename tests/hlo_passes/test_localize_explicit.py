"""Localization of programs over Explicit mesh axes (issue 13): constants that Shardy
shards, bool reductions over sharded dims, composites in partitioned programs. The
numerics against the CPU mesh are in tests/e2e/test_jax_conformance.py."""
from __future__ import annotations

import numpy as np
import pytest

import hlo_passes
from hlo_passes import ir
from tests.hlo_passes.helpers import artifact_of


@pytest.fixture(scope="module")
def mesh(jax, trn_devices):
    return jax.make_mesh((4, 2), ("x", "y"), devices=trn_devices,
                         axis_types=(jax.sharding.AxisType.Explicit,) * 2)


def _arg(jax, mesh, shape, spec):
    from jax.sharding import NamedSharding, PartitionSpec as P
    return jax.ShapeDtypeStruct(shape, np.float32, sharding=NamedSharding(mesh, P(*spec)))


def _localize(jax, mesh, f, shape=(8, 4), spec=("x", "y")) -> ir.Module:
    text = jax.jit(f).lower(_arg(jax, mesh, shape, spec)).as_text()
    return hlo_passes.compile_to_ir(text, fuse=False)


def _ops(module, kind):
    return [op for op in ir.walk(module.main.body) if op.kind == kind]


def test_sharded_splat_constants_become_local(jax, mesh):
    """chlo.erf_inv's coefficients are [8, 4] splats sharded like x: each is a
    [2, 2] constant on every device."""
    m = _localize(jax, mesh, lambda a: jax.lax.erf_inv(a / 8))
    shapes = {op.result.shape for op in _ops(m, "constant")}
    assert (8, 4) not in shapes and (2, 2) in shapes
    assert not _ops(m, "partition_id")


def test_sharded_non_splat_constant_is_sliced_per_device(jax, mesh):
    c = np.arange(32, dtype=np.float32).reshape(8, 4)
    m = _localize(jax, mesh, lambda a: a + c)
    (whole,) = [op for op in _ops(m, "constant") if op.result.shape == (8, 4)]
    np.testing.assert_array_equal(whole.attrs["value"], c)
    (piece,) = [op for op in _ops(m, "dynamic_slice") if op.operands[0] is whole.result]
    assert piece.result.shape == (2, 2) and _ops(m, "partition_id")
    assert "replicated" in m.attrs["trn.spmd"].notes[0]


@pytest.mark.parametrize("fn,combiner", [("any", "maximum"), ("all", "minimum")])
def test_bool_reduction_all_reduces_with_max_or_min(jax, mesh, fn, combiner):
    m = _localize(jax, mesh, lambda a: getattr(jax.numpy, fn)(a > 0))
    (ar,) = _ops(m, "all_reduce")
    assert ar.result.dtype == "bool"
    assert ar.regions[0].block.ops[0].kind == combiner


def test_composites_become_calls_before_shardy(jax, mesh):
    """lax.top_k arrives as a `chlo.top_k` composite; Shardy partitions its
    decomposition as a call, so the inlined sort runs on local rows."""
    code = artifact_of(lambda a: jax.lax.top_k(a, 2), _arg(jax, mesh, (8, 4), ("x", None)))
    m = hlo_passes.compile_to_ir(code, fuse=False)
    (sort,) = _ops(m, "sort")
    assert sort.operands[0].shape == (2, 4)
    assert [t.shape for t in m.main.result_types] == [(2, 2), (2, 2)]
    assert not _ops(m, "all_gather")
