"""Profiles of simulated executions. `jax_trn.profile()` is the entry point."""
from __future__ import annotations

import contextlib
import threading

from .record import Execution, KernelRecord

__all__ = ["Profile", "profile", "record", "Execution", "KernelRecord", "last_execution"]

_lock = threading.Lock()
_active: list["Profile"] = []
_last: list[Execution] = []


class Profile:
    """Collects every `Execution` that ran on a trn device while it was active."""

    def __init__(self):
        self.executions: list[Execution] = []

    def __repr__(self) -> str:
        return f"Profile({len(self.executions)} executions)"


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
