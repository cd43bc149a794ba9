"""Systems as objects (ARCHITECTURE.md Seams): a System holds its ChipSpec (with its links)
and builds its own topology, so a user-made system (any chip count, any generation) runs
sharded programs over the links it describes, like a preset."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import jax_trn
from jax_trn.collectives import collective_time
from jax_trn.hw.spec import CHIPS
from jax_trn.systems import SYSTEMS, System

TRN2_2X2 = System(name="my-2x2", chip=CHIPS["trn2"], num_chips=4, topology="torus2d",
                  dims=(2, 2), description="4 Trainium2 chips in a 2x2 torus")
TRN3_PAIR = System(name="my-trn3-pair", chip=CHIPS["trn3"], num_chips=2, topology="switch",
                   dims=(1, 2))
X = np.random.default_rng(0).normal(size=(64, 32)).astype(np.float32)


def test_a_replaced_preset_builds_the_topology_of_its_fields():
    # Observed before: KeyError in interconnect() (the name was looked up in SYSTEMS).
    small = dataclasses.replace(SYSTEMS["trn2.48xlarge"], name="trn2-2x2", num_chips=4,
                                dims=(2, 2))
    topo = small.interconnect()
    assert (topo.kind, topo.num_chips, topo.dims, topo.cores_per_chip) == ("torus", 4, (2, 2), 8)
    assert small.interconnect() is topo                       # built once per object


def test_a_system_that_keeps_a_preset_name_gets_its_own_topology():
    # Observed before: the preset's 16-chip topology, silently.
    same_name = dataclasses.replace(SYSTEMS["trn2.48xlarge"], num_chips=4, dims=(2, 2))
    assert same_name.name == "trn2.48xlarge"
    assert same_name.interconnect().num_chips == 4
    assert SYSTEMS["trn2.48xlarge"].interconnect().num_chips == 16


@pytest.mark.parametrize("kw, says", [
    (dict(num_chips=5, dims=(2, 2)), "num_chips=5 but dims"),
    (dict(topology="ring", dims=(4,), num_chips=4), "unknown topology 'ring'"),
    (dict(topology="torus3d", dims=(2, 2), num_chips=4), "3 positive integer dims"),
    (dict(topology="single", dims=(2,), num_chips=2), "dims (1,)"),
    (dict(dims=(2, 0), num_chips=0), "positive integer dims"),
])
def test_systems_are_validated(kw, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        dataclasses.replace(TRN2_2X2, **kw)
    with pytest.raises(TypeError, match="ChipSpec"):
        System("bad", "trn2", 1, "single", (1,))


def test_a_user_system_through_the_client():
    from jax_trn.config import Options
    from jax_trn.runtime.client import Client
    client = Client(Options(system=TRN2_2X2))
    assert len(client.devices) == 32 and "my-2x2" in client.platform_version
    last = client.devices[-1]
    assert (last.chip, last.core, last.coords) == (3, 7, (1, 1))
    assert last.attributes["topology"] == "torus2d" and last.attributes["system"] == "my-2x2"
    assert last.kind == "Trainium2 NeuronCore-v3"


def test_a_user_chip_is_used_for_devices_cores_and_profiles():
    """A chip of 4 NeuronCores with a smaller SBUF that keeps the preset's core name."""
    from jax_trn.runtime.device import make_devices
    core = dataclasses.replace(CHIPS["trn2"].core, sbuf_partition_bytes=128 * 1024)
    chip = dataclasses.replace(CHIPS["trn2"], cores=4, core=core)
    system = System("half-trn2-pair", chip, 2, "torus2d", (1, 2))
    devices = make_devices(system)
    assert len(devices) == 8 and system.interconnect().cores_per_chip == 4
    assert devices[0].core_model.sbuf.nbytes == core.sbuf_usable_bytes   # not the preset's
    ex = _psum_on(system, [0, 4])
    assert ex.chip_spec is chip and sorted(ex.collectives[0].devices) == [0, 4]


def _psum_on(system: System, device_ids: list[int]):
    """A shard_map psum over len(device_ids) devices, simulated on `system`."""
    import jax
    from jax import shard_map
    from jax.sharding import AbstractMesh, AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P
    mesh = AbstractMesh((len(device_ids),), ("x",), axis_types=(AxisType.Auto,))
    f = shard_map(lambda a: jax.lax.psum(a, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())
    arg = jax.ShapeDtypeStruct(X.shape, X.dtype, sharding=NamedSharding(mesh, P("x")))
    return jax_trn.compare(f, arg, systems=[system], device_ids=device_ids).executions[system.name]


@pytest.mark.parametrize("system, ids", [(TRN2_2X2, [0, 8, 16, 24]), (TRN3_PAIR, [0, 8])],
                         ids=["trn2-2x2-torus", "trn3-2-chip-switch"])
def test_a_sharded_program_runs_over_the_links_the_system_describes(system, ids):
    ex = _psum_on(system, ids)
    assert ex.system == system.name and sorted(ex.devices) == ids
    (c,) = ex.collectives
    assert c.kind == "all_reduce" and sorted(c.devices) == ids
    want = collective_time("all_reduce", (c.bytes // 4,), np.float32, [list(c.devices)],
                           system.interconnect())
    assert c.algorithm == want.algorithm
    assert c.end_ns - c.start_ns == pytest.approx(want.total_ns, rel=1e-12)
    chips = {int(system.interconnect().chip_of(d)) for d in c.devices}
    assert chips == set(range(system.num_chips))                # one rank on every chip
