"""Systems: which chips, how many, and how they are joined (trainium-hardware.md §1.3).

A `System` is a value that holds everything about itself: its chip (a
`jax_trn.hw.spec.ChipSpec`, which carries the cores, HBM and links), the number of chips,
the shape that joins them and its extent. It builds its own topology
(`system.interconnect()`, made once per System object), so a user-made system is as
good as a preset:

    from jax_trn.hw.spec import CHIPS
    my_2x2 = System(name="my-2x2", chip=CHIPS["trn2"], num_chips=4,
                    topology="torus2d", dims=(2, 2))
    jax_trn.configure(system=my_2x2)             # before the trn backend starts

and `dataclasses.replace(SYSTEMS["trn2.48xlarge"], num_chips=4, dims=(2, 2))` is a
4-chip system whatever its name. Shapes (`topology`):

    single    one chip, dims (1,)
    torus2d   a 2D torus of NeuronLink, dims (x, y) (§1.3: Trn1/Trn2 16-chip servers)
    torus3d   a 3D torus, dims (z, x, y): X/Y in a server, Z rings across servers
    switch    NeuronSwitch, dims (servers, chips per server) (§1.3: Trn3 UltraServer)

One JAX device is one physical NeuronCore; device ids run chip-major (chip c, core k ->
c * cores + k). `SYSTEMS` holds the presets by name.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jax_trn.hw.spec import CHIPS, ChipSpec

if TYPE_CHECKING:
    from jax_trn.hw.topology import Topology

DEFAULT_SYSTEM = "trn2.3xlarge"
CHIP_NAMES = {"trn1": "Trainium1", "trn2": "Trainium2", "trn3": "Trainium3"}
TOPOLOGIES = {"single": 1, "torus2d": 2, "torus3d": 3, "switch": 2}   # shape -> len(dims)


@dataclass(frozen=True)
class System:
    name: str
    chip: ChipSpec                    # the chip: cores, HBM, links (`hw.spec.CHIPS[...]`)
    num_chips: int
    topology: str                     # "single" | "torus2d" | "torus3d" | "switch"
    dims: tuple[int, ...]             # topology extent per coordinate
    description: str = ""

    def __post_init__(self):
        object.__setattr__(self, "dims", tuple(self.dims))
        _validate(self)

    @property
    def generation(self) -> str:
        """"trn1" | "trn2" | "trn3": the generation of the chip's NeuronCores."""
        return self.chip.core.generation

    @property
    def chip_coords(self) -> list[tuple[int, ...]]:
        """Coordinates of each chip, in chip-index order (last coordinate fastest)."""
        return list(itertools.product(*(range(d) for d in self.dims)))

    @property
    def cores_per_chip(self) -> int:
        return self.chip.cores

    @property
    def chip_name(self) -> str:
        return CHIP_NAMES.get(self.generation, self.chip.name)

    @property
    def num_devices(self) -> int:
        return self.num_chips * self.cores_per_chip

    def interconnect(self) -> Topology:
        """Links, routes and contention of this system (`jax_trn.hw.topology.Topology`),
        for `jax_trn.collectives`: built from the system itself, once per object."""
        return self._topology

    @functools.cached_property
    def _topology(self) -> Topology:
        # A frozen dataclass still has an instance __dict__; cached_property writes there
        # (not through __setattr__), so each System object builds its topology once.
        from jax_trn.hw.topology import Topology      # numpy: loaded when first needed
        return Topology.for_system(self)


def _validate(s: System) -> None:
    """A system whose fields agree: a known shape with its number of dims, positive
    dims whose product is the chip count, a ChipSpec."""
    where = f"system {s.name!r}"
    if not isinstance(s.chip, ChipSpec):
        raise TypeError(f"{where}: chip must be a jax_trn.hw.spec.ChipSpec (e.g. "
                        f"CHIPS['trn2']), got {type(s.chip).__name__}")
    if s.topology not in TOPOLOGIES:
        raise ValueError(f"{where}: unknown topology {s.topology!r}; expected one of "
                         f"{', '.join(TOPOLOGIES)}")
    want = TOPOLOGIES[s.topology]
    if len(s.dims) != want or not all(isinstance(d, int) and d >= 1 for d in s.dims):
        raise ValueError(f"{where}: a {s.topology} system has {want} positive integer "
                         f"dims, got {s.dims}")
    if s.topology == "single" and s.dims != (1,):
        raise ValueError(f"{where}: a single-chip system has dims (1,), got {s.dims}")
    if s.num_chips != math.prod(s.dims):
        raise ValueError(f"{where}: num_chips={s.num_chips} but dims {s.dims} hold "
                         f"{math.prod(s.dims)} chips")


def _preset(name, gen, chips, topology, dims, description):
    return System(name, CHIPS[gen], chips, topology, dims, description)


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
