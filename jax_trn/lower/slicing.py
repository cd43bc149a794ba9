"""slice, concatenate, pad and reverse: copies between views of DRAM tensors (`relayout`).

A slice reads its operand through an offset, strided view; concatenate writes each
operand into its window of the result; pad fills the result with the padding value
and then writes the operand through a view with interior-padding strides.

reverse reads its operand through negative strides (a DMA access pattern may step
backwards, §3.4). When the reversed axes leave the innermost (contiguous) axis in
order, that is the whole lowering: one DRAM->DRAM DMA whose descriptors are still
whole rows. When the innermost axis is reversed, a DMA would move one element per
descriptor (~500x slower, relayout.py), so rows are loaded forwards into SBUF ([rows on
partitions, <= 512 columns]), the columns are reversed on-chip by one [P, 1]
TensorCopy per column (no engine reads a tile backwards, §6.2), round-robin over
VectorE / GpSimd (and ScalarE for floats), and stored forwards. Few rows (a 1-D flip)
are spread over partitions by splitting the axis into (blocks, block width): blocks
reverse through the DMA pattern, each block's columns on-chip.
"""
from __future__ import annotations

import itertools

import numpy as np

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, sub
from .errors import LoweringError
from .layout import (Axes, View, box_offset, box_pattern, line_tiles, merge_axes,
                     row_major, tiles)
from .movement import copy, fill
from .registry import LowerCtx, register_lowering
from .relayout import relayout


@register_lowering("slice")
def _slice_lower(ctx: LowerCtx, x: DramTensor, *, start_indices, limit_indices,
                 strides) -> None:
    axes, out = row_major(x.shape), ctx.outs[0]
    src = tuple((st * k, n) for (st, _), k, n in zip(axes, strides, out.shape))
    offset = sum(st * s0 for (st, _), s0 in zip(axes, start_indices))
    relayout(ctx.kb, View.of(out), View(x, src, offset))


@register_lowering("concatenate")
def _concatenate_lower(ctx: LowerCtx, *xs: DramTensor, dimension) -> None:
    out = ctx.outs[0]
    axes, at = row_major(out.shape), 0
    for x in xs:
        window = tuple((st, n) for (st, _), n in zip(axes, x.shape))
        relayout(ctx.kb, View(out, window, at * axes[dimension][0]), View.of(x))
        at += x.shape[dimension]


def _pad_dim(lo: int, hi: int, interior: int, n: int) -> tuple[int, int, int]:
    """(first source index, source count, first result index) of one padded dim: source
    element i lands at lo + i * (interior + 1); negative edges cut elements off.

    >>> _pad_dim(2, 1, 0, 5), _pad_dim(-2, -1, 0, 5), _pad_dim(1, 0, 1, 3)
    ((0, 5, 2), (2, 2, 0), (0, 3, 1))
    >>> _pad_dim(-3, -2, 1, 5)      # 9 positions, cut to 4: elements 2, 3 at 1, 3
    (2, 2, 1)
    """
    k = interior + 1
    size = lo + hi + n + (n - 1) * interior if n else lo + hi
    first = max(0, -(lo // k)) if lo < 0 else 0
    last = min(n - 1, (size - 1 - lo) // k) if size > 0 else -1
    count = max(0, last - first + 1)
    return first, count, (lo + first * k) if count else 0


@register_lowering("pad")
def _pad_lower(ctx: LowerCtx, x: DramTensor, value: DramTensor, *, edge_padding_low,
               edge_padding_high, interior_padding) -> None:
    out = ctx.outs[0]
    known = ctx.constant(value)
    if known is not None:
        fill(ctx.kb, out, np.asarray(known).reshape(-1)[0])
    else:
        relayout(ctx.kb, View.of(out), View(value, tuple((0, n) for n in out.shape)))
    dims = [_pad_dim(*p, n) for *p, n in zip(edge_padding_low, edge_padding_high,
                                             interior_padding, x.shape)]
    oax, xax = row_major(out.shape), row_major(x.shape)
    dst = tuple((st * (i + 1), c) for (st, _), i, (_, c, _) in zip(oax, interior_padding, dims))
    relayout(ctx.kb, View(out, dst, sum(st * d0 for (st, _), (_, _, d0) in zip(oax, dims))),
             View(x, tuple((st, c) for (st, _), (_, c, _) in zip(xax, dims)),
                  sum(st * s0 for (st, _), (s0, _, _) in zip(xax, dims))))


# --- reverse -------------------------------------------------------------------------------

REVERSE_COLS = 512        # columns per on-chip reversal tile


@register_lowering("reverse")
def _reverse_lower(ctx: LowerCtx, x: DramTensor, *, dimensions) -> None:
    out = ctx.outs[0]
    if out.size == 0:
        return
    axes = row_major(x.shape)
    src = tuple((-st, n) if i in dimensions else (st, n) for i, (st, n) in enumerate(axes))
    offset = sum(st * (n - 1) for i, (st, n) in enumerate(axes) if i in dimensions)
    d, s = merge_axes(row_major(out.shape), src)
    if not d:
        return copy(ctx.kb, out, x)
    if s[-1][0] > 0:            # rows stay contiguous: the DMA pattern reverses them
        return relayout(ctx.kb, View(out, d), View(x, s, offset))
    for dst, src_view in _spread(View(out, d), View(x, s, offset), ctx.target.partitions):
        _reverse_columns(ctx.kb, dst, src_view)


def _spread(dst: View, src: View, pmax: int) -> list[tuple[View, View]]:
    """Splits a reversed innermost axis of m into (m // b, b) blocks (plus a tail of
    m % b columns) so that fewer than `pmax` rows still fill the partitions.

    >>> [(d.axes, s.axes, s.offset) for d, s in _spread(*_views(((1, 301),), 300), 128)]
    [(((2, 150), (1, 2)), ((-2, 150), (-1, 2)), 300), (((1, 1),), ((-1, 1),), 0)]
    """
    lead_d, lead_s = dst.axes[:-1], src.axes[:-1]
    m, rows = dst.axes[-1][1], max(1, _prod(lead_d))
    b = max(1, m // -(-pmax // rows)) if rows < pmax else m
    if b == m:
        return [(dst, src)]
    m0 = m // b * b
    out = [(View(dst.t, lead_d + ((b, m // b), (1, b)), dst.offset),
            View(src.t, lead_s + ((-b, m // b), (-1, b)), src.offset))]
    if m > m0:
        out.append((View(dst.t, lead_d + ((1, m - m0),), dst.offset + m0),
                    View(src.t, lead_s + ((-1, m - m0),), src.offset - m0)))
    return out


def _views(axes: Axes, offset: int) -> tuple[View, View]:
    """(dst, src) views of a reversed 1-D tensor (doctest helper)."""
    t = DramTensor("x", (axes[0][1],), "float32")
    return View(t, axes), View(t, ((-1, axes[0][1]),), offset)


def _prod(axes: Axes) -> int:
    n = 1
    for _, k in axes:
        n *= k
    return n


def _reverse_columns(kb: KernelBuilder, dst: View, src: View) -> None:
    """dst[..., j] = src[..., j] where src's innermost stride is -1: forward loads,
    columns reversed on-chip (one copy per tile), forward stores."""
    (_, m), lead_d, lead_s = dst.axes[-1], dst.axes[:-1], src.axes[:-1]
    dtype, width = dst.t.dtype, min(m, REVERSE_COLS)
    engines = _copy_engines(dtype)
    ins, outs = kb.ring(2, width, dtype), kb.ring(2, width, dtype)
    for box in line_tiles([n for _, n in lead_d], kb.target.partitions):
        prow_d, prow_s = box_pattern(lead_d, box)[-1:], box_pattern(lead_s, box)[-1:]
        for c0, c in tiles(m, width):
            first = src.offset + box_offset(lead_s, box) - (c0 + c - 1)
            loaded = sub(ins.next(), prow_s[0][1], c)
            kb.dma(loaded, kb.ap(src.t, first, prow_s + ((1, c),)))
            flipped = _flip_free(kb, loaded, sub(outs.next(), prow_s[0][1], c), engines)
            kb.dma(kb.ap(dst.t, dst.offset + box_offset(lead_d, box) + c0, prow_d + ((1, c),)),
                   flipped)
    kb.release(ins, outs)


def _copy_engines(dtype: str):
    """Engines that copy `dtype` exactly: GpSimd for integers (native), any for floats
    and bool (FP32 holds them exactly)."""
    return itertools.cycle(("gpsimd",) if ir.is_int(dtype) else ("vector", "gpsimd", "scalar"))


def _flip_free(kb: KernelBuilder, src: isa.Tile, dst: isa.Tile, engines) -> isa.Tile:
    """dst[:, k] = src[:, F - 1 - k]: one copy reading `src` through a stride -1 access
    pattern from its last column (§3.1)."""
    c = src.free_size
    if c == 1:
        return src
    back = sub(src, free=1, at=c - 1).with_(free=(c,), strides=(-1,))
    kb.emit(isa.TensorCopy, dst=dst, src=back, engine=next(engines))
    return dst
