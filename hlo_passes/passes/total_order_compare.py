"""total-order-compare: a float compare in total order becomes a signed integer compare.

`compare` with compare_type TOTALORDER (JAX's `lax.lt_to` / `le_to` / `eq_to`, e.g.
`jnp.searchsorted`'s "scan" and "compare_all" methods) orders
-NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN. The engines compare floats IEEE-wise
(a NaN is unordered, -0 == +0), so the lowering's float compare gave NaN-less answers
(searchsorted of NaNs was a silent wrong result). As XLA's expanders do, the operands
become integers that order the same way:

    i   = bitcast_convert(x) to the signed integer of x's width
    key = i ^ ((i >> (w - 1)) & INT_MAX)       (negative floats: all bits but the sign
                                                flipped, so larger magnitude is smaller)

and the compare is SIGNED on the keys. Comparators of sort, reduce, scatter and window
bodies are left alone: their lowerings read total order themselves (lower/sortkeys.py).
"""
from __future__ import annotations

import numpy as np

from hlo_passes import ir
from hlo_passes.complex_math import Builder

name = "total-order-compare"
# Ops whose regions are combiners / comparators, not control flow.
COMBINER_OPS = frozenset({"sort", "reduce", "reduce_window", "scatter", "select_and_scatter",
                          "all_reduce", "reduce_scatter"})
INT_OF_WIDTH = {8: "int8", 16: "int16", 32: "int32", 64: "int64"}


def run(module: ir.Module) -> bool:
    changed = False
    for fn in module.functions.values():
        changed |= _rewrite_block(fn.body)
    return changed


def _rewrite_block(block: ir.Block) -> bool:
    changed, ops, mapping = False, [], {}
    for op in block.ops:
        if op.kind not in COMBINER_OPS:
            for region in op.regions:
                for inner in region.blocks:
                    changed |= _rewrite_block(inner)
        if _is_total_order_float(op):
            b = Builder(ops, op.loc, op.name)
            x, y = (_key(b, v) for v in op.operands)
            mapping[op.result] = b.emit("compare", [x, y], op.result.shape, "bool",
                                        comparison_direction=op.attrs["comparison_direction"],
                                        compare_type="SIGNED")
            changed = True
        else:
            ops.append(op)
    block.ops = ops
    block.replace_all_uses(mapping)
    return changed


def _is_total_order_float(op: ir.Op) -> bool:
    return (op.kind == "compare" and op.attrs.get("compare_type") == "TOTALORDER"
            and ir.is_float(op.operands[0].dtype))


def _key(b: Builder, x: ir.Value) -> ir.Value:
    bits = ir.np_dtype(x.dtype).itemsize * 8
    itype = INT_OF_WIDTH[bits]
    i = b.emit("bitcast_convert", [x], x.shape, itype)
    sign = b.binary("shift_right_arithmetic", i, b.const(bits - 1, i))
    flip = b.binary("and", sign, b.const(np.iinfo(ir.np_dtype(itype)).max, i))
    return b.binary("xor", i, flip)
