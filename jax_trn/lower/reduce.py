"""reduce with add / max / min (and `and` / `or` on bool) over any axes.

Partial results accumulate in FP32 for floats and natively in int32 for integers and
bool (exact, wrapping like XLA), and are cast to the result type at the end. Three
tilings, by where the contiguous axis of the input is:

- rows: the innermost axis is reduced. Kept positions go on partitions, the reduced
  axes on the free axis (the DMA access pattern moves them innermost); TensorReduce
  along F per chunk, chunks combined with TensorTensor.
- columns: the innermost axis is kept. Reduced positions go on partitions, kept on F;
  tiles are combined elementwise into a [128, F] accumulator, whose partitions are then
  reduced by a TensorE transpose (bit-exact for FP32) and a TensorReduce along F.
- all: every axis is reduced. The flat input is tiled like an elementwise op, each tile
  reduced along F into a [128, 1] accumulator, which the transpose step finishes.

The init value is skipped when it is a known identity (0 for add, -inf for max, ...),
and otherwise combined into the result.
"""
from __future__ import annotations

import math

import numpy as np

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, sub
from .elementwise import FMAX, TILE_OPS, Src, Step, _engine
from .errors import LoweringError
from .layout import (P, Axes, View, box_offset, box_pattern, box_tiles, flat_tiles,
                     line_tiles, merge_axes, row_major)
from .movement import fill
from .relayout import relayout
from .registry import LowerCtx, register_lowering

COMBINERS = {"add": "add", "maximum": "max", "minimum": "min"}
BOOL_COMBINERS = {"and": "min", "or": "max", "maximum": "max", "minimum": "min"}


def combiner(op: ir.Op, dtype: str) -> str:
    """The ALU op of a single-op reduce region (add, max, min)."""
    body = [o for o in op.regions[0].block.ops if o.kind not in ("return", "func.return")]
    table = BOOL_COMBINERS if dtype == "bool" else COMBINERS
    if len(body) != 1 or body[0].kind not in table:
        kinds = ", ".join(o.kind for o in body) or "nothing"
        raise LoweringError(f"reduce combiner ({kinds}) is not supported; expected one of "
                            f"{sorted(table)} ({op.describe()})")
    return table[body[0].kind]


def identity(alu: str, dtype: str) -> float:
    if alu == "add":
        return 0
    if ir.is_float(dtype):
        return -np.inf if alu == "max" else np.inf
    info = np.iinfo(ir.np_dtype("uint8" if dtype == "bool" else dtype))
    lo, hi = (0, 1) if dtype == "bool" else (info.min, info.max)
    return lo if alu == "max" else hi


def _is_identity(value: np.ndarray | None, alu: str, dtype: str) -> bool:
    if value is None:
        return False
    v = np.asarray(value).reshape(-1)[:1].astype(np.float64)
    return bool(v.size and v[0] == identity(alu, dtype))


class _Reducer:
    """Shared pieces of the three tilings: accumulators, init, cast and store."""

    def __init__(self, kb: KernelBuilder, x: DramTensor, out: DramTensor, alu: str,
                 init: DramTensor | None):
        self.kb, self.x, self.out, self.alu = kb, x, out, alu
        self.acc_dtype = acc = "float32" if ir.is_float(x.dtype) else "int32"
        self.engine = _engine(acc)
        self.ident = identity(alu, x.dtype)
        self.init = self._load_init(init) if init is not None else None
        self.tiles = kb.ring(3, FMAX, x.dtype)
        self.parts = kb.ring(2, 1, acc)
        self.accs = kb.ring(2, 1, acc)
        self.psum = kb.ring(2, P, acc, mem="psum")
        self.res = kb.ring(2, 1, out.dtype) if out.dtype != acc else None

    def _load_init(self, init: DramTensor) -> isa.Tile:
        tile = self.kb.tile(1, init.dtype)
        self.kb.dma(tile, self.kb.ap(init, 0, ((0, P), (1, 1))))
        return tile

    def load(self, offset: int, pattern: Axes) -> isa.Tile:
        """DMAs a [p, *free] box of the input; returns it flattened to [p, F]."""
        free = tuple(n for _, n in pattern[1:])
        tile = sub(self.tiles.next(), pattern[0][1], free)
        self.kb.dma(tile, self.kb.ap(self.x, offset, pattern))
        return sub(tile, free=math.prod(free))

    def reduce_free(self, data: isa.Tile, dst: isa.Tile | None = None) -> isa.Tile:
        dst = dst or sub(self.parts.next(), data.num_partitions, 1)
        self.kb.emit(isa.TensorReduce, dst=dst, data=data, op=self.alu)
        return dst

    def combine(self, acc: isa.Tile, part: isa.Tile) -> None:
        self.kb.emit(isa.TensorTensor, dst=acc, data1=acc, data2=part, op=self.alu,
                     engine=self.engine)

    def accumulator(self, free: int) -> isa.Tile:
        acc = self.kb.tile(free, self.acc_dtype)
        self.kb.emit(isa.Memset, dst=acc, value=self.ident, engine=self.engine)
        return acc

    def finish(self, res: isa.Tile, offset: int, pattern: Axes) -> None:
        """Applies the init value, casts to the result type and DMAs [p, 1] out."""
        if self.init is not None:
            self.combine(res, sub(self.init, res.num_partitions))
        if self.res is not None:
            dst = sub(self.res.next(), res.num_partitions, 1)
            step = Step("convert", (0,), self.out.dtype)
            TILE_OPS["convert"](self.kb, dst, [Src(res)], step)
            res = dst
        self.kb.dma(self.kb.ap(self.out, offset, pattern), res)

    def across_partitions(self, acc: isa.Tile, fc: int) -> isa.Tile:
        """[128, fc] -> [fc, 1]: TensorE transpose into PSUM, then reduce along F."""
        tp = sub(self.psum.next(), fc, P)
        self.kb.emit(isa.NcTranspose, dst=tp, data=sub(acc, P, fc))
        return self.reduce_free(tp, sub(self.accs.next(), fc, 1))


def _rows(r: _Reducer, kept: Axes, outs: Axes, red: Axes) -> None:
    for rbox in line_tiles([n for _, n in kept], P):
        prow = box_pattern(kept, rbox)[-1:]
        acc = sub(r.accs.next(), prow[0][1], 1)
        for i, cbox in enumerate(box_tiles([n for _, n in red], FMAX)):
            off = box_offset(kept, rbox) + box_offset(red, cbox)
            data = r.load(off, prow + box_pattern(red, cbox))
            if i == 0:
                r.reduce_free(data, acc)
            else:
                r.combine(acc, r.reduce_free(data))
        r.finish(acc, box_offset(outs, rbox), box_pattern(outs, rbox)[-1:] + ((1, 1),))


def _columns(r: _Reducer, kept: Axes, outs: Axes, red: Axes) -> None:
    for kbox in line_tiles([n for _, n in kept], P):
        fcol = box_pattern(kept, kbox)[-1:]
        fc = fcol[0][1]
        acc = r.accumulator(fc)
        for rbox in line_tiles([n for _, n in red], P):
            off = box_offset(kept, kbox) + box_offset(red, rbox)
            tile = r.load(off, box_pattern(red, rbox)[-1:] + fcol)
            r.combine(sub(acc, tile.num_partitions), tile)
        res = r.across_partitions(acc, fc)
        r.finish(res, box_offset(outs, kbox), box_pattern(outs, kbox)[-1:] + ((1, 1),))
        r.kb.release(acc)


def _all(r: _Reducer) -> None:
    acc = r.accumulator(1)
    for t in flat_tiles(r.x.size, FMAX):
        part = r.reduce_free(r.load(t.offset, t.pattern))
        r.combine(sub(acc, t.parts), part)
    r.finish(r.across_partitions(acc, 1), 0, ((1, 1), (1, 1)))
    r.kb.release(acc)


def _fill_init(ctx: LowerCtx, init: DramTensor, out: DramTensor) -> None:
    value = ctx.constant(init)
    if value is not None:
        return fill(ctx.kb, out, np.asarray(value).reshape(-1)[0])
    relayout(ctx.kb, View.of(out), View(init, tuple((0, n) for n in out.shape)))


@register_lowering("reduce")
def _reduce_lower(ctx: LowerCtx, *operands: DramTensor, dimensions) -> None:
    if len(operands) != 2:
        raise LoweringError(f"reduce of {len(operands) // 2} operands at once is not "
                            f"supported ({ctx.op.describe()})")
    x, init = operands
    out, alu = ctx.outs[0], combiner(ctx.op, x.dtype)
    ctx.kb.flops += x.size
    if out.size == 0:
        return
    if x.size == 0:
        return _fill_init(ctx, init, out)
    keep_init = not _is_identity(ctx.constant(init), alu, x.dtype)
    r = _Reducer(ctx.kb, x, out, alu, init if keep_init else None)
    axes = row_major(x.shape)
    kept = tuple(a for d, a in enumerate(axes) if d not in dimensions)
    kept, outs = merge_axes(kept, row_major([n for _, n in kept]))
    (red,) = merge_axes(tuple(axes[d] for d in sorted(dimensions)))
    if not kept:
        return _all(r)
    inner_reduced = bool(red) and red[-1][0] == 1
    (_rows if inner_reduced else _columns)(r, kept, outs, red)
