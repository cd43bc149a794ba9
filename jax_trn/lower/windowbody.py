"""reduce_window with any elementwise body, over one or more operands (window.py's
rules cover one operand with an add / max / min / multiply body).

Such bodies come from `lax.reduce_window` with a Python function (a custom sum, a
subtract) and from the JVP of one: a 2-operand window over (primal, tangent) whose
body computes both. They need not be associative, so the windows are combined in
XLA's CPU order: every accumulator starts at its init, then for each window offset k,
row-major, `accs = body(accs, xs at offset k)`; elements in the padding or in the
holes of base dilation are skipped (XLA's CPU backend never reads them).

Per offset k: the operands' elements at offset k of every window are copied into
contiguous temporaries of the output shape (`relayout`: one DMA pattern each), and one
elementwise region (`emit_loop`, regions.py) reads the accumulators (the results,
updated in place) and those copies, runs the body's ops as tile steps and writes the
accumulators back. With padding or base dilation, a bool tensor of the padded shape
(True on the operand's elements) gives a mask per offset, and each new accumulator
is `select(mask, new, old)`. The body's ops must have tile rules (tileops/); others
are a LoweringError naming the op. Cost: K (window size) kernels of elementwise work
plus K x operands copies, so it serves small windows.
"""
from __future__ import annotations

import numpy as np

from hlo_passes import ir
from jax_trn.hw.program import DramTensor

from .elementwise import emit_loop
from .errors import LoweringError
from .layout import View, row_major
from .movement import fill
from .reduce import _fill_init
from .registry import LowerCtx
from .regions import Input, Region
from .relayout import relayout
from .tileops import TILE_OPS, Step

MAX_OFFSETS = 256           # windows larger than this are refused (K kernels each)


def reduce_window_any(ctx: LowerCtx, xs: list[DramTensor], inits: list[DramTensor],
                      w, pad, view_at) -> None:
    """The results `ctx.outs` of a reduce_window of `xs` (window `w`, window.Window)
    with the body of `ctx.op`, combined offset by offset (see the module doc).
    window.py's geometry: `pad(x, value)` is x in a padded temporary, `view_at(t, k)`
    the elements at window offset k of every window of `t`."""
    outs, shape = ctx.outs, tuple(ctx.outs[0].shape)
    offsets = w.offsets()
    if len(offsets) > MAX_OFFSETS:
        raise LoweringError(f"reduce_window with this body over a window of "
                            f"{len(offsets)} > {MAX_OFFSETS} elements is not supported "
                            f"({ctx.op.describe()})")
    masked = w.needs_padding()
    steps = body_steps(ctx.op, 2 * len(xs) + masked, ctx)
    for out, init in zip(outs, inits):
        _fill_init(ctx, init, out)
    srcs, mask = list(xs), None
    if masked:
        srcs = [pad(x, 0) for x in xs]
        ones = ctx.temp(tuple(xs[0].shape), "bool")
        fill(ctx.kb, ones, True)
        ctx.next_kernel("mask")
        mask = pad(ones, False)
    for k in offsets:
        kb = ctx.next_kernel("offset")
        views = srcs + ([mask] if mask is not None else [])
        copies = [ctx.temp(shape, t.dtype) for t in views]
        for t, c in zip(views, copies):
            relayout(kb, View.of(c), view_at(t, k))
        kb = ctx.next_kernel("combine")
        kb.flops += emit_loop(kb, _region(shape, outs, copies, steps, masked))


def _region(shape, outs, copies, steps: list[Step], masked: bool) -> Region:
    """Inputs: the accumulators, the operands at this offset (and the mask); steps:
    the body's (and the selects); outputs: the new accumulators, in place."""
    axes = row_major(shape)
    inputs = [Input(t, axes, t.dtype) for t in (*outs, *copies)]
    n = len(outs)
    steps = list(steps)
    results = [len(inputs) + i for i in steps.pop()]       # the body's returned values
    if masked:
        m = 2 * n
        for i, r in enumerate(results):
            steps.append(Step("select", (m, r, i), outs[i].dtype))
        results = list(range(len(inputs) + len(steps) - n, len(inputs) + len(steps)))
    return Region(shape, inputs, steps, list(zip(results, outs)))


def body_steps(op: ir.Op, base: int, ctx: LowerCtx) -> list:
    """The body's ops as tile steps over value ids (the accumulators, the operands,
    the mask if any: `base` inputs, then the steps); the last entry lists the step
    indices of the returned values. A value from outside the body (CSE shares a
    constant with the function's) must be a known scalar constant."""
    block = op.regions[0].block
    ids = {id(a): i for i, a in enumerate(block.args)}
    steps: list = []
    inside = {id(r) for o in block.ops for r in o.results}
    for v in {id(v): v for o in block.ops for v in o.operands}.values():
        if id(v) not in ids and id(v) not in inside:
            t = ctx.tensor_of(v)
            value = ctx.constant(t) if t is not None else None
            if value is None or np.size(value) != 1:
                raise LoweringError(f"{op.kind} body reads a value from outside "
                                    f"that is not a scalar constant ({op.describe()})")
            ids[id(v)] = base + len(steps)
            steps.append(Step("constant", (), v.dtype,
                              {"value": np.asarray(value).reshape(-1)[0].item()}))
    for o in block.ops:
        if o.kind in ("return", "func.return"):
            ret = [ids[id(v)] for v in o.operands]
            break
        if o.kind == "constant":
            value = np.asarray(o.attrs["value"]).reshape(-1)
            step = Step("constant", (), o.results[0].dtype, {"value": value[0].item()})
        elif o.kind in TILE_OPS and len(o.results) == 1:
            step = Step(o.kind, tuple(ids[id(v)] for v in o.operands), o.results[0].dtype,
                        dict(o.attrs))
        else:
            raise LoweringError(f"{op.kind} body op {o.kind} has no tile rule "
                                f"({op.describe()})")
        ids[id(o.results[0])] = base + len(steps)
        steps.append(step)
    if any(r < base for r in ret):          # a body returning an argument as is
        raise LoweringError(f"{op.kind} body returning its argument is not "
                            f"supported ({op.describe()})")
    return steps + [[r - base for r in ret]]
