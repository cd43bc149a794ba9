"""Device listing, kinds, attributes and system presets."""
from __future__ import annotations

import pytest

import jax_trn
from jax_trn import systems
from jax_trn.config import Options
from jax_trn.runtime.client import Client
from tests.conftest import run_python


def test_default_system_is_one_trn2_chip(trn_devices):
    assert len(trn_devices) == 8
    assert all(d.platform == "trn" for d in trn_devices)
    assert [d.id for d in trn_devices] == list(range(8))
    assert trn_devices[0].device_kind == "Trainium2 NeuronCore-v3"


def test_device_attributes_name_chip_core_and_coords(trn_devices):
    d = trn_devices[5]
    assert d.chip_index == 0 and d.core_index == 5
    assert list(d.coords) == [0, 5]
    assert "TrnDevice(id=5" in repr(d)


@pytest.mark.parametrize("name,chips,cores,kind", [
    ("trn1.2xlarge", 1, 2, "Trainium1 NeuronCore-v2"),
    ("trn1.32xlarge", 16, 2, "Trainium1 NeuronCore-v2"),
    ("trn2.3xlarge", 1, 8, "Trainium2 NeuronCore-v3"),
    ("trn2.48xlarge", 16, 8, "Trainium2 NeuronCore-v3"),
    ("trn2-ultraserver", 64, 8, "Trainium2 NeuronCore-v3"),
    ("trn3-ultraserver", 144, 8, "Trainium3 NeuronCore-v4"),
])
def test_presets(name, chips, cores, kind):
    client = Client(Options(system=systems.SYSTEMS[name]))
    assert len(client.devices) == chips * cores
    last = client.devices[-1]
    assert (last.chip, last.core) == (chips - 1, cores - 1)
    assert last.kind == kind
    chip = systems.SYSTEMS[name].chip
    assert last.hbm_limit == chip.hbm_bytes // cores


def test_torus_coordinates():
    client = Client(Options(system=systems.SYSTEMS["trn2-ultraserver"]))
    coords = {tuple(d.coords) for d in client.devices if d.core == 0}
    assert len(coords) == 64 and max(coords) == (3, 3, 3)


def test_unknown_system_lists_valid_names():
    with pytest.raises(ValueError, match="trn2.48xlarge"):
        jax_trn.get_system("trn9.huge")


def test_system_chosen_by_environment():
    r = run_python("import jax; ds = jax.devices('trn'); print(len(ds), ds[0].device_kind)",
                   env={"JAX_TRN_SYSTEM": "trn1.2xlarge"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("2 Trainium1 NeuronCore-v2")


def test_system_chosen_by_configure():
    r = run_python("import jax_trn; jax_trn.configure(system='trn1.32xlarge'); import jax; "
                   "print(len(jax.devices('trn')))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("32")
