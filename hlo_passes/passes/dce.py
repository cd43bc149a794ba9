"""Removes ops whose results are unused and that have no side effects."""
from __future__ import annotations

from collections import Counter

from hlo_passes import ir
from hlo_passes.effects import TERMINATORS, has_side_effects

name = "dce"


def run(module: ir.Module) -> bool:
    changed = False
    for fn in module.functions.values():
        uses = Counter(v for op in ir.walk(fn.body) for v in op.operands)
        changed |= _sweep(fn.body, uses)
    return changed


def run_block(block: ir.Block) -> bool:
    """`run` on one isolated block (a fusion's region)."""
    return _sweep(block, Counter(v for op in ir.walk(block) for v in op.operands))


def _sweep(block: ir.Block, uses: Counter) -> bool:
    """One backward sweep: users are visited before the ops they use."""
    changed, kept = False, []
    for op in reversed(block.ops):
        if _is_dead(op, uses):
            for inner in _self_and_nested(op):
                uses.subtract(inner.operands)
            changed = True
            continue
        for region in op.regions:
            for inner in region.blocks:
                changed |= _sweep(inner, uses)
        kept.append(op)
    block.ops = kept[::-1]
    return changed


def _is_dead(op: ir.Op, uses: Counter) -> bool:
    return (op.kind not in TERMINATORS and not any(uses[r] > 0 for r in op.results)
            and not has_side_effects(op))


def _self_and_nested(op: ir.Op):
    yield op
    for region in op.regions:
        for block in region.blocks:
            yield from ir.walk(block)
