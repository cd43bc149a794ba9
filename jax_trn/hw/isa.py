"""The NeuronCore instruction set, modelled on `nki.isa` (trainium-hardware.md §6.2).

Every instruction is a frozen dataclass with NKI-style keyword operands (`dst=`, `src=`,
`data=`, ...). Operands are `Tile`s (a region of SBUF or PSUM: a partition range and a
row-major free-axis block at a byte offset within each partition) or `DramAP`s (an
access pattern over a DRAM tensor in HBM). Operand constraints are checked when an
instruction is built (`__post_init__`), so a compiler bug is caught at the instruction;
constraints that depend on the generation are checked by `instr.check(spec)` when a
`NeuronCore` runs the kernel. `instr.execute(core)` applies it (semantics.py) and
`instr.cycles(spec)` prices it (costs.py, or the instruction's own `cycles` method).

This module holds the operands, the base class and the shared checks; the instructions
live in one module per family and are re-exported here (`isa.NcMatmul`, ...):
isa_dma.py, isa_tensor.py, isa_vector.py, isa_gpsimd.py.

| instruction          | engine               | meaning                                            |
|----------------------|----------------------|----------------------------------------------------|
| DmaCopy              | DMA queue            | dst = cast(src) through FP32; HBM/SBUF <-> HBM/SBUF|
| DmaGather            | DMA queue (swdge)    | dst[p, j] = table[indices[p, j]] (indirect rows)   |
| DmaScatter           | DMA queue (swdge)    | table[indices[p, j]] (+)= src[p, j] (indirect)     |
| DmaTranspose         | DMA queue (v3+)      | dst[B, A] = src[A, B], bit-exact, 2/4-byte types   |
| NcMatmul             | tensor               | dst[M,N] (+)= stationary[K,M].T @ moving[K,N]      |
| NcMatmulMx           | tensor (v4)          | as NcMatmul on MX data x E8M0 scales, K = 4 x P    |
| NcTranspose          | tensor / vector      | dst[F,P] = data[P,F]                               |
| Activation           | scalar               | dst = func(data * scale + bias); optional add-reduce|
| TensorTensor         | vector / gpsimd      | dst = data1 <op> data2                             |
| TensorScalar         | vector/scalar/gpsimd | dst = (data <op0> operand0) <op1> operand1         |
| ScalarTensorTensor   | vector               | dst = (data <op0> operand0) <op1> operand1 (tile)  |
| TensorReduce         | vector               | dst = reduce<op>(data) over free axes `axis`       |
| TensorPartitionReduce| gpsimd               | dst[1, F] = reduce<op>(data[P, F]) over partitions |
| TensorCopy           | vector/scalar/gpsimd | dst = cast(src)                                    |
| Memset               | vector / gpsimd      | dst = value                                        |
| Iota                 | gpsimd               | dst[p, f] = offset + p*channel_multiplier + pattern(f) |
| Select               | vector / gpsimd      | dst = on_true where pred != 0 else on_false        |
| AffineSelect         | gpsimd               | dst = on_true_tile where cmp(affine(p, f), 0) else on_false_value |
| Exponential          | vector (v4)          | dst = exp(src - max_value); reduce_res = sum(dst)  |
| QuantizeMx           | vector (v4)          | dst, dst_scale = MXFP8 x4 data + E8M0 scales of src|
| TensorTensorScan     | vector               | dst[:, i] = (data0[:, i] <op0> dst[:, i-1]) <op1> data1[:, i] |
| Max8                 | vector               | dst = the 8 largest values per partition           |
| FindIndex8           | vector               | dst = positions of 8 given values per partition    |
| MatchReplace8        | vector               | dst = data with 8 given values replaced            |

Engines compute in FP32 with casts on input and output (§2.3, §2.4, §4); integer
operands run natively on GpSimd (§2.5).

Checked at construction (IsaError):
- compute operands are Tiles; GpSimd never touches PSUM (§2.5); a tile of 65-128
  partitions starts at partition 0, of 33-64 at 0 or 64, of <=32 at a multiple of 32
  (§3.1); elementwise operands have equal partition counts and element counts, and
  may change partitions only within <=64-partition groups (§2.3); packed MX types
  (dtypes.py) only where an instruction takes them, or bit-exact copies;
- DmaCopy: Tile or DramAP on both sides, never PSUM, equal element counts (shapes
  may differ: the data is reshaped row-major); MX types are never cast (§3.4);
- NcMatmul: stationary/moving in SBUF with equal partitions (K), stationary free
  <= 128, dst [M, N] in PSUM, float inputs, FP32 only with FP32 (§2.2),
  `precision="tf32"` for FP32 operands rounded to TF32, `perf_mode="double_row"` for
  FP8 [K, 2, M] x [K, 2, N] (K = 2 x partitions);
- NcMatmulMx: x4 MX operands, partitions a multiple of 32, stationary free even
  <= 128, E8M0 scales in the layout of mx.py (§2.2);
- NcTranspose: tensor <= 128x128 SBUF -> PSUM, vector <= 32x32 (§6.2);
- TensorTensor, ScalarTensorTensor: not both tensor inputs in PSUM (§6.2);
  TensorReduce: free axes only; QuantizeMx: partitions a multiple of 32, free a
  multiple of 4 (§6.2).
Checked per generation by `check(spec)`: moving free size and PSUM banks, BF16 PSUM
and `float8_e4m3fn` (v4), double_row (v3+), MX / Exponential / QuantizeMx (v4),
DmaTranspose (v3+), DMA queue count; at run time (semantics.py), accumulating onto
PSUM data not written by a matmul (undefined on v2/v3, §2.2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Union

import numpy as np

from . import dtypes as _dt

PMAX = 128  # SBUF/PSUM partitions, §3.3 `pmax`
ENGINES = ("tensor", "vector", "scalar", "gpsimd")
_OUTPUT_FIELDS = ("dst", "reduce_res", "dst_scale")


class IsaError(ValueError):
    """An instruction was built with operands the hardware does not allow."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise IsaError(msg)


def _aligned(t: "Tile") -> bool:
    """§3.1 [NKI-ARCH1]: 65-128 partitions start at 0; 33-64 at 0 or 64; <=32 at a
    multiple of 32."""
    n, p = t.num_partitions, t.start_partition
    if n > 64:
        return p == 0
    return p in (0, 64) if n > 32 else p % 32 == 0


def _tile(t, what: str, engine: str, mem: str | None = None, mx: bool = False) -> None:
    """An on-chip operand of a compute engine (`mx`: packed MX types allowed)."""
    _check(isinstance(t, Tile), f"{what} must be an SBUF/PSUM Tile, got {type(t).__name__}")
    _check(mem is None or t.mem == mem, f"{what} must be in {mem}, not {t.mem}")
    _check(not (engine == "gpsimd" and t.mem == "psum"),
           f"GpSimd cannot access PSUM ({what}), §2.5")
    _check(_aligned(t), f"{what}: {t.num_partitions} partitions cannot start at "
           f"partition {t.start_partition}, §3.1")
    _check(mx or not _dt.is_packed(t.dtype), f"{what}: {t.dtype} is a packed MX type; "
           f"only nc_matmul_mx, quantize_mx and bit-exact copies take it, §6.2")


def _lanes(dst: "Tile", src: "Tile", what: str) -> None:
    """Elementwise: same lanes and element count. Data may change partitions only
    within <=64-partition groups (§2.3 [NKI-ARCH1])."""
    _check(dst.num_partitions == src.num_partitions and dst.free_size == src.free_size,
           f"{what}: shape {src.shape} does not match {dst.shape}")
    _check(dst.start_partition == src.start_partition or dst.num_partitions <= 64,
           f"{what}: more than 64 partitions cannot move across partitions, §2.3")


def _scalar(v, data: "Tile", what: str, engine: str) -> None:
    """An immediate or a [P, 1] tile of per-partition values (§2.4, §6.2)."""
    if isinstance(v, Tile):
        _tile(v, what, engine)
        _check(v.num_partitions == data.num_partitions and v.free_size == 1,
               f"{what} tile must be [{data.num_partitions}, 1], got {v.shape}")
    else:
        _check(isinstance(v, (int, float, np.integer, np.floating)),
               f"{what} must be a number or a [P, 1] tile, got {type(v).__name__}")


def _engine(instr, allowed: tuple[str, ...]) -> None:
    _check(instr.engine in allowed, f"{type(instr).__name__} cannot run on "
           f"{instr.engine!r} (allowed: {', '.join(allowed)})")


def _op(op: str, what: str = "ALU op") -> None:
    _check(op in _alu.ALU_OPS, f"unknown {what} {op!r}")


def _not_both_psum(a: "Tile", b: "Tile", what: str) -> None:
    _check(not (a.mem == b.mem == "psum"), f"{what} inputs cannot both be in PSUM, §6.2")


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
            _check(len(self.strides) == len(self.free) <= 4 and all(self.strides)
                   and all(abs(s) < 1 << 15 for s in self.strides),
                   f"strides {self.strides} for free shape {self.free}: up to 4 nonzero "
                   f"int16 element strides, one per free axis (§3.1)")
            # §3.1: an innermost stride above 16 bytes halves the engines' bandwidth; the
            # cost model does not price that, so such a pattern is refused, not mispriced.
            _check(abs(self.strides[-1]) * _dt.itemsize(self.dtype) <= 16,
                   f"innermost stride of {self.strides[-1]} x {self.dtype} exceeds 16 bytes "
                   f"(half-bandwidth access, §3.1, not modelled)")

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


@dataclass(frozen=True, kw_only=True)
class Instr:
    """Base of all instructions. `name` ties the instruction to its kernel and source op
    (for the profiler); `waits` are semaphore conditions (queue name, count) set by the
    sync pass, never by lowering rules."""
    name: str = ""
    waits: tuple[tuple[str, int], ...] = ()
    # True for TensorE instructions whose PSUM output may be accumulated onto (§2.2).
    matmul_output: ClassVar[bool] = False

    @property
    def queue(self) -> str:
        return self.engine  # type: ignore[attr-defined]

    def execute(self, core) -> None:
        """Apply the instruction's effect to `core` (its sbuf, psum, dram, numerics)."""
        _sem.execute(self, core)

    def cycles(self, spec) -> float:
        """Engine cycles on `spec` (a CoreSpec), §6.3. DMA instructions have no cycles:
        their duration comes from the DMA model (`costs.dma_shape`, `core`)."""
        return _costs.CYCLES[type(self)](self, spec)

    def check(self, spec) -> None:
        """Constraints that depend on the generation (raise IsaError)."""
        _costs.CHECKS[type(self)](self, spec)

    @property
    def flops(self) -> int:
        return 0

    def tiles(self) -> list[Tile]:
        """Every on-chip operand (for capacity checks)."""
        return [v for v in self.__dict__.values() if isinstance(v, Tile)]

    def outputs(self) -> list[Operand]:
        """The operands the instruction writes (`dst`, `reduce_res`, `dst_scale`)."""
        return [v for k, v in self.__dict__.items()
                if k in _OUTPUT_FIELDS and isinstance(v, (Tile, DramAP))]


# The instruction families, re-exported; then semantics and costs, which are attached
# by type and import the classes above (so they come last).
from .isa_dma import DmaCopy, DmaGather, DmaScatter, DmaTranspose  # noqa: E402
from .isa_tensor import NcMatmul, NcMatmulMx, NcTranspose  # noqa: E402
from .isa_vector import (Activation, Exponential, FindIndex8, MatchReplace8,  # noqa: E402
                         Max8, Memset, QuantizeMx, ScalarTensorTensor, Select,
                         TensorCopy, TensorReduce, TensorScalar, TensorTensor,
                         TensorTensorScan)
from .isa_gpsimd import AffineSelect, Iota, TensorPartitionReduce  # noqa: E402
from . import alu as _alu        # noqa: E402
from . import costs as _costs    # noqa: E402
from . import semantics as _sem  # noqa: E402

__all__ = ["IsaError", "Tile", "DramAP", "Operand", "Scalar", "Instr", "PMAX", "ENGINES",
           "DmaCopy", "DmaGather", "DmaScatter", "DmaTranspose", "NcMatmul", "NcMatmulMx",
           "NcTranspose", "Activation", "TensorTensor", "TensorScalar",
           "ScalarTensorTensor", "TensorReduce", "TensorPartitionReduce", "TensorCopy",
           "Memset", "Iota", "Select", "AffineSelect", "Exponential", "QuantizeMx",
           "TensorTensorScan", "Max8", "FindIndex8", "MatchReplace8"]
