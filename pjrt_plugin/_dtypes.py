"""PJRT_Buffer_Type <-> element type names (numpy / ml_dtypes spelling)."""
from __future__ import annotations

from jax_trn.hw.dtypes import BUFFER_TYPES

# PJRT_Buffer_Type enum values (C API 0.112).
_TO_NAME = {
    1: "bool", 2: "int8", 3: "int16", 4: "int32", 5: "int64",
    6: "uint8", 7: "uint16", 8: "uint32", 9: "uint64",
    10: "float16", 11: "float32", 12: "float64", 13: "bfloat16",
    14: "complex64", 15: "complex128", 16: "float8_e5m2", 17: "float8_e4m3fn",
    18: "float8_e4m3b11fnuz", 19: "float8_e5m2fnuz", 20: "float8_e4m3fnuz",
    21: "int4", 22: "uint4", 23: "token", 24: "int2", 25: "uint2",
    26: "float8_e4m3", 27: "float8_e3m4", 28: "float8_e8m0fnu", 29: "float4_e2m1fn",
    30: "int1", 31: "uint1",
}
_TO_PJRT = {v: k for k, v in _TO_NAME.items()}

# What a trn buffer holds (defined once, with the compiler's check: jax_trn.hw.dtypes):
# the device types and complex64 (interleaved float32 planes).
SUPPORTED = BUFFER_TYPES


class UnsupportedDtype(TypeError):
    pass


def to_name(pjrt_type: int) -> str:
    name = _TO_NAME.get(int(pjrt_type), f"PJRT_Buffer_Type {int(pjrt_type)}")
    if name not in SUPPORTED:
        raise UnsupportedDtype(
            f"element type {name} is not supported by the Trainium hardware "
            f"(supported: {', '.join(sorted(SUPPORTED))})")
    return name


def to_pjrt(name: str) -> int:
    return _TO_PJRT.get(name, 0)


def canonical(array, name: str):
    """Host data as the device holds it: a float4_e2m1fn value is its byte's low nibble
    (XLA's CPU client packs nibbles on transfer, dropping the high ones; ml_dtypes would
    read a stray high bit as the sign). Other types unchanged."""
    if name == "float4_e2m1fn":
        array.view("uint8")[...] &= 0xF
    return array
