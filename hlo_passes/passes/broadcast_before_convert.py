"""Swaps a convert and the view (broadcast_in_dim, reshape) reading it, so the
convert fuses into its region.

    %b16 = convert(%b)                      b: f32[8, 128] (a flax Dense bias, cast
    %y = broadcast_in_dim(%b16)                to bf16 per call)
 -> %bb = broadcast_in_dim(%b)              a view the region reads (fusion_policy)
    %y = convert(%bb)                       elementwise at the region's shape: fused

Unswapped, the convert is a kernel of its own (it cannot join the region: a computed
value is not re-laid out by a broadcast), ~4.5 us of launch and DMA latency for a few
KiB. The values are the same, for any convert: each copy of x is converted exactly
as x would be. Only when every user of the convert is a broadcast (else the converted
array is needed anyway); the convert left without users goes at the final dce. A
reshape between them (convert -> reshape -> broadcast) is swapped first, to a fixpoint.
"""
from __future__ import annotations

from hlo_passes import ir
from hlo_passes.graph import BlockGraph, rewrite_blocks

name = "broadcast-before-convert"


VIEWS = frozenset({"broadcast_in_dim", "reshape"})


def run(module: ir.Module) -> bool:
    changed = False
    while rewrite_blocks(module, _rewrite_block):
        changed = True
    return changed


def _rewrite_block(block: ir.Block) -> bool:
    graph = BlockGraph(block)
    users, producer = graph.users, graph.producer
    out, mapping = [], {}
    for op in block.ops:
        conv = producer.get(op.operands[0]) if op.kind in VIEWS else None
        if conv is None or conv.kind != "convert" or \
                not all(u.kind in VIEWS for u in users[conv.result]):
            out.append(op)
            continue
        src = conv.operands[0]
        wide = ir.Value(ir.TensorType(op.result.shape, src.dtype))
        out.append(op.replace(operands=[src], results=[wide]))
        new = conv.replace(operands=[wide], results=[ir.Value(op.result.type)])
        out.append(new)
        mapping[op.result] = new.result
    if not mapping:
        return False
    block.ops = out
    block.replace_all_uses(mapping)
    return True
