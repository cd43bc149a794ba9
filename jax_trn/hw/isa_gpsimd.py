"""GpSimd instructions (trainium-hardware.md §2.5, §6.2): iota, partition reduce,
affine select. GpSimd cannot touch PSUM (§2.5), which `_tile` enforces.

Iota's cost is in costs.py; the newer instructions carry their own `cycles`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import alu as _alu
from . import costs as _costs
from . import dtypes as _dt
from . import semantics as _sem
from .isa_base import Instr, _lanes, _tile
from .operands import Tile, _check
from .spec import AP_DIMS_MAX

__all__ = ["Iota", "TensorPartitionReduce", "AffineSelect"]

# §6.2 [NKI-ISA] `tensor_partition_reduce` docstring: add, max, bitwise_or, bitwise_and.
_PARTITION_REDUCE_OPS = ("add", "max", "bitwise_or", "bitwise_and")
_COMPARE_OPS = ("is_equal", "not_equal", "is_lt", "is_le", "is_gt", "is_ge")


def _pattern(pattern, dst: Tile, what: str) -> None:
    """An affine [step, num] pattern of up to 4 dims covering dst's free elements."""
    _check(1 <= len(pattern) <= AP_DIMS_MAX,
           f"{what} pattern {pattern} must have 1-{AP_DIMS_MAX} dims, §6.2")
    size = math.prod(n for _, n in pattern)
    _check(size == dst.free_size,
           f"{what} pattern {pattern} has {size} elements, dst {dst.free_size}")


@dataclass(frozen=True, kw_only=True)
class Iota(Instr):
    dst: Tile
    pattern: tuple[tuple[int, int], ...]   # (step, num) over the free axes, outermost first
    offset: int = 0
    channel_multiplier: int = 0
    engine = "gpsimd"
    semantics = _sem.iota
    cycles = _costs.iota

    def __post_init__(self):
        _tile(self.dst, "dst", "gpsimd")
        _pattern(self.pattern, self.dst, "iota")


@dataclass(frozen=True, kw_only=True)
class TensorPartitionReduce(Instr):
    """`tensor_partition_reduce` (§6.2): dst[1, F] = reduce<op>(data[P, F]) across
    partitions; floats in FP32, integers natively (§2.5)."""
    dst: Tile
    data: Tile
    op: str
    engine = "gpsimd"
    semantics = _sem.tensor_partition_reduce

    def __post_init__(self):
        _tile(self.data, "data", "gpsimd")
        _tile(self.dst, "dst", "gpsimd")
        _check(self.op in _PARTITION_REDUCE_OPS, f"tensor_partition_reduce op must be "
               f"one of {', '.join(_PARTITION_REDUCE_OPS)}, got {self.op!r}, §6.2")
        _check(not self.op.startswith("bitwise") or not _dt.is_float(self.data.dtype),
               f"{self.op} needs integer data, got {self.data.dtype}")
        _check(self.dst.num_partitions == 1 and self.dst.free_size == self.data.free_size,
               f"reducing {self.data.shape} across partitions cannot give "
               f"{self.dst.shape}; expected [1, {self.data.free_size}]")

    def cycles(self, spec) -> float:
        """No published cost (§2.5); our model from the GpSimd geometry: start-up
        (~150), each processor folds its 16 partitions at 512 bits per cycle, then
        log2(processors) steps combine the partial rows."""
        item = _dt.itemsize(self.data.dtype)
        n = self.data.free_size
        per_proc = spec.pmax // spec.gpsimd_processors          # 16 partitions, §2.5
        port = spec.gpsimd_port_bytes
        procs = math.ceil(self.data.num_partitions / per_proc)
        local = math.ceil(n * item * per_proc / port)
        combine = math.ceil(math.log2(procs)) * math.ceil(n * item / port)
        return float(spec.gpsimd_startup + local + combine)


@dataclass(frozen=True, kw_only=True)
class AffineSelect(Instr):
    """`affine_select` (§6.2): with a = offset + p * channel_multiplier + sum(step_k *
    i_k) over the (up to 4-D) `pattern`, dst = on_true_tile where cmp_op(a, 0) else
    on_false_value (an FP32 immediate). Selected values are copied through FP32 when
    the dtypes differ. The usual causal mask: pattern [[-1, F]], channel_multiplier 1,
    cmp_op "is_ge"."""
    dst: Tile
    on_true_tile: Tile
    on_false_value: float
    pattern: tuple[tuple[int, int], ...]   # (step, num) over the free axes, outermost first
    offset: int = 0
    channel_multiplier: int = 0
    cmp_op: str = "is_equal"
    engine = "gpsimd"
    semantics = _sem.affine_select

    def __post_init__(self):
        _tile(self.dst, "dst", "gpsimd", "sbuf")
        _tile(self.on_true_tile, "on_true_tile", "gpsimd", "sbuf")
        _lanes(self.dst, self.on_true_tile, "affine_select")
        _pattern(self.pattern, self.dst, "affine_select")
        op = _alu.ALIASES.get(self.cmp_op, self.cmp_op)
        _check(op in _COMPARE_OPS, f"affine_select cmp_op must be a comparison, got "
               f"{self.cmp_op!r}")
        _check(isinstance(self.on_false_value, (int, float, np.integer, np.floating)),
               "on_false_value must be a number (FP32)")

    def cycles(self, spec) -> float:
        """~150 + N (§6.3)."""
        return float(spec.gpsimd_startup + self.dst.free_size)
