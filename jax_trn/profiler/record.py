"""What one execution of a compiled program on the simulated machine recorded."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from .engines import ENGINES


@dataclass
class KernelRecord:
    """One kernel (fused region) run on one device: its span, per-engine busy time,
    work, and one `hw.trace.TraceEvent` per instruction. `kernel` is the
    `hw.program.Kernel` that ran (its instructions carry the semaphore waits).
    A kernel inside control flow runs once per loop trip / taken branch, each instance
    its own record; `context` says where it ran ("while.4[2]/" is trip 2 of while.4's
    body, "while.4[3].cond/" its cond before trip 3, "case.7[1]/" branch 1), "" at top
    level."""
    name: str
    device: int
    start_ns: float
    end_ns: float
    busy_ns: dict[str, float]
    flops: int
    hbm_bytes: int
    ops: list[str]
    events: list = field(default_factory=list, repr=False)   # hw.trace.TraceEvent
    chip: int = 0
    core: int = 0
    kernel: object = field(default=None, repr=False, compare=False)
    context: str = ""

    @property
    def duration_ns(self) -> float:
        return self.end_ns - self.start_ns

    @property
    def dma_bytes(self) -> int:
        """Bytes moved by this kernel's DMAs (any memory to any memory)."""
        return sum(e.bytes for e in self.events if e.queue.startswith("dma"))


@dataclass
class CollectiveRecord:
    """One collective over the interconnect, as the SPMD runtime ran it
    (`jax_trn.runtime.spmd`): its participants, the algorithm chosen, when it started
    (its group's last arrival) and ended, and the schedule's steps."""
    kind: str                      # "all_reduce" | "all_gather" | "reduce_scatter" | ...
    name: str                      # the program's step, e.g. "all_reduce.4"
    devices: list[int]             # participants (global device ids)
    algorithm: str                 # e.g. "all_reduce/ring", "all_gather/mesh"
    bytes: int                     # message bytes per participant (as used for the choice)
    start_ns: float
    end_ns: float
    groups: tuple = ()             # replica groups, as global device ids
    arrival_ns: tuple = ()         # when each participant reached it
    ops: tuple = ()                # source ops ("all_reduce at f.py:3")
    context: str = ""              # enclosing loop trips / branches
    steps: tuple = ()              # (label, start_ns, end_ns, bytes) relative to start
    spans: tuple = ()              # (device, start_ns, end_ns) of each participant

    @property
    def duration_ns(self) -> float:
        return self.end_ns - self.start_ns


@dataclass
class Execution:
    """One call of a compiled program: simulated time, work done, engine activity.

    `simulated_time_s` is the span of the slowest participating device; `flops` counts
    the useful (model) FLOPs of the source ops; `hbm_bytes` the bytes DMA moved to or
    from HBM; `engine_utilization` the fraction of the span each engine was busy
    (averaged over participating devices).

    Exports and reports: `save_trace(path)` (Chrome/Perfetto JSON), `summary()` /
    `summary_dict()` (like Neuron Explorer's summary page), `plot_timeline()`,
    `plot_utilization()`, `plot_roofline()` (matplotlib, the `plots` extra)."""
    name: str
    system: str
    devices: list[int]
    kernels: list[KernelRecord]
    peak_flops_per_s: float = 0.0                   # per device, for the program's dtype
    generation: str = ""                            # "trn1" | "trn2" | "trn3"
    dtype: str = ""                                 # the dtype the peak is for
    collectives: list[CollectiveRecord] = field(default_factory=list)
    chip: object = field(default=None, repr=False)  # the hw.spec.ChipSpec that ran

    @property
    def events(self) -> list:
        """Every instruction's trace event, kernel by kernel."""
        return [e for k in self.kernels for e in k.events]

    @property
    def chip_spec(self):
        """The `hw.spec.ChipSpec` that ran: the system's own chip, else the generation's
        preset (None if unknown)."""
        from jax_trn.hw.spec import CHIPS
        return self.chip if self.chip is not None else CHIPS.get(self.generation)

    @cached_property
    def _trace(self):
        from .trace import instructions
        spec = self.chip_spec.core if self.chip_spec else None
        instrs, deps = [], []
        for k in self.kernels:
            i, d = instructions(k, spec)
            instrs.extend(i)
            deps.extend(d)
        return instrs, deps

    @property
    def instructions(self) -> list:
        """Every executed instruction (`profiler.trace.Instruction`) with its kernel,
        source ops, semaphore waits and DMA sizes, kernel by kernel."""
        return self._trace[0]

    @property
    def dependencies(self) -> list:
        """Semaphore dependencies (`profiler.trace.Dependency`) between instructions."""
        return self._trace[1]

    @property
    def span_ns(self) -> float:
        ends = [k.end_ns for k in self.kernels] + [c.end_ns for c in self.collectives]
        starts = [k.start_ns for k in self.kernels] + [c.start_ns for c in self.collectives]
        return (max(ends) - min(starts)) if ends else 0.0

    @property
    def simulated_time_s(self) -> float:
        return self.span_ns * 1e-9

    @property
    def flops(self) -> int:
        return sum(k.flops for k in self.kernels)

    @property
    def hbm_bytes(self) -> int:
        return sum(k.hbm_bytes for k in self.kernels)

    @property
    def engine_utilization(self) -> dict[str, float]:
        span_ns = self.simulated_time_s * 1e9 * max(1, len(self.devices))
        busy = {e: sum(k.busy_ns.get(e, 0.0) for k in self.kernels) for e in ENGINES}
        return {e: (busy[e] / span_ns if span_ns else 0.0) for e in ENGINES}

    @property
    def achieved_flops_per_s(self) -> float:
        t = self.simulated_time_s
        return self.flops / t if t else 0.0

    @property
    def mfu(self) -> float:
        peak = self.peak_flops_per_s * max(1, len(self.devices))
        return self.achieved_flops_per_s / peak if peak else 0.0

    # --- reports ------------------------------------------------------------------

    def summary(self):
        """A `Summary`: `print(execution.summary())` shows the summary page."""
        from .summary import Summary
        return Summary([self])

    def summary_dict(self) -> dict:
        """The summary's numbers as a JSON-serializable dict."""
        return self.summary().to_dict()

    def trace_events(self) -> dict:
        """The Chrome trace-event JSON object of this execution."""
        from .chrome import chrome_trace
        return chrome_trace([self])

    def save_trace(self, path) -> str:
        """Writes Chrome trace-event JSON (ui.perfetto.dev, chrome://tracing)."""
        from .chrome import save_trace
        return save_trace([self], path)

    def plot_timeline(self, ax=None, **kw):
        from . import plots
        return plots.timeline([self], ax=ax, **kw)

    def plot_utilization(self, ax=None):
        from . import plots
        return plots.utilization([self], ax=ax)

    def plot_roofline(self, ax=None):
        from . import plots
        return plots.roofline([self], ax=ax)

    def plot_collectives(self, ax=None):
        from . import plots
        return plots.collectives([self], ax=ax)

    def __repr__(self) -> str:
        util = ", ".join(f"{e}={u:.0%}" for e, u in self.engine_utilization.items())
        from .devices import ranges
        return (f"Execution({self.name!r} on {self.system} devices {ranges(self.devices)}: "
                f"{self.simulated_time_s * 1e6:.2f} us simulated, {self.flops} FLOP, "
                f"{self.hbm_bytes} HBM bytes, {util})")
