"""Control instructions: what an engine's sequencer runs between data-path instructions.

Every engine (and the Sync engine that triggers DMAs) has its own sequencer, which runs
control instructions on private 32-bit registers: scalar ALU work, branches, DMA
triggers (trainium-hardware.md §2.1 [NKI-ARCH1]). Engines run their streams
asynchronously and order their data dependencies with hardware semaphores (§2.1).
A loop kept on chip (NKI's `sequential_range` / `fori_loop`, §6.1) is, on each
sequencer that takes part, the loop body's instructions followed by a back edge:

    RegisterAdd(counter, step)          counter += step
    BranchLess(counter, limit)          if counter < limit: jump to the body's start
    SemaphoreWait(...)                  the next trip's first instruction waits for the
                                        previous trip's last ones on the other engines

The reference gives no cycle count for register ALU work, branches or a semaphore wait;
each is priced as one static instruction overhead (~100 cycles for tiny / dependent
instructions, §2.6 [NKI-ARCH1][NKI-PERF]) on the engine's clock (§1.2). The sequencers
run their back edges in parallel, so a trip's control costs the slowest one
(`back_edge_ns`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["RegisterAdd", "BranchLess", "SemaphoreWait", "back_edge", "back_edge_ns"]

SEQUENCERS = ("tensor", "vector", "scalar", "gpsimd")   # the Sync engine clocks as the slowest


def _wrap(v: int) -> int:
    """A 32-bit register's signed value (§2.1: private 32-bit registers)."""
    return int(np.int64(v).astype(np.int32))


@dataclass(frozen=True)
class RegisterAdd:
    """reg += imm on the sequencer's scalar ALU (32-bit, wrapping)."""
    reg: str
    imm: int

    def apply(self, regs: dict[str, int]) -> None:
        regs[self.reg] = _wrap(regs[self.reg] + self.imm)

    def cycles(self, spec) -> float:
        return spec.static_overhead                     # §2.6, see the module doc


@dataclass(frozen=True)
class BranchLess:
    """Jump back to the loop body while reg < limit (signed 32-bit compare)."""
    reg: str
    limit: int

    def taken(self, regs: dict[str, int]) -> bool:
        return regs[self.reg] < self.limit

    def cycles(self, spec) -> float:
        return spec.static_overhead                     # §2.6, see the module doc


@dataclass(frozen=True)
class SemaphoreWait:
    """Wait until the semaphores of the previous trip's last instructions on the other
    engines reach their counts (§2.1: the hardware atomic semaphores between engines)."""
    engines: tuple[str, ...]

    def cycles(self, spec) -> float:
        return spec.static_overhead                     # §2.6, see the module doc


def back_edge(counter: str, step: int, limit: int) -> tuple:
    """The control instructions each sequencer runs at the end of a trip."""
    return (RegisterAdd(counter, step), BranchLess(counter, limit),
            SemaphoreWait(SEQUENCERS))


def back_edge_ns(instrs, spec) -> float:
    """Simulated time of one trip's back edge: every sequencer runs `instrs` at its own
    clock, in parallel; the trip ends when the slowest is done."""
    cycles = sum(i.cycles(spec) for i in instrs)
    return cycles / min(spec.clock(e) for e in SEQUENCERS)
