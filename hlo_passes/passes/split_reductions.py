"""A variadic reduce / reduce_window whose body reduces each operand on its own becomes
one reduction per operand.

    (r0, r1) = reduce((x0, x1), (i0, i1)) body (a0, a1, b0, b1) -> (a0 + b0, a1 * b1)
 -> r0 = reduce(x0, i0) body (a, b) -> a + b;  r1 = reduce(x1, i1) body (a, b) -> a * b

`lax.reduce((xs, ys), inits, lambda x, y: (x[0] + y[0], x[1] * y[1]), dims)` lowers so.
A body is separable when result k depends on no block argument but accumulator k and
element k (argmax / argmin bodies are not: the index follows the value). Each new body
holds the ops result k needs, cloned. Runs after localization, on per-device programs.
"""
from __future__ import annotations

from hlo_passes import ir
from hlo_passes.effects import has_side_effects

name = "split-reductions"
KINDS = ("reduce", "reduce_window")


def run(module: ir.Module) -> bool:
    changed = False
    for fn in module.functions.values():
        changed |= _split_block(fn.body)
    return changed


def _split_block(block: ir.Block) -> bool:
    changed, ops = False, []
    for op in block.ops:
        for region in op.regions:
            for inner in region.blocks:
                changed |= _split_block(inner)
        parts = _split(op) if op.kind in KINDS and len(op.results) > 1 else None
        ops.extend(parts or [op])
        changed |= bool(parts)
    block.ops = ops
    return changed


def _split(op: ir.Op) -> list[ir.Op] | None:
    body = op.regions[0].block
    n = len(op.results)
    if any(has_side_effects(o) for o in body.ops):
        return None
    slices = [_slice_of(body, k, n) for k in range(n)]
    if any(s is None for s in slices):
        return None
    return [_one(op, k, n, ops) for k, ops in enumerate(slices)]


def _slice_of(body: ir.Block, k: int, n: int) -> list[ir.Op] | None:
    """The body ops result k needs, in order; None if it reads another operand's
    accumulator or element."""
    producer = {r: o for o in body.ops for r in o.results}
    others = {a for i, a in enumerate(body.args) if i % n != k}
    needed, work = set(), [body.terminator.operands[k]]
    while work:
        v = work.pop()
        if v in others:
            return None
        o = producer.get(v)
        if o is not None and o not in needed:
            needed.add(o)
            work.extend(x for inner in _self_and_nested(o) for x in inner.operands)
    return [o for o in body.ops[:-1] if o in needed]


def _self_and_nested(op: ir.Op):
    yield op
    for region in op.regions:
        for block in region.blocks:
            yield from ir.walk(block)


def _one(op: ir.Op, k: int, n: int, ops: list[ir.Op]) -> ir.Op:
    """Reduction k of `op`: operand k, init k, result k, a body of `ops` cloned."""
    body = op.regions[0].block
    acc, elem = body.args[k], body.args[n + k]
    args = [ir.Value(acc.type), ir.Value(elem.type)]
    vmap = dict(zip((acc, elem), args))
    cloned = [_clone(o, vmap) for o in ops]
    ret = body.terminator
    cloned.append(ret.replace(operands=[vmap.get(ret.operands[k], ret.operands[k])],
                              results=[]))
    return op.replace(operands=[op.operands[k], op.operands[n + k]],
                      results=[op.results[k]], attrs=dict(op.attrs),
                      regions=[ir.Region([ir.Block(args, cloned)])])


def _clone(op: ir.Op, vmap: dict) -> ir.Op:
    results = [ir.Value(r.type) for r in op.results]
    regions = [ir.Region([_clone_block(b, vmap) for b in r.blocks]) for r in op.regions]
    vmap.update(zip(op.results, results))
    return op.replace(operands=[vmap.get(v, v) for v in op.operands], results=results,
                      attrs=dict(op.attrs), regions=regions)


def _clone_block(block: ir.Block, vmap: dict) -> ir.Block:
    args = [ir.Value(a.type) for a in block.args]
    vmap.update(zip(block.args, args))
    return ir.Block(args, [_clone(o, vmap) for o in block.ops])
