"""Addresses handed to C for our ctypes thunks, routed through exception-safe trampolines.

`native_address(thunk)` keeps the thunk alive for the life of the process and returns
the address C should call: a trampoline from the `_guard` extension (which sets aside a
pending Python exception around the call; see _guard.c), or the bare ctypes thunk when
the extension could not be built, in which case a jax.Array freed while an exception
propagates can abort the process.
"""
from __future__ import annotations

import ctypes
import itertools
import threading
import warnings

try:
    from . import _guard
except ImportError:                # pragma: no cover - built by `pip install`
    _guard = None
    warnings.warn("jax-trn: the _guard extension is missing (no C compiler at install?); "
                  "errors raised while trn arrays are freed may abort the process")

_KEEP: list = []                   # never freed: JAX may call in during interpreter exit
_slots = itertools.count()
_lock = threading.Lock()
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_KEEP))


def native_address(thunk) -> int:
    with _lock:
        _KEEP.append(thunk)
        address = ctypes.cast(thunk, ctypes.c_void_p).value
        if _guard is None:
            return address
        return _guard.install(next(_slots), address)
