"""Turns a reduce over dims of extent 1 only into a reshape of its input, as XLA does.

    %r = reduce(%x, %init) dims=[0]   with x: f32[1,8,16]
 -> %r = reshape(%x)                 # f32[8,16]: a view, so it fuses

XLA's reduce assumes `init` is the combiner's identity and its simplifier drops it here
(the CPU backend keeps a -0.0 and ignores a non-identity init), so we match it. Runs
before fusion because a reshape fuses where a reduce as a producer never does. An init
constant left without users stays for the `dce` pass that ends the pipeline.
"""
from __future__ import annotations

from hlo_passes import ir
from hlo_passes.graph import rewrite_blocks

name = "degenerate-reduce"


def run(module: ir.Module) -> bool:
    return rewrite_blocks(module, _rewrite_block)


def _rewrite_block(block: ir.Block) -> bool:
    ops, mapping = [], {}
    for op in block.ops:
        if is_degenerate(op):
            x, out = op.operands[0], op.result
            view = ir.Op("reshape", [x], [ir.Value(ir.TensorType(out.shape, x.dtype))],
                         loc=op.loc, name=op.name)
            ops.append(view)
            mapping[out] = view.result
        else:
            ops.append(op)
    if mapping:
        block.ops = ops
        block.replace_all_uses(mapping)
    return bool(mapping)


def is_degenerate(op: ir.Op) -> bool:
    """A single-input reduce of the input's dtype over extent-1 dims only."""
    if op.kind != "reduce" or len(op.operands) != 2 or len(op.results) != 1:
        return False
    x, init = op.operands
    return (not init.shape and x.dtype == op.result.dtype
            and all(x.shape[d] == 1 for d in op.attrs.get("dimensions", ())))
