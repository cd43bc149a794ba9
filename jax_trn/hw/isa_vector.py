"""VectorE / ScalarE instructions (trainium-hardware.md §2.3, §2.4, §6.2), and Memset /
Select, which also run on GpSimd; TensorReduce and TensorTensorScan have a GpSimd mode
for exact integer work (its 32-bit integer ALU, §2.5; VectorE computes in FP32, §2.3).

Each class names its semantics (semantics.py, semantics_mx.py) and its cost: the
original instructions' costs and generation checks are in costs.py, the newer ones
(ScalarTensorTensor, Exponential, QuantizeMx, TensorTensorScan, Max8, ...) carry their own
`cycles` / `check`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from . import alu as _alu
from . import costs as _costs
from . import dtypes as _dt
from . import mx as _mx
from . import semantics as _sem
from . import semantics_mx as _sem_mx
from .isa_base import Instr, _engine, _lanes, _not_both_psum, _op, _scalar, _tile
from .operands import Scalar, Tile, _check
from .spec import MAX8_FREE_MAX, MAX8_FREE_MIN, PARTITION_QUADRANT

__all__ = ["Activation", "TensorTensor", "TensorScalar", "ScalarTensorTensor",
           "TensorReduce", "TensorCopy", "Memset", "Select", "Exponential", "QuantizeMx",
           "TensorTensorScan", "Max8", "FindIndex8", "MatchReplace8"]

_BITVEC = ("bitwise_and", "bitwise_or", "bitwise_xor", "shift_left",
           "shift_right_logical", "shift_right_arithmetic")


@dataclass(frozen=True, kw_only=True)
class Activation(Instr):
    dst: Tile
    data: Tile
    func: str                     # "copy", "exp", "tanh", "gelu", ... (§2.4)
    scale: Scalar = 1.0
    bias: Scalar | None = None
    reduce_res: Tile | None = None   # [P, 1]: add-reduction of the result along F
    engine = "scalar"
    semantics = _sem.activation
    cycles = _costs.activation

    def __post_init__(self):
        _tile(self.data, "data", "scalar")
        _tile(self.dst, "dst", "scalar")
        _lanes(self.dst, self.data, "activation")
        _check(self.func in _alu.ACTIVATIONS, f"unknown activation function {self.func!r}")
        _scalar(self.scale, self.data, "scale", "scalar")
        if self.bias is not None:
            _scalar(self.bias, self.data, "bias", "scalar")
        if self.reduce_res is not None:
            _scalar(self.reduce_res, self.data, "reduce_res", "scalar")
            _check(isinstance(self.reduce_res, Tile), "reduce_res must be a [P, 1] tile")


@dataclass(frozen=True, kw_only=True)
class TensorTensor(Instr):
    dst: Tile
    data1: Tile
    data2: Tile
    op: str                       # ALU op name, §6.2: "add", "subtract", "multiply", ...
    engine: str = "vector"
    semantics = _sem.tensor_tensor
    cycles = _costs.tensor_tensor
    vector_fast_mode = _costs.tensor_tensor_fast_mode

    def __post_init__(self):
        _engine(self, ("vector", "gpsimd"))
        for what in ("dst", "data1", "data2"):
            _tile(getattr(self, what), what, self.engine)
        _lanes(self.dst, self.data1, "tensor_tensor data1")
        _lanes(self.data1, self.data2, "tensor_tensor data2")
        _not_both_psum(self.data1, self.data2, "tensor_tensor")
        _op(self.op)


@dataclass(frozen=True, kw_only=True)
class TensorScalar(Instr):
    dst: Tile
    data: Tile
    op0: str
    operand0: Scalar
    reverse0: bool = False        # True: operand0 <op0> data
    op1: str | None = None
    operand1: Scalar | None = None
    reverse1: bool = False
    engine: str = "vector"
    semantics = _sem.tensor_scalar
    cycles = _costs.tensor_scalar
    check = _costs.check_tensor_scalar
    vector_fast_mode = _costs.tensor_scalar_fast_mode

    def __post_init__(self):
        _engine(self, ("vector", "scalar", "gpsimd"))
        _tile(self.data, "data", self.engine)
        _tile(self.dst, "dst", self.engine)
        _lanes(self.dst, self.data, "tensor_scalar")
        _op(self.op0)
        _scalar(self.operand0, self.data, "operand0", self.engine)
        _check((self.op1 is None) == (self.operand1 is None),
               "op1 and operand1 go together")
        if self.op1 is not None:
            _op(self.op1)
            _scalar(self.operand1, self.data, "operand1", self.engine)


BN_STATS_FMAX = 512     # bn_stats free size limit, §2.3 / §3.x `bn_stats_fmax` [NKI-ISA]


@dataclass(frozen=True, kw_only=True)
class BnStats(Instr):
    """`bn_stats` (§6.2): per partition, (count, mean, variance * count) of the even and
    of the odd elements of `data` (F <= 512): 6 values, FP32 inside."""
    dst: Tile
    data: Tile
    engine = "vector"
    semantics = _sem.bn_stats
    cycles = _costs.bn_stats

    def __post_init__(self):
        _tile(self.data, "data", "vector")
        _tile(self.dst, "dst", "vector")
        _check(self.data.free_size <= BN_STATS_FMAX, f"bn_stats data has "
               f"{self.data.free_size} elements per partition, at most {BN_STATS_FMAX}, §6.2")
        _check(self.dst.num_partitions == self.data.num_partitions
               and self.dst.free_size == 6, f"bn_stats dst must be [{self.data.num_partitions},"
               f" 6], got {self.dst.shape}")


@dataclass(frozen=True, kw_only=True)
class BnAggr(Instr):
    """`bn_aggr` (§6.2): (mean, variance) per partition from one or more bn_stats
    outputs, (count, mean, variance * count) triples."""
    dst: Tile
    data: Tile
    engine = "vector"
    semantics = _sem.bn_aggr
    cycles = _costs.bn_aggr

    def __post_init__(self):
        _tile(self.data, "data", "vector")
        _tile(self.dst, "dst", "vector")
        _check(self.data.free_size % 3 == 0, f"bn_aggr data holds (count, mean, var*count) "
               f"triples: {self.data.free_size} elements per partition is no multiple of 3")
        _check(self.dst.num_partitions == self.data.num_partitions
               and self.dst.free_size == 2, f"bn_aggr dst must be [{self.data.num_partitions},"
               f" 2], got {self.dst.shape}")


@dataclass(frozen=True, kw_only=True)
class TensorReduce(Instr):
    dst: Tile
    data: Tile
    op: str                       # "add" | "max" | "min" | ...
    axis: tuple[int, ...] = (-1,)  # free axes of `data` (1-based: axis 0 is the partition)
    negate: bool = False
    # "gpsimd": an exact integer reduction on GpSimd's 32-bit integer ALU (§2.5; VectorE
    # computes in FP32, §2.3), priced like GpSimd's other compute (costs.py)
    engine: str = "vector"
    semantics = _sem.tensor_reduce
    cycles = _costs.tensor_reduce

    def __post_init__(self):
        _engine(self, ("vector", "gpsimd"))
        _tile(self.data, "data", self.engine)
        _tile(self.dst, "dst", self.engine)
        _op(self.op, "reduce op")
        axes = self.axes
        _check(len(set(axes)) == len(axes) and all(1 <= a <= len(self.data.free) for a in axes),
               f"reduce axes {self.axis} must be distinct free axes of {self.data.shape}")
        kept = [n for i, n in enumerate(self.data.free, 1) if i not in axes]
        _check(self.dst.num_partitions == self.data.num_partitions
               and self.dst.free_size == math.prod(kept),
               f"reducing {self.data.shape} over {self.axis} cannot give {self.dst.shape}")

    @property
    def axes(self) -> tuple[int, ...]:
        """The reduced axes of `data`'s full shape, normalised to positive."""
        ndim = 1 + len(self.data.free)
        return tuple(a + ndim if a < 0 else a for a in self.axis)


@dataclass(frozen=True, kw_only=True)
class TensorCopy(Instr):
    dst: Tile
    src: Tile
    engine: str = "vector"
    semantics = _sem.tensor_copy
    cycles = _costs.tensor_copy
    vector_fast_mode = _costs.tensor_copy_fast_mode

    def __post_init__(self):
        _engine(self, ("vector", "scalar", "gpsimd"))
        bits = self.src.dtype == self.dst.dtype      # packed MX types: bit copies only
        _tile(self.src, "src", self.engine, mx=bits)
        _tile(self.dst, "dst", self.engine, mx=bits)
        _lanes(self.dst, self.src, "tensor_copy")


@dataclass(frozen=True, kw_only=True)
class Memset(Instr):
    dst: Tile
    value: float | int
    engine: str = "vector"
    semantics = _sem.memset
    cycles = _costs.memset

    def __post_init__(self):
        _engine(self, ("vector", "gpsimd"))
        _tile(self.dst, "dst", self.engine)
        _scalar(self.value, self.dst, "value", self.engine)
        _check(not isinstance(self.value, Tile), "memset value must be a number")


@dataclass(frozen=True, kw_only=True)
class Select(Instr):
    dst: Tile
    pred: Tile
    on_true: Tile
    on_false: Tile
    engine: str = "vector"
    semantics = _sem.select
    cycles = _costs.select
    vector_fast_mode = _costs.select_fast_mode

    def __post_init__(self):
        _engine(self, ("vector", "gpsimd"))
        for what in ("dst", "pred", "on_true", "on_false"):
            _tile(getattr(self, what), what, self.engine)
            _lanes(self.dst, getattr(self, what), f"select {what}")


@dataclass(frozen=True, kw_only=True)
class ScalarTensorTensor(Instr):
    """`scalar_tensor_tensor` (§6.2): dst = (data <op0> operand0) <op1> operand1, the
    operand order of each op flipped by `reverse0` / `reverse1`. operand0 is an
    immediate or a [P, 1] tile; operand1 a tile shaped like data. Arithmetic ops only,
    in FP32 (VectorE)."""
    dst: Tile
    data: Tile
    op0: str
    operand0: Scalar
    op1: str
    operand1: Tile
    reverse0: bool = False
    reverse1: bool = False
    engine = "vector"
    semantics = _sem.scalar_tensor_tensor

    def __post_init__(self):
        for what in ("dst", "data", "operand1"):
            _tile(getattr(self, what), what, "vector")
        _lanes(self.dst, self.data, "scalar_tensor_tensor")
        _lanes(self.data, self.operand1, "scalar_tensor_tensor operand1")
        _not_both_psum(self.data, self.operand1, "scalar_tensor_tensor")
        for op in (self.op0, self.op1):
            _op(op)
            _check(op not in _BITVEC, f"scalar_tensor_tensor takes arithmetic ops only, "
                   f"not {op!r}, §6.2")
        _scalar(self.operand0, self.data, "operand0", "vector")

    def cycles(self, spec) -> float:
        """N for BF16 subtract-then-multiply with N even, else 2N (§6.3); at least
        MIN_II like every VectorE instruction (§2.3, §6.3)."""
        n = self.data.free_size
        bf16 = all(t.dtype == "bfloat16" for t in (self.dst, self.data, self.operand1))
        fast = bf16 and (self.op0, self.op1) == ("subtract", "multiply") and n % 2 == 0
        return float(max(spec.min_ii, n if fast else 2 * n))


@dataclass(frozen=True, kw_only=True)
class Exponential(Instr):
    """`exponential` (§2.3, v4): dst = exp(src - max_value) in FP32, and with
    `reduce_res` ([P, 1]) the running sum reduce_init + sum(exp(...)) per partition
    (the FP32 values before the cast to dst). The accumulator registers VectorE shares
    between instructions (`reduce_cmd`) are not modelled: each instruction starts its
    sum from `reduce_init` (reset_reduce / load_reduce)."""
    dst: Tile
    src: Tile
    max_value: Scalar = 0.0
    reduce_res: Tile | None = None
    reduce_init: float = 0.0
    engine = "vector"
    semantics = _sem.exponential

    def __post_init__(self):
        _tile(self.src, "src", "vector")
        _tile(self.dst, "dst", "vector")
        _lanes(self.dst, self.src, "exponential")
        _scalar(self.max_value, self.src, "max_value", "vector")
        if self.reduce_res is not None:
            _check(isinstance(self.reduce_res, Tile), "reduce_res must be a [P, 1] tile")
            _scalar(self.reduce_res, self.src, "reduce_res", "vector")

    def cycles(self, spec) -> float:
        """4x ScalarE's exp throughput (§2.3): ScalarE needs N scalar cycles, so this
        is N/4 scalar cycles in vector cycles; at least MIN_II (§6.3)."""
        ratio = spec.clock("vector") / spec.clock("scalar")
        speedup = spec.vector_exponential or 4      # 4: the v4 figure; check() rejects 0
        return float(max(spec.min_ii, self.src.free_size / speedup * ratio))

    def check(self, spec) -> None:
        _check(spec.vector_exponential > 0, f"exponential needs NC-v4, "
               f"not {spec.name}, §2.3")


_MX_FP8 = ("float8_e4m3fn_x4", "float8_e5m2_x4")


@dataclass(frozen=True, kw_only=True)
class QuantizeMx(Instr):
    """`quantize_mx` (§2.3, §4, v4): BF16/FP16 src [P, F] -> MXFP8 x4 dst [P, F/4]
    (packed value k of dst[p, j] is src[p, 4j + k] / scale) and E8M0 `dst_scale`, one
    per group of 8 partitions x 4 values, in the layout of mx.py. The scale is twice
    OCP's example value (§4). P a multiple of 32, F a multiple of 4 (§6.2)."""
    dst: Tile
    src: Tile
    dst_scale: Tile
    engine = "vector"
    semantics = _sem_mx.quantize_mx

    def __post_init__(self):
        src, dst, scale = self.src, self.dst, self.dst_scale
        _tile(src, "src", "vector", "sbuf")
        _tile(dst, "dst", "vector", "sbuf", mx=True)
        _tile(scale, "dst_scale", "vector", "sbuf")
        _check(src.dtype in ("bfloat16", "float16"), f"quantize_mx src must be BF16/FP16, "
               f"got {src.dtype}, §2.3")
        _check(dst.dtype in _MX_FP8, f"quantize_mx dst must be float8_e4m3fn_x4 or "
               f"float8_e5m2_x4, got {dst.dtype}, §6.2")
        _check(scale.dtype in _dt.MX_SCALE_TYPES, f"dst_scale must be uint8/"
               f"float8_e8m0fnu, got {scale.dtype}, §6.2")
        p, f = src.num_partitions, src.free_size
        _check(p % PARTITION_QUADRANT == 0 and f % _mx.PACK == 0, f"quantize_mx src "
               f"{src.shape}: partitions a multiple of {PARTITION_QUADRANT}, free size a "
               f"multiple of {_mx.PACK}, §6.2")
        _check(dst.num_partitions == p and dst.start_partition == src.start_partition
               and dst.free_size == f // 4, f"quantize_mx dst {dst.shape} is not "
               f"[{p}, {f // 4}] on the partitions of src")
        rows = _mx.scale_partitions(p)
        _check(scale.num_partitions == rows and scale.free_size == f // 4
               and scale.start_partition == dst.start_partition, f"dst_scale "
               f"{scale.shape} at partition {scale.start_partition} is not [{rows}, "
               f"{f // 4}] in the quadrants of dst")

    def cycles(self, spec) -> float:
        """4 elements per partition per cycle (§2.3); at least MIN_II (§6.3)."""
        per_cycle = spec.quantize_mx or 4           # 4: the v4 figure; check() rejects 0
        return float(max(spec.min_ii, math.ceil(self.src.free_size / per_cycle)))

    def check(self, spec) -> None:
        _check(spec.quantize_mx > 0, f"quantize_mx needs NC-v4, not "
               f"{spec.name}, §2.3")


@dataclass(frozen=True, kw_only=True)
class TensorTensorScan(Instr):
    """`tensor_tensor_scan` (§6.2, VectorE): per partition, along the free axis,

        dst[:, 0] = (data0[:, 0] <op0> initial) <op1> data1[:, 0]
        dst[:, i] = (data0[:, i] <op0> dst[:, i-1]) <op1> data1[:, i]

    `initial` is an immediate or a [P, 1] tile; arithmetic ops only, computed in FP32
    with the running value carried in FP32 (cast once on output), or natively in int64
    when every operand is an integer type (as the other ALU instructions, semantics.py).
    data0 and data1 cannot both be in PSUM. Cost max(MIN_II, 2N), §6.3.

    On GpSimd (`engine="gpsimd"`): the same recurrence on its 32-bit integer ALU (§2.5),
    exact for integers where VectorE's FP32 carry is not (§2.3); GpSimd is programmable
    (§2.5) and has no published scan cost, so it is priced like its other two-input
    compute, start-up + 2N (costs.py)."""
    dst: Tile
    data0: Tile
    data1: Tile
    initial: Scalar
    op0: str
    op1: str
    engine: str = "vector"
    semantics = _sem.tensor_tensor_scan

    def __post_init__(self):
        _engine(self, ("vector", "gpsimd"))
        for what in ("dst", "data0", "data1"):
            _tile(getattr(self, what), what, self.engine)
        _lanes(self.dst, self.data1, "tensor_tensor_scan data1")
        _check(self.data0.num_partitions == self.data1.num_partitions
               and self.data0.free_size == self.data1.free_size,
               f"tensor_tensor_scan data0 {self.data0.shape} does not match data1 "
               f"{self.data1.shape}")
        _not_both_psum(self.data0, self.data1, "tensor_tensor_scan")
        for op in (self.op0, self.op1):
            _op(op)
            _check(op not in _BITVEC, f"tensor_tensor_scan takes arithmetic ops only, "
                   f"not {op!r}, §6.2")
        _scalar(self.initial, self.data1, "initial", self.engine)

    def cycles(self, spec) -> float:
        """max(MIN_II, 2N), §6.3; on GpSimd start-up + 2N."""
        if self.engine == "gpsimd":
            return float(spec.gpsimd_startup + 2 * self.data1.free_size)
        return float(max(spec.min_ii, 2 * self.data1.free_size))


# --- max8 / nc_find_index8 / nc_match_replace8 (§6.2, §6.3) ---------------------------
#
# What the NKI docs state [NKI-ISA]: max8 reads 8 to 16,384 elements per partition
# (converted to FP32) and writes the 8 largest in descending order; nc_find_index8 writes
# the index of the first occurrence of each of 8 values (uint16 / uint32), pairing
# duplicate values with successive matching positions in ascending order, and the
# all-ones sentinel for a value not present; nc_match_replace8 replaces the first
# occurrence of each of the 8 values by an immediate, optionally writing the matched
# positions to `dst_idx`, duplicates in descending order across their columns.
# What they leave open, and what we chose: values are compared in FP32, so -0.0 equals
# +0.0 and NaN equals nothing (find_index8 / match_replace8 never match a NaN); max8
# ranks NaN above +inf, as the ALU's max propagates NaN (alu.py), and equal values keep
# their positions' order; match_replace8 ignores a value it cannot find (the docs say
# undefined) and writes the sentinel to its dst_idx slot, like find_index8. Engine:
# VectorE (stated for match_replace8, not for the other two). Cost: N engine cycles
# (§6.3 for max8 / find_index8; the 2.26 docstring gives match_replace8 "min(MIN_II, N)",
# read as max like every other VectorE instruction), at least MIN_II (§2.3).

_INDEX8_TYPES = ("uint16", "uint32")
MAX8_MIN, MAX8_MAX = MAX8_FREE_MIN, MAX8_FREE_MAX    # elements per partition


def _eight(t: Tile, what: str, parts: int) -> None:
    _tile(t, what, "vector")
    _check(t.num_partitions == parts and t.free_size == 8,
           f"{what} must be [{parts}, 8], got {t.shape}, §6.2")


def _search_data(t: Tile, what: str, lo: int) -> None:
    _tile(t, what, "vector")
    _check(len(t.free) <= 4, f"{what} has at most 4 free dims, got {t.shape}, §6.2")
    _check(lo <= t.free_size <= MAX8_MAX, f"{what}: {t.free_size} elements per "
           f"partition, not in [{lo}, {MAX8_MAX}], §6.2")


def _vector_n(n: int, spec) -> float:
    return float(max(spec.min_ii, n))


@dataclass(frozen=True, kw_only=True)
class Max8(Instr):
    """`max8` (§6.2): dst[p, :] = the 8 largest of src[p, ...] in descending order."""
    dst: Tile
    src: Tile
    engine = "vector"
    semantics = _sem.max8

    def __post_init__(self):
        _search_data(self.src, "max8 src", MAX8_MIN)
        _eight(self.dst, "max8 dst", self.src.num_partitions)

    def cycles(self, spec) -> float:
        return _vector_n(self.src.free_size, spec)


@dataclass(frozen=True, kw_only=True)
class FindIndex8(Instr):
    """`nc_find_index8` (§6.2): dst[p, j] = position of the first occurrence of
    vals[p, j] in data[p, ...] (duplicates: successive occurrences), else all ones."""
    dst: Tile
    data: Tile
    vals: Tile
    engine = "vector"
    semantics = _sem.find_index8

    def __post_init__(self):
        _search_data(self.data, "find_index8 data", MAX8_MIN)
        p = self.data.num_partitions
        _eight(self.vals, "find_index8 vals", p)
        _eight(self.dst, "find_index8 dst", p)
        _check(self.dst.dtype in _INDEX8_TYPES, f"find_index8 dst must be uint16/uint32, "
               f"not {self.dst.dtype}, §6.2")

    def cycles(self, spec) -> float:
        return _vector_n(self.data.free_size, spec)


@dataclass(frozen=True, kw_only=True)
class MatchReplace8(Instr):
    """`nc_match_replace8` (§6.2): dst = data with the first occurrence of each of
    vals[p, :] replaced by `imm`; dst_idx (optional) gets the matched positions."""
    dst: Tile
    data: Tile
    vals: Tile
    imm: float
    dst_idx: Tile | None = None
    engine = "vector"
    semantics = _sem.match_replace8

    def __post_init__(self):
        _search_data(self.data, "match_replace8 data", 1)
        p = self.data.num_partitions
        _eight(self.vals, "match_replace8 vals", p)
        _tile(self.dst, "match_replace8 dst", "vector")
        _lanes(self.dst, self.data, "match_replace8")
        _check(isinstance(self.imm, (int, float)), "match_replace8 imm must be a number")
        if self.dst_idx is not None:
            _eight(self.dst_idx, "match_replace8 dst_idx", p)
            _check(self.dst_idx.dtype in _INDEX8_TYPES, f"match_replace8 dst_idx must be "
                   f"uint16/uint32, not {self.dst_idx.dtype}, §6.2")

    def outputs(self):
        return [t for t in (self.dst, self.dst_idx) if t is not None]

    def cycles(self, spec) -> float:
        return _vector_n(self.data.free_size, spec)
