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

An operand's strides in the layout are strides of its own row-major buffer, each of
one dim or of a part of one (the heads of a [B, S, H*D] operand); each becomes the
view's stride of that dim (times the part). An operand with a stride that fits no dim
keeps its view. q, k, v and the backward's do are read this way (`attention_offsets`:
a start per layout operand, q k v o mask bias do dq dk dv), through a trn.view or a
single view op compose-views left alone (jnp.split's slices).

The backward's results go the other way: when dq, dk, dv feed (through reshapes,
transposes, unit-dim broadcasts) one concatenate of exactly them, followed by
transposes / reshapes (the gradient of the fused projection), the fusion returns that
final value instead, each of the three written at its strides and offset in it; the
region computes it from the three with those ops cloned in. The views, the
concatenate and the transposes left without users go to dce.
"""
from __future__ import annotations

from hlo_passes import ir
from hlo_passes.attention_layout import NoMatch, backward_strides, row_major, user_views
from hlo_passes.graph import BlockGraph, clone, rewrite_blocks
from hlo_passes.passes import compose_views

name = "attention-views"

# Per fusion kind: fusion operand position -> the operand's index in the layout's
# strides (attention_layout.OPERANDS, then the backward's do, dq, dk, dv).
READ = {"attention": {0: 0, 1: 1, 2: 2}, "attention_bwd": {0: 0, 1: 1, 2: 2, 5: 6}}
GRADS = (7, 8, 9)       # the backward's results dq, dk, dv in the layout's strides


def run(module: ir.Module) -> bool:
    return rewrite_blocks(module, _rewrite_block)


def _rewrite_block(block: ir.Block) -> bool:
    graph = BlockGraph(block)
    changed = False
    for op in block.ops:
        if op.kind == "fusion" and op.attrs.get("fusion_kind") in READ:
            changed |= _read_through(op, graph)
            if op.attrs["fusion_kind"] == "attention_bwd" and _pack(op, graph, block):
                changed = True
    return changed


def _read_through(op: ir.Op, graph: BlockGraph) -> bool:
    layout = [list(axis) for axis in op.attrs["attention_layout"]]
    read = READ[op.attrs["fusion_kind"]]
    starts = [0] * (max(read.values()) + 1)
    body = op.regions[0].block
    changed = False
    for i, o in read.items():
        view = _as_view(graph.producer.get(op.operands[i]))
        if view is None:
            continue
        strides = _strides(op.operands[i].shape, view.attrs["axes"], _column(layout, o))
        if strides is None:
            continue
        _set_column(layout, o, strides)
        starts[o] = view.attrs["offset"]
        _view_in_region(body, i, view)
        op.operands[i] = view.operands[0]
        changed = True
    if changed:
        _write(op, layout, starts)
    return changed


def _pack(op: ir.Op, graph: BlockGraph, block: ir.Block) -> bool:
    """dq, dk, dv concatenated into one gradient (of the fused projection), through
    views before (unit-dim broadcasts, reshapes, transposes) and after (transposes,
    reshapes): the fusion returns that value, each of the three written at its strides
    and offset in it (the backward's copies, concatenate and transpose gone)."""
    found = _concat_of(op, graph)
    if found is None:
        return False
    concat, parts = found
    last, chain, at = user_views(concat, graph.users, ("transpose", "reshape"))
    axis, start, pos = concat.attrs["dimension"], {}, 0
    for v in concat.operands:
        start[v], pos = pos, pos + v.shape[axis]
    layout = [list(a) for a in op.attrs["attention_layout"]]
    starts = list(op.attrs.get("attention_offsets", ()))
    starts += [0] * (max(GRADS) + 1 - len(starts))
    for o, (r, views) in zip(GRADS, parts):
        axes = _through(r, views, at)
        strides = None if axes is None else _strides(r.shape, axes, _column(layout, o))
        if strides is None:
            return False
        _set_column(layout, o, strides)
        starts[o] = start[views[-1].result if views else r] * at[axis]
    packed = [v for _, views in parts for v in views] + [concat] + chain
    _return_packed(op, packed)
    block.ops = [o for o in block.ops if o not in packed]       # all moved inside
    block.replace_all_uses({last.result: op.result})
    _write(op, layout, starts)
    return True


def _column(layout: list[list], o: int) -> list[int]:
    """Operand `o`'s stride on each axis of a layout (lists of [role, size, strides])."""
    return [axis[2][o] for axis in layout]


def _set_column(layout: list[list], o: int, strides: list[int]) -> None:
    for axis, st in zip(layout, strides):
        axis[2] = tuple(axis[2][:o]) + (st,) + tuple(axis[2][o + 1:])


def _write(op: ir.Op, layout: list[list], starts: list[int]) -> None:
    op.attrs["attention_layout"] = tuple((r, n, tuple(st)) for r, n, st in layout)
    op.attrs["attention_offsets"] = tuple(starts)


def _concat_of(op: ir.Op, graph: BlockGraph):
    """(concatenate, [(result, the views from it to the concatenate)]) when the
    fusion's three results feed, each alone through its views, one concatenate of
    exactly them; else None."""
    concat, parts = None, []
    for r in op.results:
        views, v = [], r
        while len(graph.users.get(v, ())) == 1 and _packable(graph.users[v][0]):
            views.append(graph.users[v][0])
            v = views[-1].result
        us = graph.users.get(v, ())
        if len(us) != 1 or us[0].kind != "concatenate" or concat not in (None, us[0]):
            return None
        concat = us[0]
        parts.append((r, views))
    if concat is None or len(concat.operands) != len(op.results):
        return None
    return concat, parts


def _packable(op: ir.Op) -> bool:
    return op.kind in ("reshape", "transpose") or op.kind == "broadcast_in_dim" and \
        op.result.type.size == op.operands[0].type.size


def _through(r: ir.Value, views: list[ir.Op], at) -> list[tuple[int, int]] | None:
    """(stride, size) of `r`'s dims in the packed buffer, given `at`, the strides of
    the dims of the concatenate's operand that `views` make of `r`."""
    strides = tuple(at)
    try:
        for v in reversed(views):
            if v.kind == "broadcast_in_dim":
                strides = tuple(strides[d] for d in v.attrs["broadcast_dimensions"])
            else:
                strides = backward_strides(v, strides)
    except NoMatch:
        return None
    return list(zip(strides, r.shape))


def _return_packed(op: ir.Op, ops: list[ir.Op]) -> None:
    """The region computes the packed value from what it returned (`ops` cloned after
    it) and returns that; the fusion has one result of its type."""
    body = op.regions[0].block
    ret = body.ops.pop()
    vmap = dict(zip(op.results, ret.operands))
    body.ops.extend(clone(o, vmap) for o in ops)
    final = ops[-1].result
    body.ops.append(ir.Op("return", [vmap[final]], [], loc=ret.loc))
    op.results = [ir.Value(final.type)]


def _as_view(op: ir.Op | None) -> ir.Op | None:
    """`op` as a trn.view of its operand: a trn.view, or one view op compose-views left
    alone (a chain of one, e.g. jnp.split's slice); None if it is neither."""
    if op is None or op.kind == "trn.view":
        return op
    if op.kind not in compose_views.VIEWS or len(op.operands) != 1:
        return None
    src = op.operands[0]
    axes = tuple(zip(row_major(src.shape), src.shape))
    composed = compose_views.compose(op, axes, 0)
    if composed is None:
        return None
    return ir.Op("trn.view", [src], [op.result], {"axes": composed[0],
                                                   "offset": composed[1]},
                 loc=op.loc, name=op.name)


def _strides(shape, axes, strides) -> list[int] | None:
    """`strides` (of a row-major buffer of `shape`) as strides of the view `axes`: a
    stride m * r of dim d (row-major stride r, m < its size: a part of the dim, the
    heads of a [B, S, H*D] operand) becomes m times the view's stride of d; None when a
    stride falls in no dim that way."""
    dims, step = [], 1
    for n, (st, _) in reversed(list(zip(shape, axes))):
        if n != 1:
            dims.append((step, n, st))
        step *= n
    out = []
    for s in strides:
        hit = next((st * (s // r) for r, n, st in dims if r <= s < r * n and s % r == 0),
                   None) if s else 0
        if hit is None:
            return None
        out.append(hit)
    return out


def _view_in_region(body: ir.Block, i: int, view: ir.Op) -> None:
    """Argument i becomes the view's source; the region views it as before."""
    old = body.args[i]
    new = ir.Value(view.operands[0].type)
    body.args[i] = new
    body.ops.insert(0, ir.Op("trn.view", [new], [old], dict(view.attrs), loc=view.loc,
                             name=view.name))

