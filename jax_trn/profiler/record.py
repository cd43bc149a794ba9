"""What one execution of a compiled program on the simulated machine recorded."""
from __future__ import annotations

from dataclasses import dataclass, field

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")


@dataclass
class KernelRecord:
    name: str
    device: int
    start_ns: float
    end_ns: float
    busy_ns: dict[str, float]
    flops: int
    hbm_bytes: int
    ops: list[str]
    events: list = field(default_factory=list, repr=False)   # hw.trace.TraceEvent

    @property
    def duration_ns(self) -> float:
        return self.end_ns - self.start_ns


@dataclass
class Execution:
    """One call of a compiled program: simulated time, work done, engine activity.

    `simulated_time_s` is the span of the slowest participating device; `flops` counts
    the useful (model) FLOPs of the source ops; `hbm_bytes` the bytes DMA moved to or
    from HBM; `engine_utilization` the fraction of the span each engine was busy
    (averaged over participating devices)."""
    name: str
    system: str
    devices: list[int]
    kernels: list[KernelRecord]
    peak_flops_per_s: float = 0.0                   # per device, for the program's dtype

    @property
    def events(self) -> list:
        """Every instruction's trace event, kernel by kernel."""
        return [e for k in self.kernels for e in k.events]

    @property
    def simulated_time_s(self) -> float:
        if not self.kernels:
            return 0.0
        return (max(k.end_ns for k in self.kernels) - min(k.start_ns for k in self.kernels)) * 1e-9

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

    def __repr__(self) -> str:
        util = ", ".join(f"{e}={u:.0%}" for e, u in self.engine_utilization.items())
        return (f"Execution({self.name!r} on {self.system} devices {self.devices}: "
                f"{self.simulated_time_s * 1e6:.2f} us simulated, {self.flops} FLOP, "
                f"{self.hbm_bytes} HBM bytes, {util})")
