"""Layout changes (transpose, broadcast) that a plain DRAM->DRAM DMA would do badly.

A DMA moves contiguous runs (§3.4): our cost model charges ~44 ns per descriptor, so a
copy whose innermost destination axis is strided or stride-0 in the source (2-4 byte
runs) is ~500x slower than a contiguous one. `relayout` picks, after merging axes:

- innermost axis broadcast (stride 0), e.g. a row reduction's result broadcast back
  along the row: load one value per partition, `TensorScalar(bypass)` it across F,
  and DMA out whole rows;
- the last two axes swapped (a matrix transpose, possibly batched) for 2- and 4-byte
  types: load [128, 512] tiles naturally, transpose 128x128 blocks on TensorE (the v3
  `is_transpose` mode is bit-exact, §2.2) into a PSUM bank, copy to SBUF, DMA out rows;
- anything else: a DRAM->DRAM DMA through the permuted / stride-0 pattern.
"""
from __future__ import annotations

import itertools

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, sub
from .elementwise import FMAX, _engine
from .layout import (P, Axes, box_offset, box_pattern, flat_tiles, line_tiles, merge_axes,
                     row_major, tiles)
from .movement import dram_copy
from .registry import LowerCtx, register_lowering

BLOCK = 512               # rows/columns of one TensorE transpose block (one PSUM bank)


def relayout(kb: KernelBuilder, dst: DramTensor, dst_axes: Axes, src: DramTensor,
             src_axes: Axes) -> None:
    """Copies the index space `src_axes` of `src` into `dst_axes` of `dst`."""
    d, s = merge_axes(dst_axes, src_axes)
    if d and s[-1][0] == 0:
        return _expand(kb, dst, d, src, s)
    if _is_swap(s, dst.dtype):
        return _swap(kb, dst, d, src, s)
    dram_copy(kb, dst, d, src, s)


def broadcast_axes(shape: tuple[int, ...], out_shape: tuple[int, ...],
                   dims: tuple[int, ...]) -> Axes:
    """The axes of `out_shape` reading a `shape` tensor as broadcast_in_dim does.

    >>> broadcast_axes((3, 1), (2, 3, 4), (1, 2))
    ((0, 2), (1, 3), (0, 4))
    """
    src = row_major(shape)
    strides = [0] * len(out_shape)
    for i, j in enumerate(dims):
        if shape[i] == out_shape[j]:
            strides[j] = src[i][0]
    return tuple(zip(strides, out_shape))


@register_lowering("transpose")
def _transpose_lower(ctx: LowerCtx, x: DramTensor, *, permutation) -> None:
    src = row_major(x.shape)
    out = ctx.outs[0]
    relayout(ctx.kb, out, row_major(out.shape), x, tuple(src[p] for p in permutation))


@register_lowering("broadcast_in_dim")
def _broadcast_in_dim_lower(ctx: LowerCtx, x: DramTensor, *, broadcast_dimensions) -> None:
    out = ctx.outs[0]
    src = broadcast_axes(tuple(x.shape), tuple(out.shape), tuple(broadcast_dimensions))
    relayout(ctx.kb, out, row_major(out.shape), x, src)


# --- broadcast along the innermost axis -------------------------------------------------

def _expand(kb: KernelBuilder, dst: DramTensor, d: Axes, src: DramTensor, s: Axes) -> None:
    inner, rows_d, rows_s = d[-1], d[:-1], s[:-1]
    width = min(inner[1], FMAX)
    if not rows_d:
        return _expand_scalar(kb, dst, src, inner[1], width)
    cols, wide = kb.ring(3, 1, src.dtype), kb.ring(2, width, dst.dtype)
    for box in line_tiles([n for _, n in rows_d], P):
        prow_s, prow_d = box_pattern(rows_s, box)[-1:], box_pattern(rows_d, box)[-1:]
        col = sub(cols.next(), prow_d[0][1], 1)
        kb.dma(col, kb.ap(src, box_offset(rows_s, box), prow_s + ((1, 1),)))
        tile = _broadcast_column(kb, col, sub(wide.next(), col.num_partitions, width))
        for c0, c in tiles(inner[1], width):
            ap = kb.ap(dst, box_offset(rows_d, box) + c0 * inner[0], prow_d + ((inner[0], c),))
            kb.dma(ap, sub(tile, free=c))
    kb.release(cols, wide)


def _expand_scalar(kb: KernelBuilder, dst: DramTensor, src: DramTensor, n: int,
                   width: int) -> None:
    """One value to n contiguous elements: [128, F] blocks of one broadcast tile."""
    blocks = flat_tiles(n, width)
    col, tile = kb.tile(1, src.dtype), kb.tile(max(b.free for b in blocks), dst.dtype)
    kb.dma(col, kb.ap(src, 0, ((0, P), (1, 1))))
    _broadcast_column(kb, col, tile)
    for b in blocks:
        kb.dma(kb.ap(dst, b.offset, b.pattern), sub(tile, b.parts, b.free))
    kb.release(col, tile)


def _broadcast_column(kb: KernelBuilder, col: isa.Tile, tile: isa.Tile) -> isa.Tile:
    """tile[p, :] = col[p, 0] (`bypass` returns its first operand, here operand0)."""
    kb.emit(isa.TensorScalar, dst=tile, data=tile, op0="bypass", operand0=col,
            reverse0=True, engine=_engine(tile.dtype))
    return tile


# --- swapping the last two axes on TensorE ------------------------------------------------

def _is_swap(s: Axes, dtype: str) -> bool:
    """The innermost destination axis is strided in the source, the one before it is
    the source's contiguous axis, and TensorE can transpose the type bit-exactly."""
    return (len(s) >= 2 and s[-1][0] != 1 and s[-2][0] == 1
            and ir.np_dtype(dtype).itemsize in (2, 4))


def _swap(kb: KernelBuilder, dst: DramTensor, d: Axes, src: DramTensor, s: Axes) -> None:
    rings = (kb.ring(8, BLOCK, src.dtype), kb.ring(4, BLOCK, dst.dtype, mem="psum"),
             kb.ring(3, BLOCK, dst.dtype))
    lead = [range(n) for _, n in d[:-2]]
    for index in itertools.product(*lead):
        d0 = sum(i * st for i, (st, _) in zip(index, d))
        s0 = sum(i * st for i, (st, _) in zip(index, s))
        for b0, bn in tiles(d[-1][1], BLOCK):
            for a0, an in tiles(d[-2][1], BLOCK):
                _swap_block(kb, dst, d, d0 + a0 * d[-2][0] + b0, src, s,
                            s0 + b0 * s[-1][0] + a0, an, bn, rings)
    kb.release(*rings)


def _swap_block(kb, dst, d, d_off, src, s, s_off, an, bn, rings) -> None:
    """dst[a, b] = src[b, a] for an x bn (<= 512 x 512) elements."""
    ins, banks, outs = rings
    rows = []
    for b0, bt in tiles(bn, P):
        t = sub(ins.next(), bt, an)
        kb.dma(t, kb.ap(src, s_off + b0 * s[-1][0], ((s[-1][0], bt), (1, an))))
        rows.append((b0, t))
    for a0, at in tiles(an, P):
        bank = banks.next()
        for b0, t in rows:
            kb.emit(isa.NcTranspose, dst=sub(bank, at, t.num_partitions, at=b0),
                    data=sub(t, free=at, at=a0))
        out = sub(outs.next(), at, bn)
        kb.emit(isa.TensorCopy, dst=out, src=sub(bank, at, bn), engine=kb.evac_engine())
        kb.dma(kb.ap(dst, d_off + a0 * d[-2][0], ((d[-2][0], at), (1, bn))), out)
