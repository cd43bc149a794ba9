"""select_and_scatter (the gradient of max / min pooling), with a GE / GT / LE / LT select
and an add scatter; the padding holds a value the select never prefers (-inf for max):

- windows that do not overlap, init 0 (the usual max-pool gradient), one kernel: per
  tile of the window grid, the K window elements (strided DMAs), their extreme m and,
  walking the offsets in XLA's order (first wins for GE / LE, last for GT / LT), the
  one-hot hit_k = (x_k == m) * remaining; C_k = select(hit_k, source, 0) is DMAed
  straight to its strided place in the zero-filled output;
- otherwise, through HBM temporaries: T_k[o] = x[o * stride + k] (strided copies), one
  elementwise region computing every C_k, then a read-add-write of the output at the
  window positions per offset, one kernel each.
NaN operands follow max's NaN propagation, not XLA's select order.
"""
from __future__ import annotations

import math

import numpy as np

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import sub
from .elementwise import emit_loop
from .errors import LoweringError
from .layout import View, row_major
from .movement import dram_copy, fill
from .regions import Input, Region
from .registry import LowerCtx, register_lowering
from .relayout import relayout
from .tileops import Step, engine_for
from .reduce import body_alu
from .window import (OFFSETS_FREE, OffsetBox, Window, _acc_dtype, identity, interior_view,
                     offset_boxes, offset_view, padded_copy)


# --- select_and_scatter --------------------------------------------------------------------

SELECTS = {"GE": ("max", False), "GT": ("max", True), "LE": ("min", False),
           "LT": ("min", True)}          # direction -> (extreme, last wins)


def select_kind(op: ir.Op) -> tuple[str, bool]:
    block = op.regions[0].block
    body = [o for o in block.ops if o.kind not in ("return", "func.return")]
    args = [v.name for v in block.args]
    if (len(body) != 1 or body[0].kind != "compare" or len(args) != 2
            or [v.name for v in body[0].operands] != args
            or body[0].attrs.get("comparison_direction") not in SELECTS):
        raise LoweringError(f"select_and_scatter select must be compare(GE|GT|LE|LT, a, b) "
                            f"({op.describe()})")
    return SELECTS[body[0].attrs["comparison_direction"]]


def _one_hot_region(temps, s: DramTensor, outs, extreme: str, last_wins: bool) -> Region:
    """m = extreme of T_k; hit_k = T_k == m and no hit before (in select order);
    C_k = select(hit_k, s, 0)."""
    shape = tuple(s.shape)
    k_n = len(temps)
    inputs = [Input(t, row_major(shape), t.dtype) for t in temps] + \
        [Input(s, row_major(shape), s.dtype)]
    steps: list[Step] = []

    def add(kind, args, dtype, **attrs) -> int:
        steps.append(Step(kind, tuple(args), dtype, attrs))
        return len(inputs) + len(steps) - 1

    dtype = temps[0].dtype
    m = 0
    for k in range(1, k_n):
        m = add("maximum" if extreme == "max" else "minimum", (m, k), dtype)
    zero = add("constant", (), s.dtype, value=0)
    remaining, outputs = None, []
    order = range(k_n - 1, -1, -1) if last_wins else range(k_n)
    for i, k in enumerate(order):
        hit = add("compare", (k, m), "bool", comparison_direction="EQ")
        if remaining is not None:
            hit = add("and", (hit, remaining), "bool")
        if i < k_n - 1:
            miss = add("not", (hit,), "bool")
            remaining = miss if remaining is None else add("and", (remaining, miss), "bool")
        outputs.append((add("select", (hit, k_n, zero), s.dtype), outs[k]))
    return Region(shape, inputs, steps, outputs)


@register_lowering("select_and_scatter")
def _select_and_scatter_lower(ctx: LowerCtx, x: DramTensor, s: DramTensor, init: DramTensor,
                              **attrs) -> None:
    out = ctx.outs[0]
    rank = len(x.shape)
    w = Window.of(attrs, rank)
    extreme, last_wins = select_kind(ctx.op)
    if body_alu(ctx.op.regions[1], s.dtype, "select_and_scatter scatter", ctx.op) != "add":
        raise LoweringError(f"select_and_scatter scatter must be add ({ctx.op.describe()})")
    value = ctx.constant(init)
    if value is None or x.dtype == "bool":
        raise LoweringError(f"select_and_scatter with a non-constant init or bool operand "
                            f"is not supported ({ctx.op.describe()})")
    value = np.asarray(value).reshape(-1)[0]
    if out.size == 0:
        return
    if s.size == 0:
        return fill(ctx.kb, out, value)
    ctx.kb.flops += 4 * s.size * math.prod(w.dims)
    shape = tuple(s.shape)
    xp = x
    if w.needs_padding():       # padding holds a value the select never prefers
        xp = padded_copy(ctx, x, w, identity(extreme, x.dtype))
    o = ctx.temp(w.padded_shape(x.shape), out.dtype) if w.needs_padding() else out
    boxes = None
    if not w.overlapping() and float(value) == 0.0:
        k_n = math.prod(w.dims)
        fmax = max(1, min(OFFSETS_FREE, (ctx.target.sbuf_bytes // 2) // (8 * (k_n + 8))))
        boxes = offset_boxes(shape, offset_view(xp, w, shape, w.offsets()[0]).axes, fmax,
                             ctx.target.partitions)
    if boxes is not None:
        fill(ctx.kb, o, value)
        _scatter_direct(ctx.next_kernel("scatter"), xp, s, o, w, extreme, last_wins, boxes)
    else:
        _scatter_via_temps(ctx, xp, s, o, w, value, extreme, last_wins)
    if o is not out:
        kb = ctx.next_kernel("unpad")
        relayout(kb, View.of(out), interior_view(o, w, x.shape))


def _scatter_direct(kb, xp: DramTensor, s: DramTensor, o: DramTensor, w: Window,
                    extreme: str, last_wins: bool, boxes: list[OffsetBox]) -> None:
    """Windows that do not overlap, init 0 (the max-pool gradient): per grid tile, the
    K window elements (one strided DMA each), their extreme m, and in select order the
    one-hot hit_k = (x_k == m) * remaining, remaining -= hit_k; C_k = select(hit_k, s, 0)
    goes straight to its strided place in the zero-filled output."""
    shape = tuple(s.shape)
    views = [offset_view(xp, w, shape, k) for k in w.offsets()]
    outs = [offset_view(o, w, shape, k) for k in w.offsets()]
    acc = _acc_dtype(xp.dtype)
    eng = engine_for(acc)
    fmax = max(b.free for b in boxes)
    xs = [kb.tile(fmax, acc) for _ in views]
    m, eq, rem, hit = (kb.tile(fmax, acc) for _ in range(4))
    st, zero, cs = kb.tile(fmax, s.dtype), kb.tile(fmax, s.dtype), kb.ring(2, fmax, s.dtype)
    kb.emit(isa.Memset, dst=zero, value=0, engine=engine_for(s.dtype))
    op = "max" if extreme == "max" else "min"
    order = list(range(len(views)))[::-1] if last_wins else list(range(len(views)))
    for b in boxes:
        pn, f = b.parts, b.free
        t = [sub(x, pn, f) for x in xs]
        mt, eqt, remt, hitt = (sub(z, pn, f) for z in (m, eq, rem, hit))
        for tile, v in zip(t, views):
            kb.dma(tile, kb.ap(xp, v.offset + b.view_offset, b.view_pattern))
        kb.dma(sub(st, pn, f), kb.ap(s, b.grid_offset, b.grid_pattern))
        if len(t) == 1:
            mt = t[0]
        else:
            kb.emit(isa.TensorTensor, dst=mt, data1=t[0], data2=t[1], op=op, engine=eng)
        for k in range(2, len(t)):
            kb.emit(isa.TensorTensor, dst=mt, data1=mt, data2=t[k], op=op, engine=eng)
        for i, k in enumerate(order):
            if i == 0:
                kb.emit(isa.TensorTensor, dst=hitt, data1=t[k], data2=mt, op="is_equal",
                        engine=eng)
            else:
                kb.emit(isa.TensorTensor, dst=eqt, data1=t[k], data2=mt, op="is_equal",
                        engine=eng)
                kb.emit(isa.TensorTensor, dst=hitt, data1=eqt, data2=remt, op="multiply",
                        engine=eng)
            if i == 0 and len(order) > 1:
                kb.emit(isa.TensorScalar, dst=remt, data=hitt, op0="subtract", operand0=1,
                        reverse0=True, engine=eng)
            elif i < len(order) - 1:
                kb.emit(isa.TensorTensor, dst=remt, data1=remt, data2=hitt, op="subtract",
                        engine=eng)
            c = sub(cs.next(), pn, f)
            kb.emit(isa.Select, dst=c, pred=hitt, on_true=sub(st, pn, f),
                    on_false=sub(zero, pn, f), engine=engine_for(s.dtype))
            kb.dma(kb.ap(o, outs[k].offset + b.view_offset, b.view_pattern), c)
    kb.release(*xs, m, eq, rem, hit, st, zero, cs)


def _scatter_via_temps(ctx: LowerCtx, xp: DramTensor, s: DramTensor, o: DramTensor,
                       w: Window, value, extreme: str, last_wins: bool) -> None:
    """The general case (overlapping windows, a non-zero init): through HBM temporaries."""
    shape = tuple(s.shape)
    # 1. the window elements, one contiguous temporary per offset
    temps = []
    for k in w.offsets():
        t = ctx.temp(shape, xp.dtype)
        dram_copy(ctx.kb, View.of(t), offset_view(xp, w, shape, k))
        temps.append(t)
    # 2. the one-hot contributions
    kb = ctx.next_kernel("select")
    contrib = [ctx.temp(shape, s.dtype) for _ in temps]
    kb.flops += emit_loop(kb, _one_hot_region(temps, s, contrib, extreme, last_wins))
    # 3. added into the (padded) output, one offset at a time
    fill(ctx.next_kernel("scatter"), o, value)
    kb = ctx.next_kernel("add")
    for k, c in zip(w.offsets(), contrib):
        view = offset_view(o, w, shape, k)
        cur = ctx.temp(shape, o.dtype)
        dram_copy(kb, View.of(cur), view)
        kb = ctx.next_kernel("add")
        total = ctx.temp(shape, o.dtype)
        region = Region(shape, [Input(cur, row_major(shape), o.dtype),
                                Input(c, row_major(shape), c.dtype)],
                        [Step("add", (0, 1), o.dtype)], [(2, total)])
        kb.flops += emit_loop(kb, region)
        kb = ctx.next_kernel("add")
        dram_copy(kb, view, View.of(total))
        kb = ctx.next_kernel("add")
