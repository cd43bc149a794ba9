"""Spreading a tiled elementwise loop over VectorE, GpSimd and ScalarE.

Lowering rules put float elementwise work on VectorE (`tileops.engine_for`) and
transcendental functions on ScalarE. A long fused chain (a GELU epilogue and its
backward's residuals, a LayerNorm, an optimizer update) then keeps VectorE busy while
the other two engines idle. Yet the same instructions run elsewhere in the same FP32
arithmetic (semantics.py has one function per instruction, whatever its engine):

- GpSimd runs every float tensor_tensor / tensor_scalar / select / copy / memset
  VectorE does, on SBUF operands only (it cannot touch PSUM, §2.5, §6.2);
- ScalarE runs tensor_scalar (on Trn1/Trn2 with multiply/add operators only, §6.2)
  and tensor_copy, on SBUF or PSUM (§2.4, §6.2).

`Spreader.after_tile` schedules the compute instructions one tile emitted, in order, as
a list scheduler would: each goes to the engine where it would finish first, given
each engine's running load, when its inputs are ready (the finish of the instruction
in the tile that wrote them, plus the ~100-cycle static overhead of waiting on another
engine, §2.6) and the SBUF port VectorE and GpSimd share (`costs.shares_gpsimd_port`:
on NC-v2 they cannot access SBUF together; from NC-v3 VectorE's fast modes use GpSimd's
bus, §2.3, §2.6). Each instruction costs its cycles on the engine (§6.3) over the
engine's clock (§1.2). Ties keep the rule's engine. The estimate sees one kernel's
tiles only; the core model (`hw.core`) times the result, semaphores and port included.
Results are unchanged: only engines move.
"""
from __future__ import annotations

import dataclasses

from jax_trn.hw import isa
from jax_trn.hw.costs import shares_gpsimd_port
from jax_trn.hw.operands import IsaError
from jax_trn.hw.spec import CoreSpec
from jax_trn.hw.sync import accesses

__all__ = ["Spreader", "spreader"]

_TO_GPSIMD = (isa.TensorTensor, isa.TensorScalar, isa.Select, isa.TensorCopy, isa.Memset)
_TO_SCALAR = (isa.TensorScalar, isa.TensorCopy)
_FLOATS = ("float32", "bfloat16", "float16")
_ENGINES = ("vector", "gpsimd", "scalar")
WINDOW = 3      # earlier tiles whose buffers a tile may reuse (ring depths are 2-3)


def _tiles(ins: isa.Instr) -> list[isa.Tile]:
    return [v for v in ins.__dict__.values() if isinstance(v, isa.Tile)]


def _float_work(ins: isa.Instr, mems: tuple[str, ...]) -> bool:
    tiles = _tiles(ins)
    return (all(t.mem in mems and t.dtype in _FLOATS + ("bool",) for t in tiles)
            and any(t.dtype in _FLOATS for t in tiles))


def spreader(kb) -> "Spreader":
    """A Spreader for `kb`'s kernel, pricing instructions with its target's cost model."""
    return Spreader(kb, kb.target.core)


class Spreader:
    """Per-kernel state: when each engine, and the VectorE/GpSimd SBUF port, is next
    free (ns, in the estimate's own time)."""

    def __init__(self, kb, spec: CoreSpec):
        self.kb, self.spec = kb, spec
        self.free = dict.fromkeys(_ENGINES, 0.0)
        self.port = 0.0
        self.wait = {e: spec.static_overhead / spec.clock(e) for e in _ENGINES}
        self.recent: list[list] = []      # the last WINDOW tiles' (reads, writes, end, engine)

    def _variants(self, ins: isa.Instr) -> dict[str, isa.Instr]:
        """The engines `ins` may run on, with the instruction for each."""
        out = {ins.engine: ins}
        if ins.engine != "vector":
            return out
        if type(ins) in _TO_GPSIMD and _float_work(ins, ("sbuf",)):
            out["gpsimd"] = dataclasses.replace(ins, engine="gpsimd")
        if type(ins) in _TO_SCALAR and _float_work(ins, ("sbuf", "psum")):
            try:
                moved = dataclasses.replace(ins, engine="scalar")
                moved.check(self.spec)
                out["scalar"] = moved
            except IsaError:         # an operator ScalarE lacks on this generation
                pass
        return out

    def _ns(self, ins: isa.Instr) -> float:
        return ins.cycles(self.spec) / self.spec.clock(ins.engine)

    def after_tile(self, first: int) -> None:
        """Decides the engines of the compute instructions emitted since `first`."""
        instrs = self.kb.instrs
        tile: list[tuple[tuple, tuple, float, str]] = []
        for i in range(first, len(instrs)):
            ins = instrs[i]
            if getattr(ins, "engine", None) not in _ENGINES:
                continue
            reads, writes = accesses(ins)
            deps = self._deps(tile, reads, writes)
            best, best_end, best_port = None, None, None
            for engine, x in self._variants(ins).items():
                ready = max([end + (self.wait[engine] if e != engine else 0.0)
                             for end, e in deps] + [self.free[engine]])
                cost = self._ns(x)
                port = None
                if shares_gpsimd_port(x, self.spec):
                    ready = max(ready, self.port)
                    port = ready + cost
                if best_end is None or ready + cost < best_end:
                    best, best_end, best_port = x, ready + cost, port
            self.free[best.engine] = best_end
            if best_port is not None:
                self.port = best_port
            instrs[i] = best
            tile.append((tuple(reads), tuple(writes), best_end, best.engine))
        self.recent = (self.recent + [tile])[-WINDOW:]

    def _deps(self, tile, reads, writes) -> list[tuple[float, str]]:
        """(finish, engine) of the earlier instructions (this tile's and the last
        WINDOW tiles') an instruction reading `reads` and writing `writes` must follow:
        it reads what they wrote, or writes what they read or wrote (a ring buffer's
        slot reused by a later tile)."""
        out = []
        for entries in self.recent + [tile]:
            for r0, w0, end, engine in entries:
                if (any(_overlap(a, b) for a in w0 for b in reads + writes)
                        or any(_overlap(a, b) for a in r0 for b in writes)):
                    out.append((end, engine))
        return out


def _overlap(a: tuple, b: tuple) -> bool:
    """Whether two `sync.accesses` regions (space, p0, p1, lo, hi) share a byte."""
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2] and a[3] < b[4] and b[3] < a[4]
