"""Builds the PJRT_Api function table (C API 0.112) from the registered shims.

Every slot of the table is filled: implemented entry points call their shim through a
thunk that turns exceptions into PJRT_Errors (or, for entry points JAX cannot survive
failing, logs them and reports success); the rest return UNIMPLEMENTED naming
themselves. The table, the thunks and the extension chain are kept alive for the life
of the process: JAX may call into them while Python is shutting down.
"""
from __future__ import annotations

import ctypes

from . import _c_api as C
from . import _errors
from ._native import native_address
from ._registry import ENTRIES
from . import _entries_core, _entries_client, _entries_device  # noqa: F401  (register shims)
from . import _entries_buffer, _entries_executable  # noqa: F401

_ENTRY = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
_VOID = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

_KEEP: list = []       # the table and extensions; never freed (see module doc)


def _thunk(name: str, fn, never_fails: bool, void: bool):
    cls = getattr(C, name + "_Args")
    size = C.struct_size(cls)
    errors = _errors

    def call(address, fn=fn, cls=cls, size=size, errors=errors, name=name):
        try:
            args = cls.from_address(address)
            if args.struct_size < size and not (never_fails or void):
                return errors.new_error(errors.Code.INVALID_ARGUMENT,
                                        f"{name}: struct_size {args.struct_size} < {size}")
            fn(args)
            return None
        except BaseException as exc:  # noqa: BLE001 - nothing may cross into C
            try:
                if never_fails or void:
                    errors.log_swallowed(name, exc)
                    return None
                return errors.from_exception(exc)
            except BaseException:
                return None
    return (_VOID if void else _ENTRY)(call)


def _unimplemented(name: str):
    def call(address, name=name, errors=_errors):
        try:
            return errors.new_error(errors.Code.UNIMPLEMENTED,
                                    f"{name} is not implemented by the trn plugin")
        except BaseException:
            return None
    return _ENTRY(call)


def _address(fn) -> int:
    return native_address(fn)


def _fill(struct, names) -> None:
    for name in names:
        if name in ENTRIES:
            thunk = _thunk(name, *ENTRIES[name])
        else:
            thunk = _unimplemented(name)
        offset = getattr(type(struct), name).offset
        ctypes.c_void_p.from_address(ctypes.addressof(struct) + offset).value = _address(thunk)


def _shardings_extension():
    ext = C.PJRT_Shardings_Extension()
    ext.base.struct_size = C.struct_size(C.PJRT_Shardings_Extension)
    ext.base.type = C.PJRT_Extension_Type.Shardings
    _fill(ext, ["PJRT_Shardings_PJRT_Executable_ParameterShardings",
                "PJRT_Shardings_PJRT_Executable_OutputShardings"])
    _KEEP.append(ext)
    return ext


def build_api() -> C.PJRT_Api:
    api = C.PJRT_Api()
    api.struct_size = C.struct_size(C.PJRT_Api)
    ext = _shardings_extension()
    ctypes.c_void_p.from_address(ctypes.addressof(api) + C.PJRT_Api.extension_start.offset
                                 ).value = ctypes.addressof(ext)
    version = api.pjrt_api_version
    version.struct_size = C.struct_size(C.PJRT_Api_Version)
    version.major_version = C.PJRT_API_MAJOR
    version.minor_version = C.PJRT_API_MINOR
    _fill(api, C.API_ENTRY_POINTS)
    _KEEP.append(api)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_KEEP))    # outlive interpreter teardown
    return api


_CAPSULE_NAME = ctypes.create_string_buffer(b"pjrt_c_api")


def capsule(api: C.PJRT_Api):
    """A PyCapsule named "pjrt_c_api" around the table, as register_plugin expects."""
    new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
        ("PyCapsule_New", ctypes.pythonapi))
    return new(ctypes.addressof(api), ctypes.addressof(_CAPSULE_NAME), None)
