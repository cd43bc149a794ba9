"""reduce_window (pooling, cumulative ops); the window geometry select_and_scatter shares.

reduce_window:

- cumulative (`jnp.cumsum / cumprod / cummax / cummin`, which JAX lowers on non-TPU
  platforms to a window as long as the axis, padded by n - 1 on one side): a VectorE
  `tensor_tensor_scan` per line (§6.2; cost max(MIN_II, 2N), §6.3), O(n) per line
  instead of the O(n^2) window sums. Many lines: lines on partitions, 128 at a time, the
  scanned axis on the free axis in chunks of `SCAN_CHUNK`, each chunk starting from the
  last value of the previous one (the instruction's `initial`); the reversed form reads
  and writes each chunk through negative-stride DMA patterns. Few long contiguous lines
  (forward): each line on all 128 partitions in segments, segment totals transposed onto
  one partition (TensorE), scanned into exclusive carries and transposed back. Rounding:
  FP32, sequential left to right within a line or segment (XLA's CPU backend sums each
  window left to right; for long windows it uses a tree, so long FP32 sums agree within
  tolerance, not bit for bit), carry + segment prefix in the split form, right to left
  for reverse; integers exactly, wrapping: a scan whose running value FP32 could round
  runs on GpSimd's integer ALU (`scan_engine`, §2.5; the split form then only on v3+,
  whose TensorE transposes move integers bit-exactly). The init must be a constant
  identity of the combiner.
- small windows (<= 64 offsets: pooling): the operand is first copied into an HBM
  temporary of the padded, base-dilated shape, pre-filled with the combiner's identity
  (XLA's CPU backend skips padding: a non-identity init counts once, not per padded
  element), when padding or base dilation is present. Each window offset k is then
  a strided view over it (element o * stride + k * dilation), and the output is tiled
  like an elementwise op (`offset_boxes`): per [<=128, <=2048] tile, one DMA per offset,
  combined by TensorTensor into an FP32 / int32 accumulator in XLA's window order (add,
  max, min, multiply; and / or on bool), a non-identity init combined once.
- larger windows: the (output dims, window dims) index space as one strided view,
  reduced by reduce.py's tilings (add / max / min).
- any other body, or several operands at once (a JVP): windowbody.py, offset by offset
  in XLA's order.

select_and_scatter (the max-pool gradient) is in selectscatter.py.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.isa_vector import TensorTensorScan
from jax_trn.hw.program import DramTensor

from .builder import sub
from .elementwise import _free_axes
from .errors import LoweringError
from .intdigits import fp32_exact
from .layout import (Axes, View, box_offset, box_pattern, box_tiles, flat_tiles, line_tiles,
                     merge_axes, row_major, tiles)
from .movement import dram_copy, fill
from .reduce import TensorSource, _fill_init, body_alu, emit_reduce
from .reduce import identity as _reduce_identity
from .registry import LowerCtx, register_lowering
from .relayout import relayout
from .tileops import engine_for
from .windowbody import reduce_window_any

SCAN_CHUNK = 2048          # elements per partition of one scan instruction
SPLIT_MIN = 1024           # contiguous lines this long are scanned on all partitions
SPLIT_MAX_LINES = 16       # ... when there are at most this many of them
TRANSPOSE_MIN = 16         # strided scan axes at least this long (and wide) are
#                            transposed to contiguous lines first
MAX_OFFSETS = 64           # windows up to this size are combined offset by offset
OFFSETS_FREE = 2048        # elements per partition of one such tile
REDUCIBLE = ("add", "max", "min")       # what reduce.py's tilings combine


def identity(alu: str, dtype: str):
    return 1 if alu == "multiply" else _reduce_identity(alu, dtype)


def is_identity(value, alu: str, dtype: str) -> bool:
    if value is None:
        return False
    v = np.asarray(value).reshape(-1)[:1].astype(np.float64)
    return bool(v.size and v[0] == identity(alu, dtype))


# --- window geometry ---------------------------------------------------------------------

@dataclass(frozen=True)
class Window:
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    base: tuple[int, ...]
    dilations: tuple[int, ...]

    @classmethod
    def of(cls, attrs: dict, rank: int) -> Window:
        one = (1,) * rank
        return cls(tuple(attrs["window_dimensions"]), tuple(attrs.get("window_strides") or one),
                   tuple(tuple(p) for p in (attrs.get("padding") or ((0, 0),) * rank)),
                   tuple(attrs.get("base_dilations") or one),
                   tuple(attrs.get("window_dilations") or one))

    def padded_shape(self, shape) -> tuple[int, ...]:
        return tuple((n - 1) * b + 1 + lo + hi if n else lo + hi
                     for n, b, (lo, hi) in zip(shape, self.base, self.padding))

    def needs_padding(self) -> bool:
        return any(p != (0, 0) for p in self.padding) or any(b != 1 for b in self.base)

    def offsets(self) -> list[tuple[int, ...]]:
        """Every window offset k, row-major (XLA's window iteration order)."""
        return [tuple(int(i) for i in k) for k in np.ndindex(*self.dims)]

    def overlapping(self) -> bool:
        return any((w - 1) * d + 1 > s for w, d, s in zip(self.dims, self.dilations,
                                                             self.strides))


def interior_view(t: DramTensor, w: Window, shape) -> View:
    """The operand's elements (of `shape`) inside the padded, base-dilated tensor `t`."""
    rows = row_major(t.shape)
    axes = tuple((st * b, n) for (st, _), b, n in zip(rows, w.base, shape))
    return View(t, axes, sum(st * lo for (st, _), (lo, _) in zip(rows, w.padding)))


def window_axes(padded: tuple[int, ...], w: Window, out_shape) -> Axes:
    """(output dims, window dims) over the padded tensor: one element per (o, k)."""
    rows = row_major(padded)
    outs = tuple((st * s, n) for (st, _), s, n in zip(rows, w.strides, out_shape))
    wins = tuple((st * d, k) for (st, _), d, k in zip(rows, w.dilations, w.dims))
    return outs + wins


def offset_view(t: DramTensor, w: Window, out_shape, k: tuple[int, ...]) -> View:
    """Window element k of every window: element o * stride + k * dilation."""
    rows = row_major(t.shape)
    axes = tuple((st * s, n) for (st, _), s, n in zip(rows, w.strides, out_shape))
    offset = sum(st * d * i for (st, _), d, i in zip(rows, w.dilations, k))
    return View(t, axes, offset)


def padded_copy(ctx: LowerCtx, x: DramTensor, w: Window, value) -> DramTensor:
    """x inside an HBM temporary of the padded shape, everything else `value`."""
    xp = ctx.temp(w.padded_shape(x.shape), x.dtype)
    fill(ctx.kb, xp, value)
    kb = ctx.next_kernel("pad")
    if x.size:
        dram_copy(kb, interior_view(xp, w, x.shape), View.of(x))
    ctx.next_kernel("window")
    return xp


def lines(shape: tuple[int, ...], dim: int, pmax: int) -> list[tuple[int, tuple[int, int]]]:
    """The lines along `dim`, up to `pmax` (partitions) at a time: (element offset of the
    first line's first element, (stride, count) of the lines, the partition pattern of a
    DMA)."""
    n, c, a = shape[dim], math.prod(shape[dim + 1:]), math.prod(shape[:dim])
    kept = merge_axes(((n * c, a), (1, c)))[0]
    if not kept:
        return [(0, (1, 1))]
    return [(box_offset(kept, box), box_pattern(kept, box)[-1])
            for box in line_tiles([k for _, k in kept], pmax)]


# --- reduce_window -------------------------------------------------------------------------

def cumulative(w: Window, shape: tuple[int, ...]) -> tuple[int, bool] | None:
    """(dim, reverse) when the window is a prefix (or suffix) scan along one dim."""
    if any(s != 1 for s in w.strides) or any(b != 1 for b in w.base) \
            or any(d != 1 for d in w.dilations):
        return None
    long = [d for d, k in enumerate(w.dims) if k > 1]
    if len(long) != 1:
        return None
    d = long[0]
    n = shape[d]
    if w.dims[d] != n or any(p != (0, 0) for i, p in enumerate(w.padding) if i != d):
        return None
    if w.padding[d] == (n - 1, 0):
        return d, False
    if w.padding[d] == (0, n - 1):
        return d, True
    return None


def scan_engine(alu: str, dtype: str, n: int) -> str:
    """VectorE's scan carries FP32 (§2.3); an integer scan whose running value could pass
    2**24 runs on GpSimd's integer ALU (§2.5)."""
    return "vector" if fp32_exact(alu, dtype, n) else "gpsimd"


def _scan(ctx: LowerCtx, x: DramTensor, out: DramTensor, alu: str, dim: int,
          reverse: bool) -> None:
    kb, shape = ctx.kb, tuple(x.shape)
    n, c = shape[dim], math.prod(shape[dim + 1:])
    acc = "float32" if ir.is_float(x.dtype) else ("int32" if x.dtype == "bool" else x.dtype)
    engine = {"engine": "gpsimd"} if scan_engine(alu, x.dtype, n) == "gpsimd" else {}
    chunk = min(n, SCAN_CHUNK)
    ident = kb.tile(chunk, acc)
    kb.emit(isa.Memset, dst=ident, value=identity(alu, x.dtype), engine=engine_for(acc))
    xs, res = kb.ring(3, chunk, x.dtype), kb.ring(3, chunk, acc)
    for offset, (pstride, parts) in lines(shape, dim, kb.target.partitions):
        prev = identity(alu, x.dtype)
        spans = tiles(n, chunk)
        for c0, cn in (reversed(spans) if reverse else spans):
            at, step = (c0 + cn - 1, -c) if reverse else (c0, c)
            pattern = ((pstride, parts), (step, cn))
            xt, rt = sub(xs.next(), parts, cn), sub(res.next(), parts, cn)
            kb.dma(xt, kb.ap(x, offset + at * c, pattern))
            kb.emit(TensorTensorScan, dst=rt, data0=sub(ident, parts, cn), data1=xt,
                    initial=prev, op0=alu, op1=alu, **engine)
            kb.dma(kb.ap(out, offset + at * c, pattern), rt)
            prev = sub(rt, parts, 1, at=cn - 1)
    kb.release(ident, xs, res)


def _split_line(kb, x: DramTensor, out: DramTensor, offset: int, n: int, alu: str,
                acc: str, bufs) -> None:
    """One long contiguous line scanned on all P lanes: the line is cut into segments
    of m = ceil(n / P) elements, one per partition (the tail padded with the identity),
    each segment scanned along F; the segment totals are transposed onto one partition
    (TensorE, bit-exact), scanned into exclusive carries, transposed back and combined
    into every segment (TensorScalar). Rounding: within a segment sequentially, then
    carry + segment prefix (a two-level sum, closer to the exact sum than one long
    sequential chain)."""
    ident, data, res, row, tp, col = bufs
    m = -(-n // kb.target.partitions)
    exact = scan_engine(alu, x.dtype, n) == "vector"
    engine = {} if exact else {"engine": "gpsimd"}
    full, rem = divmod(n, m)
    parts = full + (rem > 0)
    xt, rt = sub(data, parts, m), sub(res, parts, m)
    value = identity(alu, x.dtype)
    if rem:
        kb.emit(isa.Memset, dst=xt, value=value, engine=engine_for(xt.dtype))
    pieces = [(offset, sub(xt, full, m), sub(rt, full, m), ((m, full), (1, m)))]
    if rem:
        tail = xt.with_(start_partition=full, num_partitions=1, free=(rem,))
        rtail = rt.with_(start_partition=full, num_partitions=1, free=(rem,))
        pieces.append((offset + full * m, tail, rtail, ((m, 1), (1, rem))))
    for off, t, _, pat in pieces:
        kb.dma(t, kb.ap(x, off, pat))
    kb.emit(TensorTensorScan, dst=rt, data0=sub(ident, parts, m), data1=xt,
            initial=value, op0=alu, op1=alu, **engine)
    # exclusive carries: totals [parts, 1] -> [1, parts] -> scan -> [parts, 1]
    totals = tp.with_(num_partitions=1, free=(parts,))
    kb.emit(isa.NcTranspose, dst=totals, data=sub(rt, parts, 1, at=m - 1))
    carry = sub(row, 1, parts + 1)
    kb.emit(isa.Memset, dst=sub(carry, 1, 1), value=value, engine=engine_for(acc))
    if not exact:       # GpSimd cannot read PSUM (§2.5): the totals to SBUF first
        kb.emit(isa.TensorCopy, dst=sub(col, 1, parts), src=totals, engine="scalar")
        totals = sub(col, 1, parts)
    kb.emit(TensorTensorScan, dst=sub(carry, 1, parts, at=1), data0=sub(ident, 1, parts),
            data1=totals, initial=value, op0=alu, op1=alu, **engine)
    back = tp.with_(num_partitions=parts, free=(1,),
                    offset=tp.offset + kb.target.psum_bank_bytes)      # the second bank
    kb.emit(isa.NcTranspose, dst=back, data=sub(carry, 1, parts))
    kb.emit(isa.TensorCopy, dst=sub(col, parts, 1), src=back,
            **({} if exact else {"engine": "scalar"}))
    kb.emit(isa.TensorScalar, dst=rt, data=rt, op0=alu, operand0=sub(col, parts, 1),
            engine=engine_for(acc))
    for off, _, r, pat in pieces:
        kb.dma(kb.ap(out, off, pat), r)


def _scan_split(ctx: LowerCtx, x: DramTensor, out: DramTensor, alu: str, dim: int) -> bool:
    """Few long contiguous lines: each on all partitions (`_split_line`)."""
    shape, kb, pmax = tuple(x.shape), ctx.kb, ctx.target.partitions
    n, c, a = shape[dim], math.prod(shape[dim + 1:]), math.prod(shape[:dim])
    acc = _acc_dtype(x.dtype)
    if c != 1 or n < SPLIT_MIN or a > SPLIT_MAX_LINES or x.dtype == "bool" \
            or ir.np_dtype(acc).itemsize != 4 or n > pmax * SCAN_CHUNK:
        return False
    if scan_engine(alu, x.dtype, n) == "gpsimd" and not ctx.target.transpose_mode:
        return False    # integer totals cross partitions by TensorE: bit-exact on v3+
    m = -(-n // pmax)
    # PSUM: two banks of 4-byte values, the totals transposed into the first and the
    # carries back into the second (`_split_line`).
    col = 1 if scan_engine(alu, x.dtype, n) == "vector" else pmax    # + the totals row
    bufs = (kb.tile(max(m, pmax), acc), kb.tile(m, x.dtype), kb.tile(m, acc),
            kb.tile(pmax + 1, acc), kb.tile(2 * ctx.target.psum_bank_fp32, acc, mem="psum"),
            kb.tile(col, acc))
    kb.emit(isa.Memset, dst=bufs[0], value=identity(alu, x.dtype), engine=engine_for(acc))
    for line in range(a):
        _split_line(kb, x, out, line * n, n, alu, acc, bufs)
    kb.release(*bufs)
    return True


class WindowSource(TensorSource):
    """The windows of a (padded) tensor as one strided index space for reduce.py."""

    def __init__(self, kb, x: DramTensor, axes: Axes):
        super().__init__(kb, x)
        self.views = [axes]


def _acc_dtype(dtype: str) -> str:
    if ir.is_float(dtype):
        return "float32"
    return dtype if ir.np_dtype(dtype).itemsize == 8 else "int32"


@dataclass(frozen=True)
class OffsetBox:
    """One [parts, free] tile of the window grid: where it sits in the grid (row-major
    tensors of the output shape) and in each window-offset view (plus the view's own
    offset)."""
    parts: int
    free: int
    grid_offset: int
    grid_pattern: Axes
    view_offset: int
    view_pattern: Axes


def offset_boxes(shape, view_axes: Axes, fmax: int, pmax: int) -> list[OffsetBox]:
    """Tiles of the window grid `shape` read through the strided views of the window
    offsets (all alike but for their offset): the trailing merged axes on the free side
    (at most `fmax` elements), the longest other axis on partitions, the rest one index
    at a time; a grid that merges into one run is cut like a flat elementwise op."""
    out_ax, in_ax = merge_axes(row_major(shape), view_axes)
    if len(out_ax) < 2:         # one run of the grid: [pmax, F] blocks and a tail
        (so, n), (si, _) = (out_ax[0], in_ax[0]) if out_ax else ((1, 1), (1, 1))
        return [OffsetBox(t.parts, t.free, t.offset * so, ((t.pstride * so, t.parts),
                                                           (so, t.free)),
                          t.offset * si, ((t.pstride * si, t.parts), (si, t.free)))
                for t in flat_tiles(n, fmax, pmax)]
    nfree = _free_axes([n for _, n in out_ax], fmax)
    lead = list(zip(out_ax[:-nfree], in_ax[:-nfree]))
    trail_o, trail_i = out_ax[-nfree:], in_ax[-nfree:]
    pa = max(range(len(lead)), key=lambda i: (lead[i][0][1], i))
    others = [a for i, a in enumerate(lead) if i != pa]
    (po, pn_all), (pi, _) = lead[pa]
    boxes = []
    for idx in itertools.product(*(range(o[1]) for o, _ in others)):
        o_base = sum(i * o[0] for i, (o, _) in zip(idx, others))
        i_base = sum(i * ii[0] for i, (_, ii) in zip(idx, others))
        for p0, pn in tiles(pn_all, pmax):
            for fbox in box_tiles([n for _, n in trail_o], fmax):
                boxes.append(OffsetBox(
                    pn, math.prod(fbox[1]),
                    o_base + p0 * po + box_offset(trail_o, fbox),
                    ((po, pn),) + box_pattern(trail_o, fbox),
                    i_base + p0 * pi + box_offset(trail_i, fbox),
                    ((pi, pn),) + box_pattern(trail_i, fbox)))
    return boxes


def _by_offsets(ctx: LowerCtx, src: DramTensor, alu: str, w: Window, init) -> None:
    """Small windows: out = combine over window offsets k of the strided view k, each
    view tiled like an elementwise operand (`offset_boxes`: one DMA per offset and box,
    TensorTensor into an FP32 / int32 accumulator, in XLA's window order). When the last
    dim's windows tile it (stride == window, e.g. NCHW pooling), its window elements are
    contiguous with the output positions: they are loaded as an inner free axis (long
    DMA runs) and reduced by TensorReduce first (for add: (x00 + x01) + (x10 + x11)
    instead of XLA's left-to-right order)."""
    kb, out = ctx.kb, ctx.outs[0]
    shape = tuple(out.shape)
    kw = w.dims[-1]
    inner = kw if kw > 1 and w.strides[-1] == kw and w.dilations[-1] == 1 else 1
    views = [offset_view(src, w, shape, k) for k in w.offsets() if inner == 1 or k[-1] == 0]
    boxes = offset_boxes(shape, views[0].axes, max(1, OFFSETS_FREE // inner),
                         kb.target.partitions)
    acc_dt = _acc_dtype(src.dtype)
    engine = engine_for(acc_dt)
    fmax = max(b.free for b in boxes)
    loads, accs = kb.ring(3, fmax * inner, acc_dt), kb.ring(2, fmax, acc_dt)
    parts_ring = kb.ring(2, fmax, acc_dt) if inner > 1 else None
    red_engine = {} if fp32_exact(alu, src.dtype, inner) else {"engine": "gpsimd"}
    for b in boxes:
        acc = sub(accs.next(), b.parts, b.free)
        for k, v in enumerate(views):
            if inner == 1:
                dst = acc if k == 0 else sub(loads.next(), b.parts, b.free)
                kb.dma(dst, kb.ap(src, v.offset + b.view_offset, b.view_pattern))
            else:
                row = sub(loads.next(), b.parts, (b.free, inner))
                kb.dma(row, kb.ap(src, v.offset + b.view_offset, b.view_pattern + ((1, inner),)))
                dst = acc if k == 0 else sub(parts_ring.next(), b.parts, b.free)
                kb.emit(isa.TensorReduce, dst=dst, data=row, op=alu, **red_engine)
            if k:
                kb.emit(isa.TensorTensor, dst=acc, data1=acc, data2=dst, op=alu, engine=engine)
        if init is not None:
            kb.emit(isa.TensorScalar, dst=acc, data=acc, op0=alu, operand0=init, engine=engine)
        kb.dma(kb.ap(out, b.grid_offset, b.grid_pattern), acc)
    kb.release(loads, accs, *([parts_ring] if parts_ring else []))


def _generic(ctx: LowerCtx, x: DramTensor, init: DramTensor, alu: str, w: Window) -> None:
    out = ctx.outs[0]
    value = ctx.constant(init)
    src = x
    if w.needs_padding():       # XLA's padding adds nothing: the combiner's identity
        src = padded_copy(ctx, x, w, identity(alu, x.dtype))
    rank = len(x.shape)
    keep_init = not is_identity(value, alu, x.dtype)
    if math.prod(w.dims) <= MAX_OFFSETS and (value is not None or not keep_init):
        imm = np.asarray(value).reshape(-1)[0].item() if keep_init else None
        return _by_offsets(ctx, src, alu, w, imm)
    if alu not in REDUCIBLE:
        raise LoweringError(f"reduce_window with a {alu} body over a window of "
                            f"{math.prod(w.dims)} elements is not supported "
                            f"({ctx.op.describe()})")
    axes = window_axes(tuple(src.shape), w, tuple(out.shape))
    emit_reduce(ctx.kb, WindowSource(ctx.kb, src, axes), tuple(out.shape) + w.dims, out,
                alu, init if keep_init else None, tuple(range(rank, 2 * rank)))


@register_lowering("reduce_window")
def _reduce_window_lower(ctx: LowerCtx, *operands: DramTensor, **attrs) -> None:
    x, init = operands[0], operands[len(operands) // 2]
    out = ctx.outs[0]
    w = Window.of(attrs, len(x.shape))
    if any(lo < 0 or hi < 0 for lo, hi in w.padding):
        raise LoweringError(f"reduce_window with negative padding is not supported "
                            f"({ctx.op.describe()})")
    ctx.kb.flops += out.size * math.prod(w.dims)
    if out.size == 0:
        return
    alu = _one_op_body(ctx, x.dtype) if len(operands) == 2 else None
    if alu is None:             # several operands, or another body: windowbody.py
        n = len(operands) // 2
        return reduce_window_any(
            ctx, list(operands[:n]), list(operands[n:]), w,
            lambda t, value: padded_copy(ctx, t, w, value),
            lambda t, k: offset_view(t, w, tuple(out.shape), k))
    if math.prod(w.dims) == 0 or x.size == 0:
        return _fill_init(ctx, init, out)
    scan = cumulative(w, tuple(x.shape))
    if scan is not None and is_identity(ctx.constant(init), alu, x.dtype):
        return _cumulative(ctx, x, out, alu, *scan)
    _generic(ctx, x, init, alu, w)


def _one_op_body(ctx: LowerCtx, dtype: str) -> str | None:
    """The ALU op of a one-op body this module combines, else None."""
    try:
        return body_alu(ctx.op.regions[0], dtype, "reduce_window body", ctx.op)
    except LoweringError:
        return None


def _cumulative(ctx: LowerCtx, x: DramTensor, out: DramTensor, alu: str, dim: int,
                reverse: bool) -> None:
    """A scan along `dim`; along a strided axis (>= TRANSPOSE_MIN long and wide) the
    operand is transposed to contiguous lines first (relayout: TensorE transposes for
    2- and 4-byte types) and the result back, so line DMAs move rows, not elements."""
    shape = tuple(x.shape)
    a, n, c = math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])
    if c >= TRANSPOSE_MIN and n >= TRANSPOSE_MIN:
        t, to = ctx.temp((a, c, n), x.dtype), ctx.temp((a, c, n), out.dtype)
        relayout(ctx.kb, View.of(t), View(x, ((n * c, a), (1, c), (c, n))))
        ctx.next_kernel("lines")
        _cumulative(ctx, t, to, alu, 2, reverse)
        relayout(ctx.next_kernel("back"), View(out, row_major((a, n, c))),
                 View(to, ((c * n, a), (1, n), (n, c))))
        return
    if not reverse and _scan_split(ctx, x, out, alu, dim):
        return
    _scan(ctx, x, out, alu, dim, reverse)

