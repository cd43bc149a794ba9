"""Folds a transpose feeding dot_generals into their dimension numbers, as XLA's
algebraic simplifier does.

    %et = transpose(%e) perm=[1, 0]     e: [V, D] (a tied embedding, flax `Embed.attend`:
    %y = dot_general(%x, %et)              x @ E.T; jnp writes the .T as a transpose)
         contracting (1, 0)
 -> %y = dot_general(%x, %e)  contracting (1, 1)

A transpose is a kernel copying the whole array through HBM (the LM's 32000 x 1024
embedding: 883 us on trn2); the matmul reads an operand in either layout (K contiguous:
by dma_transpose on v3+, or on TensorE; lower/matmul.py), so the fold removes it.

Folded only when every user of the transpose is a dot_general that takes it as an
operand (otherwise the copy stays for the others and nothing is saved), and when each
group of that operand's dims -- batch, free, contracting -- lands on consecutive dims
of the source in the same order: the dot's result keeps its dim order (free dims in
operand order), and the lowering sees the same single K / F axes it would read from
the copy, so it needs no copy of its own.
"""
from __future__ import annotations

from hlo_passes import ir
from hlo_passes.graph import BlockGraph, rewrite_blocks

name = "dot-operand-transpose"

_DIMS = {0: ("lhs_batching_dimensions", "lhs_contracting_dimensions"),
         1: ("rhs_batching_dimensions", "rhs_contracting_dimensions")}


def run(module: ir.Module) -> bool:
    return rewrite_blocks(module, _rewrite_block)


def _rewrite_block(block: ir.Block) -> bool:
    graph = BlockGraph(block)
    new: dict[ir.Op, ir.Op] = {}
    for op in block.ops:
        if op.kind != "transpose":
            continue
        users = graph.users[op.result]
        folded = [_folded(new.get(u, u), op) for u in users]
        if users and all(f is not None for f in folded):
            new.update(zip(users, folded))
    if not new:
        return False
    block.ops = [new.get(op, op) for op in block.ops]
    return True


def _folded(dot: ir.Op, transpose: ir.Op) -> ir.Op | None:
    """`dot` reading the transpose's operand instead of the transpose, or None."""
    if dot.kind != "dot_general":
        return None
    perm = tuple(transpose.attrs["permutation"])
    attrs, operands = dict(dot.attrs), list(dot.operands)
    hits = [i for i, v in enumerate(operands) if v is transpose.result]
    if not hits:
        return None
    for i in hits:
        rank = len(perm)
        batch, contract = (tuple(dot.attrs.get(a, ())) for a in _DIMS[i])
        free = tuple(d for d in range(rank) if d not in batch and d not in contract)
        groups = [tuple(perm[d] for d in g) for g in (batch, free, contract)]
        if not all(_consecutive(g) for g in groups):
            return None
        if groups[0] and groups[1] and groups[0][-1] > groups[1][0]:
            return None                 # batch dims must stay in front of free ones
        attrs[_DIMS[i][0]], attrs[_DIMS[i][1]] = groups[0], groups[2]
        operands[i] = transpose.operands[0]
    return dot.replace(operands=operands, attrs=attrs)


def _consecutive(dims: tuple[int, ...]) -> bool:
    return all(b == a + 1 for a, b in zip(dims, dims[1:]))
