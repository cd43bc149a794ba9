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
import _thread
import signal
import threading

_SIGINT = int(signal.SIGINT)

_pending = False
_depth = 0


def _handler(signum, frame):
    global _pending
    _pending = True
    raise KeyboardInterrupt


class watched:
    """`with watched():` runs an execution with the mark set by Ctrl-C (main thread,
    default handler only: a handler the user installed is left alone). A class, not a
    generator: it is entered on every call of a program (dispatch cost, issue 14)."""

    __slots__ = ("_main", "_install")

    def __enter__(self) -> "watched":
        global _depth, _pending
        self._main = _thread.get_ident() == threading.main_thread().ident
        self._install = self._main and _depth == 0 and (
            _signal.getsignal(_SIGINT) is _signal.default_int_handler)
        if self._install:
            _pending = False
            _signal.signal(_SIGINT, _handler)
        if self._main:
            _depth += 1
        return self

    def __exit__(self, *exc) -> None:
        global _depth, _pending
        if not self._main:
            return
        _depth -= 1
        if self._install:
            _signal.signal(_SIGINT, _signal.default_int_handler)
            _pending = False


def check() -> None:
    """Raises the KeyboardInterrupt a Ctrl-C during this execution could not raise."""
    global _pending
    if _pending and threading.current_thread() is threading.main_thread():
        _pending = False
        raise KeyboardInterrupt
