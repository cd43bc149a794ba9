"""Removes no-op ops with a small (pattern, fn) table; each fn returns the replacement.

    reshape to the same shape                         -> its operand
    convert to the same dtype                         -> its operand
    transpose with the identity permutation           -> its operand
    broadcast_in_dim to the same shape, identity dims -> its operand
"""
from __future__ import annotations

from typing import Callable

from hlo_passes import ir

name = "simplify"


def _same_type(op: ir.Op) -> ir.Value | None:
    return op.operands[0] if op.operands[0].type == op.result.type else None


def _identity_transpose(op: ir.Op) -> ir.Value | None:
    perm = tuple(op.attrs["permutation"])
    return op.operands[0] if perm == tuple(range(len(perm))) else None


def _identity_broadcast(op: ir.Op) -> ir.Value | None:
    dims = tuple(op.attrs["broadcast_dimensions"])
    same = op.operands[0].type == op.result.type
    return op.operands[0] if same and dims == tuple(range(len(dims))) else None


RULES: dict[str, Callable[[ir.Op], ir.Value | None]] = {
        "reshape": _same_type,
        "convert": _same_type,
        "transpose": _identity_transpose,
        "broadcast_in_dim": _identity_broadcast,
}


def run(module: ir.Module) -> bool:
    changed = False
    for fn in module.functions.values():
        mapping: dict[ir.Value, ir.Value] = {}
        _simplify_block(fn.body, mapping)
        fn.body.replace_all_uses(mapping)
        changed |= bool(mapping)
    return changed


def _simplify_block(block: ir.Block, mapping: dict) -> None:
    kept = []
    for op in block.ops:
        for region in op.regions:
            for inner in region.blocks:
                _simplify_block(inner, mapping)
        rule = RULES.get(op.kind)
        new = rule(op) if rule and len(op.operands) == 1 and len(op.results) == 1 else None
        if new is None:
            kept.append(op)
            continue
        mapping[op.result] = mapping.get(new, new)
    block.ops = kept
