"""Attention kernels read q, k and v through the strided views compose-views made of them.

A transformer that projects q, k and v with one matmul (GPT-2's `c_attn`, a fused
`wqkv`) splits the result into heads with a reshape, a transpose and a slice per
operand; compose-views turns each chain into one `trn.view` of the projection, which
the lowering copies into a buffer of its own before the attention kernel reads it
(three copies forward, three more for the backward's inputs: ~75 us of a transformer
block's 2.6 ms). The flash kernels address every operand by strides anyway
(`attention_layout`), so they can read the projection in place:

    %q = trn.view(%qkv) {axes=((0, 1), (128, 8), (3072, 1024), (1, 128)), offset=0}
    %o = fusion(%q, %k, %v) {fusion_kind="attention", attention_layout=(...)}
 -> %o = fusion(%qkv, %qkv, %qkv) {..., attention_layout=(strides in %qkv),
                                    attention_offsets=(0, 1024, 2048)}
      ^bb(%a, %b, %c):
        %q' = trn.view(%a) {...}          # the region keeps its ops and types (a backend
        ...                               # running them one by one sees the same values)

An operand's strides in the layout are strides of its own row-major buffer, one per
dim it maps; each becomes the view's stride of that dim. An operand with a stride that
is not one of its dims' (merged dims) keeps its view. q, k, v and the backward's do
are read this way (`attention_offsets`: a start per layout operand, q k v o mask bias
do); the views left without users go to dce.
"""
from __future__ import annotations

from hlo_passes import ir
from hlo_passes.graph import BlockGraph, rewrite_blocks

name = "attention-views"

# Per fusion kind: fusion operand position -> the operand's index in the layout's
# strides (attention_layout.OPERANDS, then the backward's do, dq, dk, dv).
READ = {"attention": {0: 0, 1: 1, 2: 2}, "attention_bwd": {0: 0, 1: 1, 2: 2, 5: 6}}


def run(module: ir.Module) -> bool:
    return rewrite_blocks(module, _rewrite_block)


def _rewrite_block(block: ir.Block) -> bool:
    graph = BlockGraph(block)
    changed = False
    for op in block.ops:
        if op.kind == "fusion" and op.attrs.get("fusion_kind") in READ:
            changed |= _read_through(op, graph)
    return changed


def _read_through(op: ir.Op, graph: BlockGraph) -> bool:
    layout = [list(axis) for axis in op.attrs["attention_layout"]]
    read = READ[op.attrs["fusion_kind"]]
    starts = [0] * (max(read.values()) + 1)
    body = op.regions[0].block
    changed = False
    for i, o in read.items():
        view = graph.producer.get(op.operands[i])
        if view is None or view.kind != "trn.view":
            continue
        strides = _strides(op.operands[i].shape, view.attrs["axes"],
                           [axis[2][o] for axis in layout])
        if strides is None:
            continue
        for axis, s in zip(layout, strides):
            axis[2] = tuple(axis[2][:o]) + (s,) + tuple(axis[2][o + 1:])
        starts[o] = view.attrs["offset"]
        _view_in_region(body, i, view)
        op.operands[i] = view.operands[0]
        changed = True
    if changed:
        op.attrs["attention_layout"] = tuple((r, n, tuple(s)) for r, n, s in layout)
        op.attrs["attention_offsets"] = tuple(starts)
    return changed


def _strides(shape, axes, strides) -> list[int] | None:
    """`strides` (of a row-major buffer of `shape`) as strides of the view `axes`, or
    None when one is not a single dim's."""
    by, step = {}, 1
    for n, (st, _) in reversed(list(zip(shape, axes))):
        if n != 1:
            by[step] = st
        step *= n
    if any(s and s not in by for s in strides):
        return None
    return [by[s] if s else 0 for s in strides]


def _view_in_region(body: ir.Block, i: int, view: ir.Op) -> None:
    """Argument i becomes the view's source; the region views it as before."""
    old = body.args[i]
    new = ir.Value(view.operands[0].type)
    body.args[i] = new
    body.ops.insert(0, ir.Op("trn.view", [new], [old], dict(view.attrs), loc=view.loc,
                             name=view.name))
