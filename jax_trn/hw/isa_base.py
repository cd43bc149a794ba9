"""The base of every instruction, and the operand checks the instruction families share
(trainium-hardware.md §2.3, §2.5, §3.1, §6.2).

An instruction class names, in its own body, what it does and what it costs:

    semantics = _sem.nc_matmul        # fn(instr, core): its effect (semantics.py)
    cycles = _costs.nc_matmul         # fn(instr, spec) -> engine cycles (costs.py)
    check = _costs.check_matmul       # fn(instr, spec): generation constraints (optional)

A function assigned in a class body is a method, so `instr.cycles(spec)` calls
`costs.nc_matmul(instr, spec)`. Instructions import their semantics and costs, never the
other way round: semantics.py and costs.py know operands, not instruction classes, so
the modules form no import cycle. Every class must name its own `semantics` and
`cycles` (checked when the class is defined), so a subclass never silently inherits its
parent's (a DmaGather is not a DmaCopy to the hardware).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from . import alu as _alu
from . import dtypes as _dt
from . import semantics as _sem
from .operands import DramAP, Operand, Tile, _check
from .spec import PARTITION_MOVE_MAX, PARTITION_QUADRANT

__all__ = ["Instr", "ENGINES"]

ENGINES = ("tensor", "vector", "scalar", "gpsimd")
_OUTPUT_FIELDS = ("dst", "reduce_res", "dst_scale")
_BOUND = ("semantics", "cycles")     # what every instruction class names itself


def _aligned(t: Tile) -> bool:
    """§3.1 [NKI-ARCH1]: 65-128 partitions start at 0; 33-64 at 0 or 64; <=32 at a
    multiple of 32 (a quadrant)."""
    n, p, q = t.num_partitions, t.start_partition, PARTITION_QUADRANT
    if n > 2 * q:
        return p == 0
    return p in (0, 2 * q) if n > q else p % q == 0


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


def _lanes(dst: Tile, src: Tile, what: str) -> None:
    """Elementwise: same lanes and element count. Data may change partitions only
    within <=64-partition groups (§2.3 [NKI-ARCH1])."""
    _check(dst.num_partitions == src.num_partitions and dst.free_size == src.free_size,
           f"{what}: shape {src.shape} does not match {dst.shape}")
    _check(dst.start_partition == src.start_partition
           or dst.num_partitions <= PARTITION_MOVE_MAX,
           f"{what}: more than {PARTITION_MOVE_MAX} partitions cannot move across "
           f"partitions, §2.3")


def _scalar(v, data: Tile, what: str, engine: str) -> None:
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


def _not_both_psum(a: Tile, b: Tile, what: str) -> None:
    _check(not (a.mem == b.mem == "psum"), f"{what} inputs cannot both be in PSUM, §6.2")


@dataclass(frozen=True, kw_only=True)
class Instr:
    """Base of all instructions. `name` ties the instruction to its kernel and source op
    (for the profiler); `waits` are semaphore conditions (queue name, count) set by the
    sync pass, never by lowering rules."""
    name: str = ""
    waits: tuple[tuple[str, int], ...] = ()
    # True for TensorE instructions whose PSUM output may be accumulated onto (§2.2).
    matmul_output: ClassVar[bool] = False
    # TensorE: the operand LoadStationary puts in the PE array (§2.2); None: no LS.
    pe_weights: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        missing = [m for m in _BOUND if m not in vars(cls)]
        if missing:
            raise TypeError(f"instruction class {cls.__name__} must name its own "
                            f"{' and '.join(missing)} (see jax_trn/hw/isa_base.py)")

    @property
    def queue(self) -> str:
        return self.engine  # type: ignore[attr-defined]

    def execute(self, core) -> None:
        """Apply the instruction's effect to `core` (its sbuf, psum, dram, numerics),
        with the PSUM bookkeeping every instruction shares (semantics.execute)."""
        _sem.execute(self, core)

    def semantics(self, core) -> None:
        """The instruction's own effect (named by each class, from semantics.py)."""
        raise NotImplementedError(type(self).__name__)

    def cycles(self, spec) -> float:
        """Engine cycles on `spec` (a CoreSpec), §6.3. DMA instructions have no cycles:
        their duration comes from the DMA model (`costs.dma_shape`, `core`)."""
        raise NotImplementedError(type(self).__name__)

    def check(self, spec) -> None:
        """Constraints that depend on the generation (raise IsaError); none unless the
        class names them."""

    def vector_fast_mode(self, spec) -> bool:
        """Whether VectorE runs this instruction in a v3+ performance mode (§2.3), which
        holds the SBUF bus VectorE shares with GpSimd (`costs.shares_gpsimd_port`)."""
        return False

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
