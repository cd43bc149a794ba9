"""Devices (one per physical NeuronCore) and their HBM memory space."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from jax_trn.hw.numerics import Numerics
from jax_trn.systems import System


_EXECUTION_LOCK = threading.RLock()
_SCRATCH: dict = {}


def _scratch(spec):
    """One (SBUF, PSUM) pair per core spec (the value, not its name: a user-made core
    may keep a preset's name), shared by all devices."""
    if spec not in _SCRATCH:
        from jax_trn.hw.memory import OnChipMemory
        _SCRATCH[spec] = (OnChipMemory("sbuf", spec.pmax, spec.sbuf_usable_bytes),
                          OnChipMemory("psum", spec.pmax, spec.psum_partition_bytes))
    return _SCRATCH[spec]


class OutOfMemory(MemoryError):
    """An allocation past a device's share of its chip's HBM (RESOURCE_EXHAUSTED)."""


@dataclass(eq=False)
class Memory:
    """The HBM memory space of one device (JAX memory kind "device")."""
    id: int
    device: "Device"
    kind: str = "device"
    kind_id: int = 0

    @property
    def debug_string(self) -> str:
        return f"TrnMemory(id={self.id}, kind={self.kind}, device={self.device.id})"

    @property
    def to_string(self) -> str:
        return f"TrnMemory(kind={self.kind}, device={self.device.id})"


@dataclass(eq=False)
class Device:
    """One physical NeuronCore: `id` is global, chip-major."""
    id: int
    chip: int
    core: int
    system: System
    hbm_limit: int                      # bytes: the chip's HBM divided among its cores
    memory: Memory = field(init=False)
    bytes_in_use: int = 0
    peak_bytes_in_use: int = 0
    num_allocs: int = 0
    largest_alloc_size: int = 0
    numerics: Numerics = field(default_factory=Numerics)   # its core's rounding context
    # The process of a multi-controller run that owns it (`processes`), and whether
    # that is this process (only addressable devices run, hold buffers and take HBM).
    process_index: int = 0
    addressable: bool = True

    def __post_init__(self):
        self.memory = Memory(self.id, self)
        self._lock = threading.Lock()
        # Kernels of all devices compute in one SBUF/PSUM backing store (scratch: no
        # kernel reads what an earlier kernel left there), so one program runs at a time.
        self.execution_lock = _EXECUTION_LOCK
        self._core = None

    @property
    def core_model(self):
        """This device's simulated NeuronCore: its own timeline, computing in the
        SBUF/PSUM byte arrays every device of the process shares (27 MB per core on
        Trn2: 1152 private copies would not fit in a laptop's memory)."""
        if self._core is None:
            from jax_trn.hw.core import NeuronCore
            spec = self.system.chip.core
            self._core = NeuronCore(spec, core_id=self.core, memories=_scratch(spec),
                                    numerics=self.numerics)
        return self._core

    @property
    def coords(self) -> tuple[int, ...]:
        return self.system.chip_coords[self.chip]

    @property
    def kind(self) -> str:
        return f"{self.system.chip_name} {self.system.chip.core.name}"

    @property
    def attributes(self) -> dict:
        """Device attributes reported to JAX (ints, strings, int lists)."""
        return {
            "chip_index": self.chip,
            "core_index": self.core,
            "coords": list(self.coords) + [self.core],
            "chip_coords": list(self.coords),
            "generation": self.system.generation,
            "system": self.system.name,
            "topology": self.system.topology,
            "hbm_bytes": self.hbm_limit,
        }

    @property
    def debug_string(self) -> str:
        return f"trn:{self.id}"

    @property
    def to_string(self) -> str:
        return f"TrnDevice(id={self.id}, chip={self.chip}, core={self.core})"

    def allocate(self, nbytes: int, what: str = "buffer") -> None:
        with self._lock:
            if self.bytes_in_use + nbytes > self.hbm_limit:
                raise OutOfMemory(
                    f"out of HBM on {self.to_string} ({self.kind}) while "
                    f"allocating {nbytes} bytes for {what}: {self.bytes_in_use} of "
                    f"{self.hbm_limit} bytes in use, {self.hbm_limit - self.bytes_in_use} free")
            self.bytes_in_use += nbytes
            self.num_allocs += 1
            self.peak_bytes_in_use = max(self.peak_bytes_in_use, self.bytes_in_use)
            self.largest_alloc_size = max(self.largest_alloc_size, nbytes)

    def free(self, nbytes: int) -> None:
        with self._lock:
            self.bytes_in_use -= nbytes

    def memory_stats(self) -> dict[str, int]:
        return {
            "bytes_in_use": self.bytes_in_use,
            "peak_bytes_in_use": self.peak_bytes_in_use,
            "num_allocs": self.num_allocs,
            "largest_alloc_size": self.largest_alloc_size,
            "bytes_limit": self.hbm_limit,
        }


def make_devices(system: System, numerics: Numerics | None = None,
                 processes=None) -> list[Device]:
    """The devices of `system`, their cores rounding as `numerics` says (default: the
    hardware's round-to-nearest-even, strict activation ranges); with `processes`
    (`processes.Processes`), each owned by the process of its chip."""
    cores = system.cores_per_chip
    share = system.chip.hbm_bytes // cores
    numerics = numerics or Numerics()
    owner = processes.owner_of_chip if processes is not None else (lambda c: 0)
    me = processes.index if processes is not None else 0
    return [Device(c * cores + k, c, k, system, share, numerics=numerics,
                   process_index=owner(c), addressable=owner(c) == me)
            for c in range(system.num_chips) for k in range(cores)]


def core_numerics(options) -> Numerics:
    """The rounding context of every NeuronCore of a client with `options`
    (`jax_trn.config.Options`: stochastic rounding, its seed, strict activation ranges,
    numerics on one or two threads)."""
    return Numerics("stochastic" if options.stochastic_rounding else "rne",
                    options.stochastic_rounding_seed, options.strict_activation_ranges,
                    lanes=options.simulator_threads > 1)
