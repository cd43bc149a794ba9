"""What the passes that rewrite one block at a time share: the blocks they visit, the
producers and users of a block's values, and cloning ops into a new region.

    control_blocks(body)        # body, then the blocks of its while / case ops
    rewrite_blocks(module, f)   # f(block) on each of them: a block-local pass's run()
    BlockGraph(block)           # .producer[v], .users[v], .index[op]
    used_values(op)             # operands of op and of everything nested in it
    free_values(op, inside)     # what op uses that `inside` does not define
    clone(op, vmap)             # a copy with fresh results, operands mapped by vmap

Used by degenerate-reduce, transposed-dot, attention-fusion and fusion.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterator

from hlo_passes import ir

CONTROL_KINDS = ("while", "case")


def control_blocks(block: ir.Block) -> Iterator[ir.Block]:
    """`block` and, recursively, the cond / body / branch blocks of its loops and
    conditionals: each is a sequence of kernels of its own, rewritten on its own (values
    from enclosing blocks are inputs, like function arguments). The ops of `block` are
    read after the caller has rewritten it."""
    yield block
    for op in list(block.ops):
        if op.kind in CONTROL_KINDS:
            for region in op.regions:
                for inner in region.blocks:
                    yield from control_blocks(inner)


def rewrite_blocks(module: ir.Module, rewrite: Callable[[ir.Block], bool]) -> bool:
    """Runs `rewrite` on every control block of every function (`control_blocks`);
    True if any call changed its block: the `run` of a block-local pass."""
    changed = False
    for fn in module.functions.values():
        for block in control_blocks(fn.body):
            changed |= rewrite(block)
    return changed


class BlockGraph:
    """Producers, users and program positions of one block's top-level ops. A use
    nested in an op's regions counts as a use by that op."""

    def __init__(self, block: ir.Block):
        self.index = {op: i for i, op in enumerate(block.ops)}
        self.producer = {v: op for op in block.ops for v in op.results}
        self.users: dict[ir.Value, list[ir.Op]] = defaultdict(list)
        for op in block.ops:
            for v in used_values(op):
                if op not in self.users[v]:
                    self.users[v].append(op)


def used_values(op: ir.Op) -> Iterator[ir.Value]:
    """Operands of `op` and of everything nested in it."""
    yield from op.operands
    for region in op.regions:
        for block in region.blocks:
            for inner in ir.walk(block):
                yield from inner.operands


def free_values(op: ir.Op, inside: set[ir.Value]) -> list[ir.Value]:
    """Values `op` (and its nested regions) use that `inside` and `op`'s own regions do
    not define: the inputs a region holding `op` needs."""
    defined = set(inside)
    for r in op.regions:
        for b in r.blocks:
            defined.update(b.args)
            defined.update(v for inner in ir.walk(b) for v in inner.results)
    return [v for v in used_values(op) if v not in defined]


def clone(op: ir.Op, vmap: dict[ir.Value, ir.Value]) -> ir.Op:
    """A copy of `op` (nested regions too) with fresh results, its operands mapped
    through `vmap`; `vmap` learns the new results."""
    results = [ir.Value(r.type) for r in op.results]
    regions = [ir.Region([_clone_block(b, vmap) for b in r.blocks]) for r in op.regions]
    copy = op.replace(operands=[vmap.get(v, v) for v in op.operands], results=results,
                      attrs=dict(op.attrs), regions=regions)
    vmap.update(zip(op.results, results))
    return copy


def _clone_block(block: ir.Block, vmap: dict[ir.Value, ir.Value]) -> ir.Block:
    args = [ir.Value(a.type) for a in block.args]
    vmap.update(zip(block.args, args))
    return ir.Block(args, [clone(op, vmap) for op in block.ops])
