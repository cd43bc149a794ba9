"""Microscaling (MX) numerics: packed x4 types, E8M0 scales, group quantization.

OCP MX v1.0 as Trainium3 does it (trainium-hardware.md §2.2, §2.3, §4 [NKI-ARCH3]
[NKI-ISA]):

- A group is 32 values: 8 partitions x the 4 values of one x4-packed element. Its
  scale is one E8M0 byte, 2**(bits - 127); bits 0xFF is NaN.
- `quantize` picks the scale from the group's largest magnitude. OCP's example
  algorithm uses 2**(floor(log2(amax)) - emax), emax the element type's largest
  exponent (8 for E4M3, 15 for E5M2, 2 for E2M1); `quantize_mx` uses twice that
  (§4), so |value / scale| < 2**emax and rounding can never overflow. A group holding
  Inf or NaN gets a NaN scale; an all-zero group gets the smallest scale (bits 0).
- Scale tile layout (the `quantize_mx` / `nc_matmul_mx` docstrings [NKI-ISA]): a data
  tile of P partitions has groups g = p // 8. With P = 32 the scale tile has 4
  partitions, group g in partition g; otherwise it has P partitions and group g sits
  in partition 32 * (g // 4) + g % 4, i.e. the first 4 partitions of each quadrant.
  Scale column j belongs to packed data column j. (Hardware may also use the second
  8 partitions of a quadrant; we model the first only.)
"""
from __future__ import annotations

import numpy as np

from . import dtypes as _dt
from .spec import MX_GROUP_PARTITIONS, PARTITION_QUADRANT

__all__ = ["pack", "unpack", "scale_rows", "scale_values", "quantize", "dequantize",
           "EMAX"]

GROUP_PARTITIONS = MX_GROUP_PARTITIONS    # §2.2: a group spans 8 partitions x 4 values
PACK = 4                                  # values per packed element (the "_x4" types)
_SCALE_ROWS = PARTITION_QUADRANT // GROUP_PARTITIONS   # 4 scale rows per quadrant
EMAX = {"float8_e4m3fn": 8, "float8_e5m2": 15, "float4_e2m1fn": 2}   # OCP MX v1.0
_E8M0_BIAS = 127


def _element(packed: str) -> np.dtype:
    return _dt.PACKED[packed]


def unpack(raw: np.ndarray, packed: str) -> np.ndarray:
    """Packed elements [..., F] (uint32 / uint16) -> FP32 values [..., F, 4]."""
    elem = _element(packed)
    raw = np.ascontiguousarray(raw)
    if elem.itemsize == 1 and raw.dtype.itemsize == 4:          # FP8 x4: bytes
        codes = raw.astype("<u4").view(np.uint8).reshape(*raw.shape, PACK)
    else:                                                       # FP4 x4: nibbles
        shifts = np.arange(PACK, dtype=np.uint16) * 4
        codes = ((raw[..., None] >> shifts) & 0xF).astype(np.uint8)
    return codes.view(elem).astype(np.float32)


def pack(values: np.ndarray, packed: str) -> np.ndarray:
    """Element-typed codes [..., F, 4] (already rounded) -> packed elements [..., F]."""
    elem = _element(packed)
    codes = np.ascontiguousarray(values.astype(elem)).view(np.uint8)
    if elem.itemsize == 1 and _dt.itemsize(packed) == 4:
        return codes.reshape(*codes.shape[:-1], PACK).view("<u4")[..., 0].astype(np.uint32)
    nibbles = (codes & 0xF).astype(np.uint16) << (np.arange(PACK, dtype=np.uint16) * 4)
    return np.bitwise_or.reduce(nibbles, axis=-1).astype(np.uint16)


def _e8m0(bits: np.ndarray) -> np.ndarray:
    """E8M0 bytes -> FP32 scales 2**(bits - 127); 0xFF is NaN."""
    exp = bits.astype(np.int32) - _E8M0_BIAS
    scale = np.ldexp(np.float32(1.0), np.minimum(exp, 127)).astype(np.float32)
    return np.where(bits == 0xFF, np.float32(np.nan), scale)


def scale_rows(partitions: int) -> np.ndarray:
    """Scale-tile partition of each group g = p // 8 of a `partitions`-row data tile."""
    g = np.arange(partitions // GROUP_PARTITIONS)
    q = PARTITION_QUADRANT
    return g if partitions == q else q * (g // _SCALE_ROWS) + g % _SCALE_ROWS


def scale_partitions(partitions: int) -> int:
    """Partitions of the scale tile that goes with a data tile of `partitions`."""
    return _SCALE_ROWS if partitions == PARTITION_QUADRANT else partitions


def scale_values(scale_tile: np.ndarray, partitions: int) -> np.ndarray:
    """FP32 scale per data partition and packed column: [partitions, F]."""
    bits = scale_tile.reshape(scale_tile.shape[0], -1).view(np.uint8)
    return np.repeat(_e8m0(bits[scale_rows(partitions)]), GROUP_PARTITIONS, axis=0)


def dequantize(raw: np.ndarray, packed: str, scale_tile: np.ndarray) -> np.ndarray:
    """Packed data [P, F] and its scale tile -> FP32 values [P, F, 4]."""
    p = raw.shape[0]
    values = unpack(raw.reshape(p, -1), packed)
    return values * scale_values(scale_tile, p)[..., None]


def _exponent_bits(amax: np.ndarray, emax: int) -> np.ndarray:
    """E8M0 bits of the scale 2 * 2**(floor(log2(amax)) - emax), clamped (§4)."""
    _, e = np.frexp(amax.astype(np.float32))        # amax = m * 2**e, m in [0.5, 1)
    bits = (e - 1) - emax + 1 + _E8M0_BIAS
    bits = np.where(amax > 0, np.clip(bits, 0, 254), 0)
    return np.where(np.isfinite(amax), bits, 0xFF).astype(np.uint8)


def quantize(x: np.ndarray, element: str, cast) -> tuple[np.ndarray, np.ndarray]:
    """FP32 values [P, F] (P a multiple of 8, F of 4) -> (element-typed values
    [P, F/4, 4], E8M0 bits [P/8, F/4]). `cast(values, dtype)` rounds (RNE or SR)."""
    p, f = x.shape
    groups = x.reshape(p // GROUP_PARTITIONS, GROUP_PARTITIONS, f // PACK, PACK)
    with np.errstate(invalid="ignore"):
        amax = np.abs(groups).max(axis=(1, 3))               # [P/8, F/4], NaN-propagating
    bits = _exponent_bits(amax, EMAX[element])
    scale = np.repeat(_e8m0(bits), GROUP_PARTITIONS, axis=0)[..., None]  # [P, F/4, 1]
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = (x.reshape(p, f // PACK, PACK) / scale).astype(np.float32)
    return cast(scaled, np.dtype(_dt.PACKED[element + "_x4"])), bits
