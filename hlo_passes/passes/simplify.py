"""Removes no-op ops with a small (pattern, fn) table; each fn returns the replacement.

    reshape to the same shape                         -> its operand
    convert to the same dtype                         -> its operand
    transpose with the identity permutation           -> its operand
    broadcast_in_dim to the same shape, identity dims -> its operand
    transpose of a transpose                          -> one transpose (the composed
                                                         permutation; the identity: x)

The last one matters for matmuls: JAX's gradient of `x @ w.T` is a dot followed by two
transposes, and transposed-dot folds only one of them into the dot.
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


def _composed_transpose(op: ir.Op, inner: ir.Op | None) -> ir.Op:
    """transpose(transpose(x, p), q) as one transpose of x (its permutation p[q[i]]);
    `op` itself when its operand is not a transpose."""
    if inner is None or inner.kind != "transpose":
        return op
    p, q = tuple(inner.attrs["permutation"]), tuple(op.attrs["permutation"])
    return op.replace(operands=[inner.operands[0]],
                      attrs={**op.attrs, "permutation": tuple(p[i] for i in q)})


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
    producer: dict[ir.Value, ir.Op] = {}
    for op in block.ops:
        for region in op.regions:
            for inner in region.blocks:
                _simplify_block(inner, mapping)
        if op.kind == "transpose":
            op = _composed_transpose(op, producer.get(mapping.get(op.operands[0],
                                                                  op.operands[0])))
        producer.update((v, op) for v in op.results)
        rule = RULES.get(op.kind)
        new = rule(op) if rule and len(op.operands) == 1 and len(op.results) == 1 else None
        if new is None:
            kept.append(op)
            continue
        mapping[op.result] = mapping.get(new, new)
    block.ops = kept
