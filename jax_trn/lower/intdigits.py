"""Exact integer products on an FP32 datapath: operands as signed base-256 digits, digit
products grouped so that every FP32 partial sum stays an exact integer.

An FP32 sum of integers is exact while every partial sum is within 2**24 in magnitude
(24-bit significand): TensorE accumulates FP32 in PSUM (§2.2), so an integer matmul
computed on it as FP32 (what the Neuron compiler does, §4 [DTYPES]) rounds above 2**24
and saturates where XLA wraps. Instead, modulo 2**W (W the bits of the result, whose
two's-complement value is all XLA keeps):

    x = sum_i d_i 256**i,   d_i in [-128, 127]   (`Digits`, one operand)
    x . y = sum_(i,j) (d_i . e_j) 256**(i+j),     pairs with 8(i+j) >= W vanish mod 2**W

A digit |d| <= 256 is exact in bf16 (8 significant bits), so digit matmuls run at the
BF16 rate (§2.2). `plan_groups` packs the (pair, k-tile) matmuls of one shift i + j into
PSUM accumulation groups whose worst-case sum of |products| stays within 2**24: 1024
rows of two [-128, 127] digits (8 k-tiles of 128). int8 x int8 is one pair: K <= 1024
is a single group, the int8 fast path.

Digits of x, on GpSimd's integer ALU (§2.5): with B = sum_(i<n-1) 128 * 256**i,
z = (x + B) ^ B in one tensor_scalar; then digit i is byte i of z read as int8, since
for a byte u of y = x + B, (u ^ 0x80) as int8 is u - 128 and x = y - B (copied to bf16
by VectorE/ScalarE: an int8 is exact in FP32). When the operand is narrower than the
result its top digit must carry the sign exactly: d_(n-1) = z >> 8(n-1), arithmetic, in
[-128, 128] ([0, 256] unsigned). An 8-bit operand is its own digit, DMA-cast to bf16
(a uint8 is split like wider operands when only its value mod 256 matters: its byte
read as int8 halves the digit bound).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jax_trn.hw import dtypes as hw_dtypes

EXACT = 1 << 24         # FP32 holds every integer up to 2**24 in magnitude (§2.2: PSUM FP32)
DIGIT_BITS = 8          # |digit| <= 256 is exact in bf16 (8 significant bits)


@dataclass(frozen=True)
class Digits:
    """How one operand becomes bf16 digit planes: value = sum_i d_i 256**i mod 2**W."""
    count: int
    bounds: tuple[int, ...]     # max |d_i|
    bias: int                   # B of z = (x + B) ^ B; 0: z = x
    top_shift: bool             # the top digit is z >> 8 (count - 1), else a byte of z
    direct: str | None          # a lone 8-bit digit: the operand itself, DMA-cast to bf16

    @property
    def bytes(self) -> int:
        """Digits that are bytes of z (all but a shifted top digit)."""
        return self.count - self.top_shift


def digits_of(dtype: str, bits: int) -> Digits:
    """The digits of a `dtype` operand of a product taken mod 2**`bits`.

    >>> digits_of("int8", 32)
    Digits(count=1, bounds=(128,), bias=0, top_shift=False, direct='int8')
    >>> digits_of("uint8", 8).direct, digits_of("uint8", 32).bounds
    (None, (255,))
    >>> digits_of("int32", 32)
    Digits(count=4, bounds=(128, 128, 128, 128), bias=8421504, top_shift=False, direct=None)
    >>> digits_of("int16", 32)
    Digits(count=2, bounds=(128, 128), bias=128, top_shift=True, direct=None)
    >>> digits_of("uint16", 64).bounds, digits_of("int16", 8).count
    ((128, 256), 1)
    """
    width = 8 * hw_dtypes.itemsize(dtype)
    if width >= bits:               # only the value mod 2**bits matters: all signed bytes
        n = bits // DIGIT_BITS
        return Digits(n, (128,) * n, _bias(n), False, "int8" if dtype == "int8" else None)
    n = width // DIGIT_BITS
    top = 128 if dtype.startswith("int") else (255 if n == 1 else 256)
    return Digits(n, (128,) * (n - 1) + (top,), _bias(n), n > 1, dtype if n == 1 else None)


def _bias(n: int) -> int:
    return sum(128 << (DIGIT_BITS * i) for i in range(n - 1))


@dataclass(frozen=True)
class Group:
    """Matmuls accumulated in one PSUM bank: (lhs digit, rhs digit, k-tile, rows) each,
    all of one shift (lhs digit + rhs digit)."""
    shift: int
    units: tuple[tuple[int, int, int, int], ...]


def pairs(lhs: Digits, rhs: Digits, bits: int) -> list[tuple[int, int]]:
    """Digit pairs that survive mod 2**bits.

    >>> len(pairs(digits_of("int32", 32), digits_of("int32", 32), 32))
    10
    >>> pairs(digits_of("int8", 8), digits_of("int8", 8), 8)
    [(0, 0)]
    """
    return [(i, j) for i in range(lhs.count) for j in range(rhs.count)
            if DIGIT_BITS * (i + j) < bits]


def plan_groups(lhs: Digits, rhs: Digits, bits: int, ktiles) -> list[Group]:
    """Accumulation groups over the k-tiles `ktiles` ((start, rows) each), highest shift
    first (the combine walks the shifts down, Horner-style); within a shift, k-tiles
    then pairs (the order the digit planes are loaded in), a new group whenever the
    worst-case |sum| would pass 2**24.

    >>> gs = plan_groups(digits_of("int8", 32), digits_of("int8", 32), 32,
    ...                  [(k, 128) for k in range(0, 2048, 128)])
    >>> [(g.shift, len(g.units)) for g in gs]
    [(0, 8), (0, 8)]
    >>> gs = plan_groups(digits_of("int32", 32), digits_of("int32", 32), 32,
    ...                  [(0, 128), (128, 128), (256, 128), (384, 128)])
    >>> [(g.shift, len(g.units)) for g in gs]
    [(3, 8), (3, 8), (2, 8), (2, 4), (1, 8), (0, 4)]
    """
    groups: list[Group] = []
    todo = pairs(lhs, rhs, bits)
    for s in sorted({i + j for i, j in todo}, reverse=True):
        units: list[tuple[int, int, int, int]] = []
        load = 0
        for jt, (_, rows) in enumerate(ktiles):
            for i, j in [p for p in todo if sum(p) == s]:
                bound = lhs.bounds[i] * rhs.bounds[j]
                if units and load + rows * bound > EXACT:
                    groups.append(Group(s, tuple(units)))
                    units, load = [], 0
                units.append((i, j, jt, rows))
                load += rows * bound
        groups.append(Group(s, tuple(units)))
    return groups


def fp32_exact(alu: str, dtype: str, count: int) -> bool:
    """Whether an FP32 datapath (VectorE, §2.3) reduces `count` values of `dtype` with
    `alu` to the exact integer result: every partial result within 2**24. Floats: yes
    (FP32 is their arithmetic); a product of integers: never (it wraps).

    >>> fp32_exact("add", "int8", 2048), fp32_exact("add", "int32", 2)
    (True, False)
    >>> fp32_exact("max", "uint16", 10 ** 9), fp32_exact("max", "int32", 1)
    (True, False)
    """
    if hw_dtypes.is_float(dtype):
        return True
    if dtype == "bool":
        bound = 1
    else:
        info = hw_dtypes.iinfo(hw_dtypes.np_dtype(dtype))
        bound = max(-int(info.min), int(info.max))
    if alu == "add":
        return count * bound <= EXACT
    return alu in ("max", "min") and bound <= EXACT
