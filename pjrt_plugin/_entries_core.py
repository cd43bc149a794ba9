"""Plugin attributes and events (the PJRT_Error_* entry points are native: `_native`).

With the extension, events are C objects answered in C (`_native/_answers.c`); the
PJRT_Event_* functions here serve the build without it, and report what C cannot
answer (an invalid or destroyed event)."""
from __future__ import annotations

import ctypes

from . import _errors, _native
from ._handles import HANDLES
from ._mem import Keep, get_ptr, set_array, set_ptr
from ._objects import CEvent, named_values
from ._registry import entry

_keep = Keep()


@entry("PJRT_Plugin_Initialize")
def plugin_initialize(a):
    return None


def _attributes():
    from jaxlib.mlir.dialects import stablehlo
    version = lambda s: [int(x) for x in s.split(".")]
    return named_values(_keep, {
        "stablehlo_current_version": version(stablehlo.get_current_version()),
        "stablehlo_minimum_version": version(stablehlo.get_minimum_version()),
        "xla_version": 2,
        "supports_cross_host_transfers": False,
    })


_ATTRIBUTES: list = []


@entry("PJRT_Plugin_Attributes", never_fails=True)
def plugin_attributes(a):
    if not _ATTRIBUTES:
        _ATTRIBUTES.append(_attributes())
    set_array(a, "attributes", "num_attributes", _ATTRIBUTES[0])


def new_event(error: BaseException | None = None) -> int:
    """A ready event, failed with `error` if given: made in C with the extension (its
    PJRT_Event_* calls then never enter Python: _native/_answers.c), else a CEvent."""
    if not _native.has_guard():
        return HANDLES.new(CEvent(error))
    if error is None:
        return _native.ready_event()
    return _native.new_event(int(_errors.code_for(error)), _errors.message_for(error))


@entry("PJRT_Event_Destroy", never_fails=True)
def event_destroy(a):
    HANDLES.free(get_ptr(a, "event"))


@entry("PJRT_Event_IsReady")
def event_is_ready(a):
    HANDLES.get(get_ptr(a, "event"), CEvent)
    a.is_ready = True


@entry("PJRT_Event_Error")
def event_error(a):
    event = HANDLES.get(get_ptr(a, "event"), CEvent)
    if event.error is not None:
        raise event.error


@entry("PJRT_Event_Await")
def event_await(a):
    event_error(a)


_ON_READY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
_CALLBACKS: dict[int, object] = {}      # callback address -> its ctypes function


@entry("PJRT_Event_OnReady")
def event_on_ready(a):
    event = HANDLES.get(get_ptr(a, "event"), CEvent)
    error = _errors.from_exception(event.error) if event.error is not None else None
    address = get_ptr(a, "callback")
    callback = _CALLBACKS.get(address)
    if callback is None:                  # a few C functions: wrapped once each
        callback = _ON_READY(address)
        if len(_CALLBACKS) < 1024:
            _CALLBACKS[address] = callback
    callback(error, get_ptr(a, "user_arg") or None)


@entry("PJRT_Event_Create")
def event_create(a):
    set_ptr(a, "event", new_event())


@entry("PJRT_Event_Set")
def event_set(a):
    event = HANDLES.get(get_ptr(a, "event"), CEvent)
    if a.error_code:
        msg = ctypes.string_at(get_ptr(a, "error_message"), a.error_message_size).decode()
        event.error = _errors.PjrtError(_errors.Code(a.error_code), msg)
