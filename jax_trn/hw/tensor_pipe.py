"""TensorE timing: LoadStationary / MultiplyMoving and power throttling (§2.2).

An NcMatmul (and a TensorE transpose, which is a matmul against the identity) runs in
hardware as two instructions [NKI-ARCH1]: LoadStationary (LS) caches the stationary
tile in the PE array, MultiplyMoving (MM) streams the moving tile through it. The
array holds a second, shadow copy of the weights, so the next LS runs in the
background while the current MM streams ("background LoadStationary"):

    LS_i starts  at max(ready_i, MM_{i-1} start, LS_{i-1} end)
    MM_i starts  at max(LS_i end, MM_{i-1} end)

where ready_i is when the instruction's semaphore waits are met (core.py). LS costs
M / 4 cycles ("fast LS", costs.load_stationary); it is skipped when the instruction's
stationary tile is the one already loaded and nothing wrote to it since. MM costs the
§6.3 formula, stretched by the power throttle.

Power throttling (Trn2/Trn3, [NX-SUMMARY]): "TensorE starts at about 50% of max
utilisation and ramps to full over about 3 us; if utilisation drops below 50% in any
~3 us window, the limit re-engages." We model the limit as a rate factor
`floor + (1 - floor) * (t - warm_from) / ramp` (capped at 1) applied to MM work, where
`warm_from` is when the current ramp began. Before each MM we measure TensorE busy
time over the trailing window (clipped to the current ramp, so a ramp that just began
is not judged on the idle time before it); below `pe_throttle_util` the ramp restarts
at the MM's start. Pure arithmetic on simulated times: deterministic.
"""
from __future__ import annotations

import math
from collections import deque

from . import costs
from .spec import CoreSpec

__all__ = ["TensorPipe", "Throttle"]


class Throttle:
    """The TensorE power limit: a rate factor ramping from `floor` to 1."""
    __slots__ = ("floor", "ramp", "window", "util", "warm_from", "busy", "busy_sum")

    def __init__(self, spec: CoreSpec):
        self.floor = spec.pe_throttle_floor
        self.ramp = spec.pe_throttle_ramp_ns
        self.window = spec.pe_throttle_window_ns
        self.util = spec.pe_throttle_util
        self.warm_from: float | None = None
        self.busy: deque[tuple[float, float]] = deque()   # recent MM intervals
        self.busy_sum = 0.0

    def duration(self, start: float, work_ns: float) -> float:
        """Wall time of `work_ns` of full-rate MM work starting at `start`."""
        if self.floor >= 1.0:
            return work_ns
        if self.warm_from is None or self._utilization(start) < self.util:
            self.warm_from = start
            self.busy.clear()
            self.busy_sum = 0.0
        return self._stretch(start, work_ns)

    def record(self, start: float, end: float) -> None:
        if self.floor < 1.0 and end > start:
            self.busy.append((start, end))
            self.busy_sum += end - start

    def _utilization(self, t: float) -> float:
        lo = max(t - self.window, self.warm_from)
        busy = self.busy
        while busy and busy[0][1] <= lo:
            a, b = busy.popleft()
            self.busy_sum -= b - a
        if t <= lo:
            return 1.0
        clipped = max(0.0, lo - busy[0][0]) if busy else 0.0
        return (self.busy_sum - clipped) / (t - lo)

    def _stretch(self, t: float, work: float) -> float:
        """Solve integral_t^{t+d} rate(s) ds = work for d, rate linear then flat."""
        ramp_end = self.warm_from + self.ramp
        if t >= ramp_end:
            return work
        slope = (1.0 - self.floor) / self.ramp
        a = self.floor + slope * (t - self.warm_from)       # rate at t
        span = ramp_end - t
        ramp_work = a * span + slope * span * span / 2
        if work >= ramp_work:
            return span + (work - ramp_work)
        return (math.sqrt(a * a + 2 * slope * work) - a) / slope


class TensorPipe:
    """LS/MM pipelining state of one TensorE (kept across the kernels of an execution)."""
    __slots__ = ("spec", "clock", "throttle", "loaded", "ls_end", "mm_start", "mm_end")

    def __init__(self, spec: CoreSpec, t0: float = 0.0):
        self.spec = spec
        self.clock = spec.clock("tensor")
        self.throttle = Throttle(spec)
        self.loaded = None          # stationary tile in the PE array (None: unknown)
        self.ls_end = t0            # the LS unit is free
        self.mm_start = t0          # the shadow weights are free (current MM started)
        self.mm_end = t0            # the PE array is free

    @property
    def ready(self) -> float:
        """Earliest start of the next instruction's LS."""
        return max(self.ls_end, self.mm_start)

    def issue(self, instr, start: float) -> tuple[float, float]:
        """Runs `instr` whose LS may start at `start`; returns (busy from, end): the
        TensorE is busy for this instruction from the later of its LS start and the
        previous MM's end (a hidden LS costs nothing)."""
        st = costs.stationary(instr)
        ls_ns = None if st is None else costs.load_stationary(instr, self.spec) / self.clock
        return self.issue_known(st, ls_ns, instr.cycles(self.spec) / self.clock, start)

    def issue_known(self, st, ls_ns: float | None, work: float, start: float
                    ) -> tuple[float, float]:
        """`issue` with the instruction's static facts given (kernel_facts.py): its
        stationary tile `st`, LoadStationary time `ls_ns` and MM time `work`."""
        if st is not None and st != self.loaded:
            self.loaded = st
        else:
            ls_ns = 0.0
        ls_end = start + ls_ns
        mm_start = max(ls_end, self.mm_end)
        mm_end = mm_start + self.throttle.duration(mm_start, work)
        self.throttle.record(mm_start, mm_end)
        busy_from = max(start, self.mm_end)
        self.ls_end, self.mm_start, self.mm_end = ls_end, mm_start, mm_end
        return busy_from, mm_end

    def written(self, tile) -> None:
        """An SBUF write to `tile`: forget the loaded stationary if they overlap."""
        st = self.loaded
        if st is not None and _overlap(st, tile):
            self.loaded = None


def _overlap(a, b) -> bool:
    return (a.mem == b.mem
            and a.start_partition < b.start_partition + b.num_partitions
            and b.start_partition < a.start_partition + a.num_partitions
            and a.byte_range[0] < b.byte_range[1]
            and b.byte_range[0] < a.byte_range[1])
