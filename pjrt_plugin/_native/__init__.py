"""The native layer: the addresses C calls for our entry points, and new PJRT_Errors.

With the `_guard` extension (built from _guard.c at install; read its header comment),
an entry point's address is a C trampoline that calls the Python function
`call(args_address) -> error address | None`, and errors are C objects, so JAX never
reads an unset out-field, a Ctrl-C reaches the user as KeyboardInterrupt, and entry
points answer during interpreter shutdown. Without the extension (no C compiler at
install) the same functions are reached through ctypes thunks and errors are Python
objects (`_pyerrors`): it works, but an interrupt or an exception raised at the wrong
moment, or a call during shutdown, can leave JAX reading garbage.

`entry_address`, `new_error`, `new_event` and `defer` are the whole interface, with
`TAGS`, the second word of the handle blocks whose calls C answers (_answers.c).
"""
from __future__ import annotations

import _thread
import atexit
import ctypes
import threading
import warnings

from .._mem import clear_outputs
from . import _pyerrors

ABI = 2                            # _guard.c's ABI: the handle blocks' words, new_event

try:
    from . import _guard
except ImportError:                # pragma: no cover - built by `pip install`
    _guard = None
    warnings.warn("jax-trn: the _guard extension is missing (no C compiler at install?); "
                  "errors raised while trn arrays are freed may abort the process")
else:
    if getattr(_guard, "ABI", 1) != ABI:   # built from older sources: it would misread
        _guard = None                      # the handle blocks, so it is not used
        warnings.warn("jax-trn: the _guard extension is out of date; rebuild it with "
                      "`python setup.py build_ext --inplace` (or reinstall jax-trn)")
    else:
        atexit.register(_guard.exiting)

FALLIBLE, INFALLIBLE = 0, 1        # the kinds of _guard.c ("No garbage, ever")
_ENTRY = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
_KEEP: list = []                   # never freed: JAX may call in during interpreter exit
_lock = threading.Lock()
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_KEEP))


# Without the extension no C reads a handle block: any tag will do.
TAGS: dict[str, int] = (_guard.TAGS if _guard is not None else
                        dict.fromkeys(("buffer", "executable", "memory", "event"), 0))


def has_guard() -> bool:
    return _guard is not None


def ready_event() -> int:
    """The address of a new ready PJRT_Event without an error (extension only)."""
    return _guard.new_event(0, b"")


def new_event(code: int, message: str) -> int | None:
    """The address of a new ready PJRT_Event made in C, failed with (code, message) if
    code != 0; None without the extension (the caller makes a Python event)."""
    if _guard is None:
        return None
    return _guard.new_event(int(code), message.encode("utf-8", "replace"))


def new_error(code: int, message: str) -> int:
    """The address of a new PJRT_Error (JAX destroys it)."""
    raw = message.encode("utf-8", "replace")
    if _guard is not None:
        return _guard.new_error(int(code), raw)
    return _pyerrors.new_error(int(code), raw)


def defer(exc: BaseException) -> None:
    """Raises `exc` (a KeyboardInterrupt an entry point caught) again once control is
    back in Python, after the running entry point returned."""
    if _guard is not None:
        _guard.defer(exc)
    elif isinstance(exc, KeyboardInterrupt):
        _thread.interrupt_main()


def native_entry_points() -> dict[str, int]:
    """{name: address} of the entry points implemented natively: PJRT_Error_* and,
    with the extension, the infallible buffer getters (see _guard.c, "Buffers")."""
    if _guard is not None:
        return _guard.entry_points()
    return {name: entry_address(name, call, INFALLIBLE)
            for name, call in _pyerrors.ENTRY_POINTS.items()}


def entry_address(name: str, call, kind: int) -> int:
    """The address C should call for entry point `name`, implemented by
    `call(args_address) -> error address | None`."""
    with _lock:
        if _guard is not None:
            return _guard.install(name, call, kind)
        thunk = _ENTRY(_ctypes_call(name, call, kind))
        _KEEP.append(thunk)
        return ctypes.cast(thunk, ctypes.c_void_p).value


def _ctypes_call(name: str, call, kind: int):
    """Without the extension: what _guard.c does, as far as Python can."""
    def thunk(address, call=call, name=name, kind=kind, new_error=new_error,
              interrupt=_thread.interrupt_main, clear=clear_outputs):
        try:
            return call(address)
        except BaseException as exc:  # noqa: BLE001 - nothing may cross into C
            interrupted = not isinstance(exc, Exception)
            if interrupted:
                interrupt()              # raised again when control is back in Python
            if kind == FALLIBLE:
                return new_error(1 if interrupted else 13, f"jax-trn: {name} failed: {exc!r}")
            clear(address)
            return None
    return thunk
