"""Where a hand-written kernel spends its time, line by line (jax_trn.kernels): every
instruction of such a kernel carries the line of the kernel's source that issued it
(`Instruction.line`), and `kernel_lines` adds them up per line and engine."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from jax_trn.hw.trace import merged

from .trace import engine_of


@dataclass(frozen=True)
class LineStats:
    """One source line of a hand-written kernel on one engine (DMA queues together as
    "dma"): instructions issued, the time the engine was busy with them (DMA: the union
    over queues, so it never exceeds the kernel's time), and the time they waited at
    the head of their queue for a semaphore, with the engine they waited on most."""
    kernel: str
    line: str
    engine: str
    instructions: int
    busy_ns: float
    wait_ns: float
    waited_on: str

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "line": self.line, "engine": self.engine,
                "instructions": self.instructions, "busy_s": self.busy_ns * 1e-9,
                "wait_s": self.wait_ns * 1e-9, "waited_on": self.waited_on}


def kernel_lines(executions) -> list[LineStats]:
    """Per (kernel, line, engine), the slowest first; empty without hand-written kernels."""
    acc: dict = defaultdict(lambda: [0, [], 0.0, defaultdict(float)])
    for ex in executions:
        for i in ex.instructions:
            if not i.line:
                continue
            a = acc[(i.kernel.rpartition(".")[0] or i.kernel, i.line, i.engine)]
            a[0] += 1
            a[1].append((id(ex), i.device, i.start_ns, i.end_ns))
            if i.idle_ns > 0 and i.waited_on:
                a[2] += i.idle_ns
                a[3][engine_of(i.waited_on)] += i.idle_ns
    rows = [LineStats(k, line, e, n, _busy(spans), wait,
                      max(on, key=on.get) if on else "")
            for (k, line, e), (n, spans, wait, on) in acc.items()]
    return sorted(rows, key=lambda r: -r.busy_ns)


def _busy(spans) -> float:
    """The union of the intervals, per execution and device, summed."""
    groups: dict = defaultdict(list)
    for run, device, lo, hi in spans:
        groups[(run, device)].append((lo, hi))
    return sum(hi - lo for g in groups.values() for lo, hi in merged(g))
