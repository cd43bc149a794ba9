"""A float reduction converted to a narrower float is one reduction with that result type.

    %s = reduce(%x: f32[B, D], init 0) dims=[0]    -> f32[D]       a parameter's gradient
    %r = reshape(%s) -> f32[1, D]                                  summed in f32 (a bias,
    %q = reshape(%r) -> f32[D]                                     a LayerNorm gain) and
    %g = convert(%q) -> bf16[D]                                    returned in bf16
 -> %g = reduce(%x, init 0) dims=[0] -> bf16[D]

The lowering accumulates every float reduction in FP32 and casts its result to the
result type once (jax_trn/lower/reduce.py, rows.py), so the sum is the same FP32 value
rounded once, exactly as the f32 reduce and the convert; the reshapes between them (JAX's
keepdims and degenerate-reduce's) move no element. Each was a kernel of its own: the
reshape a copy, the convert a loop over D elements (~6 us per parameter on Trn2).

Only single-input reduces of float32 to a narrower float, every value in the chain used
once; the reshapes collapse into one (none when the shapes agree).
"""
from __future__ import annotations

from hlo_passes import ir
from hlo_passes.graph import BlockGraph, rewrite_blocks

name = "convert-into-reduce"

NARROW = ("bfloat16", "float16")


def run(module: ir.Module) -> bool:
    return rewrite_blocks(module, _rewrite_block)


def _rewrite_block(block: ir.Block) -> bool:
    graph = BlockGraph(block)
    changed, gone = False, set()
    for op in list(block.ops):
        if op.kind != "convert" or op.result.dtype not in NARROW:
            continue
        found = _chain(op, graph)
        if found is None:
            continue
        red, reshapes = found
        narrow = ir.Value(ir.TensorType(red.result.type.shape, op.result.dtype))
        red.results = [narrow]
        if tuple(narrow.shape) == tuple(op.result.shape):
            block.replace_all_uses({op.result: narrow})
            gone.update([op, *reshapes])
        else:                       # the last reshape, from the reduce, makes the result
            reshapes[0].operands, reshapes[0].results = [narrow], [op.result]
            gone.update([op, *reshapes[1:]])
        changed = True
    if changed:
        block.ops = [o for o in block.ops if o not in gone]
    return changed


def _chain(convert: ir.Op, graph: BlockGraph):
    """(reduce, [reshapes from the convert back]) when the convert's operand is a
    float32 reduce seen through reshapes, each value used once; else None."""
    reshapes, v = [], convert.operands[0]
    while True:
        if len(graph.users.get(v, ())) != 1:
            return None
        p = graph.producer.get(v)
        if p is None:
            return None
        if p.kind == "reshape":
            reshapes.append(p)
            v = p.operands[0]
            continue
        if p.kind == "reduce" and len(p.operands) == 2 and len(p.results) == 1 and \
                p.operands[0].dtype == "float32" and p.result.dtype == "float32":
            return p, reshapes
        return None
