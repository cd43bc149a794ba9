"""Compiled programs and their execution on the simulated NeuronCores.

Every execution is recorded for the profiler (`profiler.record`), one `KernelRecord` per
kernel instance that ran (a loop body's kernels once per trip). `simulate` times a
program on a fresh NeuronCore of any system, outside any JAX backend: the timing run
behind `cost_analysis()` and `jax_trn.compare`.

The steps of a program (kernels, control flow, collectives, host callbacks) run on each
device's control path (`steps.StepRunner`). A loop that runs more than
`Options.max_while_iterations` trips (JAX_TRN_MAX_WHILE_ITERATIONS, default 10000) stops the call
with an ExecutionError instead of hanging. Donated arguments (`donation`) give their HBM
to the outputs that alias them.
"""
from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import Counter

import numpy as np

from jax_trn import profiler
from jax_trn.hw import dtypes as _dt
from jax_trn.hw.program import has_collectives, host_callbacks

from jax_trn.config import Options
from jax_trn.systems import System

from . import blas, callbacks, donation, interrupts, replay, spmd, spmd_batch, timing_only
from .buffer import Allocations, Buffer, TimingOnlyValue
from .device import Device
from .dram import PARTITION_ID, REPLICA_ID, Dram, bind_dram, static_dram  # noqa: F401
from .execution import compute_dtype, make_execution  # noqa: F401
from .gc_pause import gc_paused
# The control path moved to steps.py; these names are still imported from here.
from .steps import ExecutionError, StepRunner, control_ns, run_kernels  # noqa: F401

_StepRunner = StepRunner
_NO_SCOPE = contextlib.nullcontext()       # stateless: one instance serves every call


class Executable:
    """One compiled program, loaded for `devices` (one per replica × partition)."""

    def __init__(self, name: str, program, signature, devices: list[Device], options,
                 mlir_text: str = "", settings: Options | None = None, kv=None):
        """`signature`: the IR's (`compiler.Signature`); `options`: JAX's compile options
        (replicas, partitions, device assignment); `settings`: the jax-trn options the
        program was compiled and runs with; `kv`: the store of a multi-controller run
        (`kvstore`), through which collectives reach devices of other processes."""
        self.name = name
        self.program = program
        self.signature = signature
        self._mlir_text = mlir_text or None
        self.devices = devices
        # The devices this process runs (all of them unless the program spans the
        # processes of a multi-controller run: `spmd_remote`).
        self.local_devices = [d for d in devices if d.addressable]
        self.kv = kv
        self._program_key: str | None = None  # its calls' keys across processes
        self.options = options
        self.settings = settings or Options(system=devices[0].system)
        # What JAX sees (`Signature`): complex parameters and results stay complex;
        # their bytes are the float32[..., 2] the program reads and writes.
        self.output_types = list(signature.result_types)
        self.param_types = list(signature.param_types)
        # {parameter: output} a call donates unless told not to (`donation`).
        self.aliases = donation.aliases(list(signature.arg_attrs), program.params,
                                        program.outputs)
        self.spmd = signature.spmd                    # hlo_passes.passes.localize.Spmd
        # The host functions the program calls, kept alive while it is loaded.
        self.host_functions = [callbacks.lookup(s.key) for s in host_callbacks(program.steps)]
        # All devices at once (spmd.drive): collectives, and callbacks one device makes
        # for all of them (the others wait for its results).
        self.collectives = has_collectives(program.steps) or (len(devices) > 1 and any(
            s.device is not None for s in host_callbacks(program.steps)))
        # TensorE tile math runs on one BLAS thread during a call (`blas`).
        self.uses_blas = uses_blas(program)
        # Timelines computed once (`replay`): {device ids of a call: DeviceTimeline each}.
        self.replayable = replay.replayable(program)
        self._timelines: dict[tuple[int, ...], tuple[replay.DeviceTimeline, ...]] = {}
        # {device ids: (the records of a replayed call, their profiler Execution)}: a
        # call that takes the recorded path has the recorded timeline, so it shares one
        # Execution (immutable once made) instead of building one per call.
        self._replayed: dict[tuple[int, ...], tuple[list, profiler.Execution | None]] = {}
        self.fingerprint = hashlib.sha256(program.text.encode() + name.encode()).hexdigest()[:32]
        self.deleted = False
        self._lock = threading.Lock()
        self._timing: profiler.Execution | None = None
        self._dtype: str | None = None        # compute_dtype(program), for the profiler
        self._static: dict[int, dict] = {}    # partition -> static_dram
        # Per-call facts, computed once: each output's (shape, dtype) and the temporaries'
        # bytes and their name in an out-of-HBM error.
        self._outputs = [(tuple(int(d) for d in t.shape), t.dtype) for t in self.output_types]
        self._params = [(tuple(int(d) for d in t.shape), t.dtype) for t in self.param_types]
        self._temp_bytes = program.temp_bytes
        self._temps_what = f"{len(program.temps)} temporaries of {name}"
        _check_signature(name, program, self.param_types, self.output_types)
        # Constants live in each device's HBM for as long as the executable is loaded.
        self.constant_bytes = sum(int(np.asarray(v).nbytes) for v in program.constants.values())
        for i, d in enumerate(self.local_devices):
            try:
                d.allocate(self.constant_bytes, f"the constants of {name}")
            except MemoryError:
                for loaded in self.local_devices[:i]:
                    loaded.free(self.constant_bytes)
                raise

    def release(self) -> None:
        """Unloads the executable: frees its constants' HBM."""
        with self._lock:
            if not self.deleted:
                self.deleted = True
                for d in self.local_devices:
                    d.free(self.constant_bytes)

    @property
    def num_replicas(self) -> int:
        return self.options.num_replicas

    @property
    def num_partitions(self) -> int:
        return self.options.num_partitions

    @property
    def optimized_text(self) -> str:
        return self.program.text

    @property
    def code_size_bytes(self) -> int:
        """Instruction bytes, at a nominal 64 bytes per instruction (the encoding is not
        public, trainium-hardware.md §11)."""
        return 64 * sum(len(k.instructions) for k in self.program.kernels)

    def memory_stats(self) -> dict[str, int]:
        """Per device: argument, output and temporary bytes; `alias_size_in_bytes` the
        outputs that reuse a donated argument's HBM (counted once in the peak)."""
        prog = self.program
        args = sum(t.nbytes for t in prog.params)
        outs = sum(t.nbytes for t in prog.outputs)
        temps = prog.temp_bytes
        alias = sum(prog.outputs[j].nbytes for j in self.aliases.values())
        peak = args + outs + temps - alias
        return {"generated_code_size_in_bytes": self.code_size_bytes,
                "argument_size_in_bytes": args, "output_size_in_bytes": outs,
                "alias_size_in_bytes": alias, "temp_size_in_bytes": temps,
                "peak_memory_in_bytes": peak, "total_size_in_bytes": peak}

    def cost_analysis(self) -> dict[str, float]:
        """Figures of the compiled program (per device): FLOPs and argument + result
        bytes, and from one timing run (`timing()`) the simulated time, MFU, MBU and the
        bytes DMA moves to and from HBM. FLOPs are the static count, or with control
        flow those the timing run executed (loop trips of all-zero arguments)."""
        timing = self.timing()
        summary = timing.summary().to_dict()
        flops = timing.flops if self.program.control_flow else self.program.flops
        return {
            "flops": float(flops),
            "bytes accessed": float(sum(t.nbytes for t in self.program.params)
                                    + sum(t.nbytes for t in self.program.outputs)),
            "simulated_time_s": float(timing.simulated_time_s),
            "mfu": summary["mfu_estimated_percent"] / 100,
            "mbu": summary["mbu_estimated_percent"] / 100,
            "hbm bytes": float(timing.hbm_bytes),
        }

    def timing(self) -> profiler.Execution:
        """One timing-only run on a fresh core of this executable's system (computed
        once; not recorded by `profile()`). Without control flow simulated time does
        not depend on the data, so it equals a real call's; with loops or conditionals
        it is the time of a call with all-zero arguments (see `simulate`)."""
        with self._lock:
            if self._timing is None:
                self._timing = simulate(self.name, self.program, self.settings,
                                        [d.id for d in self.devices])
            return self._timing

    @property
    def optimized_mlir(self) -> str:
        """The program as MLIR text (`program_mlir`; made on first request: 0.5 s for
        an lm1b-size training step, which a program loaded from the cache skips)."""
        if self._mlir_text is None:
            from .program_mlir import program_mlir
            self._mlir_text = program_mlir(self.name, self.program,
                                           (self.param_types, self.output_types))
        return self._mlir_text

    def execute(self, arg_lists: list[list[Buffer]], device: Device | None = None,
                keep: frozenset[int] = frozenset()) -> list[list[Buffer]]:
        """Runs the program once on `devices` (or `device` alone); returns each device's
        output buffers. Aliased arguments not in `keep` (the caller's non-donatable
        parameter indices) are donated: deleted, their HBM reused by the outputs. A
        call that fails in any way (an error, a runaway loop, Ctrl-C, out of HBM or host
        memory on any device) leaves nothing allocated and donates nothing."""
        devices = [device] if device is not None else self.local_devices
        if not devices and not arg_lists:
            # A multi-process program none of whose devices is this process's (JAX
            # calls it everywhere): the processes that own its devices run it.
            return []
        if len(arg_lists) != len(devices):
            raise ExecutionError(
                f"{self.name} was compiled for {len(self.devices)} devices "
                f"({len(self.local_devices)} of this process), "
                f"called with {len(arg_lists)} argument lists")
        if timing_only.active():
            return self._timing_only(devices, arg_lists, keep)
        donate = donation.donated(self.aliases, keep) if self.aliases else {}
        with Allocations(donate) as alloc, interrupts.watched(), \
                blas.one_thread() if self.uses_blas else _NO_SCOPE, gc_paused(), \
                np.errstate(all="ignore"):
            # (IEEE results are the simulated hardware's; numpy's warnings about them,
            # which the interpreter silenced per instruction, are noise to the user)
            run = self._execute_spmd if self.collectives else self._execute_each
            results, records, collectives = run(devices, arg_lists, alloc)
            profiler.record(self._execution(records, devices, collectives))
            return results

    def _timing_only(self, devices, arg_lists, keep) -> list[list[Buffer]]:
        """A call under `jax_trn.timing_only()`: one device timed, the collectives over
        all (`timing_only.run`), outputs without values, donated arguments deleted."""
        for dev, args in zip(devices, arg_lists):
            self._check_args(dev, args, values=False)
        # Every device of the program (a multi-process program's too: the timing needs
        # no data, so each process times the whole program alike).
        every = self.devices if devices is self.local_devices else devices
        ex = timing_only.run(self.name, self.program, self.settings, [d.id for d in every])
        profiler.record(ex)
        why = (f"this array is a result of {self.name} called under jax_trn.timing_only(): "
               f"it has a shape and a simulated time, but no values")
        for args in arg_lists:
            for i in donation.donated(self.aliases, keep):
                args[i].delete()
        return [[Buffer.without_values(d, t.shape, t.dtype, why) for t in self.output_types]
                for d in devices]

    def failed_outputs(self, error: BaseException, device: Device | None = None
                       ) -> list[list[Buffer]]:
        """Stand-ins for the outputs of a call that did not complete (`Buffer.failed`:
        they charge nothing and raise `error` when read), one list per device."""
        devices = [device] if device is not None else self.local_devices
        return [[Buffer.failed(d, t.shape, t.dtype, error) for t in self.output_types]
                for d in devices]

    @staticmethod
    def _hbms(devices) -> dict:
        """One HBM per chip, fresh for each execution: the devices of one call run
        concurrently (from t=0) and contend for their chip's HBM; separate calls do not."""
        from jax_trn.hw.bandwidth import Hbm
        chip = devices[0].system.chip
        sharers = Counter(d.chip for d in devices)
        return {c: Hbm(chip.hbm_bytes_per_ns, f"hbm.chip{c}", n if n > 1 else None)
                for c, n in sharers.items()}

    def _execute_each(self, devices, arg_lists, alloc):
        """One device after the other (a program without collectives). The first call
        on these devices is timed; later ones replay its timeline while they take its
        path (`replay`): only their numerics run."""
        key = (devices[0].id,) if len(devices) == 1 else tuple(d.id for d in devices)
        prepared = [self._prepare(dev, args, p, alloc)
                    for p, dev, args in zip(self._partitions(devices), devices, arg_lists)]
        results = [outs for outs, _ in prepared]
        cached = self._timelines.get(key) if self.replayable else None
        if cached is not None:
            try:
                self._replay(devices, prepared, cached)
                return results, self._replayed[key][0], ()
            except replay.Diverged:          # a new path: time the call from the start
                for _, dram in prepared:
                    self._clear(dram)
        hbms = self._hbms(devices)
        recorded = []
        for dev, (_, dram) in zip(devices, prepared):
            with dev.execution_lock:
                recorded.append(self._run_device(dev, dram, hbms[dev.chip]))
        records = [r for t in recorded for r in t.records]
        if self.replayable and sum(len(t.plan) for t in recorded) <= MAX_REPLAY_STEPS:
            self._timelines[key] = tuple(recorded)
            self._replayed[key] = (records, None)
        return results, records, ()

    def _replay(self, devices, prepared, timelines) -> None:
        """The numerics of a call along its recorded path, device by device (raises
        replay.Diverged if it leaves it)."""
        for dev, (_, dram), timeline in zip(devices, prepared, timelines):
            with dev.execution_lock:
                replay.replay(timeline, self.program.steps, dev.core_model, dram,
                              self.settings.max_while_iterations)

    def _clear(self, dram) -> None:
        """Outputs and temporaries back to zeros, as a call finds them."""
        for t in self.program.outputs:
            dram[t.name][...] = 0
        if isinstance(dram, Dram):
            dram.reset()
        else:
            for t in self.program.temps:
                dram[t.name][...] = 0

    def _run_device(self, dev, dram, hbm) -> replay.DeviceTimeline:
        """The steps on `dev`'s core from simulated time 0, timed in full."""
        core = dev.core_model
        core.begin(hbm)
        runner = StepRunner(core, dram, dev.id, dev.chip, True, self.program.steps,
                            self.settings.max_while_iterations, chip_spec=dev.system.chip)
        runner.plan = []
        for arrival in runner.run():
            raise ExecutionError(f"{arrival.step.name} is a collective: run the program "
                                 "on all its devices (spmd.drive)")
        return replay.DeviceTimeline(tuple(runner.records), tuple(runner.plan))

    def _execute_spmd(self, devices, arg_lists, alloc):
        """All devices at once: each runs the steps on its core until a collective,
        which runs when all have reached it (`spmd.drive`); one timeline per class of
        equivalent chips (`spmd_batch`)."""
        prepared = [self._prepare(dev, args, p, alloc)
                    for p, dev, args in zip(self._partitions(devices), devices, arg_lists)]
        exchange = self._exchange() if devices is self.local_devices else None
        with contextlib.ExitStack() as locks:
            for dev in sorted(set(devices), key=lambda d: d.id):
                locks.enter_context(dev.execution_lock)
            try:
                records, collectives = spmd_batch.run(
                        self.program, devices, [dram for _, dram in prepared],
                        lambda: self._hbms(devices), self.settings, exchange=exchange)
            except BaseException as exc:
                if exchange is not None:
                    exchange.abort(exc)
                raise
        outputs = [outs for outs, _ in prepared]
        spmd_batch.adopt(self.program, outputs, [dram for _, dram in prepared])
        return outputs, records, collectives

    def _partitions(self, devices) -> list[int]:
        """The partition each of a call's devices runs: its place among the program's
        devices (a call on this process's share of a multi-process program), or 0.. for
        a call on one chosen device."""
        if devices is self.local_devices and len(devices) < len(self.devices):
            return [p for p, d in enumerate(self.devices) if d.addressable]
        return list(range(len(devices)))

    def _exchange(self):
        """The cross-process side of this call (`spmd_remote`), or None if every
        device of the program is this process's."""
        if len(self.local_devices) == len(self.devices):
            return None
        if self.kv is None:
            raise ExecutionError(f"{self.name} runs on devices of several processes, and "
                                 "this client has no key-value store to reach them")
        from .spmd_remote import Exchange, check_settings, next_call, program_key
        if self._program_key is None:
            self._program_key = program_key(self.program, [d.id for d in self.devices])
        check_settings(self.kv, self.local_devices[0].process_index,
                       sorted({d.process_index for d in self.devices}
                              - {self.local_devices[0].process_index}),
                       self.settings.process_timeout)
        return Exchange(self.kv, self.devices, self.local_devices[0].process_index,
                        self._program_key, next_call(self.kv, self._program_key),
                        self.settings.process_timeout)

    def _execution(self, kernels, devices, collectives=()) -> profiler.Execution:
        key = (devices[0].id,) if len(devices) == 1 else tuple(d.id for d in devices)
        shared = self._replayed.get(key)
        if shared is not None and shared[0] is kernels and shared[1] is not None:
            return shared[1]             # a replayed call: the recorded call's Execution
        if self._dtype is None:        # a walk over every instruction: once
            self._dtype = compute_dtype(self.program)
        ex = make_execution(self.name, self.program, devices[0].system,
                            [d.id for d in devices], kernels, collectives, self._dtype)
        if shared is not None and shared[0] is kernels:
            self._replayed[key] = (kernels, ex)
        return ex

    def _check_args(self, device: Device, args: list[Buffer], values: bool = True) -> None:
        """Count, types, devices and liveness of one device's arguments; `values`: the
        call computes, so arrays without values (timing-only results) are refused."""
        if len(args) != len(self._params):
            raise ExecutionError(f"{self.name} takes {len(self._params)} arguments, "
                                 f"got {len(args)}")
        for i, ((shape, dtype), b) in enumerate(zip(self._params, args)):
            if b.error is not None:
                raise b.error
            if values and b.unset is not None:
                raise TimingOnlyValue(f"argument {i} of {self.name}: {b.unset}; a call "
                                      f"that computes values needs arrays that have them")
            if b.is_deleted:
                raise donation.DeletedArgument(
                    f"Invalid buffer passed to Execute() as argument {i} to replica 0: "
                    "INVALID_ARGUMENT: Buffer has been deleted or donated.")
            if shape != b.shape or dtype != b.dtype:
                raise ExecutionError(f"argument {i} of {self.name}: expected {dtype}"
                                     f"{list(shape)}, got {b.dtype}{list(b.shape)}")
            if b.device is not device:
                raise ExecutionError(f"argument {i} of {self.name} is on {b.device.to_string}, "
                                     f"the program runs on {device.to_string}")

    def _prepare(self, device: Device, args: list[Buffer], partition: int, alloc):
        """Output buffers and temporaries of one device's run (charged to its HBM
        through `alloc`, an output aliasing a donated argument in that argument's HBM)
        and the run's DRAM binding."""
        self._check_args(device, args)
        prog = self.program
        if alloc.donate:          # (without donations no argument can clash)
            donation.check_clashes(args, alloc.donate, partition)
            donor = {j: args[i] for i, j in alloc.donate.items()}
            outs = [alloc.reuse(donor[j], shape, dtype) if j in donor
                    else alloc.output(device, shape, dtype)
                    for j, (shape, dtype) in enumerate(self._outputs)]
        else:
            outs = [alloc.output(device, shape, dtype) for shape, dtype in self._outputs]
        alloc.reserve(device, self._temp_bytes, self._temps_what)
        static = self._static.get(partition)
        if static is None:
            static = self._static[partition] = static_dram(prog, partition, 0)
        dram = bind_dram(prog, [b.data for b in args], [b.data for b in outs],
                         partition=partition, replica=0, static=static)
        return outs, dram


# A recorded call (`replay`) is kept while loaded: at most this many kernel instances,
# decisions and callbacks (a long loop's records would hold hundreds of MB of trace).
MAX_REPLAY_STEPS = 200_000

def simulate(name: str, prog, options: Options | System, device_ids: list[int] | None = None
             ) -> profiler.Execution:
    """The timing of one call of `prog` on fresh NeuronCores of `options.system` (a
    `System` stands for `Options(system=it)`: default numerics and choices) (core 0 of
    chip 0, or the devices `device_ids` for a program with collectives), as an
    Execution that `profile()` does not record. Needs no JAX backend.

    Without control flow or collectives no instruction takes effect (simulated time
    never depends on the data). With loops or conditionals, trip counts and branches
    are data: the run executes the numerics too, on all-zero arguments, so it times
    the path an all-zero call takes (exact for loops whose trip count does not depend
    on the arguments, e.g. fori_loop and scan with static bounds). Collectives run their
    numerics too (on zeros), on every device of the program. Host callbacks are timed
    but call nothing (their results are zeros)."""
    from .device import core_numerics
    options = options if isinstance(options, Options) else Options(system=options)
    system, numerics = options.system, core_numerics(options)
    chip = system.chip
    collectives = has_collectives(prog.steps)
    ids = list(device_ids) if collectives and device_ids else [0]
    execute = prog.control_flow or collectives
    with blas.one_thread(execute and uses_blas(prog)):
        return _simulate(name, prog, options, system, numerics, chip, collectives, ids, execute)


def _simulate(name, prog, options, system, numerics, chip, collectives, ids, execute):
    """`simulate` on fresh cores for device ids `ids`."""
    from jax_trn.hw.bandwidth import Hbm
    from jax_trn.hw.core import NeuronCore
    cores_per_chip = system.cores_per_chip
    hbms: dict[int, Hbm] = {}
    sharers = Counter(d // cores_per_chip for d in ids)
    runners = []
    for p, d in enumerate(ids):
        c = d // cores_per_chip
        if c not in hbms:
            hbms[c] = Hbm(chip.hbm_bytes_per_ns, f"hbm.chip{c}",
                          sharers[c] if sharers[c] > 1 else None)
        core = NeuronCore(chip.core, core_id=d % cores_per_chip, numerics=numerics)
        core.begin(hbms[c])
        dram = {}
        if execute:
            zeros = [np.zeros(t.size, _dt.np_dtype(t.dtype)) for t in prog.params]
            outs = [np.zeros(t.size, _dt.np_dtype(t.dtype)) for t in prog.outputs]
            dram = bind_dram(prog, zeros, outs, partition=p)
        runners.append(StepRunner(core, dram, d, c, execute, prog.steps,
                                   options.max_while_iterations, chip_spec=chip,
                                   call_host=False))
        runners[-1].shared = len(ids) > 1
    if not collectives:
        kernels = run_kernels(prog, runners[0].core, runners[0].dram, 0, 0, execute=execute,
                              limit=options.max_while_iterations, chip_spec=chip,
                              call_host=False)
        return make_execution(name, prog, system, [0], kernels)
    done = spmd.drive(runners, [_SimDevice(d) for d in ids], system.interconnect(),
                      algorithm=options.collective_algorithm)
    return make_execution(name, prog, system, ids, [r for run in runners for r in run.records],
                          done)


class _SimDevice:
    """What spmd.drive needs of a device: its global id."""

    def __init__(self, device_id: int):
        self.id = device_id


def uses_blas(prog) -> bool:
    """Whether any kernel of `prog` has a TensorE instruction (tile matmuls)."""
    return any(ins.engine == "tensor" for k in prog.kernels for ins in k.instructions)


def _stored(t) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) of the program's parameter or result that JAX sees as `t`: a
    complex64[S] buffer is the program's float32[S, 2] (hlo_passes complex-planes)."""
    if t.dtype == "complex64":
        return tuple(t.shape) + (2,), "float32"
    return tuple(t.shape), t.dtype


def _check_signature(name, program, param_types, output_types) -> None:
    """The lowered program must take and return exactly what the module declares
    (JAX trusts the executable's output types when it builds result arrays)."""
    declared = [_stored(t) for t in output_types]
    lowered = [(tuple(t.shape), t.dtype) for t in program.outputs]
    params = [_stored(t) for t in param_types]
    lowered_params = [(tuple(t.shape), t.dtype) for t in program.params]
    if declared != lowered or params != lowered_params:
        raise ExecutionError(
            f"internal compiler error in {name}: the lowered program's signature "
            f"{lowered_params} -> {lowered} differs from the module's {params} -> {declared}")
