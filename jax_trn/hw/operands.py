"""The operands of the instruction set: on-chip `Tile`s and DRAM access patterns
(`DramAP`), and `IsaError` (trainium-hardware.md §3.1, §3.4, §6.1).

The bottom of the ISA: instructions (isa_*.py), their semantics (semantics.py), costs
(costs.py) and the memories (memory.py) all build on these, and this module imports
nothing of the model but the element types and the spec's ISA-wide limits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

from . import dtypes as _dt
from .spec import AP_DIMS_MAX, INNER_STRIDE_MAX_BYTES, PMAX

__all__ = ["IsaError", "Tile", "DramAP", "Operand", "Scalar"]


class IsaError(ValueError):
    """An instruction was built with operands the hardware does not allow."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise IsaError(msg)


@dataclass(frozen=True)
class Tile:
    """A region of on-chip memory: partitions [start_partition, +num_partitions), and in
    each partition a block of shape `free` of `dtype` at byte `offset`: row-major and
    contiguous, or with `strides` (elements per free axis, negative to walk backwards;
    §3.1: an access pattern of up to 4 (size, stride) dims, the same for every
    partition)."""
    mem: str                      # "sbuf" | "psum"
    start_partition: int
    num_partitions: int
    offset: int                   # bytes from the start of each partition
    free: tuple[int, ...]         # free-axis shape
    dtype: str
    strides: tuple[int, ...] | None = None    # None: row-major, contiguous

    def __post_init__(self):
        _check(self.mem in ("sbuf", "psum"), f"bad memory {self.mem}")
        _check(0 <= self.start_partition and self.num_partitions >= 1
               and self.start_partition + self.num_partitions <= PMAX,
               f"partitions [{self.start_partition}, +{self.num_partitions}) outside 0..{PMAX}")
        _check(all(d >= 1 for d in self.free), f"empty free shape {self.free}")
        _dt.np_dtype(self.dtype)      # TypeError for a dtype the hardware lacks
        if self.strides is not None:
            _check(len(self.strides) == len(self.free) <= AP_DIMS_MAX and all(self.strides)
                   and all(abs(s) < 1 << 15 for s in self.strides),
                   f"strides {self.strides} for free shape {self.free}: up to 4 nonzero "
                   f"int16 element strides, one per free axis (§3.1)")
            # §3.1: an innermost stride above 16 bytes halves the engines' bandwidth; the
            # cost model does not price that, so such a pattern is refused, not mispriced.
            _check(abs(self.strides[-1]) * _dt.itemsize(self.dtype) <= INNER_STRIDE_MAX_BYTES,
                   f"innermost stride of {self.strides[-1]} x {self.dtype} exceeds "
                   f"{INNER_STRIDE_MAX_BYTES} bytes (half-bandwidth access, §3.1, not modelled)")

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.num_partitions, *self.free)

    @property
    def free_size(self) -> int:
        return math.prod(self.free)

    @property
    def bytes_per_partition(self) -> int:
        return self.free_size * _dt.itemsize(self.dtype)

    @property
    def nbytes(self) -> int:
        return self.num_partitions * self.bytes_per_partition

    @property
    def byte_range(self) -> tuple[int, int]:
        """[lo, hi): the bytes of each partition the tile touches. `offset` is element
        0's, which a negative stride puts above others."""
        if self.strides is None:
            return self.offset, self.offset + self.bytes_per_partition
        steps = [(n - 1) * s for n, s in zip(self.free, self.strides)]
        item = _dt.itemsize(self.dtype)
        return (self.offset + item * sum(d for d in steps if d < 0),
                self.offset + item * (sum(d for d in steps if d > 0) + 1))

    def with_(self, **kw) -> "Tile":
        return Tile(**{**self.__dict__, **kw})


@dataclass(frozen=True)
class DramAP:
    """An access pattern over a DRAM tensor: element `offset` plus (stride, num) pairs in
    elements, outermost first (the reverse of NKI's `.ap` order, §3.1). When the other
    side of a DMA is a Tile, the first pair walks partitions."""
    tensor: str
    offset: int
    pattern: tuple[tuple[int, int], ...]
    dtype: str

    def __post_init__(self):
        _check(all(num >= 1 for _, num in self.pattern),
               f"empty dimension in access pattern {self.pattern}")
        _dt.np_dtype(self.dtype)      # TypeError for a dtype the hardware lacks

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(n for _, n in self.pattern)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * _dt.itemsize(self.dtype)


Operand = Union[Tile, DramAP]
Scalar = Union[float, int, Tile]   # an immediate, or a [P, 1] tile of per-partition values
