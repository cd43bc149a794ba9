"""reduce with add / max / min / multiply (`and` / `or` on bool; and `and` / `or` /
`xor` on integers, on GpSimd) over any axes,
alone or fused with the elementwise ops that produce its input (input fusion).

Partial results accumulate in FP32 for floats and in int32 for integers and bool
(uint32 / int64 / uint64 in their own type; exact, wrapping like XLA: integer work that
FP32 could round runs on GpSimd, see `_Reducer`), and are cast to the result type at the
end. Three tilings, by where the contiguous axis of the input is:

- rows: the innermost axis is reduced. Kept positions go on partitions, the reduced
  axes on the free axis (the DMA access pattern moves them innermost); TensorReduce
  along F per chunk, chunks combined with TensorTensor.
- columns: the innermost axis is kept. Reduced positions go on partitions, kept on F
  (up to 1024: long DMA rows); tiles are combined elementwise into a [P, F]
  accumulator, whose partitions are then reduced by TensorE transposes of 128 columns
  (bit-exact for FP32) and TensorReduces along F.
- stream: the innermost axis is kept and the reduced positions are few (a sum over a batch of 4 keeping [1023, 1024]: columns
  would use 4 partitions and 128-element rows). The kept space is tiled like an
  elementwise op ([P, F] blocks, flat or rows) and each reduced index's block is combined into a
  [P, F] accumulator elementwise: no transposes, every partition busy. Picked by
  `_stream_cheaper` (engine cycles, §6.3: max(MIN_II, N) per instruction).
- all: every axis is reduced. The flat input is tiled like an elementwise op, each tile
  reduced along F into a [P, 1] accumulator, which the transpose step finishes.

What is reduced comes from a source, one box at a time: the input tensor (a DMA per
box), or a fused region evaluated on the box (regions.py): its inputs are views of the
same index space (`views`: one Axes per view, merged together), so a broadcast mean in
`x - mean` is one value per partition in the rows tiling. The init value is skipped when
it is a known identity (0 for add, -inf for max, ...), and otherwise combined into the
result.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from hlo_passes import ir
from jax_trn.hw import dtypes as hw_dtypes, isa
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, sub
from .errors import LoweringError
from .folding_reduce import fold_source
from .intdigits import fp32_exact
from .layout import (View, box_offset, box_pattern, box_size, box_tiles, flat_tiles,
                     line_tiles, merge_axes, row_major, tiles)
from .movement import fill
from .reduce_ones import applies as ones_applies, ones_columns
from .regions import FMAX, Evaluator, Region
from .spread import spreader
from .relayout import relayout
from .registry import LowerCtx, register_lowering
from .tileops import TILE_OPS, Src, Step, engine_for, fill_scalar

COMBINERS = {"add": "add", "maximum": "max", "minimum": "min", "multiply": "multiply"}
BOOL_COMBINERS = {"and": "min", "or": "max", "maximum": "max", "minimum": "min"}
# integers also and / or / xor: GpSimd's integer ALU (§2.5), bit for bit
INT_COMBINERS = {**COMBINERS, "and": "bitwise_and", "or": "bitwise_or",
                 "xor": "bitwise_xor"}
BITWISE = ("bitwise_and", "bitwise_or", "bitwise_xor")
MIN_II = 64          # engine cycles of a short instruction (§6.3)
COLUMN_WIDTH = 1024  # kept positions per block of the columns tiling


def combiner(op, dtype: str) -> str:
    """The ALU op of a single-op reduce region (add, max, min, multiply)."""
    return body_alu(op.regions[0], dtype, "reduce combiner", op)


def body_alu(region, dtype: str, what: str, op) -> str:
    """The ALU op of a one-op binary body (add, max, min, multiply; and/or on bool):
    reduce, reduce_window and select_and_scatter bodies."""
    body = [o for o in region.block.ops if o.kind not in ("return", "func.return")]
    table = BOOL_COMBINERS if dtype == "bool" else \
        INT_COMBINERS if ir.is_int(dtype) else COMBINERS
    if len(body) != 1 or body[0].kind not in table:
        kinds = ", ".join(o.kind for o in body) or "nothing"
        raise LoweringError(f"{what} ({kinds}) is not supported; expected one of "
                            f"{sorted(table)} ({op.describe()})")
    return table[body[0].kind]


def identity(alu: str, dtype: str) -> float:
    if alu in ("add", "multiply", "bitwise_or", "bitwise_xor"):
        return int(alu == "multiply")
    if alu == "bitwise_and":            # every bit set
        return -1 if hw_dtypes.iinfo(ir.np_dtype(dtype)).min < 0 else hw_dtypes.iinfo(
            ir.np_dtype(dtype)).max
    if ir.is_float(dtype):
        return -np.inf if alu == "max" else np.inf
    info = hw_dtypes.iinfo(ir.np_dtype("uint8" if dtype == "bool" else dtype))
    lo, hi = (0, 1) if dtype == "bool" else (info.min, info.max)
    return lo if alu == "max" else hi


def is_identity(value, alu: str, dtype: str) -> bool:
    if value is None:
        return False
    v = np.asarray(value).reshape(-1)[:1].astype(np.float64)
    return bool(v.size and v[0] == identity(alu, dtype))


# --- sources: what is reduced, per box ---------------------------------------------------

class TensorSource:
    """The reduce's input tensor: one DMA per box."""

    def __init__(self, kb: KernelBuilder, x: DramTensor):
        self.kb, self.x, self.dtype = kb, x, x.dtype
        self.views = [row_major(x.shape)]
        self.tiles = kb.ring(3, FMAX, x.dtype)
        self.chunk = FMAX

    def load(self, boxes) -> isa.Tile:
        offset, pattern = boxes[0]
        free = tuple(n for _, n in pattern[1:])
        tile = sub(self.tiles.next(), pattern[0][1], free)
        self.kb.dma(tile, self.kb.ap(self.x, offset, pattern))
        return sub(tile, free=math.prod(free))

    def close(self) -> None:
        self.kb.release(self.tiles)


class RegionSource:
    """A fused region evaluated per box; value `vid` is reduced, its outputs stored."""

    def __init__(self, kb: KernelBuilder, region: Region, vid: int, chunk: int):
        self.kb, self.region, self.vid = kb, region, vid
        self.dtype, self.views, self.chunk = region.dtype(vid), region.views(), chunk
        self.ev = Evaluator(kb, region, chunk)
        self.spread = spreader(kb)

    def load(self, boxes) -> isa.Tile:
        parts = boxes[0][1][0][1]
        free = math.prod(n for _, n in boxes[0][1][1:])
        loaded = self.ev.load(boxes[1:])
        first = len(self.kb.instrs)
        vals = self.ev.compute(loaded, parts, free)
        tile = self.ev._full(vals[self.vid], parts, free, ("reduced",)).tile
        if self.spread is not None:         # the box's elementwise work (spread.py)
            self.spread.after_tile(first)
        self.ev.store(vals, boxes[0], free)
        return tile

    def close(self) -> None:
        self.ev.close()


# --- the reducer -----------------------------------------------------------------------------

class _Reducer:
    """Shared pieces of the three tilings: accumulators, init, cast and store.

    VectorE reduces in FP32 (§2.3): an integer reduction whose partial results could
    pass 2**24 (`fp32_exact`) runs on GpSimd's integer ALU instead (§2.5): along F by
    its tensor_reduce mode, across partitions by tensor_partition_reduce (min as
    ~max(~x)), a product by a TensorE transpose (bit-exact data movement) and a
    GpSimd reduce along F."""

    def __init__(self, kb: KernelBuilder, source, out: DramTensor, alu: str, init,
                 count: int, exact: bool | None = None):
        self.kb, self.source, self.out, self.alu = kb, source, out, alu
        self.pmax = kb.target.partitions
        self.acc_dtype = acc = "float32" if ir.is_float(source.dtype) else \
            source.dtype if source.dtype in ("uint32", "int64", "uint64") else "int32"
        # uint32: min/max above 2**31; 64-bit integers: sums past the int32 range
        if source.dtype == "uint64" and alu in ("max", "min"):
            raise LoweringError(f"{alu} of uint64 is not supported: the integer ALU "
                                "compares in signed 64-bit")
        self.engine = engine_for(acc)
        self.free_engine = "vector" if exact or exact is None and fp32_exact(
            alu, source.dtype, source.chunk) else "gpsimd"
        self.cross_exact = exact or exact is None and fp32_exact(alu, source.dtype, count)
        self.ident = identity(alu, source.dtype)
        self.init = self._load_init(init, out.dtype) if init is not None else None
        self.parts = kb.ring(2, 1, acc)
        self.accs = kb.ring(2, 1 if self.cross_exact else self.pmax, acc)
        self.psum = kb.ring(2, self.pmax, acc, mem="psum")
        wide = 1 if self.cross_exact else self.pmax      # [1, fc] results from GpSimd
        self.res = kb.ring(2, wide, out.dtype) if out.dtype != acc else None

    def _load_init(self, init, dtype: str) -> isa.Tile:
        """A [P, 1] tile of the init value: from DRAM, or an immediate."""
        if isinstance(init, DramTensor):
            tile = self.kb.tile(1, init.dtype)
            self.kb.dma(tile, self.kb.ap(init, 0, ((0, self.pmax), (1, 1))))
            return tile
        return fill_scalar(self.kb, self.kb.tile(1, dtype), init)

    def load(self, boxes) -> isa.Tile:
        return self.source.load(boxes)

    def reduce_free(self, data: isa.Tile, dst: isa.Tile | None = None,
                    engine: str | None = None) -> isa.Tile:
        dst = dst or sub(self.parts.next(), data.num_partitions, 1)
        if (engine or self.free_engine) == "vector":
            self.kb.emit(isa.TensorReduce, dst=dst, data=data, op=self.alu)
        else:
            self.kb.emit(isa.TensorReduce, dst=dst, data=data, op=self.alu, engine="gpsimd")
        return dst

    def combine(self, acc: isa.Tile, part: isa.Tile) -> None:
        self.kb.emit(isa.TensorTensor, dst=acc, data1=acc, data2=part, op=self.alu,
                     engine=self.engine)

    def accumulator(self, free: int) -> isa.Tile:
        acc = self.kb.tile(free, self.acc_dtype)
        self.kb.emit(isa.Memset, dst=acc, value=self.ident, engine=self.engine)
        return acc

    def finish(self, res: isa.Tile, offset: int, pattern) -> None:
        """Applies the init value, casts to the result type and DMAs [p, 1] (or, from
        `across_partitions` on GpSimd, [1, p]) out."""
        row = res.num_partitions == 1 and res.free_size > 1
        if self.init is not None:
            if row:
                self.kb.emit(isa.TensorScalar, dst=res, data=res, op0=self.alu,
                             operand0=sub(self.init, 1), engine=self.engine)
            else:
                self.combine(res, sub(self.init, res.num_partitions))
        if self.res is not None and res.dtype != self.out.dtype:
            dst = sub(self.res.next(), res.num_partitions, res.free_size)
            step = Step("convert", (0,), self.out.dtype)
            TILE_OPS["convert"].emit(self.kb, dst, [Src.of(res)], step)
            res = dst
        if row:
            pattern = ((1, 1), pattern[0])
        self.kb.dma(self.kb.ap(self.out, offset, pattern), res)

    def finish_block(self, acc: isa.Tile, offset: int, pattern) -> None:
        """`finish` for a [P, F] block of results (the stream tiling): the init value
        as a per-partition operand, the cast, one DMA out."""
        parts, free = acc.num_partitions, acc.free_size
        if self.init is not None:
            self.kb.emit(isa.TensorScalar, dst=acc, data=acc, op0=self.alu,
                         operand0=sub(self.init, parts), engine=self.engine)
        res = acc
        if self.out.dtype != self.acc_dtype:
            res = sub(self.kb.tile(free, self.out.dtype, parts=self.pmax), parts, free)
            step = Step("convert", (0,), self.out.dtype)
            TILE_OPS["convert"].emit(self.kb, res, [Src.of(acc)], step)
        self.kb.dma(self.kb.ap(self.out, offset, pattern), res)
        if res is not acc:
            self.kb.release(res)

    def across_partitions(self, acc: isa.Tile, fc: int) -> isa.Tile:
        """[P, fc] -> [fc, 1]: TensorE transpose into PSUM, then reduce along F; an
        integer reduce that FP32 could round: [1, fc] on GpSimd (`_across_gpsimd`)."""
        if not self.cross_exact:
            return self._across_gpsimd(sub(acc, self.pmax, fc), fc)
        tp = sub(self.psum.next(), fc, self.pmax)
        self.kb.emit(isa.NcTranspose, dst=tp, data=sub(acc, self.pmax, fc))
        return self.reduce_free(tp, sub(self.accs.next(), fc, 1), "vector")

    def _across_gpsimd(self, data: isa.Tile, fc: int) -> isa.Tile:
        """Exact integer [P, fc] -> [1, fc] by tensor_partition_reduce (add, max, and,
        or; min as ~max(~x), `~` reversing the order); a product or xor -> [fc, 1] by a
        TensorE transpose (moves bits), a copy out of PSUM and a GpSimd reduce along F."""
        kb = self.kb
        if self.alu in ("multiply", "bitwise_xor"):
            tp = sub(self.psum.next(), fc, self.pmax)
            kb.emit(isa.NcTranspose, dst=tp, data=data)
            rows = sub(self.accs.next(), fc, self.pmax)
            kb.emit(isa.TensorCopy, dst=rows, src=tp, engine="scalar")
            return self.reduce_free(rows, sub(self.parts.next(), fc, 1))
        dst = sub(self.accs.next(), 1, fc)
        if self.alu == "min":
            kb.emit(isa.TensorScalar, dst=data, data=data, op0="bitwise_xor", operand0=-1,
                    engine="gpsimd")
        kb.emit(isa.TensorPartitionReduce, dst=dst, data=data,
                op=self.alu if self.alu in ("add", "bitwise_and", "bitwise_or") else "max")
        if self.alu == "min":
            kb.emit(isa.TensorScalar, dst=dst, data=dst, op0="bitwise_xor", operand0=-1,
                    engine="gpsimd")
        return dst

    def close(self) -> None:
        rings = [self.parts, self.accs, self.psum] + ([self.res] if self.res else [])
        self.kb.release(*rings, *([self.init] if self.init is not None else []))
        self.source.close()


def _boxes(kept, red, kbox, rbox, kept_on_partitions: bool):
    """(offset, pattern) per view for a kept box and a reduced box."""
    out = []
    for k, r in zip(kept, red):
        offset = box_offset(k, kbox) + box_offset(r, rbox)
        if kept_on_partitions:
            out.append((offset, box_pattern(k, kbox)[-1:] + box_pattern(r, rbox)))
        else:
            out.append((offset, box_pattern(r, rbox)[-1:] + box_pattern(k, kbox)[-1:]))
    return out


def _rows(r: _Reducer, kept, outs, red) -> None:
    """Kept positions on partitions, each row's chunks reduced along F and combined into
    a [P, 1] accumulator: FP32, or a max / min of 16-bit floats in their own type (one
    of the values, exact; a BF16 TensorReduce costs N / 2, §6.3)."""
    accs, parts_ring = r.accs, r.parts
    if r.alu in ("max", "min") and r.source.dtype in ("bfloat16", "float16"):
        accs, parts_ring = (r.kb.ring(2, 1, r.source.dtype) for _ in range(2))
    for kbox in line_tiles([n for _, n in kept[0]], r.pmax):
        parts = box_pattern(kept[0], kbox)[-1][1]
        acc = sub(accs.next(), parts, 1)
        for i, rbox in enumerate(box_tiles([n for _, n in red[0]], r.source.chunk)):
            boxes = _boxes(kept, red, kbox, rbox, True)
            part = acc if i == 0 else sub(parts_ring.next(), parts, 1)
            if hasattr(r.source, "sum_box"):        # a fold (folding_reduce.py)
                r.source.sum_box(boxes, part)
            else:
                r.reduce_free(r.load(boxes), part)
            if i:
                r.combine(acc, part)
        r.finish(acc, box_offset(outs, kbox), box_pattern(outs, kbox)[-1:] + ((1, 1),))
    if accs is not r.accs:
        r.kb.release(accs, parts_ring)


def _columns(r: _Reducer, kept, outs, red) -> None:
    """Kept blocks of up to `column_width` positions on F (long DMA rows, §3.4), the
    reduced positions P at a time on partitions, combined into a [P, fc] accumulator;
    its partitions are reduced 128 columns at a time (`across_partitions`)."""
    width = column_width(r.source.chunk, r.pmax)
    if ones_applies(r):             # 16-bit sums: a ones-vector matmul (reduce_ones.py)
        return ones_columns(r, kept, outs, red,
                            lambda kbox, rbox: _boxes(kept, red, kbox, rbox, False), width)
    last = outs[-1][0] if outs else 1
    for kbox in line_tiles([n for _, n in kept[0]], width):
        fc = box_pattern(kept[0], kbox)[-1][1]
        acc = r.accumulator(fc)
        for rbox in line_tiles([n for _, n in red[0]], r.pmax):
            tile = r.load(_boxes(kept, red, kbox, rbox, False))
            r.combine(sub(acc, tile.num_partitions), tile)
        base = box_offset(outs, kbox)
        for c0, cn in tiles(fc, r.pmax):
            res = r.across_partitions(sub(acc, free=cn, at=c0), cn)
            r.finish(res, base + c0 * last, ((last, cn), (1, 1)))
        r.kb.release(acc)


def column_width(chunk: int, pmax: int) -> int:
    """Kept positions per block of the columns tiling: 1024 (4 KiB FP32 rows, §3.4),
    within the source's chunk, a whole number of 128-column transposes."""
    return max(pmax, min(COLUMN_WIDTH, chunk) // pmax * pmax)


def _stream_cheaper(blocks: list, red: int, k: int, chunk: int, pmax: int) -> bool:
    """Whether streaming the reduced indices over the kept `blocks` ((boxes, parts,
    free) each) costs fewer engine cycles than `_columns` (max(MIN_II, N) per
    instruction plus MIN_II for its DMA, §6.3; columns also transposes and reduces
    each kept block)."""
    ii = MIN_II     # the compiler's estimate; the hardware model prices the result
    stream = sum(red * (max(ii, free) + ii) for _, _, free in blocks)
    width = column_width(chunk, pmax)
    kboxes, rboxes, fc = -(-k // width), -(-red // pmax), min(k, width)
    columns = kboxes * (rboxes * (max(ii, fc) + ii) +
                        -(-fc // pmax) * (2 * max(ii, pmax) + ii))
    return stream < columns


def _kept_blocks(kept, chunk: int, pmax: int) -> list:
    """[P, F] blocks of the kept index space, as (a box per view, parts, free): flat
    tiles when every view is one axis; else the trailing axes that fit `chunk` on the
    free side and the others on partitions, like an elementwise op's rows tiling."""
    sizes = [n for _, n in kept[0]]
    if len(sizes) == 1:
        return [([(t.offset * s, ((t.pstride * s, t.parts), (s, t.free)))
                  for ((s, _),) in kept], t.parts, t.free)
                for t in flat_tiles(sizes[0], chunk, pmax)]
    nfree, size = 1, sizes[-1]
    while nfree < len(sizes) - 1 and size * sizes[-nfree - 1] <= chunk:
        size *= sizes[-nfree - 1]
        nfree += 1
    out = []
    for rbox in line_tiles(sizes[:-nfree], pmax):
        for fbox in box_tiles(sizes[-nfree:], chunk):
            boxes = [(box_offset(v[:-nfree], rbox) + box_offset(v[-nfree:], fbox),
                      box_pattern(v[:-nfree], rbox)[-1:] + box_pattern(v[-nfree:], fbox))
                     for v in kept]
            out.append((boxes, boxes[0][1][0][1], box_size(fbox)))
    return out


def _stream(r: _Reducer, blocks: list, red) -> None:
    """Per kept block (the views' boxes, the output's last), every reduced index's
    block is combined into an FP32 (or integer) [P, F] accumulator."""
    red_sizes = [m for _, m in red[0]]
    for boxes, parts, free in blocks:
        acc = sub(r.stream_acc.next(), parts, free)
        for i, index in enumerate(itertools.product(*map(range, red_sizes))):
            views = [(off + sum(j * rs for j, (rs, _) in zip(index, rv)), pattern)
                     for (off, pattern), rv in zip(boxes[:-1], red)]
            data = sub(r.load(views), parts, free)
            if i == 0:
                r.kb.emit(isa.TensorCopy, dst=acc, src=data, engine=r.engine)
            else:
                r.combine(acc, data)
        r.finish_block(acc, *boxes[-1])


def _all(r: _Reducer, axes, n: int) -> None:
    acc = r.accumulator(1)
    for t in flat_tiles(n, r.source.chunk, r.pmax):
        boxes = [(t.offset * s, ((t.pstride * s, t.parts), (s, t.free))) for s, _ in axes]
        part = r.reduce_free(r.load(boxes))
        r.combine(sub(acc, t.parts), part)
    r.finish(r.across_partitions(acc, 1), 0, ((1, 1), (1, 1)))
    r.kb.release(acc)


def emit_reduce(kb: KernelBuilder, source, shape, out: DramTensor, alu: str, init,
                dimensions, exact: bool | None = None) -> None:
    """Reduces `source` (index space `shape`) over `dimensions` into `out`; `init` is a
    DramTensor, an immediate, or None (a known identity). `exact`: the caller knows
    FP32 reduces its integers exactly (None: judged from the dtype, `fp32_exact`)."""
    if alu == "add" and init is None:
        source = fold_source(source)
    r = _Reducer(kb, source, out, alu, init, math.prod(shape[d] for d in dimensions),
                 exact)
    views = source.views
    kept = [tuple(a for d, a in enumerate(v) if d not in dimensions) for v in views]
    *kept, outs = merge_axes(*kept, row_major([n for d, n in enumerate(shape)
                                               if d not in dimensions]))
    red = merge_axes(*[tuple(v[d] for d in sorted(dimensions)) for v in views])
    if not kept[0]:
        flat = merge_axes(*views)
        if len(flat[0]) <= 1:
            _all(r, [m[0] if m else (1, 1) for m in flat], math.prod(shape))
        else:       # a fused input that is not contiguous: one row on one partition
            _rows(r, [()] * len(views), (), red)
    else:
        inner_reduced = bool(red[0]) and red[0][-1][0] == 1
        if inner_reduced:
            _rows(r, kept, outs, red)
        else:
            _kept_or_columns(r, kept, outs, red, math.prod(shape))
    r.close()


def _kept_or_columns(r: _Reducer, kept, outs, red, n: int) -> None:
    """The innermost axis kept: the stream tiling when it is cheaper, else columns."""
    nred = math.prod(m for _, m in red[0])
    blocks = _kept_blocks([*kept, outs], r.source.chunk, r.pmax)
    if _stream_cheaper(blocks, nred, n // nred, r.source.chunk, r.pmax):
        r.stream_acc = r.kb.ring(2, r.source.chunk, r.acc_dtype)
        _stream(r, blocks, red)
        r.kb.release(r.stream_acc)
    else:
        _columns(r, kept, outs, red)


def _fill_init(ctx: LowerCtx, init: DramTensor, out: DramTensor) -> None:
    value = ctx.constant(init)
    if value is not None:
        return fill(ctx.kb, out, np.asarray(value).reshape(-1)[0])
    relayout(ctx.kb, View.of(out), View(init, tuple((0, n) for n in out.shape)))


@register_lowering("reduce")
def _reduce_lower(ctx: LowerCtx, *operands: DramTensor, dimensions) -> None:
    if len(operands) != 2:      # two reduced at once: argreduce.py's rule (4 operands)
        raise LoweringError(f"reduce of {len(operands) // 2} operands at once is not "
                            f"supported ({ctx.op.describe()})")
    x, init = operands
    out, alu = ctx.outs[0], combiner(ctx.op, x.dtype)
    ctx.kb.flops += x.size
    if out.size == 0:
        return
    if x.size == 0:
        return _fill_init(ctx, init, out)
    keep_init = not is_identity(ctx.constant(init), alu, x.dtype)
    emit_reduce(ctx.kb, TensorSource(ctx.kb, x), tuple(x.shape), out, alu,
                init if keep_init else None, tuple(dimensions))

