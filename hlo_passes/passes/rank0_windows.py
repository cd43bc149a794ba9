"""Windows over no dimension get one dimension of extent 1.

    convolution with no spatial dims  (lax.conv_general_dilated with window_strides=():
                                       a dot, grouped or not)
    reduce_window of rank 0           (body(init, x))

become the same op with one trailing spatial / window dimension of size 1 (window 1,
stride 1, no padding or dilation: the same values), between reshapes. That is the form
every window rule handles, so these degenerate forms need no rule of their own.
"""
from __future__ import annotations

from typing import Callable

from hlo_passes import ir

name = "rank0-windows"


def run(module: ir.Module) -> bool:
    changed = False
    for fn in module.functions.values():
        changed |= _rewrite_block(fn.body)
    return changed


def _rewrite_block(block: ir.Block) -> bool:
    changed, ops = False, []
    for op in block.ops:
        for region in op.regions:
            for inner in region.blocks:
                changed |= _rewrite_block(inner)
        rule = RULES.get(op.kind)
        new = rule(op) if rule else None
        ops.extend(new or [op])
        changed |= bool(new)
    block.ops = ops
    return changed


def _conv(op: ir.Op) -> list[ir.Op] | None:
    dims = op.attrs["dimension_numbers"]
    if dims["input_spatial_dimensions"]:
        return None
    reshapes = [_add_unit_dim(v, op) for v in op.operands]
    spatial = {"input_spatial_dimensions": (2,), "kernel_spatial_dimensions": (2,),
               "output_spatial_dimensions": (2,)}
    attrs = {**op.attrs, "dimension_numbers": {**dims, **spatial},
             "window_strides": (1,), "lhs_dilation": (1,), "rhs_dilation": (1,),
             "padding": ((0, 0),)}
    if op.attrs.get("window_reversal"):
        attrs["window_reversal"] = (False,)
    return _around(op, reshapes, [r.result for r in reshapes], attrs)


def _reduce_window(op: ir.Op) -> list[ir.Op] | None:
    if op.operands[0].shape:
        return None
    n = len(op.results)
    reshapes = [_add_unit_dim(v, op) for v in op.operands[:n]]
    attrs = {**op.attrs, "window_dimensions": (1,), "window_strides": (1,),
             "base_dilations": (1,), "window_dilations": (1,), "padding": ((0, 0),)}
    operands = [r.result for r in reshapes] + op.operands[n:]      # inits stay scalars
    return _around(op, reshapes, operands, attrs)


def _add_unit_dim(v: ir.Value, like: ir.Op) -> ir.Op:
    return ir.Op("reshape", [v], [ir.Value(ir.TensorType(v.shape + (1,), v.dtype))],
                 loc=like.loc, name=like.name)


def _around(op: ir.Op, reshapes: list[ir.Op], operands: list[ir.Value],
            attrs: dict) -> list[ir.Op]:
    """`reshapes` in, `op` on `operands` with results of one more unit dim, reshapes
    out to `op`'s own result values (so their uses stay as they are)."""
    wide = [ir.Value(ir.TensorType(r.shape + (1,), r.dtype)) for r in op.results]
    new = op.replace(operands=operands, results=wide, attrs=attrs)
    outs = [ir.Op("reshape", [w], [r], loc=op.loc, name=op.name)
            for w, r in zip(wide, op.results)]
    return reshapes + [new] + outs


RULES: dict[str, Callable[[ir.Op], list[ir.Op] | None]] = {
        "convolution": _conv,
        "reduce_window": _reduce_window,
}
