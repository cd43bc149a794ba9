"""Python exceptions turned into PJRT_Errors: the code and message for an exception.

The error objects themselves are made by the native layer (`_native.new_error`).
"""
from __future__ import annotations

import sys
import traceback

from . import _c_api as C
from . import _native


# PJRT_Error_Code values (absl status codes).
Code = C.PJRT_Error_Code


class PjrtError(Exception):
    """An error with an explicit PJRT code."""

    def __init__(self, code: Code, message: str):
        super().__init__(message)
        self.code = code


def code_for(exc: BaseException) -> Code:
    code = getattr(exc, "code", None)
    if isinstance(code, Code):
        return code
    if _user_code(exc) is not None:
        return _user_code(exc)
    if isinstance(exc, MemoryError):
        return Code.RESOURCE_EXHAUSTED
    if isinstance(exc, NotImplementedError):
        return Code.UNIMPLEMENTED
    if isinstance(exc, LookupError):
        return Code.NOT_FOUND
    if isinstance(exc, (ValueError, TypeError)) or any(c.__name__.endswith(
            ("LoweringError", "CompileError", "VerifyError", "HloImportError", "IsaError"))
            for c in type(exc).__mro__):         # subclasses too (kernels.KernelError)
        return Code.INVALID_ARGUMENT
    return Code.INTERNAL


def _user_code(exc: BaseException) -> Code | None:
    """The code a runtime error names for itself (`pjrt_code`, e.g. "INTERNAL" for a
    host callback that raised: the user's error, not ours, told as it is)."""
    name = getattr(type(exc), "pjrt_code", None)
    return getattr(Code, name, None) if isinstance(name, str) else None


def message_for(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if _user_code(exc) is not None:
        return text
    if code_for(exc) == Code.INTERNAL:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:])
        text = f"internal error in jax-trn: {type(exc).__name__}: {text}\n{tb}"
    return text


def new_error(code: Code, message: str) -> int:
    return _native.new_error(int(code), message)


def from_exception(exc: BaseException) -> int:
    return new_error(code_for(exc), message_for(exc))


def log_swallowed(entry: str, exc: BaseException) -> None:
    """For entry points JAX treats as infallible: report, never return an error."""
    try:
        sys.stderr.write(f"jax-trn: {entry} failed (ignored): {type(exc).__name__}: {exc}\n")
    except Exception:
        pass
