"""Timelines computed once (issue 14, point 2).

The simulated timeline of a program without collectives depends on the data only
through its control decisions (loop predicates, branch indices): every kernel's
instructions are timed from static facts (costs, byte counts, semaphores), the core's
timeline state starts fresh at each call (`NeuronCore.begin`), and host callbacks take a
fixed time (`callbacks.local_span`). So the first call on a given set of devices
records, per device, its profiler records and its *plan*: each kernel instance with the
order its instructions took effect in, each control decision, each host callback.

A later call on the same devices walks the program's steps again but only runs the
numerics: each kernel's instructions replayed in the recorded order
(`NeuronCore.replay`, the order a full run applies them in, so results are
bit-identical, even those of a kernel with a missing semaphore), each predicate or
branch index read from HBM as the control path does and compared with the recorded
decision (a loop on chip, `hw.program.Loop`, makes no decision: its trip count is static). If every decision matches, the call took the recorded path and its timeline
is the recorded one: the records are reused (the same objects). If one differs (a loop
ran another number of trips, another branch was taken) the path is new: the walk stops,
the outputs and temporaries are cleared and the call is simulated in full, and its
timeline replaces the recorded one.

Not replayed: programs with collectives (arrival order and in-flight overlap are
timed across devices) and programs with both control flow and host callbacks (a walk
that diverges would call the host twice).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jax_trn.hw.program import Case, Collective, HostCallback, Kernel, Loop, While, walk_steps

from . import callbacks, interrupts

__all__ = ["DeviceTimeline", "Diverged", "replayable", "replay"]

KERNEL, HOST, DECISION = "kernel", "host", "decision"     # the kinds of plan entries


class Diverged(Exception):
    """The call took a path its recorded timeline does not cover."""


def replayable(prog) -> bool:
    """Whether calls of `prog` may reuse a recorded timeline: no collectives, and no
    host callbacks in a program with loops or conditionals."""
    steps = list(walk_steps(prog.steps))
    if any(isinstance(s, Collective) for s in steps):
        return False
    control = any(isinstance(s, (While, Case)) for s in steps)
    return not (control and any(isinstance(s, HostCallback) for s in steps))


@dataclass(frozen=True)
class DeviceTimeline:
    """One device's part of a recorded call: its profiler records and its plan
    ((KERNEL, kernel, issue order), (HOST, step), (DECISION, value) in the order the
    call met them)."""
    records: tuple
    plan: tuple


def replay(timeline: DeviceTimeline, steps, core, dram, limit: int) -> None:
    """The numerics of one device's call of `steps` against `dram`, along the recorded
    path (its records are the timeline's: the executable keeps them). Raises Diverged
    (having run part of the numerics) if the call leaves the path."""
    walk = _Walk(timeline.plan, core, dram, limit)
    walk.steps(steps)
    if walk.next < len(timeline.plan):
        raise Diverged("the call ended before the recorded path")


class _Walk:
    def __init__(self, plan, core, dram, limit: int):
        self.plan, self.core, self.dram, self.limit = plan, core, dram, limit
        self.next = 0

    def _entry(self, kind: str):
        if self.next >= len(self.plan) or self.plan[self.next][0] != kind:
            raise Diverged(f"expected a {kind} at step {self.next} of the recorded path")
        self.next += 1
        return self.plan[self.next - 1]

    def _decide(self, value) -> None:
        if self._entry(DECISION)[1] != value:
            raise Diverged(f"decision {self.next - 1} differs from the recorded path")

    def _read(self, tensor) -> np.generic:
        return np.asarray(self.dram[tensor.name]).reshape(-1)[0]

    def steps(self, steps) -> None:
        for step in steps:
            interrupts.check()
            if isinstance(step, Kernel):
                _, kernel, order = self._entry(KERNEL)
                if kernel is not step:
                    raise Diverged(f"{step.name} is not the recorded kernel")
                self.core.replay(step, order, self.dram)
            elif isinstance(step, While):
                self.loop(step)
            elif isinstance(step, Case):
                index = int(self._read(step.index))
                if not 0 <= index < len(step.branches):
                    index = len(step.branches) - 1
                self._decide(index)
                self.steps(step.branches[index])
            elif isinstance(step, Loop):          # a static trip count: no decisions
                self.steps(step.enter)
                for _ in range(step.trips):
                    self.steps(step.body)
                self.steps(step.exit)
            elif isinstance(step, HostCallback):
                self._entry(HOST)
                callbacks.run(step, self.dram, self.dram, True)
            else:
                raise Diverged(f"{step.name} cannot be replayed")

    def loop(self, step: While) -> None:
        trip = 0
        while True:
            self.steps(step.cond)
            go = bool(self._read(step.pred))
            self._decide(go)
            if not go:
                return
            if trip >= self.limit:          # the recorded call stopped here too
                raise Diverged(f"{step.name} ran past the trip limit")
            self.steps(step.body)
            trip += 1
