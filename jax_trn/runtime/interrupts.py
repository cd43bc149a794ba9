"""Ctrl-C during an execution is never lost.

Python runs a signal's handler at the next bytecode boundary of the main thread, and
a simulated execution runs Python for as long as it lasts. If that boundary falls in
code whose exceptions Python cannot raise (a garbage-collector callback such as
JAX's `_xla_gc_callback`, a `__del__`, a weakref callback), the KeyboardInterrupt is
printed as "Exception ignored" and dropped, and a long loop ran on to its end
(tests/e2e/test_faults.py, Ctrl-C during execution).

So while the main thread executes, SIGINT (when its handler is Python's default) also
leaves a mark, and the runtime looks at it between steps and loop trips (`check`): an
interrupt the handler could not raise is raised there.
"""
from __future__ import annotations

import _signal      # what `signal` wraps, without its enum conversions (~10 us a call)
import contextlib
import signal
import threading

_SIGINT = int(signal.SIGINT)

_pending = False
_depth = 0


def _handler(signum, frame):
    global _pending
    _pending = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def watched():
    """Runs an execution with the mark set by Ctrl-C (main thread, default handler
    only: a handler the user installed is left alone)."""
    global _depth, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    install = _depth == 0 and _signal.getsignal(_SIGINT) is _signal.default_int_handler
    if install:
        _pending = False
        _signal.signal(_SIGINT, _handler)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if install:
            _signal.signal(_SIGINT, _signal.default_int_handler)
            _pending = False


def check() -> None:
    """Raises the KeyboardInterrupt a Ctrl-C during this execution could not raise."""
    global _pending
    if _pending and threading.current_thread() is threading.main_thread():
        _pending = False
        raise KeyboardInterrupt
