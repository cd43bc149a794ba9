"""Element types of the hardware (trainium-hardware.md §4), by numpy/ml_dtypes name."""
from __future__ import annotations

import numpy as np
import ml_dtypes

_DTYPES = {
    "bool": np.dtype(np.bool_),
    "int8": np.dtype(np.int8), "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32), "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8), "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32), "uint64": np.dtype(np.uint64),
    "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "float8_e4m3": np.dtype(ml_dtypes.float8_e4m3),
}


def np_dtype(name: str) -> np.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise TypeError(f"the Trainium hardware has no element type {name!r}") from None


def itemsize(name: str) -> int:
    return np_dtype(name).itemsize


def is_float(name: str) -> bool:
    return name.startswith(("float", "bfloat"))
