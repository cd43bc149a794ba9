"""A NeuronCore: memories, engine queues with semaphores, and a discrete-event timeline.

`NeuronCore.run(kernel, dram)` executes a kernel's instructions (§2.1): each engine
(tensor, vector, scalar, gpsimd) and each DMA queue ("dma0".."dma15") runs its own
instructions in program order; an instruction starts when its queue is free and its
semaphore waits are met (`waits = ((queue, count), ...)`: that queue has completed at
least `count` instructions). Instructions take effect in start-time order, so a
missing semaphore really does produce a wrong result, as on hardware.

Timing: compute instructions take `cycles / clock` (costs.py); an instruction that had
to wait for another engine pays the ~100-cycle static overhead (§2.6). TensorE
instructions go through `TensorPipe` (tensor_pipe.py): LoadStationary in the
background of the previous MultiplyMoving, skipped for an already-loaded stationary,
and the Trn2/Trn3 power throttle (§2.2). A DMA takes the ~1.3 us fixed cost (§2.6)
and then moves its bytes through the core's DMA engines and, when it touches DRAM,
the chip's shared HBM (bandwidth.py), at up to `engines x 23 B/ns x efficiency(chunk)`
(§3.4). The TensorE pipeline and the DMA bandwidth bookkeeping persist across the
kernels of one execution (`begin`); a `run` starting before the previous one ended
starts a fresh timeline.
"""
from __future__ import annotations

import heapq

import numpy as np

from . import costs
from .bandwidth import Bandwidth, Hbm, reserve
from .isa import DmaCopy, Instr, IsaError
from .kernel_facts import InstrFacts, KernelFacts, facts
from .memory import OnChipMemory
from .numerics import Numerics
from .plan import PlanCache
from .program import Kernel
from .spec import ChipSpec, CoreSpec
from .tensor_pipe import TensorPipe
from .trace import KernelRun, TraceEvent

__all__ = ["NeuronCore", "DeadlockError", "chip_cores"]

COMPUTE_QUEUES = ("tensor", "vector", "scalar", "gpsimd")


class DeadlockError(RuntimeError):
    """No queue head can ever run: its semaphore waits are never satisfied."""


class NeuronCore:
    """One simulated NeuronCore of generation `spec`. `hbm` is the chip's HBM
    bandwidth, shared by passing the same `Hbm` to every core of the chip; with None
    the core's own DMA engines are the only bandwidth limit."""
    lead = ()      # no leading device axis on its memories' views (batch.BatchCore has)

    def __init__(self, spec: CoreSpec, *, hbm: Hbm | None = None, core_id: int = 0,
                 numerics: Numerics | None = None,
                 memories: tuple[OnChipMemory, OnChipMemory] | None = None):
        """`numerics`: the core's rounding context (default `Numerics()`: RNE, strict
        activation ranges); its creator decides it, the model reads no settings.
        `memories`: the (SBUF, PSUM) byte arrays to compute in, when several simulated
        cores share one backing store (they then must not run kernels at the same
        time); by default the core's own."""
        self.spec = spec
        self.core_id = core_id
        self.hbm = hbm
        self.sbuf, self.psum = memories or (
                OnChipMemory("sbuf", spec.pmax, spec.sbuf_usable_bytes),
                OnChipMemory("psum", spec.pmax, spec.psum_partition_bytes))
        self._mems = {"sbuf": self.sbuf, "psum": self.psum}
        self.numerics = numerics if numerics is not None else Numerics()
        self.dram: dict[str, np.ndarray] = {}
        self.plans = PlanCache()       # kernels' numerics compiled for this core (plan.py)
        self._clock = dict(spec.clock_ghz)
        self._new_timeline(0.0)

    def mem(self, tile) -> OnChipMemory:
        return self._mems[tile.mem]

    def begin(self, hbm: Hbm | None = None) -> None:
        """Starts a new execution at simulated time 0: fresh DMA bandwidth bookkeeping
        and the chip's HBM for this execution. SBUF and PSUM keep their contents, as on
        the hardware (a kernel must not read what it did not write)."""
        self.hbm = hbm
        self._new_timeline(0.0)

    def _new_timeline(self, t0: float) -> None:
        self.dma_bw = Bandwidth(self.spec.dma_bytes_per_ns, f"dma.core{self.core_id}")
        share = self.hbm.share if self.hbm is not None else float("inf")
        self.hbm_share = (Bandwidth(share, f"hbm-share.core{self.core_id}")
                          if share < float("inf") else None)   # see `Hbm.share`
        self.pipe = TensorPipe(self.spec, t0)
        self._last_end = t0

    def run(self, kernel: Kernel, dram: dict[str, np.ndarray],
            start_ns: float = 0.0, *, execute: bool = True) -> KernelRun:
        """Execute `kernel` against DRAM arrays `dram` (flat numpy arrays by tensor
        name, allocated by the caller) starting at simulated time `start_ns`. With
        `execute=False` only the timing is simulated (no instruction takes effect):
        timing never depends on data, so benchmarks of the model may skip the work."""
        known = facts(kernel, self)        # validated once per kernel and geometry
        self.dram = dram
        if start_ns < self._last_end:
            self._new_timeline(start_ns)
        self.dma_bw.prune(start_ns)
        if self.hbm_share is not None:
            self.hbm_share.prune(start_ns)
        try:
            result = _Run(self, kernel, start_ns, execute, known).run()
        finally:
            self.dram = {}        # the call's temporaries are not kept alive by the core
        self._last_end = result.end_ns
        return result

    def replay(self, kernel: Kernel, order, dram: dict[str, np.ndarray]) -> None:
        """The numerics of `kernel` alone, against DRAM arrays `dram`: its instructions
        take effect in `order` (a `KernelRun.order` of an earlier `run` of the same
        kernel), which is what `run` does when its timeline is that run's. No timing,
        no validation (the earlier run did both); the timeline state is untouched.
        Kernels with enough matmul work run on two host threads (lanes.py), with the
        same results."""
        self.dram = dram
        try:
            plan, lanes = self.plans.replay_plan(kernel, order, self)
            if lanes is not None:            # matmuls on a second thread (lanes.py)
                lanes.run()
                return
            if self.numerics.rounding == "rne":     # no random stream to key
                for index in order:
                    plan[index]()
                return
            at, name = self.numerics.at, kernel.name
            for index in order:
                at(name, index)
                plan[index]()
        finally:
            self.dram = {}

    def validate(self, kernel: Kernel) -> None:
        """Generation constraints and SBUF/PSUM capacity of every instruction."""
        for i, instr in enumerate(kernel.instructions):
            try:
                instr.check(self.spec)
                for tile in instr.tiles():
                    self._mems[tile.mem].check(tile)
            except IsaError as e:
                raise IsaError(f"{kernel.name}: instruction {i} {_describe(instr)}: {e}") from e

    # --- durations ------------------------------------------------------------------

    def compute_ns(self, instr: Instr) -> float:
        return instr.cycles(self.spec) / self._clock[instr.engine]

    def overhead_ns(self, instr: Instr) -> float:
        return self.spec.static_overhead / self._clock[instr.engine]

    def dma_end(self, instr: DmaCopy, start: float) -> float:
        """Fixed cost, then the bytes through this core's DMA engines and the HBM."""
        spec = self.spec
        begin = start + spec.dma_fixed_ns
        chunk, engines = costs.dma_shape(instr, spec)
        # Per-descriptor efficiency, times the instruction's own factor (DmaTranspose
        # reaches 90% / 50% of the DMA rate, §3.4).
        eff = spec.dma_efficiency(chunk) * instr.efficiency
        lines = [(self.dma_bw, 1.0 / eff)]       # overhead time occupies the engines
        rate = engines * spec.dma_engine_bytes_per_ns * eff
        hbm_sides = instr.hbm_bytes / max(instr.nbytes, 1)
        if hbm_sides > 0 and self.hbm is not None:
            lines.append((self.hbm, hbm_sides))
            if self.hbm_share is not None:
                lines.append((self.hbm_share, hbm_sides))
        return reserve(lines, begin, instr.nbytes, rate)


    def dma_end_known(self, f: InstrFacts, start: float) -> float:
        """`dma_end` from the instruction's static facts (kernel_facts.py)."""
        begin = start + self.spec.dma_fixed_ns
        lines = [(self.dma_bw, f.inv_eff)]
        if f.hbm_sides > 0 and self.hbm is not None:
            lines.append((self.hbm, f.hbm_sides))
            if self.hbm_share is not None:
                lines.append((self.hbm_share, f.hbm_sides))
        return reserve(lines, begin, f.nbytes, f.rate)


def chip_cores(chip: ChipSpec) -> list[NeuronCore]:
    """The NeuronCores of one chip, sharing the chip's HBM bandwidth (§1.1)."""
    hbm = Hbm(chip.hbm_bytes_per_ns, f"hbm.{chip.name}", sharers=chip.cores)
    return [NeuronCore(chip.core, hbm=hbm, core_id=i) for i in range(chip.cores)]


def _describe(instr: Instr) -> str:
    return f"{type(instr).__name__}({instr.name!r} on {instr.queue})"


class _Run:
    """The discrete-event simulation of one kernel on one core, from the kernel's
    static facts (`kernel_facts`: computed once per kernel and core geometry)."""

    def __init__(self, core: NeuronCore, kernel: Kernel, start_ns: float, execute: bool,
                 known: KernelFacts):
        self.core, self.kernel, self.t0, self.execute = core, kernel, start_ns, execute
        self.queues = known.queues
        self.known = known
        self.rank = {q: _queue_rank(q) for q in self.queues}
        self.free = dict.fromkeys(self.queues, start_ns)   # next instruction may start
        self.last_end = dict.fromkeys(self.queues, start_ns)  # previous one ended
        self.done: dict[str, list[float]] = {q: [] for q in self.queues}  # end times
        self.heap: list[tuple[float, int, str]] = []
        self.port_free = start_ns      # the SBUF access VectorE and GpSimd share ...
        self.port_users = known.port_users     # ... and whether anyone holds it
        self.parked: dict[str, list[tuple[int, str]]] = {}   # queue -> [(count, waiter)]
        self.events: list[TraceEvent] = []
        self.order: list[int] = []     # instruction indices in issue order
        self.plan = core.plans.get(kernel, core) if execute else None

    def run(self) -> KernelRun:
        # 1. every queue head whose waits are known goes on the heap by start time
        for q in self.queues:
            self._offer(q)
        # 2. issue the earliest-starting head; its successor and waiters become offers
        while self.heap:
            start, rank, q = heapq.heappop(self.heap)
            later = self._port_start(q, start)
            if later > start:       # the shared port was taken since the offer
                heapq.heappush(self.heap, (later, rank, q))
                continue
            self._issue(q, start)
            self._offer(q)
            self._wake(q)
        # 3. anything left can never run
        self._check_finished()
        return self._result()

    def _head(self, q: str) -> InstrFacts | None:
        n = len(self.done[q])
        entries = self.queues[q]
        return entries[n] if n < len(entries) else None

    def _offer(self, q: str) -> None:
        head = self._head(q)
        if head is None:
            return
        start = self._start_time(q, head)
        if start is not None:
            heapq.heappush(self.heap, (start, self.rank[q], q))

    def _start_time(self, q: str, head: InstrFacts) -> float | None:
        """max(queue free, waits met) (+ static overhead if it waited on another
        engine); None (and parked) while a wait's instruction is not yet scheduled."""
        free, met = self.free[q], -np.inf
        for wq, count in head.waits:
            if count <= 0:
                continue
            ends = self.done.get(wq)
            if ends is None or len(ends) < count:
                self.parked.setdefault(wq, []).append((count, q))
                return None
            met = max(met, ends[count - 1])
        if met >= free and head.engine != "dma":
            return self._port_start(q, met + head.overhead_ns)
        return self._port_start(q, max(free, met))

    def _port_start(self, q: str, start: float) -> float:
        """`start`, or later while the SBUF port VectorE and GpSimd share is held
        (`costs.shares_gpsimd_port`, §2.3, §2.6)."""
        if self.port_users and self._head(q).port:
            return max(start, self.port_free)
        return start

    def _wake(self, q: str) -> None:
        waiting = self.parked.get(q)
        if not waiting:
            return
        n = len(self.done[q])
        still = [(c, w) for c, w in waiting if c > n]
        self.parked[q] = still
        for c, w in waiting:
            if c <= n:
                self._offer(w)

    def _issue(self, q: str, start: float) -> None:
        head = self._head(q)
        core = self.core
        self.order.append(head.index)
        if self.execute:
            core.numerics.at(self.kernel.name, head.index)
            self.plan[head.index]()
        free = None
        if head.engine == "tensor":
            start, end = core.pipe.issue_known(head.stationary, head.ls_ns, head.mm_ns, start)
            free = core.pipe.ready
        else:
            if core.pipe.loaded is not None:
                for tile in head.written:
                    core.pipe.written(tile)
            if head.engine == "dma":
                end = core.dma_end_known(head, start)
            else:
                end = start + head.compute_ns
                if head.port:
                    self.port_free = end
        self.events.append(TraceEvent(q, head.opcode, head.name, start, end,
                                      self.last_end[q], head.nbytes, head.flops,
                                      core.core_id))
        self.free[q] = end if free is None else free
        self.last_end[q] = end
        self.done[q].append(end)

    def _check_finished(self) -> None:
        stuck = []
        for q in self.queues:
            head = self._head(q)
            if head is not None:
                stuck.append(f"{q}: instruction {head.index} {_describe(head.instr)} waits "
                             f"{head.waits}, done counts "
                             f"{ {w: len(self.done.get(w, ())) for w, _ in head.waits} }")
        if stuck:
            raise DeadlockError(f"kernel {self.kernel.name!r} deadlocked:\n  " + "\n  ".join(stuck))

    def _result(self) -> KernelRun:
        events = self.events
        end = max((e.end_ns for e in events), default=self.t0)
        run = KernelRun(self.kernel.name, self.t0, end, events, core=self.core.core_id,
                        order=tuple(self.order))
        run.busy_ns = _busy(events)
        run.flops = sum(e.flops for e in events)
        run.hbm_bytes = self.known.hbm_bytes
        return run


def _queue_rank(q: str) -> int:
    """Fixed tie-break order: tensor, vector, scalar, gpsimd, dma0, dma1, ..."""
    if q in COMPUTE_QUEUES:
        return COMPUTE_QUEUES.index(q)
    return len(COMPUTE_QUEUES) + int(q[3:])


def _busy(events: list[TraceEvent]) -> dict[str, float]:
    busy = dict.fromkeys(COMPUTE_QUEUES, 0.0)
    dma = []
    for e in events:
        if e.queue.startswith("dma"):
            dma.append((e.start_ns, e.end_ns))
        else:
            busy[e.queue] += e.end_ns - e.start_ns
    busy["dma"] = _union_length(dma)
    return busy


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, cur_a, cur_b = 0.0, None, None
    for a, b in sorted(intervals):
        if cur_b is None or a > cur_b:
            total += (cur_b - cur_a) if cur_b is not None else 0.0
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    return total + ((cur_b - cur_a) if cur_b is not None else 0.0)
