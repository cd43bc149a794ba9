"""The simulator's tile math on one BLAS thread (issue 14, point 1).

TensorE semantics multiply tiles of at most 128 x 128 x 512 with `np.matmul`. On such
small products OpenBLAS's threads cost more than they give, and on a loaded machine
they cost much more: a transformer block fwd+bwd ran 9x slower with numpy's default
threads than with one. `one_thread(needed)` sets every BLAS library numpy loaded
(found once with threadpoolctl) to one thread for the duration of an execution and
restores the previous count afterwards, so the user's own numpy keeps its setting
outside our calls. Executions may nest or overlap in threads: the first to enter saves
and sets, the last to leave restores. While one runs, BLAS calls the user makes in
another thread run single-threaded too (the setting is per process).

Entering costs two foreign calls per library (a few microseconds), so executables
whose kernels have no TensorE instruction do not ask (`needed=False`): a tiny jitted
add pays nothing.
"""
from __future__ import annotations

import contextlib
import threading

__all__ = ["one_thread"]

_lock = threading.Lock()
_depth = 0
_saved: list[tuple[object, int]] = []
_libraries: list | None = None


def _blas_libraries() -> list:
    """threadpoolctl's controllers of the BLAS libraries loaded (found once)."""
    global _libraries
    if _libraries is None:
        from threadpoolctl import ThreadpoolController

        from jax_trn.hw import sgemm
        sgemm.library()          # the simulator's own OpenBLAS loaded: limited too
        _libraries = [lib for lib in ThreadpoolController().lib_controllers
                      if lib.user_api == "blas"]
    return _libraries


def _enter() -> None:
    global _depth
    with _lock:
        if _depth == 0:
            _saved[:] = [(lib, lib.get_num_threads()) for lib in _blas_libraries()]
            for lib, n in _saved:
                if n != 1:
                    lib.set_num_threads(1)
        _depth += 1


def _leave() -> None:
    global _depth
    with _lock:
        _depth -= 1
        if _depth == 0:
            for lib, n in _saved:
                if n != 1:
                    lib.set_num_threads(n)
            _saved.clear()


@contextlib.contextmanager
def one_thread(needed: bool = True):
    """BLAS on one thread inside the block (when `needed`), as it was outside."""
    if not needed:
        yield
        return
    _enter()
    try:
        yield
    finally:
        _leave()
