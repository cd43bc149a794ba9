"""Spreading tiled elementwise work over VectorE, GpSimd and ScalarE.

Lowering rules put float elementwise work on VectorE (`tileops.engine_for`). In a long
fused chain each tile's steps depend on one another, so moving single instructions to
another engine only lengthens the chain; but consecutive tiles are independent. GpSimd
runs every float tensor_tensor / tensor_scalar / select / copy / memset VectorE does,
in the same FP32 arithmetic (§2.3, §2.5), so a whole tile's VectorE work can go to
GpSimd while VectorE works on the next tile (ScalarE keeps its activations). A
scalar_tensor_tensor (folding.py; VectorE only, §6.2) moves as its tensor_scalar and
tensor_tensor when its destination is FP32 (the same FP32 intermediate).

`Spreader.after_tile` looks at the instructions one tile emitted and moves its VectorE
ones to GpSimd when all of them can move (GpSimd cannot touch PSUM, §6.2) and the tile
would finish earlier there. The estimate keeps three running loads: VectorE's,
GpSimd's, and the SBUF port the two share (`costs.shares_gpsimd_port`: on NC-v2 they
cannot access SBUF together; from NC-v3 VectorE's fast modes use GpSimd's bus, §2.3,
§2.6), each instruction costing its cycles on the engine (§6.3) over its clock (§1.2);
a tile finishes at the later of its engine's and the port's load. GpSimd pays its
start-up per instruction and has no fast modes, so BF16 chains rarely move; FP32 ones
split. The core model (`hw.core`) times the result, port included.

Matmul epilogues (`ListSpreader`): the first step of a drained chunk reads PSUM, which
GpSimd cannot, so a chunk never moves whole. There each instruction is scheduled as a
list scheduler would: it goes to the engine (VectorE; GpSimd for SBUF-only float work;
ScalarE for tensor_scalar with the operators it has, §6.2, and copies, §2.4) where it
would finish first, given the engines' running loads, when its inputs are ready (the
instruction that wrote them in this chunk or the last WINDOW ones, plus the ~100-cycle
wait on another engine, §2.6) and the shared port. In elementwise loops the same
instruction-level choice measured worse than whole tiles (the hops between engines
stall a pipeline two tiles deep: an AdamW update 1127 -> 1268 us), so loops keep tiles
whole.
"""
from __future__ import annotations

import dataclasses

from jax_trn.hw import isa
from jax_trn.hw.costs import shares_gpsimd_port
from jax_trn.hw.operands import IsaError
from jax_trn.hw.spec import CoreSpec
from jax_trn.hw.sync import accesses

__all__ = ["ListSpreader", "Spreader", "spreader"]

_MOVABLE = (isa.TensorTensor, isa.TensorScalar, isa.Select, isa.TensorCopy, isa.Memset)
_FLOATS = ("float32", "bfloat16", "float16")


def _tiles(ins: isa.Instr) -> list[isa.Tile]:
    return [v for v in ins.__dict__.values() if isinstance(v, isa.Tile)]


def _float_work(ins: isa.Instr, mems: tuple[str, ...]) -> bool:
    """Float work (bool masks allowed) whose tiles are all in `mems`."""
    tiles = _tiles(ins)
    return (all(t.mem in mems and t.dtype in _FLOATS + ("bool",) for t in tiles)
            and any(t.dtype in _FLOATS for t in tiles))


def _movable(ins: isa.Instr, reduces: bool = False) -> bool:
    """Whether GpSimd can run `ins` as VectorE does (SBUF operands only, §2.5); with
    `reduces`, a float TensorReduce too (the same FP32 reduction, semantics.py)."""
    kinds = _MOVABLE + (isa.TensorReduce,) if reduces else _MOVABLE
    return type(ins) in kinds and _float_work(ins, ("sbuf",))


def _on_gpsimd(ins: isa.Instr, reduces: bool = False) -> list[isa.Instr] | None:
    """`ins` as GpSimd runs it, or None when it cannot. A scalar_tensor_tensor (VectorE
    only, §6.2) becomes its tensor_scalar and tensor_tensor, the intermediate in its FP32
    destination: the same FP32 arithmetic as the one instruction (§2.3, §2.5)."""
    if _movable(ins, reduces):
        return [dataclasses.replace(ins, engine="gpsimd")]
    if not isinstance(ins, isa.ScalarTensorTensor) or ins.dst.dtype != "float32" or \
            not _float_work(ins, ("sbuf",)) or _overlap(_area(ins.dst), _area(ins.operand1)):
        return None             # (the tensor_scalar would overwrite operand1 first)
    first = isa.TensorScalar(dst=ins.dst, data=ins.data, op0=ins.op0, operand0=ins.operand0,
                             reverse0=ins.reverse0, engine="gpsimd")
    a, b = (ins.operand1, ins.dst) if ins.reverse1 else (ins.dst, ins.operand1)
    return [first, isa.TensorTensor(dst=ins.dst, data1=a, data2=b, op=ins.op1,
                                    engine="gpsimd")]


def spreader(kb, reduces: bool = False) -> "Spreader":
    """A Spreader for `kb`'s kernel, pricing instructions with its target's cost model;
    `reduces`: tiles with float reductions along F move too (a row fusion's, rows.py)."""
    return Spreader(kb, kb.target.core, reduces)


class Spreader:
    """Per-kernel state: the running VectorE and GpSimd loads (ns) of spread tiles."""

    def __init__(self, kb, spec: CoreSpec, reduces: bool = False):
        self.kb, self.spec, self.reduces = kb, spec, reduces
        self.load = {"vector": 0.0, "gpsimd": 0.0}
        self.port = 0.0         # time the two engines' shared SBUF port is held

    def _ns(self, ins: isa.Instr, engine: str) -> float:
        if ins.engine != engine:
            ins = dataclasses.replace(ins, engine=engine)
        return ins.cycles(self.spec) / self.spec.clock(engine)

    def after_tile(self, first: int) -> None:
        """Decides the engine of the VectorE instructions emitted since index `first`."""
        instrs = self.kb.instrs
        idx = [i for i in range(first, len(instrs)) if getattr(instrs[i], "engine", "") == "vector"]
        if not idx:
            return
        moved = {"vector": [instrs[i] for i in idx]}
        on_gpsimd = [_on_gpsimd(instrs[i], self.reduces) for i in idx]
        if all(x is not None for x in on_gpsimd):
            moved["gpsimd"] = [y for x in on_gpsimd for y in x]
        cost = {e: sum(self._ns(x, e) for x in moved[e]) for e in moved}
        port = {e: sum(self._ns(x, e) for x in moved[e] if shares_gpsimd_port(x, self.spec))
                for e in moved}

        def finish(e):
            return max(self.load[e] + cost[e], self.port + port[e])
        best = min(moved, key=lambda e: (finish(e), e != "vector"))
        self.load[best] += cost[best]
        self.port += port[best]
        if best == "gpsimd":
            swap = dict(zip(idx, on_gpsimd))
            instrs[first:] = [y for i in range(first, len(instrs))
                              for y in swap.get(i, [instrs[i]])]


_TO_SCALAR = (isa.TensorScalar, isa.TensorCopy)
_ENGINES = ("vector", "gpsimd", "scalar")
WINDOW = 3      # earlier tiles whose buffers a tile may reuse (ring depths are 2-3)


class ListSpreader:
    """Instruction-level spreading for matmul epilogues (see the module docstring):
    when each engine, and the VectorE/GpSimd SBUF port, is next free (ns, in the
    estimate's own time), and the last WINDOW tiles' accesses."""

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
        if _movable(ins):
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


def _area(t: isa.Tile) -> tuple:
    """A tile's (space, p0, p1, lo, hi), as `sync.accesses` gives regions."""
    return (t.mem, t.start_partition, t.start_partition + t.num_partitions, *t.byte_range)


def _overlap(a: tuple, b: tuple) -> bool:
    """Whether two `sync.accesses` regions (space, p0, p1, lo, hi) share a byte."""
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2] and a[3] < b[4] and b[3] < a[4]
