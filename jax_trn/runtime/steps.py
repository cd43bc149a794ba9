"""The control path of one device: the interpreter of a program's steps.

`StepRunner` runs a step list on one NeuronCore: kernels back to back on the core's
engines, loops and conditionals decided on the control path between kernels (the
predicate / branch index read from HBM after the kernel that wrote it, `control_ns`),
loops on chip trip after trip with the sequencers' back edge between trips
(`on_chip`), collectives handed to `spmd.drive` (the runner is a generator that stops at each), and
host callbacks (`callbacks`): for the device itself here, or through `spmd.drive` when
one device calls the host for all. `run_kernels` runs a program without collectives on
one device. Every kernel instance and callback becomes a profiler record.
"""
from __future__ import annotations

import numpy as np

from jax_trn import profiler
from jax_trn.config import Options
from jax_trn.hw.isa import DramAP
from jax_trn.hw.isa_control import back_edge_ns
from jax_trn.hw.program import Case, Collective, HostCallback, Kernel, Loop, While, walk_steps

from . import callbacks, interrupts, replay, spmd


class ExecutionError(RuntimeError):
    pass


def control_ns(spec) -> float:
    """Simulated time of one control-path decision between kernels: the sequencer loads
    the predicate / branch index (4 bytes) from HBM into a register and branches
    (control instructions run on the sequencer, trainium-hardware.md §2.1). The
    reference gives no figure for either, so the load is priced as one DMA's fixed
    cost (descriptor + semaphore-to-start, ~1.3 us, §2.6 [NKI-DMABW]) and the branch as
    one static instruction overhead (~100 cycles, §2.6) at the slowest engine clock."""
    return spec.dma_fixed_ns + spec.static_overhead / min(dict(spec.clock_ghz).values())


def run_kernels(prog, core, dram, device_id: int, chip: int, *, execute: bool = True,
                limit: int = Options.max_while_iterations, chip_spec=None,
                call_host: bool = True) -> list[profiler.KernelRecord]:
    """Runs the program's steps on `core` from simulated time 0: kernels back to back,
    loops and conditionals on the control path (with `execute=False` only the kernels'
    timing, which needs a program without control flow), host callbacks (`chip_spec`
    prices their copies; `call_host=False`: timed, but no Python function is called).
    Control decisions delay the next kernel by `control_ns`; one after the last kernel
    (a final loop exit test) is in no record, so an execution's span ends with its last
    kernel. A program with collectives runs through `spmd.drive` instead (all its
    devices at once). A loop running more than `limit` trips is stopped as a runaway."""
    if not execute and prog.control_flow:
        raise ExecutionError("a timing-only run cannot decide loops or branches: "
                             "run the program's numerics (see `simulate`)")
    run = StepRunner(core, dram, device_id, chip, execute, prog.steps, limit,
                      chip_spec=chip_spec, call_host=call_host)
    for arrival in run.run():
        raise ExecutionError(f"{arrival.step.name} is a collective: run the program on "
                             "all its devices (spmd.drive)")
    return run.records


class StepRunner:
    """Interprets a step list on one core: the control path between kernels. `run()` is
    a generator that yields an `spmd.Arrival` at each collective and resumes with the
    collective's span on this device (an `spmd.Issued`, sent by `spmd.drive`). The
    device goes on with the following steps while the collective is in flight and waits
    for its end only at the first step that depends on it (see `spmd`, "Overlap").
    A host callback the device makes for itself runs here (`callbacks.local_span`); one
    that another device makes for all is an arrival too, resumed with this device's
    `callbacks.Span`. `call_host=False` (timing runs) calls no Python function: the
    results are zeros."""

    def __init__(self, core, dram, device_id: int, chip: int, execute: bool, steps=(),
                 limit: int = Options.max_while_iterations, *, chip_spec=None,
                 call_host: bool = True):
        self.core, self.dram, self.execute = core, dram, execute
        self.device_id, self.chip = device_id, chip
        self.chip_spec, self.call_host = chip_spec, call_host
        self.shared = False            # run by spmd.drive with the program's other devices
        self.control_ns = control_ns(core.spec)
        self.limit = limit             # trips at which a while loop is a runaway
        self.records: list[profiler.KernelRecord] = []
        self.program_steps = steps
        self.in_flight: list[tuple[frozenset, frozenset, float]] = []  # (results, operands, end)
        self.cc_free = 0.0             # when this device's CC cores finish its last collective
        self.end_ns = 0.0              # the device's end: last step, collectives included
        self._touch: dict[int, tuple[frozenset, frozenset]] = {}
        # When a list: what the call met, in order, for `replay` (kernel instances
        # with their issue order, host callbacks, control decisions).
        self.plan: list | None = None

    def run(self):
        t = yield from self.steps(self.program_steps, 0.0, "")
        self.end_ns = max([t] + [end for _, _, end in self.in_flight])
        self.in_flight = []

    def steps(self, steps, t: float, context: str):
        for i, step in enumerate(steps):
            interrupts.check()
            t = self.wait_for(step, t)
            if isinstance(step, Kernel):
                t = self.kernel(step, t, context)
            elif isinstance(step, While):
                t = yield from self.loop(step, t, context)
            elif isinstance(step, Case):
                t = yield from self.case(step, t, context)
            elif isinstance(step, Loop):
                t = self.on_chip(step, t, context)
            elif isinstance(step, Collective):
                nxt = steps[i + 1] if i + 1 < len(steps) else None
                overlaps = isinstance(nxt, Kernel) and not self._depends(nxt, *_names(step))
                issued = yield spmd.Arrival(step, t, context, max(t, self.cc_free), overlaps)
                self.issue(step, issued)
            elif isinstance(step, HostCallback):
                t = yield from self.host_callback(step, t, context)
        return t

    # --- host callbacks -------------------------------------------------------------

    def host_callback(self, step: HostCallback, t: float, context: str):
        """Calls the host (see `callbacks`): for this device alone, or through
        `spmd.drive` when another device calls for all (`step.device`)."""
        if self.chip_spec is None:
            raise ExecutionError(f"{step.name}: a host callback needs the chip's spec")
        if step.device is not None and self.shared:
            span = yield spmd.Arrival(step, t, context)
        else:
            span = callbacks.local_span(step, self.chip_spec, t)
            if self.execute:
                callbacks.run(step, self.dram, self.dram, self.call_host)
            if self.plan is not None:
                self.plan.append((replay.HOST, step))
        self.records.append(callbacks.record(step, span, self.device_id, self.chip,
                                             self.core.core_id, context))
        return span.end_ns

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
        elif isinstance(step, (Collective, HostCallback)):
            res, ops = _names(step)
            got = (res | ops, res)
        else:                                  # loops and conditionals: everything inside
            names = set()
            if isinstance(step, While):
                names |= {step.pred.name} | {c.name for c in step.carried}
                inner = step.cond + step.body
            elif isinstance(step, Loop):
                names |= {c.name for c in step.carried}
                inner = step.enter + step.body + step.exit
            else:
                names |= {step.index.name} | {r.name for r in step.results}
                inner = [s for b in step.branches for s in b]
            for s in walk_steps(inner):
                if isinstance(s, (Kernel, Collective, HostCallback)):
                    names |= self._touches(s)[0]
            got = (frozenset(names), frozenset(names))
        self._touch[id(step)] = got
        return got

    def kernel(self, kernel, t: float, context: str) -> float:
        run = self.core.run(kernel, self.dram, t, execute=self.execute)
        if self.plan is not None:
            self.plan.append((replay.KERNEL, kernel, run.order))
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
            go = bool(self.read(step.pred))
            if self.plan is not None:
                self.plan.append((replay.DECISION, go))
            if not go:
                return t
            if trip >= self.limit:
                raise ExecutionError(
                    f"{step.name} ({'; '.join(step.ops)}) ran {self.limit} iterations "
                    f"without its predicate becoming false; raise "
                    f"JAX_TRN_MAX_WHILE_ITERATIONS (or the compiler option "
                    f"jax_trn_max_while_iterations) if the loop is meant to run longer")
            t = yield from self.steps(step.body, t, f"{context}{step.name}[{trip}]/")
            trip += 1

    def on_chip(self, step: Loop, t: float, context: str) -> float:
        """A loop on chip: its enter kernels, then its body kernels trip after trip,
        each trip followed by the sequencers' back edge (`isa_control`: the counter
        add and branch run on the registers, no control-path decision), then its exit
        kernels. The trip count is static, so a timing-only run times it too."""
        if step.trips > self.limit:
            raise ExecutionError(
                f"{step.name} ({'; '.join(step.ops)}) ran {self.limit} iterations of its "
                f"{step.trips}; raise JAX_TRN_MAX_WHILE_ITERATIONS (or the compiler option "
                f"jax_trn_max_while_iterations) if the loop is meant to run longer")
        for kernel in step.enter:
            t = self.kernel(kernel, t, context)
        control = step.control
        edge_ns = back_edge_ns(control, self.core.spec)
        regs, trip = {step.counter: step.start}, 0
        while control[1].taken(regs):
            for kernel in step.body:
                t = self.kernel(kernel, t, f"{context}{step.name}[{trip}]/")
            control[0].apply(regs)
            t += edge_ns
            trip += 1
        for kernel in step.exit:
            t = self.kernel(kernel, t, context)
        return t

    def case(self, step: Case, t: float, context: str):
        t += self.control_ns
        index = int(self.read(step.index))
        if not 0 <= index < len(step.branches):
            index = len(step.branches) - 1        # stablehlo.case: the default branch
        if self.plan is not None:
            self.plan.append((replay.DECISION, index))
        return (yield from self.steps(step.branches[index], t,
                                      f"{context}{step.name}[{index}]/"))


def _names(step: Collective) -> tuple[frozenset, frozenset]:
    """(result tensor names, operand tensor names) of a collective."""
    return frozenset(t.name for t in step.results), frozenset(t.name for t in step.operands)


def _kernel_record(kernel, device_id: int, chip: int, core: int, run, context: str = ""
                   ) -> profiler.KernelRecord:
    # Model FLOPs only: the ones the lowering rule credited to this kernel (a staging or
    # relayout kernel's TensorE work is executed FLOPs, which the profiler reads from
    # the events; crediting it here counted a convolution twice).
    return profiler.KernelRecord(kernel.name, device_id, run.start_ns, run.end_ns,
                                 dict(run.busy_ns), int(kernel.flops),
                                 int(run.hbm_bytes), list(kernel.ops), run.events,
                                 chip=chip, core=core, kernel=kernel, context=context)
