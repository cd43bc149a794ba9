"""The runtime behind one PJRT client: devices of the configured system, compilation,
and host transfers. Everything here is plain Python; pjrt_plugin maps C calls onto it.

A client is made from one `jax_trn.config.Options` (`create_client` resolves them from
`configure()`, the PJRT create options and the environment, once); the compiler and the
runtime get their settings from it."""
from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from jax_trn import config
from jax_trn.config import Options
from jax_trn.hw.program import host_callbacks
from . import compile_cache, compile_options, compiler
from .buffer import Buffer
from .device import Device, Memory, OutOfMemory, core_numerics, make_devices
from .executable import Executable
from .kvstore import KVStore
from .processes import Processes, split

PLATFORM_NAME = "trn"


class CompileError(Exception):
    pass


class Client:
    def __init__(self, options: Options, processes: Processes | None = None,
                 kv: KVStore | None = None):
        """`processes`: this process's share of a multi-controller run (default: the
        only process); `kv`: the store the run's processes share (JAX's coordination
        service; needed by programs whose devices span processes)."""
        from jax_trn import __version__
        self.options = options
        self.system = system = options.system
        self.processes = processes = processes or Processes()
        self.kv = kv
        if processes.multi and kv is not None:
            from .channel import announce
            from .spmd_remote import publish_settings, watch_exit
            announce(kv, processes.index)
            publish_settings(kv, processes.index, options)
            watch_exit(kv, processes.index)
        self.devices: list[Device] = make_devices(system, core_numerics(options), processes)
        self.local_devices: list[Device] = [d for d in self.devices if d.addressable]
        self.memories: list[Memory] = [d.memory for d in self.devices]
        self.local_memories: list[Memory] = [d.memory for d in self.local_devices]
        # The build (a digest of the plugin's sources) is part of the version: JAX's own
        # persistent cache, where it engages for trn (when a CPU program compiled first
        # in the process), keys its entries by it, so an entry of an older jax-trn is
        # a miss, not a warning at every run that it cannot be loaded.
        self.platform_version = (
            f"jax-trn {__version__} (build {compile_cache.plugin_digest()[:12]}): "
            f"simulated {system.name} ({system.num_chips} x "
            f"{system.chip_name}, {system.cores_per_chip} x {system.chip.core.name} each)")
        self._compile_lock = threading.Lock()
        self._counter = 0

    @property
    def platform_name(self) -> str:
        return PLATFORM_NAME

    @property
    def process_index(self) -> int:
        return self.processes.index

    def device(self, device_id: int) -> Device:
        if not 0 <= device_id < len(self.devices):
            raise LookupError(f"no trn device with id {device_id} "
                              f"({self.system.name} has {len(self.devices)})")
        return self.devices[device_id]

    def local_device(self, device_id: int) -> Device:
        d = self.device(device_id)
        if not d.addressable:
            raise LookupError(f"trn device {device_id} belongs to process {d.process_index}; "
                              f"this is process {self.process_index}")
        return d

    def default_device_assignment(self, num_replicas: int, num_partitions: int) -> list[int]:
        """This process's first devices (all of them in a single-process run); a
        program larger than that takes the global devices from id 0."""
        n = num_replicas * num_partitions
        if n > len(self.devices):
            raise ValueError(f"{n} devices requested, {self.system.name} has {len(self.devices)}")
        if n <= len(self.local_devices):
            return [d.id for d in self.local_devices[:n]]
        return list(range(n))

    def buffer_from_host(self, array: np.ndarray, device: Device) -> Buffer:
        return Buffer.from_host(device, array)

    def compile(self, code: bytes, fmt: str, options: bytes) -> Executable:
        if fmt != "mlir":
            raise CompileError(f"program format {fmt!r} is not supported; expected 'mlir'")
        opts = compile_options.parse(options)
        settings = config.for_compile(self.options, opts.overrides)
        devices = self._assigned_devices(opts)
        compiled = self._compile_cached(code, opts, settings, devices)
        return self._load(compiled, devices, opts, settings)

    def _compile_cached(self, code: bytes, options, settings: Options,
                        devices: list[Device]) -> compiler.Compiled:
        """Compiles, or reads the program from JAX's persistent cache directory
        (`compile_cache`; off unless the user set one)."""
        cache_settings = config.persistent_cache()
        cache = compile_cache.DiskCache(cache_settings) if cache_settings else None
        key = compile_cache.key(code, options, settings) if cache else ""
        if cache is not None:
            hit = cache.load(key)
            if isinstance(hit, compiler.Compiled):
                return hit
        with self._compile_lock:
            self._counter += 1
            name = f"module_{self._counter:04d}"
        start = time.perf_counter()
        compiled = compiler.compile_program(
            code, settings, name=name, check=lambda n, m: _check_fits(n, m, devices))
        if cache is not None and not host_callbacks(compiled.program.steps):
            # With its MLIR text, which JAX asks of every executable (for its layouts)
            # and which takes ~0.5 s to make for a training step.
            from .program_mlir import program_mlir
            sig = compiled.signature
            compiled = dataclasses.replace(compiled, mlir_text=program_mlir(
                compiled.name, compiled.program, (sig.param_types, sig.result_types)))
            cache.store(key, compiled.without_ir(), time.perf_counter() - start)
        return compiled

    def _load(self, compiled: compiler.Compiled, devices: list[Device], opts,
              settings: Options) -> Executable:
        return Executable(compiled.name, compiled.program, compiled.signature, devices, opts,
                          compiled.mlir_text or "", settings, kv=self.kv)

    def serialize(self, executable: Executable) -> bytes:
        """The executable as bytes `deserialize` loads again (in this process or
        another one running the same jax-trn): PJRT_Executable_Serialize."""
        if host_callbacks(executable.program.steps):
            raise CompileError(f"{executable.name} calls host functions, which live in "
                               f"this process only: it cannot be serialized")
        compiled = compiler.Compiled(executable.name, executable.program, executable.signature,
                                     mlir_text=executable.optimized_mlir)
        return compile_cache.dumps((compiled, executable.options.raw, executable.settings))

    def deserialize(self, data: bytes, options: bytes | None = None) -> Executable:
        """An executable from `serialize`'s bytes, loaded for the devices of its compile
        options (or of `options`, JAX's overriding ones)."""
        try:
            compiled, raw, settings = compile_cache.loads(data)
        except compile_cache.CacheFormatError as exc:
            raise CompileError(f"cannot load a serialized executable: {exc}") from None
        if settings.system != self.system:
            raise CompileError(f"{compiled.name} was compiled for {settings.system.name}; "
                               f"this client simulates {self.system.name}")
        opts = compile_options.parse(options or raw)
        return self._load(compiled, self._assigned_devices(opts), opts, settings)

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


def create_client(create_options: dict | None = None, kv: KVStore | None = None) -> Client:
    """The process's client, with the options `config.start` resolves (and records as
    the live ones: `configure()` refuses changes from now on). JAX's create options
    `node_id` / `num_nodes` (after `jax.distributed.initialize`) place it in a
    multi-controller run (`processes.split`); `kv` is that run's store."""
    create_options = dict(create_options or {})
    options = config.resolve(create_options)
    processes = split(options.system, int(create_options.get("node_id", 0)),
                      int(create_options.get("num_nodes", 1)))
    if processes.multi and kv is None:
        raise ValueError(f"process {processes.index} of {processes.count}: a multi-process "
                         f"trn client needs the coordination service's key-value store "
                         f"(jax.distributed.initialize before the first use of trn)")
    global _latest
    _latest = Client(config.start(create_options), processes, kv)
    return _latest


_latest: Client | None = None


def latest_client() -> Client | None:
    """The client `create_client` made last (the process's `trn` backend), or None."""
    return _latest
