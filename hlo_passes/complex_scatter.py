"""A complex scatter whose combiner multiplies (`x.at[i].multiply(y)`,
`x.at[i].power(y)` on complex arrays), in real ops for `complex-planes`.

With unique indices (JAX's `unique_indices=True`) each element of the operand meets
at most one update, so the scatter is `x * y` where an update lands and `x` elsewhere:

    placed = scatter-replace(x, i, y)          one per plane
    hit    = scatter-replace(false, i, true)   where an update lands
    out    = select(hit, x * placed, x)        a complex multiply (complex_math.mul)

the same single complex product per element as XLA's CPU backend computes. With
indices that may repeat, the order of the products would be the scatter's own (a
complex product is not exactly associative), so that form stays refused.
"""
from __future__ import annotations

from hlo_passes import complex_math, ir
from hlo_passes.complex_math import Builder, Planes
from hlo_passes.errors import HloImportError


def is_multiply(op: ir.Op) -> bool:
    """Whether `op`'s combiner returns the product of its two arguments."""
    blk = op.regions[0].block
    ops = blk.ops
    return (len(ops) == 2 and ops[0].kind == "multiply"
            and set(ops[0].operands) == set(blk.args[:2])
            and blk.terminator.operands[0] is ops[0].result)


def multiply(planes: list[Planes], b: Builder, op: ir.Op) -> Planes:
    """`op` (scatter, multiply combiner; operand and updates given as `planes`) as
    real scatters, a complex multiply and a select."""
    if not op.attrs.get("unique_indices"):
        raise HloImportError(f"complex scatter with a multiply combiner needs unique "
                             f"indices (unique_indices=True) ({op.describe()})")
    (x, upd), idx = planes, op.operands[1]
    placed = tuple(_replace(b, op, xp, idx, up) for xp, up in zip(x, upd))
    hit = _replace(b, op, b.const(False, x[0], "bool"), idx,
                   b.const(True, upd[0], "bool"))
    prod = complex_math.mul(b, x, placed)
    return tuple(b.select(hit, p, xp) for p, xp in zip(prod, x))


def _replace(b: Builder, op: ir.Op, x: ir.Value, idx: ir.Value, upd: ir.Value):
    """scatter(x, idx, upd) with `op`'s dimension numbers and a replace combiner."""
    args = [ir.Value(ir.TensorType((), x.dtype)) for _ in range(2)]
    body = ir.Region([ir.Block(args, [ir.Op("return", [args[1]], [])])])
    return b.emit_op("scatter", [x, idx, upd], [x.type], op.attrs, [body]).result



