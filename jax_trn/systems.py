"""System presets: which chips, how many, and how they are joined (trainium-hardware.md §1.3).

A system is data: a generation (the chip spec comes from `jax_trn.hw.spec.CHIPS`), a
number of chips, and each chip's coordinates in its topology. One JAX device is one
physical NeuronCore; device ids run chip-major (chip c, core k -> c * cores + k).
"""
from __future__ import annotations

import functools
import itertools
import os
from dataclasses import dataclass

DEFAULT_SYSTEM = "trn2.3xlarge"
CHIP_NAMES = {"trn1": "Trainium1", "trn2": "Trainium2", "trn3": "Trainium3"}


@dataclass(frozen=True)
class System:
    name: str
    generation: str                   # "trn1" | "trn2" | "trn3"
    num_chips: int
    topology: str                     # "single" | "torus2d" | "torus3d" | "switch"
    dims: tuple[int, ...]             # topology extent per coordinate
    description: str

    @property
    def chip_coords(self) -> list[tuple[int, ...]]:
        """Coordinates of each chip, in chip-index order (last coordinate fastest)."""
        return list(itertools.product(*(range(d) for d in self.dims)))

    @property
    def chip(self):
        from jax_trn.hw.spec import CHIPS
        return CHIPS[self.generation]

    @property
    def cores_per_chip(self) -> int:
        return self.chip.cores

    @property
    def chip_name(self) -> str:
        return CHIP_NAMES[self.generation]

    @property
    def num_devices(self) -> int:
        return self.num_chips * self.cores_per_chip

    def interconnect(self):
        """Links, routes and contention of this system (`jax_trn.hw.topology.Topology`),
        for `jax_trn.collectives`."""
        return _interconnect(self.name)


def _preset(name, gen, chips, topology, dims, description):
    assert chips == _prod(dims), name
    return System(name, gen, chips, topology, dims, description)


def _prod(xs):
    n = 1
    for x in xs:
        n *= x
    return n


SYSTEMS: dict[str, System] = {s.name: s for s in [
    # §1.3 Trn1: trn1.2xlarge has 1 chip; trn1.32xlarge 16 chips in a 2D torus [TRN1-INST].
    _preset("trn1.2xlarge", "trn1", 1, "single", (1,), "1 Trainium1 chip, 2 NeuronCore-v2"),
    _preset("trn1.32xlarge", "trn1", 16, "torus2d", (4, 4),
            "16 Trainium1 chips in a 4x4 2D torus (NeuronLink-v2)"),
    # §1.3 Trn2: trn2.48xlarge is 16 chips in a 4x4 2D torus [TRN2-INST][CC-ABOUT].
    _preset("trn2.3xlarge", "trn2", 1, "single", (1,), "1 Trainium2 chip, 8 NeuronCore-v3"),
    _preset("trn2.48xlarge", "trn2", 16, "torus2d", (4, 4),
            "16 Trainium2 chips in a 4x4 2D torus (NeuronLink-v3)"),
    # §1.3: 4 servers, same-(x,y) chips ringed in Z -> a 4x4x4 3D torus (derived).
    _preset("trn2-ultraserver", "trn2", 64, "torus3d", (4, 4, 4),
            "64 Trainium2 chips: 4 trn2u.48xlarge servers in a 4x4x4 3D torus"),
    # §1.3 Trn3 Gen2 UltraServer: 36 servers x 4 chips behind NeuronSwitch-v1 [TRN3-INST].
    _preset("trn3-ultraserver", "trn3", 144, "switch", (36, 4),
            "144 Trainium3 chips: 36 servers x 4 chips, all-to-all over NeuronSwitch-v1"),
]}

@functools.cache
def _interconnect(name: str):
    from jax_trn.hw.topology import Topology
    return Topology.for_system(SYSTEMS[name])


_configured: str | None = None


def configure(system: str | None = None) -> None:
    """Chooses the simulated system before the `trn` backend starts."""
    global _configured
    if system is not None:
        get_system(system)          # validates the name
        _configured = system


def get_system(name: str | None = None) -> System:
    name = name or _configured or os.environ.get("JAX_TRN_SYSTEM") or DEFAULT_SYSTEM
    try:
        return SYSTEMS[name]
    except KeyError:
        raise ValueError(
            f"unknown Trainium system {name!r}; valid systems: {', '.join(SYSTEMS)}") from None
