"""Elementwise ops and loop fusions: one `Region` (regions.py) tiled over its index space.

A single elementwise op is a region of one step; a loop fusion hands over many steps
and broadcast inputs (fusion.py). `emit_loop` picks the tiling:

- flat: when every view (the index space and each input's axes) merges into a single
  axis (contiguous tensors and scalars), the flat index space is cut into [P, F]
  blocks plus an [r, 1] tail (`layout.flat_tiles`): the longest DMA runs;
- rows: otherwise (a row or column broadcast), the trailing merged axes go on the free
  side (at most F elements, `box_tiles`) and the leading ones on partitions, P at a
  time (`line_tiles`; P: the target's partitions). A broadcast row then is a stride-0 partition pattern (one DMA
  reading the same row into every partition), a broadcast column one value per
  partition, the TensorScalar operand.

Per tile the inputs are DMAed into SBUF ring buffers, every step runs on its engine
(tileops/), and the outputs are DMAed back: each input is read once and only the
region's outputs are written. In loops of MIN_BALANCED tiles or more, VectorE work
ScalarE can run ahead of it moves there (balance.py), then spread.py may give a
tile's VectorE work to GpSimd.
"""
from __future__ import annotations

import math
from functools import partial

from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder
from .layout import (box_offset, box_pattern, box_size, box_tiles, flat_tiles, line_tiles,
                     merge_axes, row_major)
from .regions import FMAX, Evaluator, Input, Region, _itemsize
from .balance import scalar_balance
from .spread import spreader
from .registry import LowerCtx, register_lowering
from .tileops import TILE_OPS, Src, Step, engine_for

__all__ = ["FMAX", "TILE_OPS", "Src", "Step", "emit_loop", "single_op_region"]

MIN_FREE = 512       # below this a DMA moves < 2 KiB per partition (§3.4): prefer fewer tiles
MIN_BALANCED = 4     # tiles of a loop whose work balance.py spreads (see _Engines)
TILE_BYTES = 8192    # per partition: DMA runs of 8 KiB are ~97% efficient (§3.4)
_engine = engine_for     # the name other rule modules import


def emit_loop(kb: KernelBuilder, region: Region) -> int:
    """Emits the tiled loop of `region` into `kb`; returns its FLOP count."""
    n = region.size
    if n == 0:
        return 0
    merged = merge_axes(*region.views())
    free = free_size(kb, region, n // kb.target.partitions)
    ev = Evaluator(kb, region, free)
    spread = _Engines(kb, n >= MIN_BALANCED * kb.target.partitions * free)
    if len(merged[0]) <= 1:
        _flat(ev, merged, n, free, spread)
    else:
        _rows(ev, merged, free, spread)
    ev.close()
    return n * sum(1 for s in region.steps if s.kind != "constant")


def free_size(kb: KernelBuilder, region: Region, cols: int) -> int:
    """F of the [P, F] tiles: what fits half of SBUF, at least 4 tiles when large,
    and at most FMAX elements or TILE_BYTES per partition of the widest input."""
    ins, steps = region.bytes_per_element()
    fit = max(1, (kb.target.sbuf_bytes // 2) // max(1, ins + steps))
    widest = max([_itemsize(i.dtype) for i in region.inputs if i.t is not None] + [1])
    cap = max(FMAX, TILE_BYTES // widest)
    return max(1, min(cap, fit, max(MIN_FREE, -(-cols // 4))))


class _Engines:
    """Each tile's work spread over the engines: tensor_scalars and copies to ScalarE
    while it has room (balance.py), then the rest of VectorE's to GpSimd when that
    finishes first (spread.py)."""

    def __init__(self, kb: KernelBuilder, balance: bool):
        self.scalar = scalar_balance(kb) if balance else None
        self.gpsimd = spreader(kb)

    def after_tile(self, first: int) -> None:
        if self.scalar is not None:
            self.scalar.after_tile(first)
        self.gpsimd.after_tile(first)


def _compute(ev: Evaluator, loaded, parts: int, free: int, spread):
    first = len(ev.kb.instrs)
    vals = ev.compute(loaded, parts, free)
    if spread is not None:
        spread.after_tile(first)
    return vals


def _flat(ev: Evaluator, merged, n: int, free: int, spread=None) -> None:
    axis = [m[0] if m else (1, 1) for m in merged]
    for t in flat_tiles(n, free, ev.kb.target.partitions):
        boxes = [(t.offset * s, ((t.pstride * s, t.parts), (s, t.free))) for s, _ in axis]
        vals = _compute(ev, ev.load(boxes[1:]), t.parts, t.free, spread)
        ev.store(vals, boxes[0], t.free)


def _rows(ev: Evaluator, merged, free: int, spread=None, base=None) -> None:
    nfree = _free_axes([n for _, n in merged[0]], free)
    lead, trail = [m[:-nfree] for m in merged], [m[-nfree:] for m in merged]
    rows, last = math.prod(n for _, n in lead[0]), merged[0][-1][1]
    if nfree == 1 and rows < ev.kb.target.partitions and last > free and base is None:
        return _split_last(ev, merged, free, spread)
    base = base or [0] * len(merged)
    for rbox in line_tiles([n for _, n in lead[0]], ev.kb.target.partitions):
        for fbox in box_tiles([n for _, n in trail[0]], free):
            boxes = [(b + box_offset(l, rbox) + box_offset(t, fbox),
                      box_pattern(l, rbox)[-1:] + box_pattern(t, fbox))
                     for b, l, t in zip(base, lead, trail)]
            parts, f = boxes[0][1][0][1], box_size(fbox)
            vals = _compute(ev, ev.load(boxes[1:]), parts, f, spread)
            ev.store(vals, boxes[0], f)


def _split_last(ev: Evaluator, merged, free: int, spread) -> None:
    """Few rows and a long last axis (an iota or a broadcast row over [2, N]): the
    last axis is cut into chunks of `free` that go on partitions too (every view's
    (s, n) becomes (s * free, n // free), (s, free)), then the rest of each row."""
    q, r = divmod(merged[0][-1][1], free)
    _rows(ev, [m[:-1] + ((m[-1][0] * free, q), (m[-1][0], free)) for m in merged], free,
          spread, base=[0] * len(merged))
    if r:
        _rows(ev, [m[:-1] + ((m[-1][0], r),) for m in merged], free, spread,
              base=[m[-1][0] * q * free for m in merged])


def _free_axes(nums: list[int], free: int) -> int:
    """How many trailing axes go on the free side: as many as fit in `free` elements,
    at least one, and never all of them (partitions need an axis)."""
    k, size = 1, nums[-1]
    while k < len(nums) - 1 and size * nums[-k - 1] <= free:
        size *= nums[-k - 1]
        k += 1
    return k


# --- rules -------------------------------------------------------------------------------

def operand_axes(t: DramTensor, shape: tuple[int, ...]):
    """How an operand of `shape` (or a scalar) is read over the index space `shape`."""
    if tuple(t.shape) == tuple(shape):
        return row_major(shape)
    return tuple((0, n) for n in shape)


def single_op_region(ctx: LowerCtx, kind: str, operands, attrs) -> Region:
    out = ctx.outs[0]
    shape = tuple(out.shape)
    inputs = [Input(t, operand_axes(t, shape), t.dtype) for t in operands]
    step = Step(kind, tuple(range(len(operands))), out.dtype, dict(attrs))
    return Region(shape, inputs, [step], [(len(operands), out)])


def _elementwise(kind: str, ctx: LowerCtx, *operands: DramTensor, **attrs) -> None:
    ctx.kb.flops += emit_loop(ctx.kb, single_op_region(ctx, kind, operands, attrs))


def _same_shapes(op, arg) -> bool:
    """The generic rule may write its result over an operand it reads (`i = i + 1` in a
    loop, control.py): each [P, F] tile of every operand is read before the same tile
    of the result is written, tiles disjoint -- when no operand is broadcast."""
    return all(v.shape == r.shape for v in op.operands for r in op.results)


# Kinds with a tile op for fusions but a rule of their own when alone: a bitcast_convert
# is two DMAs over the same bytes (bitcast.py), no copy on an engine.
OWN_RULE = frozenset({"bitcast_convert"})

for _kind in TILE_OPS.keys() - OWN_RULE:
    register_lowering(_kind, in_place=_same_shapes)(partial(_elementwise, _kind))

