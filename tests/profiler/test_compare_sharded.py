"""jax_trn.compare on sharded programs: arguments with a NamedSharding (on an AbstractMesh,
on the CPU backend's 8-device mesh, or through in_shardings=) compile once for the mesh
and run on each system's first N devices, collectives included."""
from __future__ import annotations

import numpy as np
import pytest

import jax_trn

SYSTEMS = ["trn2.3xlarge", "trn3-ultraserver"]
A = np.random.default_rng(0).normal(size=(128, 256)).astype(np.float32)
B = np.random.default_rng(1).normal(size=(256, 64)).astype(np.float32)


def _matmul(a, b):
    return a @ b


def _abstract(jax, n, *specs):
    from jax.sharding import AbstractMesh, AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P
    mesh = AbstractMesh((n,), ("x",), axis_types=(AxisType.Auto,))
    return [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, P(*s)))
            for a, s in zip((A, B), specs)]


@pytest.fixture(scope="module")
def contraction(jax):
    """The contraction dim sharded 8 ways: a partial matmul per device, then an all-reduce."""
    return jax_trn.compare(_matmul, *_abstract(jax, 8, (None, "x"), ("x", None)),
                           systems=SYSTEMS)


def test_sharded_rows_have_devices_and_collective_share(contraction):
    for r in contraction.rows:
        assert r["devices"] == 8
        assert r["collectives"] >= 1
        assert 0 < r["collective_time_s"] < r["simulated_time_s"]
        assert 0 < r["collective_percent"] < 100
        assert r["tflops"] > 0 and 0 < r["mfu"] < 1
    text = str(contraction)
    assert "on 8 NeuronCores" in text and "coll." in text


def test_sharded_run_uses_the_first_devices_with_an_all_reduce(contraction):
    for system in SYSTEMS:
        ex = contraction.executions[system]
        assert ex.system == system and sorted(ex.devices) == list(range(8))
        kinds = {c.kind for c in ex.collectives}
        assert "all_reduce" in kinds, kinds
        assert all(sorted(c.devices) == list(range(8)) for c in ex.collectives)
        # collective time is part of the summary's collective section
        assert ex.summary_dict()["collectives"]["count"] == len(ex.collectives)


def test_concrete_cpu_mesh_gives_the_same_program_as_an_abstract_mesh(jax, contraction):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    cpus = jax.devices("cpu")
    if len(cpus) < 8:
        pytest.skip("needs 8 CPU devices (tests/conftest.py sets XLA_FLAGS)")
    mesh = jax.make_mesh((8,), ("x",), devices=cpus[:8],
                         axis_types=(jax.sharding.AxisType.Auto,))
    a = jax.device_put(A, NamedSharding(mesh, P(None, "x")))
    b = jax.device_put(B, NamedSharding(mesh, P("x", None)))
    c = jax_trn.compare(_matmul, a, b, systems=SYSTEMS[:1])
    assert c.rows[0]["simulated_time_s"] == contraction.rows[0]["simulated_time_s"]


def test_in_shardings_argument(jax, contraction):
    from jax.sharding import AbstractMesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    mesh = AbstractMesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    c = jax_trn.compare(_matmul, jax.ShapeDtypeStruct(A.shape, A.dtype),
                        jax.ShapeDtypeStruct(B.shape, B.dtype), systems=SYSTEMS[:1],
                        in_shardings=(NamedSharding(mesh, P(None, "x")),
                                      NamedSharding(mesh, P("x", None))))
    assert c.rows[0]["devices"] == 8
    assert c.rows[0]["simulated_time_s"] == contraction.rows[0]["simulated_time_s"]


def test_sharded_compare_matches_a_real_run_on_the_backend(jax, trn_devices, contraction):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    system = jax_trn.get_system()
    if system.name not in SYSTEMS or len(trn_devices) < 8:
        pytest.skip(f"backend runs {system.name}")
    mesh = jax.make_mesh((8,), ("x",), devices=trn_devices[:8],
                         axis_types=(jax.sharding.AxisType.Auto,))
    a = jax.device_put(A, NamedSharding(mesh, P(None, "x")))
    b = jax.device_put(B, NamedSharding(mesh, P("x", None)))
    f = jax.jit(_matmul)
    f(a, b).block_until_ready()                        # compile outside the profile
    with jax_trn.profile() as prof:
        f(a, b).block_until_ready()
    ex = prof.executions[-1]
    assert len(ex.collectives) == len(contraction.executions[system.name].collectives)
    assert contraction[system.name]["simulated_time_s"] == pytest.approx(
        ex.simulated_time_s, rel=1e-9)


def test_unpartitioned_data_parallel_counts_flops_of_every_device(jax):
    """Rows sharded without collectives: device 0 is simulated, FLOP/s count all 8."""
    c1 = jax_trn.compare(_matmul, A, B, systems=SYSTEMS[:1])
    c8 = jax_trn.compare(_matmul, *_abstract(jax, 8, ("x", None), (None, None)),
                         systems=SYSTEMS[:1])
    r1, r8 = c1.rows[0], c8.rows[0]
    assert r1["devices"] == 1 and r8["devices"] == 8 and r8["collectives"] == 0
    assert r8["simulated_time_s"] < r1["simulated_time_s"]
    flops8 = r8["tflops"] * r8["simulated_time_s"]
    flops1 = r1["tflops"] * r1["simulated_time_s"]
    assert flops8 == pytest.approx(flops1, rel=1e-6)


def test_mesh_larger_than_a_system_is_an_error_naming_both(jax):
    args = _abstract(jax, 16, ("x", None), (None, None))
    with pytest.raises(ValueError, match=r"16 devices.*trn2\.3xlarge has \(8 devices\)"):
        jax_trn.compare(_matmul, *args, systems=["trn2.3xlarge", "trn2.48xlarge"])


def test_sixteen_devices_of_a_torus_cross_chips(jax):
    c = jax_trn.compare(_matmul, *_abstract(jax, 16, (None, "x"), ("x", None)),
                        systems=["trn2.48xlarge"])
    ex = c.executions["trn2.48xlarge"]
    assert sorted(ex.devices) == list(range(16))      # cores 0-7 of chips 0 and 1
    assert c.rows[0]["collectives"] >= 1 and c.rows[0]["collective_percent"] > 0


def test_fuse_false_skips_fusion(jax):
    f = lambda x: jax.numpy.tanh(x * 2 + 1).sum(0)
    fused = jax_trn.compare(f, A, systems=SYSTEMS[:1])
    unfused = jax_trn.compare(f, A, systems=SYSTEMS[:1], fuse=False)
    assert unfused.rows[0]["kernels"] > fused.rows[0]["kernels"]


def test_device_ids_spread_the_mesh_over_chips(jax):
    one_per_chip = lambda s: [c * s.cores_per_chip for c in range(16)]
    c = jax_trn.compare(_matmul, *_abstract(jax, 16, (None, "x"), ("x", None)),
                        systems=["trn2.48xlarge"], device_ids=one_per_chip)
    ex = c.executions["trn2.48xlarge"]
    assert sorted(ex.devices) == list(range(0, 128, 8))
    assert all(sorted(r.devices) == list(range(0, 128, 8)) for r in ex.collectives)
    with pytest.raises(ValueError, match="not 16 distinct devices of trn2.48xlarge"):
        jax_trn.compare(_matmul, *_abstract(jax, 16, (None, "x"), ("x", None)),
                        systems=["trn2.48xlarge"], device_ids=[0] * 16)


def test_shard_map_on_an_abstract_mesh(jax):
    from jax import shard_map
    from jax.sharding import AbstractMesh, AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P
    mesh = AbstractMesh((8,), ("x",), axis_types=(AxisType.Auto,))
    f = shard_map(lambda a: jax.lax.psum(a, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())
    arg = jax.ShapeDtypeStruct(A.shape, A.dtype, sharding=NamedSharding(mesh, P("x")))
    c = jax_trn.compare(f, arg, systems=SYSTEMS[:1])
    ex = c.executions[SYSTEMS[0]]
    assert [col.kind for col in ex.collectives] == ["all_reduce"]
    assert c.rows[0]["collective_percent"] > 50          # nothing else to do
