"""PJRT_Errors as Python objects: the fallback when the `_guard` extension is missing.

An error is a handle whose first word points at a PJRT_Error_FunctionTable (C API 0.107)
of ctypes thunks; the PJRT_Error_* entry points of the API table read the same objects.
With the extension, errors are C objects instead (_guard.c), readable without Python.
"""
from __future__ import annotations

import ctypes

from .._handles import HANDLES

_void_p = ctypes.c_void_p


class Error:
    def __init__(self, code: int, message: bytes):
        self.code = code
        self.message = message
        self.buffer = ctypes.create_string_buffer(message, len(message) + 1)


def new_error(code: int, message: bytes) -> int:
    return HANDLES.new(Error(code, message), VTABLE_ADDRESS)


def _error(address: int) -> Error:
    return HANDLES.get(address or 0, Error)


def _vt_destroy(err):
    HANDLES.free(err or 0)


def _vt_message(err, out_msg, out_size):
    e = _error(err)
    _void_p.from_address(out_msg).value = ctypes.addressof(e.buffer)
    ctypes.c_size_t.from_address(out_size).value = len(e.message)


def _vt_get_code(err):
    return int(_error(err).code)


def _vt_payload(err, visitor, user_arg):
    return None      # our errors carry no payloads


_THUNKS = (ctypes.CFUNCTYPE(None, _void_p)(_vt_destroy),
           ctypes.CFUNCTYPE(None, _void_p, _void_p, _void_p)(_vt_message),
           ctypes.CFUNCTYPE(ctypes.c_int, _void_p)(_vt_get_code),
           ctypes.CFUNCTYPE(None, _void_p, _void_p, _void_p)(_vt_payload))
# struct_size, instance_size, extension_start, then the four functions; struct_size =
# offset of the last field + 8 = 56; instance_size = 8 (the PJRT_Error base).
_VTABLE = (_void_p * 7)(56, 8, None, *(ctypes.cast(t, _void_p).value for t in _THUNKS))
VTABLE_ADDRESS = ctypes.addressof(_VTABLE)

# The PJRT_Error_* entry points: *_Args is struct_size, extension_start, error, then
# the out-fields (offsets from pjrt_c_api.h, checked by tests/pjrt_abi).
_ERROR, _OUT = 16, 24


def _destroy(args: int):
    _vt_destroy(_void_p.from_address(args + _ERROR).value)


def _message(args: int):
    _vt_message(_void_p.from_address(args + _ERROR).value, args + _OUT, args + _OUT + 8)


def _get_code(args: int):
    ctypes.c_int.from_address(args + _OUT).value = _vt_get_code(
        _void_p.from_address(args + _ERROR).value)


def _for_each_payload(args: int):
    return None


ENTRY_POINTS = {"PJRT_Error_Destroy": _destroy, "PJRT_Error_Message": _message,
                "PJRT_Error_GetCode": _get_code, "PJRT_Error_ForEachPayload": _for_each_payload}
