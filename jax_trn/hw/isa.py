"""The NeuronCore instruction set, modelled on `nki.isa` (trainium-hardware.md §6.2).

Every instruction is a frozen dataclass with NKI-style keyword operands (`dst=`, `src=`,
`data=`, ...). Operands are `Tile`s (a region of SBUF or PSUM: a partition range and a
row-major free-axis block at a byte offset within each partition) or `DramAP`s (an
access pattern over a DRAM tensor in HBM). Operand constraints are checked when an
instruction is built (`__post_init__`), so a compiler bug is caught at the instruction.

| instruction    | engine                 | meaning                                                   |
|----------------|------------------------|-----------------------------------------------------------|
| DmaCopy        | DMA queue              | dst = cast(src) through FP32; HBM/SBUF <-> HBM/SBUF       |
| NcMatmul       | tensor                 | dst[M,N] (+)= stationary[K,M].T @ moving[K,N], FP32 PSUM  |
| NcTranspose    | tensor / vector        | dst[F,P] = data[P,F]                                      |
| Activation     | scalar                 | dst = func(data * scale + bias); optional add-reduce      |
| TensorTensor   | vector / gpsimd        | dst = data1 <op> data2                                    |
| TensorScalar   | vector / scalar/gpsimd | dst = (data <op0> operand0) <op1> operand1                |
| TensorReduce   | vector                 | dst = reduce<op>(data) over the last free axes            |
| TensorCopy     | vector/scalar/gpsimd   | dst = cast(src)                                           |
| Memset         | vector / gpsimd        | dst = value                                               |
| Iota           | gpsimd                 | dst[p, f] = offset + p*channel_multiplier + pattern(f)    |
| Select         | vector                 | dst = on_true where pred != 0 else on_false               |

Engines compute in FP32 with casts on input and output (§2.3, §2.4, §4); integer
operands run natively on GpSimd (§2.5).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np

from . import dtypes as _dt

PMAX = 128  # SBUF/PSUM partitions, §3.3 `pmax`
ENGINES = ("tensor", "vector", "scalar", "gpsimd")


class IsaError(ValueError):
    """An instruction was built with operands the hardware does not allow."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise IsaError(msg)


@dataclass(frozen=True)
class Tile:
    """A region of on-chip memory: partitions [start_partition, +num_partitions), and in
    each partition a row-major block of shape `free` of `dtype` at byte `offset`."""
    mem: str                      # "sbuf" | "psum"
    start_partition: int
    num_partitions: int
    offset: int                   # bytes from the start of each partition
    free: tuple[int, ...]         # free-axis shape, row-major, contiguous
    dtype: str

    def __post_init__(self):
        _check(self.mem in ("sbuf", "psum"), f"bad memory {self.mem}")
        _check(0 <= self.start_partition and self.num_partitions >= 1
               and self.start_partition + self.num_partitions <= PMAX,
               f"partitions [{self.start_partition}, +{self.num_partitions}) outside 0..{PMAX}")

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.num_partitions, *self.free)

    @property
    def free_size(self) -> int:
        return int(np.prod(self.free, dtype=np.int64))

    @property
    def bytes_per_partition(self) -> int:
        return self.free_size * _dt.itemsize(self.dtype)

    @property
    def nbytes(self) -> int:
        return self.num_partitions * self.bytes_per_partition

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

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(n for _, n in self.pattern)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

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

    @property
    def queue(self) -> str:
        return self.engine  # type: ignore[attr-defined]


@dataclass(frozen=True, kw_only=True)
class DmaCopy(Instr):
    dst: Operand
    src: Operand
    dma_queue: int = 0

    @property
    def queue(self) -> str:
        return f"dma{self.dma_queue}"

    engine = "dma"


@dataclass(frozen=True, kw_only=True)
class NcMatmul(Instr):
    dst: Tile
    stationary: Tile
    moving: Tile
    accumulate: bool = False      # False: overwrite the PSUM region; True: add into it
    perf_mode: str = "none"       # "none" | "double_row" (v3+ FP8)
    engine = "tensor"


@dataclass(frozen=True, kw_only=True)
class NcTranspose(Instr):
    dst: Tile
    data: Tile
    engine: str = "tensor"


@dataclass(frozen=True, kw_only=True)
class Activation(Instr):
    dst: Tile
    data: Tile
    func: str                     # "copy", "exp", "tanh", "gelu", ... (§2.4)
    scale: Scalar = 1.0
    bias: Scalar | None = None
    reduce_res: Tile | None = None   # [P, 1]: add-reduction of the result along F
    engine = "scalar"


@dataclass(frozen=True, kw_only=True)
class TensorTensor(Instr):
    dst: Tile
    data1: Tile
    data2: Tile
    op: str                       # ALU op name, §6.2: "add", "subtract", "multiply", ...
    engine: str = "vector"


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


@dataclass(frozen=True, kw_only=True)
class TensorReduce(Instr):
    dst: Tile
    data: Tile
    op: str                       # "add" | "max" | "min" | ...
    axis: tuple[int, ...] = (-1,)  # free axes of `data` (1-based: axis 0 is the partition)
    negate: bool = False
    engine = "vector"


@dataclass(frozen=True, kw_only=True)
class TensorCopy(Instr):
    dst: Tile
    src: Tile
    engine: str = "vector"


@dataclass(frozen=True, kw_only=True)
class Memset(Instr):
    dst: Tile
    value: float | int
    engine: str = "vector"


@dataclass(frozen=True, kw_only=True)
class Iota(Instr):
    dst: Tile
    pattern: tuple[tuple[int, int], ...]   # (step, num) over the free axes, outermost first
    offset: int = 0
    channel_multiplier: int = 0
    engine = "gpsimd"


@dataclass(frozen=True, kw_only=True)
class Select(Instr):
    dst: Tile
    pred: Tile
    on_true: Tile
    on_false: Tile
    engine: str = "vector"
