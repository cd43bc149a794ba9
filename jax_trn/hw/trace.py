"""Trace records of simulated execution (consumed by jax_trn.profiler)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One instruction on one queue: it reached the head of its queue at
    `wait_start_ns`, started at `start_ns` (semaphores satisfied, engine free) and
    finished at `end_ns`."""
    queue: str              # "tensor" | "vector" | "scalar" | "gpsimd" | "dma<i>"
    opcode: str             # instruction class name, e.g. "NcMatmul"
    name: str               # instr.name (kernel / source op)
    start_ns: float
    end_ns: float
    wait_start_ns: float
    bytes: int = 0          # bytes moved (DMA)
    flops: int = 0          # TensorE FLOPs (matmul)
    core: int = 0           # core_id of the NeuronCore

    @property
    def duration_ns(self) -> float:
        return self.end_ns - self.start_ns


@dataclass
class KernelRun:
    """The result of `NeuronCore.run` for one kernel."""
    kernel: str
    start_ns: float
    end_ns: float
    events: list[TraceEvent] = field(default_factory=list)
    busy_ns: dict[str, float] = field(default_factory=dict)   # engine -> busy ns
    flops: int = 0
    hbm_bytes: int = 0          # bytes DMA'd to or from DRAM
    core: int = 0               # core_id of the NeuronCore
    # Instruction indices in the order they took effect (start-time order): replaying
    # them in this order reproduces the kernel's numerics (`NeuronCore.replay`).
    order: tuple[int, ...] = ()

    @property
    def duration_ns(self) -> float:
        return self.end_ns - self.start_ns


def merged(intervals) -> list[list]:
    """[lo, hi) intervals sorted and merged where they overlap or meet."""
    out: list[list] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out
