"""The NeuronCore instruction set, modelled on `nki.isa` (trainium-hardware.md §6.2).

Every instruction is a frozen dataclass with NKI-style keyword operands (`dst=`, `src=`,
`data=`, ...). Operands are `Tile`s (a region of SBUF or PSUM: a partition range and a
row-major free-axis block at a byte offset within each partition) or `DramAP`s (an
access pattern over a DRAM tensor in HBM). Operand constraints are checked when an
instruction is built (`__post_init__`), so a compiler bug is caught at the instruction;
constraints that depend on the generation are checked by `instr.check(spec)` when a
`NeuronCore` runs the kernel. `instr.execute(core)` applies it (semantics.py) and
`instr.cycles(spec)` prices it (costs.py).

| instruction    | engine                 | meaning                                                   |
|----------------|------------------------|-----------------------------------------------------------|
| DmaCopy        | DMA queue              | dst = cast(src) through FP32; HBM/SBUF <-> HBM/SBUF       |
| NcMatmul       | tensor                 | dst[M,N] (+)= stationary[K,M].T @ moving[K,N], FP32 PSUM  |
| NcTranspose    | tensor / vector        | dst[F,P] = data[P,F]                                      |
| Activation     | scalar                 | dst = func(data * scale + bias); optional add-reduce      |
| TensorTensor   | vector / gpsimd        | dst = data1 <op> data2                                    |
| TensorScalar   | vector / scalar/gpsimd | dst = (data <op0> operand0) <op1> operand1                |
| TensorReduce   | vector                 | dst = reduce<op>(data) over free axes `axis`              |
| TensorCopy     | vector/scalar/gpsimd   | dst = cast(src)                                           |
| Memset         | vector / gpsimd        | dst = value                                               |
| Iota           | gpsimd                 | dst[p, f] = offset + p*channel_multiplier + pattern(f)    |
| Select         | vector / gpsimd        | dst = on_true where pred != 0 else on_false               |

Engines compute in FP32 with casts on input and output (§2.3, §2.4, §4); integer
operands run natively on GpSimd (§2.5).

Checked at construction (IsaError):
- compute operands are Tiles; GpSimd never touches PSUM (§2.5); a tile of 65-128
  partitions starts at partition 0, of 33-64 at 0 or 64, of <=32 at a multiple of 32
  (§3.1); elementwise operands have equal partition counts and element counts, and
  may change partitions only within <=64-partition groups (§2.3);
- DmaCopy: Tile or DramAP on both sides, never PSUM, equal element counts (shapes
  may differ: the data is reshaped row-major);
- NcMatmul: stationary/moving in SBUF with equal partitions (K), stationary free
  <= 128, dst [M, N] in PSUM, float inputs, FP32 only with FP32 (§2.2),
  `precision="tf32"` for FP32 operands rounded to TF32, `perf_mode="double_row"` for
  FP8 [K, 2, M] x [K, 2, N];
- NcTranspose: tensor <= 128x128 SBUF -> PSUM, vector <= 32x32 (§6.2);
- TensorTensor: not both inputs in PSUM (§6.2); TensorReduce: free axes only.
"""
from __future__ import annotations

import math
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


def _aligned(t: "Tile") -> bool:
    """§3.1 [NKI-ARCH1]: 65-128 partitions start at 0; 33-64 at 0 or 64; <=32 at a
    multiple of 32."""
    n, p = t.num_partitions, t.start_partition
    if n > 64:
        return p == 0
    return p in (0, 64) if n > 32 else p % 32 == 0


def _tile(t, what: str, engine: str, mem: str | None = None) -> None:
    """An on-chip operand of a compute engine."""
    _check(isinstance(t, Tile), f"{what} must be an SBUF/PSUM Tile, got {type(t).__name__}")
    _check(mem is None or t.mem == mem, f"{what} must be in {mem}, not {t.mem}")
    _check(not (engine == "gpsimd" and t.mem == "psum"),
           f"GpSimd cannot access PSUM ({what}), §2.5")
    _check(_aligned(t), f"{what}: {t.num_partitions} partitions cannot start at "
           f"partition {t.start_partition}, §3.1")


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
        _check(all(d >= 1 for d in self.free), f"empty free shape {self.free}")
        _dt.np_dtype(self.dtype)      # TypeError for a dtype the hardware lacks

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

    @property
    def queue(self) -> str:
        return self.engine  # type: ignore[attr-defined]

    def execute(self, core) -> None:
        """Apply the instruction's effect to `core` (its sbuf, psum, dram, numerics)."""
        _sem.EXECUTE[type(self)](self, core)

    def cycles(self, spec) -> float:
        """Engine cycles on `spec` (a CoreSpec), §6.3. DmaCopy has no cycles: its
        duration comes from the DMA model (`costs.dma_ns`)."""
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


@dataclass(frozen=True, kw_only=True)
class DmaCopy(Instr):
    dst: Operand
    src: Operand
    dma_queue: int = 0

    def __post_init__(self):
        for what, v in (("dst", self.dst), ("src", self.src)):
            _check(isinstance(v, (Tile, DramAP)), f"DMA {what} must be a Tile or DramAP")
            _check(not isinstance(v, Tile) or v.mem == "sbuf",
                   f"DMA {what} must be in SBUF or DRAM, not PSUM, §3.4")
        _check(self.src_size == self.dst_size, f"DMA moves {self.src_size} elements "
               f"into {self.dst_size}")
        _check(self.dma_queue >= 0, f"bad DMA queue {self.dma_queue}")

    @property
    def queue(self) -> str:
        return f"dma{self.dma_queue}"

    engine = "dma"

    @property
    def src_size(self) -> int:
        return _size(self.src)

    @property
    def dst_size(self) -> int:
        return _size(self.dst)

    @property
    def nbytes(self) -> int:
        """Bytes moved (the wider side, when the DMA casts)."""
        return max(self.src.nbytes, self.dst.nbytes)

    @property
    def hbm_bytes(self) -> int:
        """Bytes read from plus written to DRAM."""
        return sum(v.nbytes for v in (self.src, self.dst) if isinstance(v, DramAP))


def _size(v: Operand) -> int:
    return v.size if isinstance(v, DramAP) else v.num_partitions * v.free_size


_MATMUL_DTYPES = ("float8_e4m3", "float8_e5m2", "float8_e4m3fn", "bfloat16", "float16",
                  "float32")


@dataclass(frozen=True, kw_only=True)
class NcMatmul(Instr):
    dst: Tile
    stationary: Tile
    moving: Tile
    accumulate: bool = False      # False: overwrite the PSUM region; True: add into it
    perf_mode: str = "none"       # "none" | "double_row" (v3+ FP8)
    precision: str = "native"     # "native" | "tf32": round FP32 operands to TF32 first
    engine = "tensor"

    def __post_init__(self):
        st, mv, dst = self.stationary, self.moving, self.dst
        _tile(st, "stationary", "tensor", "sbuf")
        _tile(mv, "moving", "tensor", "sbuf")
        _tile(dst, "dst", "tensor", "psum")
        _check(st.num_partitions == mv.num_partitions, f"contraction (partition) sizes "
               f"differ: stationary {st.shape}, moving {mv.shape}")
        _check(st.dtype in _MATMUL_DTYPES and mv.dtype in _MATMUL_DTYPES,
               f"TensorE takes float inputs only, got {st.dtype} x {mv.dtype}, §2.2")
        _check((st.dtype == "float32") == (mv.dtype == "float32"),
               f"if one matmul operand is FP32/TF32 the other must be too, §2.2 "
               f"({st.dtype} x {mv.dtype})")
        _check(self.precision in ("native", "tf32"), f"bad precision {self.precision!r}")
        _check(self.precision == "native" or st.dtype == "float32",
               "precision='tf32' needs FP32 operands")
        self._check_mode()
        _check(self.m <= PMAX, f"stationary free size {self.m} > {PMAX}, §2.2")
        _check(dst.num_partitions == self.m and dst.free_size == self.n,
               f"dst {dst.shape} is not [{self.m}, {self.n}]")
        _check(dst.dtype in ("float32", "bfloat16"), f"matmul dst must be FP32 (v4: or "
               f"BF16), got {dst.dtype}, §2.2")

    def _check_mode(self) -> None:
        st, mv = self.stationary, self.moving
        _check(self.perf_mode in ("none", "double_row"), f"bad perf_mode {self.perf_mode!r}")
        if self.perf_mode == "double_row":
            _check(st.dtype.startswith("float8") and mv.dtype.startswith("float8"),
                   "double_row needs FP8 operands, §2.2")
            _check(st.free[0] == 2 and mv.free[0] == 2, "double_row operands are "
                   "[K, 2, M] and [K, 2, N], §2.2")

    @property
    def rows(self) -> int:
        """Contraction length: partitions, x2 in double_row mode."""
        return self.stationary.num_partitions * (2 if self.perf_mode == "double_row" else 1)

    @property
    def m(self) -> int:
        return self.stationary.free_size // (2 if self.perf_mode == "double_row" else 1)

    @property
    def n(self) -> int:
        return self.moving.free_size // (2 if self.perf_mode == "double_row" else 1)

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.m * self.n


@dataclass(frozen=True, kw_only=True)
class NcTranspose(Instr):
    dst: Tile
    data: Tile
    engine: str = "tensor"

    def __post_init__(self):
        _engine(self, ("tensor", "vector"))
        d, dst = self.data, self.dst
        _tile(d, "data", self.engine, "sbuf" if self.engine == "tensor" else None)
        _tile(dst, "dst", self.engine, "psum" if self.engine == "tensor" else None)
        limit = PMAX if self.engine == "tensor" else 32     # §6.2 [NKI-ISA]
        _check(d.num_partitions <= limit and d.free_size <= limit,
               f"{self.engine} transpose is limited to {limit}x{limit}, got {d.shape}")
        _check(dst.num_partitions == d.free_size and dst.free_size == d.num_partitions,
               f"transpose of {d.shape} cannot be written to {dst.shape}")


@dataclass(frozen=True, kw_only=True)
class Activation(Instr):
    dst: Tile
    data: Tile
    func: str                     # "copy", "exp", "tanh", "gelu", ... (§2.4)
    scale: Scalar = 1.0
    bias: Scalar | None = None
    reduce_res: Tile | None = None   # [P, 1]: add-reduction of the result along F
    engine = "scalar"

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

    def __post_init__(self):
        _engine(self, ("vector", "gpsimd"))
        for what in ("dst", "data1", "data2"):
            _tile(getattr(self, what), what, self.engine)
        _lanes(self.dst, self.data1, "tensor_tensor data1")
        _lanes(self.data2, self.data1, "tensor_tensor data2")
        _check(not (self.data1.mem == self.data2.mem == "psum"),
               "tensor_tensor inputs cannot both be in PSUM, §6.2")
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


@dataclass(frozen=True, kw_only=True)
class TensorReduce(Instr):
    dst: Tile
    data: Tile
    op: str                       # "add" | "max" | "min" | ...
    axis: tuple[int, ...] = (-1,)  # free axes of `data` (1-based: axis 0 is the partition)
    negate: bool = False
    engine = "vector"

    def __post_init__(self):
        _tile(self.data, "data", "vector")
        _tile(self.dst, "dst", "vector")
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

    def __post_init__(self):
        _engine(self, ("vector", "scalar", "gpsimd"))
        _tile(self.src, "src", self.engine)
        _tile(self.dst, "dst", self.engine)
        _lanes(self.dst, self.src, "tensor_copy")


@dataclass(frozen=True, kw_only=True)
class Memset(Instr):
    dst: Tile
    value: float | int
    engine: str = "vector"

    def __post_init__(self):
        _engine(self, ("vector", "gpsimd"))
        _tile(self.dst, "dst", self.engine)
        _scalar(self.value, self.dst, "value", self.engine)
        _check(not isinstance(self.value, Tile), "memset value must be a number")


@dataclass(frozen=True, kw_only=True)
class Iota(Instr):
    dst: Tile
    pattern: tuple[tuple[int, int], ...]   # (step, num) over the free axes, outermost first
    offset: int = 0
    channel_multiplier: int = 0
    engine = "gpsimd"

    def __post_init__(self):
        _tile(self.dst, "dst", "gpsimd")
        size = math.prod(n for _, n in self.pattern)
        _check(size == self.dst.free_size,
               f"iota pattern {self.pattern} has {size} elements, dst {self.dst.free_size}")


@dataclass(frozen=True, kw_only=True)
class Select(Instr):
    dst: Tile
    pred: Tile
    on_true: Tile
    on_false: Tile
    engine: str = "vector"

    def __post_init__(self):
        _engine(self, ("vector", "gpsimd"))
        for what in ("dst", "pred", "on_true", "on_false"):
            _tile(getattr(self, what), what, self.engine)
            _lanes(self.dst, getattr(self, what), f"select {what}")


# Semantics and costs live in their own modules and are attached by type; imported last
# because they import the classes above.
from . import alu as _alu        # noqa: E402
from . import costs as _costs    # noqa: E402
from . import semantics as _sem  # noqa: E402
