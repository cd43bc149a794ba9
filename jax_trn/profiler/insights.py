"""Automatic performance insights, like Neuron Explorer's (trainium-hardware.md §7).

Each rule looks at the instructions of the executions and returns `Insight`s with the
simulated time they concern (`impact_ns`); the summary keeps the few largest. Rules:

- waiting: a compute engine sat at the head of its queue on a semaphore for >= 20% of
  a kernel, released last by another engine ("TensorE idle 40% of kernel
  dot_general.0 waiting on DMA"); waits on TensorE are left out (engines evacuating
  PSUM wait for their matmuls: TensorE is then the critical path, as it should be);
- small_dma: DMA transfers of fewer than 512 contiguous bytes per descriptor
  (partition), which the DMA engines move at a fraction of their bandwidth (§3.4);
- latency: kernels whose time goes to fixed costs rather than to any engine or to
  memory bandwidth (each DMA pays a fixed ~1.3 us, §2.6), so fusing them pays;
- transposes: TensorE spends >= 25% of its busy time in a kernel on transposes.
"""
from __future__ import annotations

from dataclasses import dataclass

from .engines import COMPUTE_ENGINES, ENGINE_NAMES
from .metrics import KernelStats
from .trace import engine_of

SMALL_DMA_BYTES = 512
WAIT_SHARE = 0.20
TRANSPOSE_SHARE = 0.25
LATENCY_SHARE = 0.30
MAX_INSIGHTS = 4


@dataclass(frozen=True)
class Insight:
    kind: str                # "waiting" | "small_dma" | "latency" | "transposes"
    kernel: str              # the kernel it is about ("" for several)
    impact_ns: float         # simulated time concerned, for ranking
    message: str

    def to_dict(self) -> dict:
        return {"kind": self.kind, "kernel": self.kernel,
                "impact_s": self.impact_ns * 1e-9, "message": self.message}


def insights(executions, stats: list[KernelStats], limit: int = MAX_INSIGHTS
             ) -> list[Insight]:
    """The `limit` most important insights, largest impact first."""
    instrs = [i for ex in executions for i in ex.instructions]
    by_kernel = {s.name: s for s in stats}
    spec = next((ex.chip_spec for ex in executions if ex.chip_spec), None)
    found = (_waiting(instrs, by_kernel) + _small_dma(instrs, spec)
             + _latency(stats, spec) + _transposes(instrs, by_kernel))
    found.sort(key=lambda i: -i.impact_ns)
    return found[:limit]


def _us(ns: float, devices: int = 1) -> str:
    """Time summed over `devices` devices, shown per device (they run side by side)."""
    return f"{ns / devices / 1e3:.1f} us" + (" per device" if devices > 1 else "")


def _devices(by_kernel, kernel: str) -> int:
    s = by_kernel.get(kernel)
    return max(1, len(s.devices)) if s is not None else 1


def _waiting(instrs, by_kernel) -> list[Insight]:
    """One insight per (engine, waited-on engine), over the kernels where it idles."""
    idle: dict[tuple[str, str], dict[str, float]] = {}
    for i in instrs:
        on = engine_of(i.waited_on) if i.waited_on is not None else "tensor"
        if i.engine in COMPUTE_ENGINES and on != "tensor":
            per_kernel = idle.setdefault((i.engine, on), {})
            per_kernel[i.kernel] = per_kernel.get(i.kernel, 0.0) + i.idle_ns
    out = []
    for (engine, on), per_kernel in idle.items():
        hits = []
        for kernel, ns in per_kernel.items():
            span = by_kernel[kernel].totals.device_ns if kernel in by_kernel else 0.0
            if span and ns / span >= WAIT_SHARE:
                hits.append((ns, kernel, ns / span))
        if hits:
            devices = max(_devices(by_kernel, h[1]) for h in hits)
            out.append(_waiting_insight(engine, on, sorted(hits, reverse=True), devices))
    return out


def _waiting_insight(engine: str, on: str, hits: list[tuple[float, str, float]],
                     devices: int = 1) -> Insight:
    ns = sum(h[0] for h in hits)
    what = f"{ENGINE_NAMES[engine]} idle"
    if len(hits) == 1:
        _, kernel, share = hits[0]
        return Insight("waiting", kernel, ns, (
            f"{what} {share:.0%} of kernel {kernel} waiting on {ENGINE_NAMES[on]} "
            f"({_us(ns, devices)} of semaphore waits)"))
    names = ", ".join(h[1] for h in hits[:3]) + (", ..." if len(hits) > 3 else "")
    lo, hi = min(h[2] for h in hits), max(h[2] for h in hits)
    share = f"{lo:.0%}" if f"{lo:.0%}" == f"{hi:.0%}" else f"{lo:.0%}-{hi:.0%}"
    return Insight("waiting", "", ns, (
        f"{what} {share} of {len(hits)} kernels ({names}) waiting on {ENGINE_NAMES[on]} "
        f"({_us(ns, devices)} of semaphore waits)"))


def _small_dma(instrs, spec) -> list[Insight]:
    groups: dict[str, list] = {}
    for i in instrs:
        if i.engine == "dma" and 0 < i.descriptor_bytes < SMALL_DMA_BYTES:
            groups.setdefault(i.kernel, []).append(i)
    totals: dict[str, int] = {}
    for i in instrs:
        if i.engine == "dma":
            totals[i.kernel] = totals.get(i.kernel, 0) + 1
    out = []
    for kernel, small in groups.items():
        avg = sum(i.descriptor_bytes for i in small) / len(small)
        ns = sum(i.duration_ns for i in small)
        eff = (f", ~{spec.core.dma_efficiency(avg):.0%} of DMA bandwidth"
               if spec is not None and hasattr(spec.core, "dma_efficiency") else "")
        out.append(Insight("small_dma", kernel, ns, (
            f"DMA transfers under {SMALL_DMA_BYTES} B per partition in kernel {kernel}: "
            f"{len(small)} of {totals[kernel]} (avg {avg:.0f} B per descriptor{eff})")))
    return out


def _latency(stats: list[KernelStats], spec) -> list[Insight]:
    slow = [s for s in stats if s.bound[0] == "latency"]
    total = sum(s.totals.device_ns for s in stats)
    ns = sum(s.totals.device_ns for s in slow)
    if not total or ns / total < LATENCY_SHARE:
        return []
    names = ", ".join(s.name for s in slow[:3]) + (", ..." if len(slow) > 3 else "")
    fixed = spec.core.dma_fixed_ns if spec is not None else None
    why = (f"each DMA pays ~{fixed / 1e3:.1f} us fixed cost" if fixed
           else "fixed costs dominate")
    return [Insight("latency", slow[0].name if len(slow) == 1 else "", ns, (
        f"{len(slow)} kernel{'s' if len(slow) > 1 else ''} ({ns / total:.0%} of time) "
        f"are latency-bound ({names}): no engine or memory path is busy; {why}, so "
        f"fusing short kernels saves their HBM round trips"))]


def _transposes(instrs, by_kernel) -> list[Insight]:
    busy: dict[str, list[float]] = {}
    for i in instrs:
        if i.engine == "tensor":
            acc = busy.setdefault(i.kernel, [0.0, 0.0])
            acc[0] += i.duration_ns
            if "Transpose" in i.opcode:
                acc[1] += i.duration_ns
    out = []
    for kernel, (total, transposes) in busy.items():
        if total and transposes / total >= TRANSPOSE_SHARE:
            out.append(Insight("transposes", kernel, transposes, (
                f"TensorE spends {transposes / total:.0%} of its busy time in kernel "
                f"{kernel} on transposes ({_us(transposes, _devices(by_kernel, kernel))}): "
                f"operands arrive with the contraction dimension off the partitions")))
    return out
