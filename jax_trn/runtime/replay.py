"""Timelines computed once (issue 14, point 2).

The simulated timeline of a program without loops, conditionals or collectives never
depends on the data: every kernel's instructions are timed from static facts (costs,
byte counts, semaphores), the core's timeline state starts fresh at each call
(`NeuronCore.begin`), and host callbacks take a fixed time (`callbacks.local_span`). So
the first call on a given set of devices records, per device, its profiler records and
its *plan*: each kernel instance with the order its instructions took effect in, and
each host callback. Later calls on the same devices reuse the records (simulated time,
trace events, busy times, all bit-identical: they are the same objects) and only run
the numerics, replaying each kernel's instructions in the recorded order
(`NeuronCore.replay`), which is the order a full run would apply them in, so results
are bit-identical too (even those of a kernel with a missing semaphore).

Programs with loops or conditionals (paths are data) and with collectives (arrival
order and in-flight overlap) are simulated in full on every call.
"""
from __future__ import annotations

from dataclasses import dataclass

from jax_trn.hw.program import Case, Collective, HostCallback, While, walk_steps

from . import callbacks, interrupts

__all__ = ["DeviceTimeline", "static_timeline", "replay"]


def static_timeline(prog) -> bool:
    """Whether every call of `prog` has the same timeline: no loop, conditional or
    collective anywhere in its steps."""
    return not any(isinstance(s, (While, Case, Collective)) for s in walk_steps(prog.steps))


@dataclass(frozen=True)
class DeviceTimeline:
    """One device's part of a recorded call: its profiler records and its plan."""
    records: tuple          # profiler.KernelRecord / callback records, in order
    plan: tuple             # (kernel, issue order) per kernel instance; HostCallback steps


def replay(timeline: DeviceTimeline, core, dram) -> list:
    """The numerics of one device's call against `dram`, as recorded; its records."""
    for entry in timeline.plan:
        interrupts.check()
        if isinstance(entry, HostCallback):
            callbacks.run(entry, dram, dram, True)
        else:
            core.replay(entry[0], entry[1], dram)
    return list(timeline.records)
