"""Tile-level elementwise ops: one IR elementwise op on SBUF/PSUM tiles, as instructions.

    TILE_OPS[kind].emit(kb, dst, srcs, step)    # the instruction(s) computing `step`
    TILE_OPS[kind].scratch                      # scratch tiles it takes after `srcs`
    TILE_OPS[kind].width                        # bytes per element of each (4, or 8)
    TILE_OPS[kind].row_scratch                  # [P, 1] FP32 scratch tiles after those

Modules: core (Step, Src, TileRule, instruction helpers), simple (one-instruction ops),
ranged (log, log1p, sqrt, rsqrt: ScalarE functions kept inside their input ranges),
trig (sine, cosine, tan with full-range argument reduction), mathops (short instruction
sequences: rounding, expm1, cbrt, atan2, bit counts, ...). The
table is the union of their `RULES`, built here once; no module adds to another's.
"""
from __future__ import annotations

from . import mathops, ranged, simple, trig
from .core import ACTIVATION as ACTIVATION
from .core import ALU as ALU
from .core import COMPARE as COMPARE
from .core import NEEDS_FULL_TILES as NEEDS_FULL_TILES
from .core import NO_INSTRUCTION as NO_INSTRUCTION
from .core import Src as Src
from .core import Step as Step
from .core import TileRule as TileRule
from .core import engine_for as engine_for
from .core import expand as expand
from .core import fill_scalar as fill_scalar
from .core import scratch_dtype as scratch_dtype


def _union(*tables: dict[str, TileRule]) -> dict[str, TileRule]:
    out: dict[str, TileRule] = {}
    for table in tables:
        twice = out.keys() & table.keys()
        assert not twice, f"tile ops defined twice: {sorted(twice)}"
        out.update(table)
    return out


TILE_OPS: dict[str, TileRule] = _union(simple.RULES, mathops.RULES, ranged.RULES, trig.RULES)


def scratch(kind: str) -> int:
    """Scratch tiles a step of `kind` takes (0 for steps with no tile op)."""
    rule = TILE_OPS.get(kind)
    return rule.scratch if rule is not None else 0


def scratch_width(kind: str) -> int:
    """Bytes per element of each scratch tile a step of `kind` takes (4 by default)."""
    rule = TILE_OPS.get(kind)
    return rule.width if rule is not None else 4


def row_scratch(kind: str) -> int:
    """[P, 1] FP32 scratch tiles a step of `kind` takes after its full-width ones."""
    rule = TILE_OPS.get(kind)
    return rule.row_scratch if rule is not None else 0
