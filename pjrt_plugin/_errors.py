"""PJRT_Error objects: a Python exception turned into a C error with a code and message.

Error objects carry the PJRT_Error_FunctionTable vtable (C API 0.107), so callers may use
either the vtable or the api table's PJRT_Error_* entry points on them.
"""
from __future__ import annotations

import ctypes
import sys
import traceback

from . import _c_api as C
from ._handles import HANDLES
from ._native import native_address


# PJRT_Error_Code values (absl status codes).
Code = C.PJRT_Error_Code


class PjrtError(Exception):
    """An error with an explicit PJRT code."""

    def __init__(self, code: Code, message: str):
        super().__init__(message)
        self.code = code


class Error:
    def __init__(self, code: Code, message: str):
        self.code = code
        self.message = message.encode("utf-8", "replace")
        self.buffer = ctypes.create_string_buffer(self.message, len(self.message) + 1)


def code_for(exc: BaseException) -> Code:
    code = getattr(exc, "code", None)
    if isinstance(code, Code):
        return code
    if isinstance(exc, MemoryError):
        return Code.RESOURCE_EXHAUSTED
    if isinstance(exc, NotImplementedError):
        return Code.UNIMPLEMENTED
    if isinstance(exc, LookupError):
        return Code.NOT_FOUND
    if isinstance(exc, (ValueError, TypeError)) or type(exc).__name__.endswith(
            ("LoweringError", "CompileError", "VerifyError", "HloImportError", "IsaError")):
        return Code.INVALID_ARGUMENT
    return Code.INTERNAL


def message_for(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if code_for(exc) == Code.INTERNAL:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:])
        text = f"internal error in jax-trn: {type(exc).__name__}: {text}\n{tb}"
    return text


# --- the vtable -------------------------------------------------------------------

_VT_DESTROY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_VT_MESSAGE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_VT_GET_CODE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_VT_PAYLOAD = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


def _vt_destroy(err, handles=HANDLES):
    handles.free(err or 0)


def _vt_message(err, out_msg, out_size, handles=HANDLES):
    e = handles.get(err or 0, Error)
    ctypes.c_void_p.from_address(out_msg).value = ctypes.addressof(e.buffer)
    ctypes.c_size_t.from_address(out_size).value = len(e.message)


def _vt_get_code(err, handles=HANDLES):
    return int(handles.get(err or 0, Error).code)


def _vt_payload(err, visitor, user_arg):
    return None      # our errors carry no payloads


_THUNKS = (_VT_DESTROY(_vt_destroy), _VT_MESSAGE(_vt_message), _VT_GET_CODE(_vt_get_code),
           _VT_PAYLOAD(_vt_payload))
# PJRT_Error_FunctionTable: struct_size, instance_size, extension_start, then the four
# functions; struct_size = offset of the last field + 8 = 56; instance_size = 8.
_VTABLE = (ctypes.c_void_p * 7)(56, 8, None, *(native_address(t) for t in _THUNKS))
VTABLE_ADDRESS = ctypes.addressof(_VTABLE)


def new_error(code: Code, message: str) -> int:
    return HANDLES.new(Error(code, message), VTABLE_ADDRESS)


def from_exception(exc: BaseException) -> int:
    return new_error(code_for(exc), message_for(exc))


def log_swallowed(entry: str, exc: BaseException) -> None:
    """For entry points JAX treats as infallible: report, never return an error."""
    try:
        sys.stderr.write(f"jax-trn: {entry} failed (ignored): {type(exc).__name__}: {exc}\n")
    except Exception:
        pass
