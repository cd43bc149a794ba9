"""argmax / argmin: the variadic reduce over (values, indices) that `jnp.argmax`,
`jnp.argmin` and `lax.argmax` emit.

The reduce body is recognised structurally (`match`): with block arguments
(a, ai, b, bi),

    p  = compare(GT|LT, a, b) [or compare(NE, a, a)]     # a wins (NaN counts as extreme)
    q  = p or (compare(EQ, a, b) and compare(LT, ai, bi))  # ties: the smaller index
    return select(p, a, b), select(q, ai, bi)

Lowered as two kernels of instructions, reusing reduce.py's tilings:

1. m = max (min) reduce of the values into the first result (FP32 accumulation for
   floats, int32 for integers). The ALU's max / min propagate NaN, so a row holding a NaN
   reduces to NaN, as XLA's argmax value.
2. the second result = min reduce of select(x == m or x != x, index, INT32_MAX), with m
   read broadcast along the reduced axes: the smallest index holding the extreme value,
   or the first NaN when there is one (what the CPU backend returns).

The value init must be the combiner's identity (-inf / +inf, the integer limits) and the
index init 0, as JAX emits them: then the init only ever ties when every value equals
the identity, where the smallest index (0 for the iota) is the answer either way.
Anything else is a LoweringError naming the op.
"""
from __future__ import annotations

import numpy as np

from hlo_passes import ir
from jax_trn.hw.program import DramTensor

from .elementwise import free_size
from .errors import LoweringError
from .layout import row_major
from .intdigits import EXACT
from .reduce import RegionSource, TensorSource, _fill_init, emit_reduce, identity
from .registry import LowerCtx, register_lowering
from .regions import FMAX, Input, Region
from .tileops import Step

INDEX_MAX = int(np.iinfo(np.int32).max)


def _defs(block) -> dict[str, ir.Op]:
    return {r.name: o for o in block.ops for r in o.results}


def match(op: ir.Op) -> tuple[str, bool] | None:
    """("max" | "min", NaN check present) if the body is an argmax / argmin, else None."""
    if len(op.regions) != 1 or len(op.regions[0].blocks) != 1:
        return None
    block = op.regions[0].block
    if len(block.args) != 4:
        return None
    a, ai, b, bi = (v.name for v in block.args)
    defs = _defs(block)
    ret = block.terminator
    if ret.kind not in ("return", "func.return") or len(ret.operands) != 2:
        return None

    def op_of(v, kind):
        o = defs.get(v.name)
        return o if o is not None and o.kind == kind else None

    def is_cmp(v, direction, lhs, rhs):
        o = op_of(v, "compare")
        return (o is not None and o.attrs.get("comparison_direction") == direction
                and [x.name for x in o.operands] == [lhs, rhs])

    def pair(v, kind):
        o = op_of(v, kind)
        return tuple(o.operands) if o is not None and len(o.operands) == 2 else None

    sel_v, sel_i = (op_of(v, "select") for v in ret.operands)
    if sel_v is None or sel_i is None:
        return None
    p, *vals = sel_v.operands
    q, *idxs = sel_i.operands
    if [v.name for v in vals] != [a, b] or [v.name for v in idxs] != [ai, bi]:
        return None
    # p: compare(dir, a, b), optionally or'ed with compare(NE, a, a)
    nan, parts = False, pair(p, "or")
    if parts is not None:
        isnan = [v for v in parts if is_cmp(v, "NE", a, a)]
        if len(isnan) != 1:
            return None
        nan, cmp = True, next(v for v in parts if v is not isnan[0])
    else:
        cmp = p
    alu = next((k for k, d in (("max", "GT"), ("min", "LT")) if is_cmp(cmp, d, a, b)), None)
    if alu is None:
        return None
    # q: p or (compare(EQ, a, b) and compare(LT, ai, bi))
    parts = pair(q, "or")
    if parts is None or sum(v is p for v in parts) != 1:
        return None
    tie = pair(next(v for v in parts if v is not p), "and")
    if tie is None:
        return None
    eq = [v for v in tie if is_cmp(v, "EQ", a, b)]
    lt = [v for v in tie if is_cmp(v, "LT", ai, bi)]
    if len(eq) != 1 or len(lt) != 1:
        return None
    return alu, nan


def _constant(ctx: LowerCtx, t: DramTensor, what: str):
    value = ctx.constant(t)
    if value is None:
        raise LoweringError(f"an argmax/argmin reduce with a non-constant {what} init is "
                            f"not supported ({ctx.op.describe()})")
    return np.asarray(value).reshape(-1)[0]


@register_lowering("reduce", operands=4)
def lower_argreduce(ctx: LowerCtx, x: DramTensor, idx: DramTensor, xinit: DramTensor,
                    iinit: DramTensor, *, dimensions) -> None:
    found = match(ctx.op)
    if found is None:
        raise LoweringError(f"reduce of 2 operands at once that is not an argmax / "
                            f"argmin is not supported ({ctx.op.describe()})")
    alu, nan = found
    if not ir.is_int(idx.dtype) or tuple(x.shape) != tuple(idx.shape):
        raise LoweringError(f"argmax/argmin over {x.dtype} values with {idx.dtype} indices "
                            f"is not supported ({ctx.op.describe()})")
    v0, i0 = _constant(ctx, xinit, "value"), _constant(ctx, iinit, "index")
    if not (float(v0) == float(identity(alu, x.dtype)) and int(i0) == 0):
        raise LoweringError(f"an argmax/argmin reduce whose init is not ({identity(alu, x.dtype)}"
                            f", 0) is not supported ({ctx.op.describe()})")
    vout, iout = ctx.outs
    dims, shape = tuple(dimensions), tuple(x.shape)
    ctx.kb.flops += 4 * x.size
    if vout.size == 0:
        return
    if x.size == 0:
        _fill_init(ctx, xinit, vout)
        return _fill_init(ctx, iinit, iout)
    # 1. the extreme values
    emit_reduce(ctx.kb, TensorSource(ctx.kb, x), shape, vout, alu, None, dims)
    # 2. the smallest index holding them (or the first NaN)
    kb = ctx.next_kernel("index")
    bcast, kept = [], iter(row_major(vout.shape))
    for d, n in enumerate(shape):
        bcast.append((0, n) if d in dims else (next(kept)[0], n))
    inputs = [Input(x, row_major(shape), x.dtype), Input(vout, tuple(bcast), vout.dtype),
              Input(idx, row_major(shape), idx.dtype)]
    steps = [Step("compare", (0, 1), "bool", {"comparison_direction": "EQ"})]
    if nan and ir.is_float(x.dtype):
        steps += [Step("compare", (0, 0), "bool", {"comparison_direction": "NE"}),
                  Step("or", (3, 4), "bool")]
    steps += [Step("constant", (), idx.dtype, {"value": INDEX_MAX}),
              Step("select", (2 + len(steps), 2, 3 + len(steps)), idx.dtype)]
    region = Region(shape, inputs, steps, [])
    chunk = min(FMAX, free_size(kb, region, 4 * FMAX * ctx.target.partitions))
    source = RegionSource(kb, region, 2 + len(steps), chunk)
    emit_reduce(kb, source, shape, iout, "min", None, dims, exact=_small(ctx, idx))


def _small(ctx: LowerCtx, idx: DramTensor) -> bool:
    """Whether the indices are below 2**24, so VectorE's FP32 min of them is exact (so
    is the INT32_MAX filler's: it rounds to 2**31, which converts back to INT32_MAX):
    checked when they are a known constant; otherwise they are taken to be the iota
    along the reduced axes that jnp.argmax / lax.argmax pass, below 2**24 when the
    operand has fewer elements."""
    known = ctx.constant(idx)
    if known is not None:
        return not np.size(known) or bool(np.abs(np.asarray(known, np.int64)).max() < EXACT)
    return idx.size < EXACT
