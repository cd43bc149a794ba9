"""Element types of the hardware (trainium-hardware.md §4), by numpy/ml_dtypes name.

Packed MX types (§2.2, §4 [NKI-ISA]): `float8_e4m3fn_x4` and `float8_e5m2_x4` are
32-bit elements holding four FP8 values, `float4_e2m1fn_x4` a 16-bit element holding
four FP4 values. Their storage dtype here is the unsigned integer of that width, so
tiles of them are plain bit containers: copies are bit-exact and every other ALU
instruction rejects them. Value k (0..3) of a packed element sits in byte k (FP8) or
nibble k (FP4), little-endian; `mx.py` packs and unpacks them. `float8_e8m0fnu` is the
MX scale type (an 8-bit biased exponent, 0xFF = NaN); NKI also takes `uint8` scales.
"""
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
    "complex64": np.dtype(np.complex64),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "float8_e4m3": np.dtype(ml_dtypes.float8_e4m3),
    "float8_e8m0fnu": np.dtype(ml_dtypes.float8_e8m0fnu),
    "float4_e2m1fn": np.dtype(ml_dtypes.float4_e2m1fn),
    "float8_e4m3fn_x4": np.dtype(np.uint32),
    "float8_e5m2_x4": np.dtype(np.uint32),
    "float4_e2m1fn_x4": np.dtype(np.uint16),
    # 4-bit integers: one value per byte on the device (ml_dtypes' layout, sign- or
    # zero-extended; the ALUs compute on them like int8 / uint8 and wrap results to 4
    # bits on write); PJRT hands them over packed two per byte (pjrt_plugin/_dtypes.py)
    "int4": np.dtype(ml_dtypes.int4), "uint4": np.dtype(ml_dtypes.uint4),
}

# Packed type -> the element type of its four values (§4 [NKI-SHARED]).
PACKED = {
    "float8_e4m3fn_x4": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2_x4": np.dtype(ml_dtypes.float8_e5m2),
    "float4_e2m1fn_x4": np.dtype(ml_dtypes.float4_e2m1fn),
}
MX_SCALE_TYPES = ("uint8", "float8_e8m0fnu")

# The one definition of what a trn device holds: the element types of its buffers, of a
# program's arguments and results and of every value inside a program (§4: the
# hardware's integer and float types JAX can name; FP8: legacy e4m3 and e5m2 on every
# generation, OCP e4m3fn natively from v4, §2.2). The plugin refuses transfers of any
# other type and the compiler refuses programs using one, naming it.
DEVICE_TYPES = frozenset({
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float8_e4m3fn", "float8_e5m2", "float8_e4m3",
    "int4", "uint4",
    "float4_e2m1fn",        # OCP FP4 (§4): one value per byte in HBM and SBUF, as JAX
                            # hands it over (PJRT type 29); ALUs compute on it in FP32.
                            # Packed two per byte only as float4_e2m1fn_x4 (mx_matmul)
    "float8_e8m0fnu",       # MX block scales (§2.2, §4): stored, bit-copied and read by
                            # nc_matmul_mx; no ALU reads it and DMA cannot cast it
})

# What a trn buffer may hold: the device types and complex64, which no instruction
# reads: a complex64 buffer is interleaved float32 pairs (real, imaginary) in HBM, and
# programs see it as float32[..., 2] (hlo_passes/passes/complex_planes.py).
BUFFER_TYPES = DEVICE_TYPES | {"complex64"}


def np_dtype(name: str) -> np.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise TypeError(f"the Trainium hardware has no element type {name!r}") from None


def itemsize(name: str) -> int:
    return np_dtype(name).itemsize


NIBBLE_INTS = frozenset({"int4", "uint4"})


def bits(name: str) -> int:
    """The width of an element's value in bits (4 for int4 / uint4, stored in a byte)."""
    return 4 if name in NIBBLE_INTS else 8 * itemsize(name)


def is_nibble(dt: np.dtype) -> bool:
    """int4 / uint4 storage (ml_dtypes' have numpy kind 'V'; the kind is cheap to read,
    the name is not, and this runs for every instruction executed)."""
    return dt.kind == "V" and dt.name in NIBBLE_INTS


def is_int_storage(dt: np.dtype) -> bool:
    """Integer or bool numpy storage; ml_dtypes' int4 / uint4 have numpy kind 'V'."""
    return dt.kind in "iub" or is_nibble(dt)


def int_astype(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Integer -> integer, wrapping; through int64 when a 4-bit type is involved
    (ml_dtypes casts neither int4 <-> uint4 nor bool <-> them directly)."""
    if is_nibble(x.dtype) or is_nibble(dt):
        return x.astype(np.int64).astype(dt)
    return x.astype(dt)


def iinfo(dt: np.dtype):
    """np.iinfo that also knows int4 / uint4."""
    return ml_dtypes.iinfo(dt)


def is_float(name: str) -> bool:
    return name.startswith(("float", "bfloat")) and not is_mx(name)


def is_packed(name: str) -> bool:
    """An x4-packed MX data type."""
    return name in PACKED


def is_mx(name: str) -> bool:
    """An MX data or scale type: DMA cannot cast it (§3.4), the ALUs cannot read it."""
    return name in PACKED or name == "float8_e8m0fnu"
