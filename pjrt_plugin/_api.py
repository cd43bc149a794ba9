"""Builds the PJRT_Api function table (C API 0.112) from the registered shims.

Every slot of the table is filled. Some entry points are native
(`_native.native_entry_points`). The others call their shim through
`call(args_address)`, which turns an `Exception` into a PJRT_Error (or, for entry points
JAX cannot survive failing, logs it and answers with zeroed out-fields); those without a
shim return UNIMPLEMENTED naming themselves. `_native` turns each `call` into the
address C calls, and handles what a Python function cannot: interrupts
(KeyboardInterrupt is not caught here), exceptions escaping `call`, calls during
interpreter shutdown. The table and the extension chain are kept alive for the
life of the process: JAX may call into them while Python is shutting down.
"""
from __future__ import annotations

import ctypes

from . import _c_api as C
from . import _errors
from . import _native
from ._mem import clear_outputs
from ._registry import ENTRIES
from . import _entries_core, _entries_client, _entries_device  # noqa: F401  (register shims)
from . import _entries_buffer, _entries_executable  # noqa: F401

_KEEP: list = []       # the table and extensions; never freed (see module doc)


def _call(name: str, fn, never_fails: bool):
    """The Python side of entry point `name`: `call(args_address) -> error | None`.
    Everything it uses is bound as a default argument: late in interpreter exit the
    module globals and builtins are cleared, and JAX may still call in."""
    cls = getattr(C, name + "_Args")
    size = C.struct_size(cls)

    def call(address, fn=fn, cls=cls, size=size, errors=_errors, name=name,
             never_fails=never_fails, clear=clear_outputs, Exception=Exception):
        try:
            args = cls.from_address(address)
            if args.struct_size < size and not never_fails:
                return errors.new_error(errors.Code.INVALID_ARGUMENT,
                                        f"{name}: struct_size {args.struct_size} < {size}")
            fn(args)
            return None
        except Exception as exc:  # noqa: BLE001 - not interrupts: those go on to _native
            if not never_fails:
                return errors.from_exception(exc)
            errors.log_swallowed(name, exc)
            clear(address)
            return None
    return call


def _unimplemented(name: str):
    def call(address, name=name, errors=_errors):
        return errors.new_error(errors.Code.UNIMPLEMENTED,
                                f"{name} is not implemented by the trn plugin")
    return call


def _address(name: str) -> int:
    if name in ENTRIES:
        fn, never_fails = ENTRIES[name]
        kind = _native.INFALLIBLE if never_fails else _native.FALLIBLE
        return _native.entry_address(name, _call(name, fn, never_fails), kind)
    return _native.entry_address(name, _unimplemented(name), _native.FALLIBLE)


def _fill(struct, names, native: dict[str, int] | None = None) -> None:
    native = native or {}
    for name in names:
        address = native[name] if name in native else _address(name)
        offset = getattr(type(struct), name).offset
        ctypes.c_void_p.from_address(ctypes.addressof(struct) + offset).value = address


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
    _fill(api, C.API_ENTRY_POINTS, _native.native_entry_points())
    _KEEP.append(api)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_KEEP))    # outlive interpreter teardown
    return api


_CAPSULE_NAME = ctypes.create_string_buffer(b"pjrt_c_api")


def capsule(api: C.PJRT_Api):
    """A PyCapsule named "pjrt_c_api" around the table, as register_plugin expects."""
    new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
        ("PyCapsule_New", ctypes.pythonapi))
    return new(ctypes.addressof(api), ctypes.addressof(_CAPSULE_NAME), None)
