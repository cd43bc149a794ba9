"""Spreading a tiled elementwise loop over VectorE and GpSimd, a tile at a time.

Lowering rules put float elementwise work on VectorE (`tileops.engine_for`). In a long
fused chain each tile's steps depend on one another, so moving single instructions to
another engine only lengthens the chain; but consecutive tiles are independent. GpSimd
runs every float tensor_tensor / tensor_scalar / select / copy / memset VectorE does,
in the same FP32 arithmetic (§2.3, §2.5), so a whole tile's VectorE work can go to
GpSimd while VectorE works on the next tile (ScalarE keeps its activations).

`Spreader.after_tile` looks at the instructions one tile emitted and moves its VectorE
ones to GpSimd when all of them can move (GpSimd cannot touch PSUM, §6.2) and the tile
would finish earlier there. The estimate keeps three running loads: VectorE's,
GpSimd's, and the SBUF port the two share (`costs.shares_gpsimd_port`: on NC-v2 they
cannot access SBUF together; from NC-v3 VectorE's fast modes use GpSimd's bus, §2.3,
§2.6), each instruction costing its cycles on the engine (§6.3) over its clock (§1.2);
a tile finishes at the later of its engine's and the port's load. GpSimd pays its
start-up per instruction and has no fast modes, so BF16 chains rarely move; FP32 ones
split. The core model (`hw.core`) times the result, port included.
"""
from __future__ import annotations

import dataclasses

from jax_trn.hw import isa
from jax_trn.hw.costs import shares_gpsimd_port
from jax_trn.hw.spec import CoreSpec

__all__ = ["Spreader", "spreader"]

_MOVABLE = (isa.TensorTensor, isa.TensorScalar, isa.Select, isa.TensorCopy, isa.Memset)
_FLOATS = ("float32", "bfloat16", "float16")


def _tiles(ins: isa.Instr) -> list[isa.Tile]:
    return [v for v in ins.__dict__.values() if isinstance(v, isa.Tile)]


def _movable(ins: isa.Instr) -> bool:
    return (type(ins) in _MOVABLE
            and all(t.mem == "sbuf" and t.dtype in _FLOATS + ("bool",) for t in _tiles(ins))
            and any(t.dtype in _FLOATS for t in _tiles(ins)))


def spreader(kb) -> "Spreader":
    """A Spreader for `kb`'s kernel, pricing instructions with its target's cost model."""
    return Spreader(kb, kb.target.core)


class Spreader:
    """Per-kernel state: the running VectorE and GpSimd loads (ns) of spread tiles."""

    def __init__(self, kb, spec: CoreSpec):
        self.kb, self.spec = kb, spec
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
        if all(_movable(instrs[i]) for i in idx):
            moved["gpsimd"] = [dataclasses.replace(instrs[i], engine="gpsimd") for i in idx]
        cost = {e: sum(self._ns(x, e) for x in moved[e]) for e in moved}
        port = {e: sum(self._ns(x, e) for x in moved[e] if shares_gpsimd_port(x, self.spec))
                for e in moved}

        def finish(e):
            return max(self.load[e] + cost[e], self.port + port[e])
        best = min(moved, key=lambda e: (finish(e), e != "vector"))
        self.load[best] += cost[best]
        self.port += port[best]
        if best == "gpsimd":
            for i, x in zip(idx, moved["gpsimd"]):
                instrs[i] = x
