"""Compiled programs and their execution on the simulated NeuronCores.

Every execution is recorded for the profiler (`profiler.record`), one `KernelRecord` per
kernel instance that ran (a loop body's kernels once per trip). `simulate` times a
program on a fresh NeuronCore of any system, outside any JAX backend: the timing run
behind `cost_analysis()` and `jax_trn.compare`.

Control flow (`hw.program.While` / `Case` steps) runs on the core's control path between
kernels: after the kernel that wrote the predicate / branch index completed, the
sequencer reads it from HBM and branches (`control_ns`). A loop that runs more than
`Options.max_while_iterations` trips (JAX_TRN_MAX_WHILE_ITERATIONS, default 10000) stops the call
with an ExecutionError instead of hanging.
"""
from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import Counter

import numpy as np

from jax_trn import profiler
from jax_trn.hw import dtypes as _dt
from jax_trn.hw.isa import DramAP
from jax_trn.hw.program import (
    Case,
    Collective,
    Kernel,
    While,
    has_collectives,
    walk_steps,
)

from . import spmd
from .buffer import Allocations, Buffer
from jax_trn.config import Options
from jax_trn.systems import System

from .device import Device


class ExecutionError(RuntimeError):
    pass


class Executable:
    """One compiled program, loaded for `devices` (one per replica × partition)."""

    def __init__(self, name: str, program, module, devices: list[Device], options,
                 mlir_text: str = "", settings: Options | None = None):
        """`options`: JAX's compile options (replicas, partitions, device assignment);
        `settings`: the jax-trn options the program was compiled and runs with."""
        self.name = name
        self.program = program
        self.optimized_mlir = mlir_text
        self.devices = devices
        self.options = options
        self.settings = settings or Options(system=devices[0].system)
        fn = module.main
        self.output_types = list(fn.result_types)
        self.param_types = [a.type for a in fn.args]
        self.spmd = module.attrs.get("trn.spmd")      # hlo_passes.passes.localize.Spmd
        self.collectives = has_collectives(program.steps)
        self.fingerprint = hashlib.sha256(program.text.encode() + name.encode()).hexdigest()[:32]
        self.deleted = False
        self._lock = threading.Lock()
        self._timing: profiler.Execution | None = None
        _check_signature(name, program, self.param_types, self.output_types)
        # Constants live in each device's HBM for as long as the executable is loaded.
        self.constant_bytes = sum(int(np.asarray(v).nbytes) for v in program.constants.values())
        for i, d in enumerate(devices):
            try:
                d.allocate(self.constant_bytes, f"the constants of {name}")
            except MemoryError:
                for loaded in devices[:i]:
                    loaded.free(self.constant_bytes)
                raise

    def release(self) -> None:
        """Unloads the executable: frees its constants' HBM."""
        with self._lock:
            if not self.deleted:
                self.deleted = True
                for d in self.devices:
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
        prog = self.program
        args = sum(t.nbytes for t in prog.params)
        outs = sum(t.nbytes for t in prog.outputs)
        temps = sum(t.nbytes for t in prog.temps)
        return {"generated_code_size_in_bytes": self.code_size_bytes,
                "argument_size_in_bytes": args, "output_size_in_bytes": outs,
                "temp_size_in_bytes": temps, "peak_memory_in_bytes": args + outs + temps,
                "total_size_in_bytes": args + outs + temps}

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

    def execute(self, arg_lists: list[list[Buffer]], device: Device | None = None
                ) -> list[list[Buffer]]:
        """Runs the program once on `devices` (or `device` alone); returns each device's
        output buffers. A call that fails in any way (an error, a runaway loop, Ctrl-C,
        out of HBM or host memory on any device) leaves nothing allocated."""
        devices = [device] if device is not None else self.devices
        if len(arg_lists) != len(devices):
            raise ExecutionError(
                f"{self.name} was compiled for {len(self.devices)} devices, "
                f"called with {len(arg_lists)} argument lists")
        from jax_trn.hw.bandwidth import Hbm
        chip = devices[0].system.chip
        # One HBM per chip, fresh for each execution: the devices of one call run
        # concurrently (from t=0) and contend for their chip's HBM; separate calls do not.
        sharers = Counter(d.chip for d in devices)
        hbms = {c: Hbm(chip.hbm_bytes_per_ns, f"hbm.chip{c}", n if n > 1 else None)
                for c, n in sharers.items()}
        with Allocations() as alloc:
            run = self._execute_spmd if self.collectives else self._execute_each
            results, records, collectives = run(devices, arg_lists, hbms, alloc)
            profiler.record(self._execution(records, devices, collectives))
            return results

    def failed_outputs(self, error: BaseException, device: Device | None = None
                       ) -> list[list[Buffer]]:
        """Stand-ins for the outputs of a call that did not complete (`Buffer.failed`:
        they charge nothing and raise `error` when read), one list per device."""
        devices = [device] if device is not None else self.devices
        return [[Buffer.failed(d, t.shape, t.dtype, error) for t in self.program.outputs]
                for d in devices]

    def _execute_each(self, devices, arg_lists, hbms, alloc):
        """One device after the other (a program without collectives)."""
        records, results = [], []
        for p, (dev, args) in enumerate(zip(devices, arg_lists)):
            outs, dram = self._prepare(dev, args, p, alloc)
            with dev.execution_lock:
                core = dev.core_model
                core.begin(hbms[dev.chip])
                records.extend(run_kernels(self.program, core, dram, dev.id, dev.chip,
                                           limit=self.settings.max_while_iterations))
            results.append(outs)
        return results, records, ()

    def _execute_spmd(self, devices, arg_lists, hbms, alloc):
        """All devices at once: each runs the steps on its core until a collective,
        which runs when all have reached it (`spmd.drive`)."""
        prepared = [self._prepare(dev, args, p, alloc)
                    for p, (dev, args) in enumerate(zip(devices, arg_lists))]
        runners = []
        with contextlib.ExitStack() as locks:
            for dev in sorted(set(devices), key=lambda d: d.id):
                locks.enter_context(dev.execution_lock)
            for dev, (_, dram) in zip(devices, prepared):
                core = dev.core_model
                core.begin(hbms[dev.chip])
                runners.append(_StepRunner(core, dram, dev.id, dev.chip, True,
                                           self.program.steps,
                                           self.settings.max_while_iterations))
            collectives = spmd.drive(runners, devices, devices[0].system.interconnect(),
                                     algorithm=self.settings.collective_algorithm)
        records = [r for run in runners for r in run.records]
        return [outs for outs, _ in prepared], records, collectives

    def _execution(self, kernels, devices, collectives=()) -> profiler.Execution:
        return make_execution(self.name, self.program, devices[0].system,
                              [d.id for d in devices], kernels, collectives)

    def _check_args(self, device: Device, args: list[Buffer]) -> None:
        if len(args) != len(self.program.params):
            raise ExecutionError(f"{self.name} takes {len(self.program.params)} arguments, "
                                 f"got {len(args)}")
        for i, (p, b) in enumerate(zip(self.program.params, args)):
            if b.error is not None:
                raise b.error
            if b.is_deleted:
                raise ExecutionError(f"argument {i} of {self.name} was deleted")
            if tuple(p.shape) != b.shape or p.dtype != b.dtype:
                raise ExecutionError(f"argument {i} of {self.name}: expected {p.dtype}"
                                     f"{list(p.shape)}, got {b.dtype}{list(b.shape)}")
            if b.device is not device:
                raise ExecutionError(f"argument {i} of {self.name} is on {b.device.to_string}, "
                                     f"the program runs on {device.to_string}")

    def _prepare(self, device: Device, args: list[Buffer], partition: int, alloc):
        """Output buffers and temporaries of one device's run (charged to its HBM
        through `alloc`) and the run's DRAM binding."""
        self._check_args(device, args)
        prog = self.program
        outs = [alloc.output(device, t.shape, t.dtype) for t in prog.outputs]
        alloc.reserve(device, sum(t.nbytes for t in prog.temps),
                      f"{len(prog.temps)} temporaries of {self.name}")
        dram = bind_dram(prog, [b.data for b in args], [b.data for b in outs],
                         partition=partition, replica=0)
        return outs, dram


# Per-device values a program reads from DRAM (`stablehlo.partition_id` / `replica_id`).
PARTITION_ID, REPLICA_ID = "sys:partition_id", "sys:replica_id"


def bind_dram(prog, params: list[np.ndarray], outs: list[np.ndarray], *, partition: int = 0,
              replica: int = 0) -> dict[str, np.ndarray]:
    """The DRAM tensors of one execution by name: flat parameter arrays (read-only),
    output arrays (written in place), fresh temporaries, the constants, and this
    device's partition and replica ids (uint32 scalars the runtime writes)."""
    dram = {PARTITION_ID: np.array([partition], np.uint32),
            REPLICA_ID: np.array([replica], np.uint32)}
    for p, data in zip(prog.params, params):
        view = data.view()
        view.flags.writeable = False      # kernels may not write their inputs
        dram[p.name] = view
    for t, data in zip(prog.outputs, outs):
        dram[t.name] = data
    for t in prog.temps:
        dram[t.name] = np.zeros(t.size, _dt.np_dtype(t.dtype))
    for name, value in prog.constants.items():
        view = np.ascontiguousarray(value).reshape(-1).view()
        view.flags.writeable = False
        dram[name] = view
    return dram


def control_ns(spec) -> float:
    """Simulated time of one control-path decision between kernels: the sequencer loads
    the predicate / branch index (4 bytes) from HBM into a register and branches
    (control instructions run on the sequencer, trainium-hardware.md §2.1). The
    reference gives no figure for either, so the load is priced as one DMA's fixed
    cost (descriptor + semaphore-to-start, ~1.3 us, §2.6 [NKI-DMABW]) and the branch as
    one static instruction overhead (~100 cycles, §2.6) at the slowest engine clock."""
    return spec.dma_fixed_ns + spec.static_overhead / min(dict(spec.clock_ghz).values())


def run_kernels(prog, core, dram, device_id: int, chip: int, *, execute: bool = True,
                limit: int = Options.max_while_iterations) -> list[profiler.KernelRecord]:
    """Runs the program's steps on `core` from simulated time 0: kernels back to back,
    loops and conditionals on the control path (with `execute=False` only the kernels'
    timing, which needs a program without control flow). Control decisions delay the
    next kernel by `control_ns`; one after the last kernel (a final loop exit test) is
    in no record, so an execution's span ends with its last kernel. A program with
    collectives runs through `spmd.drive` instead (all its devices at once). A loop
    running more than `limit` trips is stopped as a runaway."""
    if not execute and prog.control_flow:
        raise ExecutionError("a timing-only run cannot decide loops or branches: "
                             "run the program's numerics (see `simulate`)")
    run = _StepRunner(core, dram, device_id, chip, execute, prog.steps, limit)
    for arrival in run.run():
        raise ExecutionError(f"{arrival.step.name} is a collective: run the program on "
                             "all its devices (spmd.drive)")
    return run.records


class _StepRunner:
    """Interprets a step list on one core: the control path between kernels. `run()` is
    a generator that yields an `spmd.Arrival` at each collective and resumes with the
    collective's span on this device (an `spmd.Issued`, sent by `spmd.drive`). The
    device goes on with the following steps while the collective is in flight and waits
    for its end only at the first step that depends on it (see `spmd`, "Overlap")."""

    def __init__(self, core, dram, device_id: int, chip: int, execute: bool, steps=(),
                 limit: int = Options.max_while_iterations):
        self.core, self.dram, self.execute = core, dram, execute
        self.device_id, self.chip = device_id, chip
        self.control_ns = control_ns(core.spec)
        self.limit = limit             # trips at which a while loop is a runaway
        self.records: list[profiler.KernelRecord] = []
        self.program_steps = steps
        self.in_flight: list[tuple[frozenset, frozenset, float]] = []  # (results, operands, end)
        self.cc_free = 0.0             # when this device's CC cores finish its last collective
        self.end_ns = 0.0              # the device's end: last step, collectives included
        self._touch: dict[int, tuple[frozenset, frozenset]] = {}

    def run(self):
        t = yield from self.steps(self.program_steps, 0.0, "")
        self.end_ns = max([t] + [end for _, _, end in self.in_flight])
        self.in_flight = []

    def steps(self, steps, t: float, context: str):
        for i, step in enumerate(steps):
            t = self.wait_for(step, t)
            if isinstance(step, Kernel):
                t = self.kernel(step, t, context)
            elif isinstance(step, While):
                t = yield from self.loop(step, t, context)
            elif isinstance(step, Case):
                t = yield from self.case(step, t, context)
            elif isinstance(step, Collective):
                nxt = steps[i + 1] if i + 1 < len(steps) else None
                overlaps = isinstance(nxt, Kernel) and not self._depends(nxt, *_names(step))
                issued = yield spmd.Arrival(step, t, context, max(t, self.cc_free), overlaps)
                self.issue(step, issued)
        return t

    # --- collectives in flight ------------------------------------------------------

    def issue(self, step: Collective, issued) -> None:
        """Registers a collective in flight; its DMA traffic takes its rate from this
        core's DMA bandwidth over its span (the kernels it overlaps get the rest)."""
        if issued is None:                     # a driver that does not overlap
            return
        self.cc_free = issued.end_ns
        self.in_flight.append((*_names(step), issued.end_ns))
        if issued.dma_bytes_per_ns > 0 and issued.end_ns > issued.start_ns:
            bw = self.core.dma_bw
            # at most the collective's packet share: round-robin leaves compute the rest
            rate = min(issued.dma_bytes_per_ns, bw.capacity * spmd.COLLECTIVE_DMA_SHARE)
            bw.add(issued.start_ns, issued.end_ns, rate)

    def wait_for(self, step, t: float) -> float:
        """`t`, or the end of the in-flight collectives `step` depends on if later."""
        if not self.in_flight:
            return t
        for results, operands, end in self.in_flight:
            if end > t and self._depends(step, results, operands):
                t = end
        self.in_flight = [f for f in self.in_flight if f[2] > t]
        return t

    def _depends(self, step, results: frozenset, operands: frozenset) -> bool:
        """Whether `step` reads or writes one of `results` or writes one of `operands`."""
        touched, written = self._touches(step)
        return bool(touched & results) or bool(written & operands)

    def _touches(self, step) -> tuple[frozenset, frozenset]:
        """(every DRAM tensor `step` names, those it may write), cached per step."""
        got = self._touch.get(id(step))
        if got is not None:
            return got
        if isinstance(step, Kernel):
            written = frozenset(o.tensor for ins in step.instructions for o in ins.outputs()
                                if isinstance(o, DramAP))
            got = (frozenset(step.dram) | written, written)
        elif isinstance(step, Collective):
            res, ops = _names(step)
            got = (res | ops, res)
        else:                                  # loops and conditionals: everything inside
            names = set()
            if isinstance(step, While):
                names |= {step.pred.name} | {c.name for c in step.carried}
                inner = step.cond + step.body
            else:
                names |= {step.index.name} | {r.name for r in step.results}
                inner = [s for b in step.branches for s in b]
            for s in walk_steps(inner):
                if isinstance(s, (Kernel, Collective)):
                    names |= self._touches(s)[0]
            got = (frozenset(names), frozenset(names))
        self._touch[id(step)] = got
        return got

    def kernel(self, kernel, t: float, context: str) -> float:
        run = self.core.run(kernel, self.dram, t, execute=self.execute)
        self.records.append(_kernel_record(kernel, self.device_id, self.chip,
                                           self.core.core_id, run, context))
        return run.end_ns

    def read(self, tensor) -> np.generic:
        """The scalar `tensor` holds, as the control path reads it from HBM."""
        return np.asarray(self.dram[tensor.name]).reshape(-1)[0]

    def loop(self, step: While, t: float, context: str):
        trip = 0
        while True:
            t = yield from self.steps(step.cond, t, f"{context}{step.name}[{trip}].cond/")
            t += self.control_ns
            if not bool(self.read(step.pred)):
                return t
            if trip >= self.limit:
                raise ExecutionError(
                    f"{step.name} ({'; '.join(step.ops)}) ran {self.limit} iterations "
                    f"without its predicate becoming false; raise "
                    f"JAX_TRN_MAX_WHILE_ITERATIONS (or the compiler option "
                    f"jax_trn_max_while_iterations) if the loop is meant to run longer")
            t = yield from self.steps(step.body, t, f"{context}{step.name}[{trip}]/")
            trip += 1

    def case(self, step: Case, t: float, context: str):
        t += self.control_ns
        index = int(self.read(step.index))
        if not 0 <= index < len(step.branches):
            index = len(step.branches) - 1        # stablehlo.case: the default branch
        return (yield from self.steps(step.branches[index], t,
                                      f"{context}{step.name}[{index}]/"))


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
    numerics too (on zeros), on every device of the program."""
    from jax_trn.hw.bandwidth import Hbm
    from jax_trn.hw.core import NeuronCore
    from .device import core_numerics
    options = options if isinstance(options, Options) else Options(system=options)
    system, numerics = options.system, core_numerics(options)
    chip = system.chip
    collectives = has_collectives(prog.steps)
    ids = list(device_ids) if collectives and device_ids else [0]
    cores_per_chip = system.cores_per_chip
    hbms: dict[int, Hbm] = {}
    sharers = Counter(d // cores_per_chip for d in ids)
    runners = []
    execute = prog.control_flow or collectives
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
        runners.append(_StepRunner(core, dram, d, c, execute, prog.steps,
                                   options.max_while_iterations))
    if not collectives:
        kernels = run_kernels(prog, runners[0].core, runners[0].dram, 0, 0, execute=execute,
                              limit=options.max_while_iterations)
        return make_execution(name, prog, system, [0], kernels)
    done = spmd.drive(runners, [_SimDevice(d) for d in ids], system.interconnect(),
                      algorithm=options.collective_algorithm)
    return make_execution(name, prog, system, ids, [r for run in runners for r in run.records],
                          done)


def _names(step: Collective) -> tuple[frozenset, frozenset]:
    """(result tensor names, operand tensor names) of a collective."""
    return frozenset(t.name for t in step.results), frozenset(t.name for t in step.operands)


class _SimDevice:
    """What spmd.drive needs of a device: its global id."""

    def __init__(self, device_id: int):
        self.id = device_id


def make_execution(name: str, prog, system, device_ids: list[int], kernels, collectives=()
                   ) -> profiler.Execution:
    dtype = compute_dtype(prog)
    peak = system.chip.peak_tflops_per_core(dtype) * 1e12
    return profiler.Execution(name, system.name, device_ids, kernels, peak,
                              generation=system.generation, dtype=dtype,
                              collectives=list(collectives), chip=system.chip)


def compute_dtype(prog) -> str:
    """The dtype whose TensorE peak MFU is measured against: the input dtype of the
    matmuls doing most FLOPs ("tf32" for FP32 matmuls rounded to TF32), else the
    first parameter's dtype."""
    flops: dict[str, int] = {}
    for kernel in prog.kernels:
        for instr in kernel.instructions:
            moving = getattr(instr, "moving", None)
            if instr.flops and moving is not None:
                dtype = moving.dtype
                if dtype == "float32" and getattr(instr, "precision", "") == "tf32":
                    dtype = "tf32"
                flops[dtype] = flops.get(dtype, 0) + instr.flops
    if flops:
        return max(flops, key=lambda d: flops[d])
    return prog.params[0].dtype if prog.params else "float32"


def _check_signature(name, program, param_types, output_types) -> None:
    """The lowered program must take and return exactly what the module declares
    (JAX trusts the executable's output types when it builds result arrays)."""
    declared = [(tuple(t.shape), t.dtype) for t in output_types]
    lowered = [(tuple(t.shape), t.dtype) for t in program.outputs]
    params = [(tuple(t.shape), t.dtype) for t in param_types]
    lowered_params = [(tuple(t.shape), t.dtype) for t in program.params]
    if declared != lowered or params != lowered_params:
        raise ExecutionError(
            f"internal compiler error in {name}: the lowered program's signature "
            f"{lowered_params} -> {lowered} differs from the module's {params} -> {declared}")


def _kernel_record(kernel, device_id: int, chip: int, core: int, run, context: str = ""
                   ) -> profiler.KernelRecord:
    # Model FLOPs only: the ones the lowering rule credited to this kernel (a staging or
    # relayout kernel's TensorE work is executed FLOPs, which the profiler reads from
    # the events; crediting it here counted a convolution twice).
    return profiler.KernelRecord(kernel.name, device_id, run.start_ns, run.end_ns,
                                 dict(run.busy_ns), int(kernel.flops),
                                 int(run.hbm_bytes), list(kernel.ops), run.events,
                                 chip=chip, core=core, kernel=kernel, context=context)
