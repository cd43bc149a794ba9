"""Combines independent all_reduces into one variadic all_reduce (XLA's all-reduce combiner).

A data-parallel step reduces every gradient leaf with its own all_reduce; each pays the
collective's fixed latency (its algorithm's steps, §5.3), so many small ones cost far
more than one of the same bytes. Within a block, all_reduces with the same replica
groups, combiner, element type and device-id mode are gathered into buckets, in
program order, and each bucket becomes one all_reduce at its last member's place, with
the members' operands and results (the same values: their users need no rewrite). The
ops between the members that use an earlier member's result (directly or through each
other: a reshape, a transpose, an optimizer update) move to just after the combined op.
An all_reduce joins the bucket only if its operands depend on none of those (no cycle),
while no side-effecting op would have to move (a host callback or another collective
keeps its order), and while the bucket stays within `THRESHOLD_BYTES`.

The runtime runs a combined all_reduce as one message over the concatenated operands
(`jax_trn.runtime.spmd`): one algorithm, one latency. Nested blocks (loop bodies,
branches) are combined within themselves.
"""
from __future__ import annotations

from hlo_passes import ir
from hlo_passes.effects import has_side_effects

name = "combine-all-reduce"

# The largest combined message. XLA's GPU combiner defaults to 30 MiB
# (xla_gpu_all_reduce_combine_threshold_bytes); the same order here keeps one bucket
# of a large model's gradients from waiting for the whole backward pass.
THRESHOLD_BYTES = 32 << 20


def run(module: ir.Module) -> bool:
    changed = False
    for fn in module.functions.values():
        changed |= _combine(fn.body)
    return changed


def _combine(block: ir.Block) -> bool:
    changed = False
    for op in block.ops:
        for region in op.regions:
            for inner in region.blocks:
                changed |= _combine(inner)
    start = 0
    while True:
        found = _next_bucket(block, start)
        if found is None:
            return changed
        members, moved = found
        if len(members) > 1:
            members = [_apply(block, members, moved)]
            changed = True
        start = block.ops.index(members[0]) + 1


def _next_bucket(block: ir.Block, start: int):
    """The first bucket from `start` on: (members, ops that must move after it)."""
    ops = block.ops
    for i in range(start, len(ops)):
        key = _key(ops[i])
        if key is None:
            continue
        members, moved = [ops[i]], []
        tainted = {id(r) for r in ops[i].results}
        size = _nbytes(ops[i])
        for op in ops[i + 1:-1]:                       # never past the terminator
            uses = any(id(v) in tainted for v in _operands(op))
            if not uses and _key(op) == key and size + _nbytes(op) <= THRESHOLD_BYTES:
                members.append(op)
                tainted |= {id(r) for r in op.results}
                size += _nbytes(op)
            elif uses:
                if has_side_effects(op):
                    break
                moved.append(op)
                tainted |= {id(r) for r in op.results}
        at = {id(op): k for k, op in enumerate(ops)}
        moved = [op for op in moved if at[id(op)] < at[id(members[-1])]]
        return members, moved
    return None


def _apply(block: ir.Block, members: list[ir.Op], moved: list[ir.Op]) -> ir.Op:
    """Puts the bucket's combined all_reduce where its last member was, the `moved`
    ops right after it; returns the combined op."""
    last = members[-1]
    combined = last.replace(operands=[v for m in members for v in m.operands],
                            results=[r for m in members for r in m.results])
    skip = {id(op) for op in members} | {id(op) for op in moved}
    out = []
    for op in block.ops:
        if op is last:
            out += [combined, *moved]
        elif id(op) not in skip:
            out.append(op)
    block.ops = out
    return combined


def _key(op: ir.Op) -> tuple | None:
    """What all_reduces must share to be combined (None: not combinable)."""
    if op.kind != "all_reduce" or not op.results or len(op.regions) != 1:
        return None
    inner = op.regions[0].block.ops[:-1]
    dtypes = {v.dtype for v in op.operands}
    if len(inner) != 1 or len(dtypes) != 1:
        return None
    groups = tuple(tuple(int(d) for d in g) for g in op.attrs.get("replica_groups", ()))
    return (groups, inner[0].kind, dtypes.pop(),
            bool(op.attrs.get("use_global_device_ids", False)))


def _nbytes(op: ir.Op) -> int:
    return sum(v.type.nbytes for v in op.operands)


def _operands(op: ir.Op):
    """Every value `op` reads, its nested regions' included."""
    yield from op.operands
    for region in op.regions:
        for b in region.blocks:
            for inner in ir.walk(b):
                yield from inner.operands
