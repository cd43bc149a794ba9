"""Reuses the result of an identical earlier op (same kind, operands, attrs, types).

Scoped like MLIR's CSE: an op inside a region may reuse an op of an enclosing block
that comes before the region's op; ops with regions or side effects are never merged.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from hlo_passes import ir
from hlo_passes.effects import TERMINATORS, has_side_effects

name = "cse"


def run(module: ir.Module) -> bool:
    changed = False
    for fn in module.functions.values():
        mapping: dict[ir.Value, ir.Value] = {}
        _cse_block(fn.body, {}, mapping)
        fn.body.replace_all_uses(mapping)
        changed |= bool(mapping)
    return changed


def _cse_block(block: ir.Block, seen: dict, mapping: dict) -> None:
    scope, kept = dict(seen), []
    for op in block.ops:
        for region in op.regions:
            for inner in region.blocks:
                _cse_block(inner, scope, mapping)
        key = _key(op, mapping)
        if key is not None and key in scope:
            mapping.update(zip(op.results, scope[key].results))
            continue
        if key is not None:
            scope[key] = op
        kept.append(op)
    block.ops = kept


def _key(op: ir.Op, mapping: dict) -> tuple | None:
    if op.regions or not op.results or op.kind in TERMINATORS or has_side_effects(op):
        return None
    operands = tuple(id(mapping.get(v, v)) for v in op.operands)
    types = tuple(r.type for r in op.results)
    return op.kind, operands, types, attrs_key(op.attrs)


def attrs_key(attrs: dict[str, Any]) -> tuple:
    """A hashable, exact key for an attribute dict (numpy arrays by dtype/shape/bytes)."""
    return tuple(sorted((k, _hashable(v)) for k, v in attrs.items()))


def _hashable(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return ("ndarray", str(v.dtype), v.shape, v.tobytes())
    if isinstance(v, dict):
        return ("dict", attrs_key(v))
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    return v
