"""Folds a transpose that swaps a dot_general's free dims into the dot: C^T = B^T A^T.

    %c = dot_general(%a, %b)            a: [M, K], b: [K, N], c: [M, N]
    %t = transpose(%c) perm=[1, 0]
 -> %t = dot_general(%b, %a)            the same products, no transpose kernel

Batch dims stay in front; the lhs / rhs dimension numbers (and precision config) swap.
Only when the transpose is the dot's only user, so no dot is computed twice.
"""
from __future__ import annotations

from hlo_passes import ir
from hlo_passes.graph import BlockGraph, rewrite_blocks

name = "transposed-dot"

_SWAP = (("lhs_batching_dimensions", "rhs_batching_dimensions"),
         ("lhs_contracting_dimensions", "rhs_contracting_dimensions"))


def run(module: ir.Module) -> bool:
    return rewrite_blocks(module, _rewrite_block)


def _rewrite_block(block: ir.Block) -> bool:
    graph = BlockGraph(block)
    users, producer = graph.users, graph.producer
    swapped: dict[ir.Op, ir.Op] = {}
    for op in block.ops:
        dot = producer.get(op.operands[0]) if op.kind == "transpose" else None
        if dot is not None and _folds(op, dot, users):
            swapped[op] = _swapped(dot, op.result.type)
    if not swapped:
        return False
    dead = {producer[op.operands[0]] for op in swapped}
    block.ops = [swapped.get(op, op) for op in block.ops if op not in dead]
    block.replace_all_uses({op.result: new.result for op, new in swapped.items()})
    return True


def _folds(transpose: ir.Op, dot: ir.Op, users: dict) -> bool:
    return (dot.kind == "dot_general" and users[dot.result] == [transpose]
            and tuple(transpose.attrs["permutation"]) == _swap_permutation(dot))


def _swapped(dot: ir.Op, result: ir.TensorType) -> ir.Op:
    """dot_general(b, a) with the lhs / rhs attributes exchanged."""
    attrs = dict(dot.attrs)
    for a, b in _SWAP:
        attrs[a], attrs[b] = dot.attrs.get(b, ()), dot.attrs.get(a, ())
    if dot.attrs.get("precision_config"):
        attrs["precision_config"] = tuple(reversed(dot.attrs["precision_config"]))
    return dot.replace(operands=list(reversed(dot.operands)), results=[ir.Value(result)],
                       attrs=attrs)


def _swap_permutation(dot: ir.Op) -> tuple[int, ...]:
    """The transpose that moves the rhs free dims before the lhs free dims."""
    lhs, rhs = dot.operands
    nb = len(dot.attrs.get("lhs_batching_dimensions", ()))
    fl = lhs.type.rank - nb - len(dot.attrs.get("lhs_contracting_dimensions", ()))
    fr = rhs.type.rank - nb - len(dot.attrs.get("rhs_contracting_dimensions", ()))
    return (*range(nb), *range(nb + fl, nb + fl + fr), *range(nb, nb + fl))
