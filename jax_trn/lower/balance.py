"""Moving a tiled loop's VectorE tensor_scalar and tensor_copy work to ScalarE while
ScalarE has room (trainium-hardware.md §2.4, §6.2).

Lowering rules put float arithmetic on VectorE and transcendental functions on ScalarE
(`tileops.engine_for`). VectorE shares its SBUF port with GpSimd (§2.3, §2.6), and in
a fused loop like a cross-entropy gradient (an `exp` per element on ScalarE, several
VectorE instructions per element) VectorE bounds the tile while ScalarE idles. ScalarE
runs `tensor_scalar` with the operators its generation has (Trn2: add / subtract /
multiply / bypass, §6.2) and `tensor_copy`, in FP32 like VectorE (§2.3-2.4): the same
values, at max(MIN_II, N) cycles on ScalarE's clock (§6.3) against VectorE's N / 2 or
N / 4 (its performance modes, §2.3) on a slower clock (§1.2).

`ScalarBalance.after_tile` keeps the kernel's running VectorE, shared-port, ScalarE and
DMA loads (ns: each instruction's cycles over its engine's clock, a DMA's bytes over
the core's DMA rate at its descriptors' efficiency, §3.4) and moves a tile's movable
VectorE instructions, in program order, when the move lowers the compute side that
bounds the kernel (not when DMA does) -- and only when the tile's ScalarE work then
reads nothing its VectorE / GpSimd work wrote: ScalarE runs ahead and VectorE
consumes, which the in-order engines pipeline across tiles (spread.py's observation:
hops back and forth between engines stall a pipeline two tiles deep). Tiles otherwise
keep their engines, and spread.py may still move the rest of a tile's VectorE work to
GpSimd. Decisions depend only on the instructions: deterministic.
"""
from __future__ import annotations

import dataclasses

from jax_trn.hw import isa
from jax_trn.hw.costs import dma_shape, shares_gpsimd_port
from jax_trn.hw.operands import IsaError
from jax_trn.hw.spec import CoreSpec
from jax_trn.hw.sync import accesses

__all__ = ["ScalarBalance", "scalar_balance"]

_MOVABLE = (isa.TensorScalar, isa.TensorCopy)
_FLOATS = ("float32", "bfloat16", "float16")


def scalar_balance(kb) -> "ScalarBalance":
    """A ScalarBalance for `kb`'s kernel, priced with its target's cost model."""
    return ScalarBalance(kb, kb.target.core)


class ScalarBalance:
    """Per-kernel running loads (ns): VectorE, the VectorE/GpSimd SBUF port, ScalarE,
    DMA."""

    def __init__(self, kb, spec: CoreSpec):
        self.kb, self.spec = kb, spec
        self.vector = self.port = self.scalar = self.dma = 0.0
        self.counted = 0        # instructions before this index are in the loads

    def _ns(self, ins: isa.Instr) -> float:
        return ins.cycles(self.spec) / self.spec.clock(ins.engine)

    def after_tile(self, first: int) -> None:
        """Decides the engines of the instructions emitted since index `first` (see
        the module doc); a tile whose ScalarE work already waits for VectorE (AdamW's
        sqrt) keeps its engines: a move would queue the next tile's ScalarE work
        behind that wait."""
        instrs = self.kb.instrs
        for ins in instrs[self.counted:first]:    # the last tile as it ran (spread.py
            self._add(ins)                        # may have moved it), stores, loads
        self.counted = first
        loads = self.loads
        moves = self._moves(instrs, first)
        self.loads = loads                  # this tile counts once its engines are final
        for i, ins in (moves or {}).items():
            instrs[i] = ins

    def _moves(self, instrs: list, first: int) -> dict[int, isa.Instr] | None:
        """{index: the instruction on ScalarE} for the tile from `first`, its loads
        added; None when a ScalarE instruction would read VectorE / GpSimd output."""
        written, moves = [], {}
        for i in range(first, len(instrs)):
            ins = instrs[i]
            reads, writes = accesses(ins)
            moved = on_scalar(ins, self.spec)
            if moved is not None and not _touches(reads, written) and self._pays(ins, moved):
                moves[i] = ins = moved
            engine = getattr(ins, "engine", None)
            if engine == "scalar" and _touches(reads, written):
                return None
            self._add(ins)
            if engine in ("vector", "gpsimd"):
                written.extend(writes)
        return moves

    @property
    def loads(self) -> tuple[float, float, float, float]:
        return self.vector, self.port, self.scalar, self.dma

    @loads.setter
    def loads(self, value) -> None:
        self.vector, self.port, self.scalar, self.dma = value

    def _pays(self, ins: isa.Instr, moved: isa.Instr) -> bool:
        """Whether moving `ins` lowers the bound of a compute-bound kernel so far."""
        v = self._ns(ins)
        side = max(self.vector + v,
                   self.port + (v if shares_gpsimd_port(ins, self.spec) else 0.0))
        return self.scalar + self._ns(moved) < side and self.dma < side

    def _add(self, ins: isa.Instr) -> None:
        engine = getattr(ins, "engine", None)
        if isinstance(ins, isa.DmaCopy):
            chunk, _ = dma_shape(ins, self.spec)
            rate = self.spec.dma_bytes_per_ns * self.spec.dma_efficiency(chunk)
            self.dma += ins.nbytes / rate
        elif engine == "scalar":
            self.scalar += self._ns(ins)
        elif engine in ("vector", "gpsimd"):
            ns = self._ns(ins)
            self.vector += ns if engine == "vector" else 0.0
            self.port += ns if shares_gpsimd_port(ins, self.spec) else 0.0


def _touches(reads: list[tuple], written: list[tuple]) -> bool:
    return any(_overlap(a, b) for a in reads for b in written)


def _overlap(a: tuple, b: tuple) -> bool:
    """Whether two `sync.accesses` regions (space, p0, p1, lo, hi) share a byte."""
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2] and a[3] < b[4] and b[3] < a[4]


def on_scalar(ins: isa.Instr, spec: CoreSpec) -> isa.Instr | None:
    """`ins` as ScalarE runs it, or None: a VectorE tensor_scalar / tensor_copy of
    floats whose operators ScalarE has on `spec` (§6.2)."""
    if getattr(ins, "engine", None) != "vector" or type(ins) not in _MOVABLE:
        return None
    tiles = [v for v in ins.__dict__.values() if isinstance(v, isa.Tile)]
    if not all(t.dtype in _FLOATS and t.mem in ("sbuf", "psum") for t in tiles):
        return None
    moved = dataclasses.replace(ins, engine="scalar")
    try:
        moved.check(spec)
    except IsaError:
        return None
    return moved
