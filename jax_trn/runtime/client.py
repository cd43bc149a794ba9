"""The runtime behind one PJRT client: devices of the configured system, compilation,
and host transfers. Everything here is plain Python; pjrt_plugin maps C calls onto it."""
from __future__ import annotations

import threading

import numpy as np

from jax_trn import systems
from . import compile_options
from .buffer import Buffer
from .device import Device, Memory, OutOfMemory, make_devices
from .executable import Executable

PLATFORM_NAME = "trn"


class CompileError(Exception):
    pass


class Client:
    def __init__(self, system: systems.System):
        from jax_trn import __version__
        self.system = system
        self.devices: list[Device] = make_devices(system)
        self.memories: list[Memory] = [d.memory for d in self.devices]
        self.platform_version = (
            f"jax-trn {__version__}: simulated {system.name} ({system.num_chips} x "
            f"{system.chip_name}, {system.cores_per_chip} x {system.chip.core.name} each)")
        self._compile_lock = threading.Lock()
        self._counter = 0

    @property
    def platform_name(self) -> str:
        return PLATFORM_NAME

    def device(self, device_id: int) -> Device:
        if not 0 <= device_id < len(self.devices):
            raise LookupError(f"no trn device with id {device_id} "
                              f"({self.system.name} has {len(self.devices)})")
        return self.devices[device_id]

    def default_device_assignment(self, num_replicas: int, num_partitions: int) -> list[int]:
        n = num_replicas * num_partitions
        if n > len(self.devices):
            raise ValueError(f"{n} devices requested, {self.system.name} has {len(self.devices)}")
        return list(range(n))

    def buffer_from_host(self, array: np.ndarray, device: Device) -> Buffer:
        return Buffer.from_host(device, array)

    def compile(self, code: bytes, fmt: str, options: bytes) -> Executable:
        import hlo_passes
        from jax_trn.lower import lower_module
        if fmt != "mlir":
            raise CompileError(f"program format {fmt!r} is not supported; expected 'mlir'")
        opts = compile_options.parse(options)
        devices = self._assigned_devices(opts)
        with self._compile_lock:
            self._counter += 1
            name = f"module_{self._counter:04d}"
        module = hlo_passes.compile_to_ir(code, name=name, **_pass_options())
        name = module.attrs.get("sym_name", name) or name
        _check_fits(str(name), module, devices)
        program = lower_module(module, self.system.chip.core)
        from .program_mlir import program_mlir
        return Executable(str(name), program, module, devices, opts,
                          program_mlir(str(name), program))

    def _assigned_devices(self, opts) -> list[Device]:
        """The devices of a program, replica-major (device r * partitions + p runs
        replica r, partition p)."""
        n = opts.num_replicas * opts.num_partitions
        if n > len(self.devices):
            raise CompileError(f"a program over {n} devices (num_replicas="
                               f"{opts.num_replicas}, num_partitions={opts.num_partitions}) "
                               f"on {self.system.name}, which has {len(self.devices)}")
        if opts.device_assignment is None:
            return [self.devices[i] for i in self.default_device_assignment(
                opts.num_replicas, opts.num_partitions)]
        return [self.device(i) for row in opts.device_assignment for i in row]


def _check_fits(name: str, module, devices: list[Device]) -> None:
    """A program whose arguments and results alone exceed a device's HBM can never run:
    say so at compile time (before lowering a program that large)."""
    fn = module.main
    need = sum(a.type.nbytes for a in fn.args) + sum(t.nbytes for t in fn.result_types)
    for d in devices:
        if need > d.hbm_limit:
            raise OutOfMemory(
                f"{name} needs {need} bytes of HBM for its arguments and "
                f"results, more than the {d.hbm_limit} bytes of {d.to_string} ({d.kind})")


def _pass_options() -> dict:
    """hlo_passes reads no environment: JAX_TRN_DUMP / JAX_TRN_DISABLE_PASSES as its
    parameters, read at each compile as before (until the options object passes them)."""
    import os
    names = os.environ.get("JAX_TRN_DISABLE_PASSES", "").split(",")
    return {"dump_dir": os.environ.get("JAX_TRN_DUMP") or None,
            "disabled_passes": frozenset(n.strip() for n in names if n.strip())}


def create_client(options: dict | None = None) -> Client:
    options = options or {}
    return Client(systems.get_system(options.get("system")))
