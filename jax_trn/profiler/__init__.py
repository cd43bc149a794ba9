"""Profiles of simulated executions. `jax_trn.profile()` is the entry point.

    with jax_trn.profile() as prof:
        f(x).block_until_ready()
    ex = prof.executions[-1]
    print(ex.summary())             # or prof.summary() for every execution
    ex.save_trace("f.json")         # open in ui.perfetto.dev

Modules: record (Execution, KernelRecord, CollectiveRecord), trace (per-instruction
records with kernel, source and semaphore waits), metrics (the summary's definitions),
devices (device lists as ranges, time per device, one row per program), summary,
insights, chrome (trace export), plots (matplotlib, optional).

FLOPs: a kernel's `flops` are model FLOPs, credited by the lowering rule to the kernel
that does the op's work (once per op); the FLOPs TensorE executed (padding, transposes,
staging included) are the trace events' and are shown beside them (HFU). The profiler only
reads records: it never compiles or runs anything (`jax_trn.compare`, one program on
several systems, is built on the runtime and hands its executions here).
"""
from __future__ import annotations

import contextlib
import threading

from .record import CollectiveRecord, Execution, KernelRecord

__all__ = ["Profile", "profile", "record", "Execution", "KernelRecord", "CollectiveRecord",
           "last_execution"]

_lock = threading.Lock()
_active: list["Profile"] = []
_last: list[Execution] = []


class Profile:
    """Collects every `Execution` that ran on a trn device while it was active."""

    def __init__(self):
        self.executions: list[Execution] = []

    def __repr__(self) -> str:
        return f"Profile({len(self.executions)} executions)"

    def summary(self):
        """The summary page over every execution (`print(prof.summary())`)."""
        from .summary import Summary
        return Summary(self.executions)

    def summary_dict(self) -> dict:
        return self.summary().to_dict()

    def trace_events(self) -> dict:
        from .chrome import chrome_trace
        return chrome_trace(self.executions)

    def save_trace(self, path) -> str:
        """Chrome trace-event JSON of every execution, laid end to end in run order."""
        from .chrome import save_trace
        return save_trace(self.executions, path)

    def plot_timeline(self, ax=None, **kw):
        from . import plots
        return plots.timeline(self.executions, ax=ax, **kw)

    def plot_utilization(self, ax=None):
        from . import plots
        return plots.utilization(self.executions, ax=ax)

    def plot_roofline(self, ax=None):
        from . import plots
        return plots.roofline(self.executions, ax=ax)

    def plot_collectives(self, ax=None):
        from . import plots
        return plots.collectives(self.executions, ax=ax)


@contextlib.contextmanager
def profile():
    """`with jax_trn.profile() as prof:` records each execution into `prof.executions`."""
    prof = Profile()
    with _lock:
        _active.append(prof)
    try:
        yield prof
    finally:
        with _lock:
            _active.remove(prof)


def record(execution: Execution) -> None:
    """Called by the runtime after each execution."""
    with _lock:
        _last[:] = [execution]
        for prof in _active:
            prof.executions.append(execution)


def recording() -> bool:
    return bool(_active)


def last_execution() -> Execution | None:
    """The most recent execution on any trn device (also outside `profile()`)."""
    return _last[0] if _last else None
