"""The numbers of a summary page, computed from executions (trainium-hardware.md §7).

Definitions (one place, used by the summary, the insights, compare and the plots):

- device time: the execution's span times its number of devices; engine "active %"
  is busy time over device time (DMA: the union of the core's DMA queues' busy time).
- MFU: model FLOPs over (device time x the generation's published dense peak per core
  for the program's dtype, `ChipSpec.peak_tflops_per_core`); HFU: the FLOPs TensorE
  executed (including padding) over the same.
- DMA bandwidth %: bytes the DMAs moved over (device time x the core's DMA ceiling,
  16 engines x B/ns per engine, `CoreSpec.dma_bytes_per_ns`); HBM bandwidth %: bytes
  read from plus written to HBM over (span x chips x the chip's HBM bandwidth).
  MBU is the larger of the two: how close the memory path that binds is to its peak.
- bound (§7 [NKI-PERF]): "compute" when a compute engine is >= 90% active, "memory"
  when MBU >= 60% (when both, the nearer to its peak) or when the DMA queues are
  >= 90% active below that MBU (busy with small, inefficient descriptors, §3.4), else
  "latency" (fixed DMA costs, semaphore hand-offs and dependency chains leave every
  resource idle).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .devices import program_names
from .engines import COMPUTE_ENGINES, ENGINE_NAMES, ENGINES

COMPUTE_BOUND = 0.90
MEMORY_BOUND = 0.60


@dataclass
class Totals:
    """Sums over kernel runs (or whole executions) that fractions are taken of."""
    time_ns: float = 0.0             # wall (span) time; per device for a kernel
    device_ns: float = 0.0           # time summed over devices
    busy_ns: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ENGINES, 0.0))
    flops: int = 0                   # model FLOPs
    tensor_flops: int = 0            # FLOPs TensorE executed
    hbm_bytes: int = 0
    dma_bytes: int = 0
    peak_flop: float = 0.0           # FLOPs the devices could have done in device time
    dma_capacity: float = 0.0        # bytes the cores' DMA engines could have moved
    hbm_capacity: float = 0.0        # bytes the chips' HBM could have moved

    def add_kernel(self, k, spec, peak_flops_per_s: float) -> None:
        """Adds one kernel run to the device time; the wall time of kernels is set by
        `KernelStats` (runs on different devices overlap)."""
        d = k.duration_ns
        self.device_ns += d
        for e in ENGINES:
            self.busy_ns[e] += k.busy_ns.get(e, 0.0)
        self.flops += k.flops
        self.tensor_flops += sum(e.flops for e in k.events)
        self.hbm_bytes += k.hbm_bytes
        self.dma_bytes += k.dma_bytes
        self.peak_flop += d * 1e-9 * peak_flops_per_s
        if spec is not None:
            self.dma_capacity += d * spec.core.dma_bytes_per_ns
            self.hbm_capacity += d * spec.hbm_bytes_per_ns

    def add_execution(self, ex) -> None:
        span, ndev = ex.span_ns, max(1, len(ex.devices))
        spec = ex.chip_spec
        self.time_ns += span
        self.device_ns += span * ndev
        for k in ex.kernels:
            for e in ENGINES:
                self.busy_ns[e] += k.busy_ns.get(e, 0.0)
            self.tensor_flops += sum(e.flops for e in k.events)
            self.dma_bytes += k.dma_bytes
        self.flops += ex.flops
        self.hbm_bytes += ex.hbm_bytes
        self.peak_flop += span * ndev * 1e-9 * ex.peak_flops_per_s
        if spec is not None:
            chips = len({k.chip for k in ex.kernels}) or 1
            self.dma_capacity += span * ndev * spec.core.dma_bytes_per_ns
            self.hbm_capacity += span * chips * spec.hbm_bytes_per_ns

    # --- ratios ---------------------------------------------------------------------

    def active(self, engine: str) -> float:
        return self.busy_ns[engine] / self.device_ns if self.device_ns else 0.0

    @property
    def mfu(self) -> float:
        return self.flops / self.peak_flop if self.peak_flop else 0.0

    @property
    def hfu(self) -> float:
        return self.tensor_flops / self.peak_flop if self.peak_flop else 0.0

    @property
    def dma_utilization(self) -> float:
        return self.dma_bytes / self.dma_capacity if self.dma_capacity else 0.0

    @property
    def hbm_utilization(self) -> float:
        return self.hbm_bytes / self.hbm_capacity if self.hbm_capacity else 0.0

    @property
    def mbu(self) -> float:
        return max(self.dma_utilization, self.hbm_utilization)

    @property
    def arithmetic_intensity(self) -> float:
        """Model FLOPs per HBM byte."""
        return self.flops / self.hbm_bytes if self.hbm_bytes else 0.0

    @property
    def flops_per_s(self) -> float:
        return self.flops / (self.time_ns * 1e-9) if self.time_ns else 0.0

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_bytes / (self.time_ns * 1e-9) if self.time_ns else 0.0

    def bound(self) -> tuple[str, str]:
        return classify({e: self.active(e) for e in COMPUTE_ENGINES}, self.mbu,
                        self.active("dma"))


def classify(active: dict[str, float], mbu: float, dma_active: float = 0.0
             ) -> tuple[str, str]:
    """(bound, why) from compute-engine active fractions, MBU and how busy the DMA
    queues are (see module doc)."""
    engine = max(active, key=lambda e: active[e]) if active else "tensor"
    top = active.get(engine, 0.0)
    compute, memory = top >= COMPUTE_BOUND, mbu >= MEMORY_BOUND
    if compute and (not memory or top / COMPUTE_BOUND >= mbu / MEMORY_BOUND):
        return "compute", f"{ENGINE_NAMES[engine]} {top:.0%} active"
    if memory:
        return "memory", f"MBU {mbu:.0%}"
    if dma_active >= COMPUTE_BOUND:
        return "memory", (f"DMA queues {dma_active:.0%} active at MBU {mbu:.0%}: "
                          f"descriptors too small to reach the DMA rate")
    return "latency", f"busiest engine {ENGINE_NAMES[engine]} {top:.0%}, MBU {mbu:.0%}"


@dataclass
class KernelStats:
    """A kernel aggregated over devices and calls. The same kernel runs side by side on
    every device of an SPMD program, so its time is per device (`totals.time_ns`:
    device time over the devices that ran it) and `calls` its runs per device;
    `totals.device_ns` sums all devices (shares of device time use it)."""
    key: tuple[str, str]             # (execution name, kernel name)
    ops: list[str]
    runs: dict[int, int] = field(default_factory=dict)      # device -> runs
    totals: Totals = field(default_factory=Totals)

    @property
    def name(self) -> str:
        return self.key[1]

    @property
    def devices(self) -> list[int]:
        return sorted(self.runs)

    @property
    def calls(self) -> int:
        return max(self.runs.values(), default=0)

    @property
    def bound(self) -> tuple[str, str]:
        return self.totals.bound()

    def add(self, k, spec, peak_flops_per_s: float) -> None:
        self.runs[k.device] = self.runs.get(k.device, 0) + 1
        self.totals.add_kernel(k, spec, peak_flops_per_s)
        self.totals.time_ns = self.totals.device_ns / len(self.runs)


def kernel_stats(executions) -> list[KernelStats]:
    """Per-kernel statistics, slowest first."""
    stats: dict[tuple[str, str], KernelStats] = {}
    for ex, name in zip(executions, program_names(executions)):
        spec = ex.chip_spec
        for k in ex.kernels:
            key = (name, k.name)
            s = stats.get(key)
            if s is None:
                s = stats[key] = KernelStats(key, list(k.ops))
            s.add(k, spec, ex.peak_flops_per_s)
    return sorted(stats.values(), key=lambda s: -s.totals.device_ns)


def totals(executions) -> Totals:
    t = Totals()
    for ex in executions:
        t.add_execution(ex)
    return t


def program_bound(stats: list[KernelStats]) -> tuple[str, float]:
    """The bound class holding the most kernel time, and its share of kernel time."""
    by_bound: dict[str, float] = {}
    for s in stats:
        b = s.bound[0]
        by_bound[b] = by_bound.get(b, 0.0) + s.totals.device_ns
    total = sum(by_bound.values())
    if not total:
        return "latency", 0.0
    best = max(by_bound, key=lambda b: by_bound[b])
    return best, by_bound[best] / total
