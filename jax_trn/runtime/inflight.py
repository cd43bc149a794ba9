"""Compiles still running when the interpreter exits.

JAX compiles on a thread of its own and waits for it interruptibly: after Ctrl-C during
a compile the user gets KeyboardInterrupt while our compile goes on running Python on
JAX's thread. If the interpreter then shuts down, JAX's exit handler destroys the client
and joins XLA's thread pool while that thread is still inside the compile, and CPython
ends a thread that needs the GIL after finalization began (pthread_exit in the middle of
XLA's task): the process hung at exit (tests/e2e/test_faults.py, Ctrl-C during compile).

So every compile runs `tracked()`. At exit, a handler registered after JAX's own (exit
handlers run last-registered first, while other threads can still run Python) asks the
running compiles to stop at their next `checkpoint()` and waits for them to return; the
native layer's exit handler then waits for the thread to leave the entry point
(pjrt_plugin/_native/_guard.c, `exiting`).
"""
from __future__ import annotations

import atexit
import contextlib
import threading

_cond = threading.Condition()
_running = 0
_stopping = False


class Cancelled(RuntimeError):
    """A compile stopped because the interpreter is exiting."""


@contextlib.contextmanager
def tracked():
    """Runs a compile; the exit handler waits for it."""
    global _running
    with _cond:
        checkpoint()
        _running += 1
    try:
        yield
    finally:
        with _cond:
            _running -= 1
            _cond.notify_all()


def checkpoint() -> None:
    """Raises Cancelled once the interpreter is exiting (a compile's step boundary)."""
    if _stopping:
        raise Cancelled("compilation cancelled: the Python interpreter is exiting")


def drain() -> None:
    """Stops new compiles and waits for the running ones to finish or stop."""
    global _stopping
    with _cond:
        _stopping = True
        _cond.wait_for(lambda: _running == 0)


atexit.register(drain)      # imported when the trn client starts: after JAX's handlers
