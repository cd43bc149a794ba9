"""Python's cyclic garbage collector kept out of compilation.

Compiling allocates hundreds of thousands of small objects (IR values, instructions,
semaphore bookkeeping) that live until the compile ends. Each one counts toward the
collector's thresholds, so it runs over and over during a compile, and its full
collections walk the whole heap (JAX's included) finding nothing to free: 13-31% of
the compile time of `jnp.zeros(2**30) + 1` and `x * 2 + 1` (benchmarks/compile_scaling.py).
Reference counting still frees everything acyclic at once; cycles made during the
compile wait for the first collection after it.
"""
from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_depth = 0                 # bodies running (compiles may run in several threads)
_was_enabled = False


class gc_paused:
    """`with gc_paused():` runs the body with the collector disabled; the collector's
    state before the first of any overlapping bodies is restored when the last one
    ends. (A class, not a generator: every execution enters it.)"""

    __slots__ = ()

    def __enter__(self) -> "gc_paused":
        global _depth, _was_enabled
        with _lock:
            if _depth == 0:
                _was_enabled = gc.isenabled()
                gc.disable()
            _depth += 1
        return self

    def __exit__(self, *exc) -> None:
        global _depth
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
