"""Layout changes (transpose, broadcast) that a plain DRAM->DRAM DMA would do badly.

A DMA moves contiguous runs (§3.4): our cost model charges ~44 ns per descriptor, so a
copy whose innermost destination axis is strided or stride-0 in the source (2-4 byte
runs) is ~500x slower than a contiguous one. `relayout` picks, after merging axes:

- innermost axis broadcast (stride 0), e.g. a row reduction's result broadcast back
  along the row: load one value per partition, `TensorScalar(bypass)` it across F,
  and DMA out whole rows;
- the last two axes swapped (a matrix transpose, possibly batched) for 2- and 4-byte
  types: load [P, B] tiles naturally (B: one PSUM bank of 4-byte elements, 512),
  transpose P x P blocks on TensorE (the v3 `is_transpose` mode is bit-exact, §2.2)
  into a PSUM bank, copy to SBUF, DMA out rows;
- two outer axes swapped with short rows kept ([S, H, D] <-> [H, S, D], D * itemsize
  under 2 KiB: a DMA of D-element runs is far below the DMA rate): G consecutive S
  positions per partition are loaded with long source runs, reordered within each
  partition by an engine copy (strided free-axis pattern, §3.1), and stored as runs
  of G * D elements (`_row_swap`);
- anything else: a DRAM->DRAM DMA through the permuted / stride-0 pattern.
"""
from __future__ import annotations

import itertools

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, sub
from .elementwise import FMAX, _engine
from .layout import (Axes, View, box_offset, box_pattern, flat_tiles, line_tiles, merge_axes,
                     row_major, tiles)
from .movement import dram_copy
from .registry import LowerCtx, register_lowering


def relayout(kb: KernelBuilder, dst: View, src: View) -> None:
    """Copies the elements of view `src` into view `dst` (same index space)."""
    d, s = merge_axes(dst.axes, src.axes)
    dst, src = View(dst.t, d, dst.offset), View(src.t, s, src.offset)
    if d and s[-1][0] == 0 and d[-1][1] > 1:
        return _expand(kb, dst, src)
    if _is_swap(s, dst.t.dtype):
        return _swap(kb, dst, src)
    if _is_row_swap(d, s, dst.t.dtype, kb.target.partitions):
        return _row_swap(kb, dst, src)
    dram_copy(kb, dst, src)


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
    permute(ctx, ctx.outs[0], x, tuple(int(p) for p in permutation))


def permute(ctx: LowerCtx, out: DramTensor, x: DramTensor, perm: tuple[int, ...]) -> None:
    """out = transpose(x, perm): in one pass, or in two through an HBM temporary when
    the output's innermost dim is strided in `x` and no swap of two axes does it (one
    DMA would then move 2-4 byte runs, §3.4): a TensorE swap and a copy of whole rows
    (`_first_stage` picks their order)."""
    first = _first_stage(x, perm)
    if first is None:
        return _permute(ctx.kb, out, x, perm)
    moved = ctx.temp(tuple(x.shape[d] for d in first), x.dtype)
    _permute(ctx.kb, moved, x, first)
    _permute(ctx.next_kernel("rows"), out, moved, tuple(first.index(p) for p in perm))


# The shortest row (elements) worth a second pass: below it the rows' DMA descriptors
# are as short as the direct copy's, nearly.
MIN_ROW = 32


def _permute(kb: KernelBuilder, out: DramTensor, x: DramTensor, perm: tuple[int, ...]) -> None:
    src = row_major(x.shape)
    relayout(kb, View.of(out), View(x, tuple(src[p] for p in perm)))


def _first_stage(x: DramTensor, perm: tuple[int, ...]) -> tuple[int, ...] | None:
    """The layout of the temporary of a two-pass transpose (a permutation of x's dims),
    or None for one pass. Of two ways, the one with the longer rows:
      - swap, then rows: the output's trailing dims (`tail`, consecutive in x) moved
        behind the rest of x by a swap; then rows of `tail` elements to their places;
      - rows, then swap: x's trailing dims (`head`, consecutive in the output, which is
        [P, head, Q]) kept innermost while rows go to [P, Q, head]; then a swap of
        `head` and Q."""
    src = row_major(x.shape)
    _, s = merge_axes(row_major(tuple(x.shape[p] for p in perm)), tuple(src[p] for p in perm))
    if (len(s) < 2 or s[-1][0] in (0, 1) or _is_swap(s, x.dtype)
            or ir.np_dtype(x.dtype).itemsize not in (2, 4)):
        return None
    n = len(perm)
    k = n - 1
    while k > 0 and perm[k - 1] + 1 == perm[k]:
        k -= 1
    tail = perm[k:]
    j = i = perm.index(n - 1)
    while i > 0 and perm[i - 1] + 1 == perm[i]:
        i -= 1
    head = perm[i:j + 1]
    options = [(_extent(x, tail), tuple(d for d in range(n) if d not in tail) + tail),
               (_extent(x, head), perm[:i] + perm[j + 1:] + head)]
    rows, first = max(options, key=lambda o: o[0])
    return first if rows >= MIN_ROW else None


def _extent(x: DramTensor, dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= x.shape[d]
    return n


@register_lowering("trn.view")
def _view_lower(ctx: LowerCtx, x: DramTensor, *, axes, offset) -> None:
    """A chain of layout ops composed into one strided view of `x`
    (hlo_passes/passes/compose_views.py)."""
    relayout(ctx.kb, View.of(ctx.outs[0]), View(x, tuple(tuple(a) for a in axes), offset))


@register_lowering("broadcast_in_dim")
def _broadcast_in_dim_lower(ctx: LowerCtx, x: DramTensor, *, broadcast_dimensions) -> None:
    out = ctx.outs[0]
    src = broadcast_axes(tuple(x.shape), tuple(out.shape), tuple(broadcast_dimensions))
    relayout(ctx.kb, View.of(out), View(x, src))


# --- broadcast along the innermost axis -------------------------------------------------

def _expand(kb: KernelBuilder, dst: View, src: View) -> None:
    inner, rows_d, rows_s = dst.axes[-1], dst.axes[:-1], src.axes[:-1]
    width = min(inner[1], FMAX)
    if not rows_d and inner[0] == 1:
        return _expand_scalar(kb, dst, src, inner[1], width)
    cols, wide = kb.ring(3, 1, src.t.dtype), kb.ring(2, width, dst.t.dtype)
    for box in line_tiles([n for _, n in rows_d], kb.target.partitions):
        prow_s, prow_d = box_pattern(rows_s, box)[-1:], box_pattern(rows_d, box)[-1:]
        col = sub(cols.next(), prow_d[0][1], 1)
        kb.dma(col, kb.ap(src.t, src.offset + box_offset(rows_s, box), prow_s + ((1, 1),)))
        tile = _broadcast_column(kb, col, sub(wide.next(), col.num_partitions, width))
        for c0, c in tiles(inner[1], width):
            at = dst.offset + box_offset(rows_d, box) + c0 * inner[0]
            kb.dma(kb.ap(dst.t, at, prow_d + ((inner[0], c),)), sub(tile, free=c))
    kb.release(cols, wide)


def _expand_scalar(kb: KernelBuilder, dst: View, src: View, n: int, width: int) -> None:
    """One value to n contiguous elements: [P, F] blocks of one broadcast tile."""
    pmax = kb.target.partitions
    blocks = flat_tiles(n, width, pmax)
    col = kb.tile(1, src.t.dtype)
    tile = kb.tile(max(b.free for b in blocks), dst.t.dtype)
    kb.dma(col, kb.ap(src.t, src.offset, ((0, pmax), (1, 1))))
    _broadcast_column(kb, col, tile)
    for b in blocks:
        kb.dma(kb.ap(dst.t, dst.offset + b.offset, b.pattern), sub(tile, b.parts, b.free))
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


def _swap(kb: KernelBuilder, dst: View, src: View) -> None:
    """Blocks of B x B elements, B = one PSUM bank of 4-byte elements (§3.2)."""
    d, s, dtype = dst.axes, src.axes, dst.t.dtype
    block = kb.target.psum_bank_fp32
    rings = (kb.ring(8, block, dtype), kb.ring(4, block, dtype, mem="psum"),
             kb.ring(3, block, dtype))
    for index in itertools.product(*(range(n) for _, n in d[:-2])):
        d0 = dst.offset + sum(i * st for i, (st, _) in zip(index, d))
        s0 = src.offset + sum(i * st for i, (st, _) in zip(index, s))
        for b0, bn in tiles(d[-1][1], block):
            for a0, an in tiles(d[-2][1], block):
                _swap_block(kb, View(dst.t, d[-2:], d0 + a0 * d[-2][0] + b0 * d[-1][0]),
                            View(src.t, s[-2:], s0 + b0 * s[-1][0] + a0 * s[-2][0]),
                            an, bn, rings)
    kb.release(*rings)


def _swap_block(kb: KernelBuilder, dst: View, src: View, an: int, bn: int, rings) -> None:
    """dst[a, b] = src[b, a] for an x bn (<= B x B) elements: (a, b) strides are
    `dst.axes`, (a, b) strides in the source `src.axes` (a's is 1)."""
    ins, banks, outs = rings
    (da, db), (sa, sb) = ((st for st, _ in dst.axes)), ((st for st, _ in src.axes))
    pmax = kb.target.partitions
    rows = []
    for b0, bt in tiles(bn, pmax):
        t = sub(ins.next(), bt, an)
        kb.dma(t, kb.ap(src.t, src.offset + b0 * sb, ((sb, bt), (sa, an))))
        rows.append((b0, t))
    for a0, at in tiles(an, pmax):
        bank = banks.next()
        for b0, t in rows:
            kb.emit(isa.NcTranspose, dst=sub(bank, at, t.num_partitions, at=b0),
                    data=sub(t, free=at, at=a0))
        out = sub(outs.next(), at, bn)
        kb.emit(isa.TensorCopy, dst=out, src=sub(bank, at, bn), engine=kb.evac_engine())
        kb.dma(kb.ap(dst.t, dst.offset + a0 * da, ((da, at), (db, bn))), out)


# --- swapping two outer axes with short rows kept -------------------------------------------

RUN_BYTES = 2048        # DMA runs from here on are efficient enough (§3.4: 2 KiB
                        # reaches ~80% of the rate in our model)
ROW_SWAP_TILE = 16384   # bytes per partition of one staged tile
ROW_SWAP_TYPES = frozenset({"bfloat16", "float16", "float32"})   # engine copies are exact


def _is_row_swap(d: Axes, s: Axes, dtype: str, pmax: int) -> bool:
    """dst [.., B, A, R] (contiguous) from src [.., A, B, R] (B's rows of R contiguous,
    A's at any pitch of at least B * R: a slice of wider rows, e.g. q out of a fused
    q/k/v projection's [S, 3 * H * D]), R short."""
    if len(d) < 3 or dtype not in ROW_SWAP_TYPES:
        return False
    (db, nb), (da, na), (dr, r) = d[-3:]
    (sb, _), (sa, _), (sr, _) = s[-3:]
    isz = ir.np_dtype(dtype).itemsize
    if not (dr == sr == 1 and r * isz < RUN_BYTES and da == r and db == na * r
            and sb == r and sa >= nb * r and max(na, nb) >= pmax):
        return False
    g, c = _row_swap_blocks(na, nb, r, isz, pmax)
    return min(g, c) * r * isz >= RUN_BYTES // 2     # else the copies buy little


def _row_swap_blocks(na: int, nb: int, r: int, isz: int, pmax: int) -> tuple[int, int]:
    """(G positions of the longer axis per partition, C positions of the other)."""
    n_p, nq = max(na, nb), min(na, nb) if na != nb else nb
    g = max(1, min(-(-RUN_BYTES // (r * isz)), n_p // pmax))
    return g, max(1, min(nq, ROW_SWAP_TILE // (g * r * isz)))


def _row_swap(kb: KernelBuilder, dst: View, src: View) -> None:
    """The longer of A and B goes on partitions, G consecutive positions per partition
    (G * R * itemsize >= RUN_BYTES when it is long enough), with a chunk of C positions
    of the other: loaded in source order [.., R] (runs of G * R or C * R), reordered to
    destination order on VectorE / GpSimd in turn (a strided read, §3.1), stored (runs
    of C * R or G * R)."""
    d, s, dtype = dst.axes, src.axes, dst.t.dtype
    isz, pmax = ir.np_dtype(dtype).itemsize, kb.target.partitions
    (db, nb), (da, na), (_, r) = d[-3:]
    sb, sa = s[-3][0], s[-2][0]
    a_parts = na >= nb                  # A on partitions (else B)
    (sp, dp, n_p), (sq, dq, nq) = ((sa, da, na), (sb, db, nb)) if a_parts else \
        ((sb, db, nb), (sa, da, na))
    g, c = _row_swap_blocks(na, nb, r, isz, pmax)
    width = g * c * r
    rings = (kb.ring(2, width, dtype), kb.ring(2, width, dtype))
    engines = itertools.cycle(("vector", "gpsimd"))
    for index in itertools.product(*(range(n) for _, n in d[:-3])):
        d0 = dst.offset + sum(i * st for i, (st, _) in zip(index, d))
        s0 = src.offset + sum(i * st for i, (st, _) in zip(index, s))
        for p0, parts, gg in _p_blocks(n_p, g, pmax):
            for q0, qn in tiles(nq, c):
                src_p, src_q, dst_p, dst_q = (sp, gg), (sq, qn), (dp, gg), (dq, qn)
                # source order is [A, B, R], destination order [B, A, R]
                load = (src_p, src_q) if a_parts else (src_q, src_p)
                store = (dst_q, dst_p) if a_parts else (dst_p, dst_q)
                loaded = sub(rings[0].next(), parts, gg * qn * r)
                kb.dma(loaded, kb.ap(src.t, s0 + p0 * sp + q0 * sq,
                                     ((gg * sp, parts),) + load + ((1, r),)))
                n1, n2 = load[0][1], load[1][1]
                moved = sub(rings[1].next(), parts, gg * qn * r)
                kb.emit(isa.TensorCopy, dst=moved, engine=next(engines),
                        src=loaded.with_(free=(n2, n1, r), strides=(r, n2 * r, 1)))
                kb.dma(kb.ap(dst.t, d0 + p0 * dp + q0 * dq,
                             ((gg * dp, parts),) + store + ((1, r),)), moved)
    kb.release(*rings)


def _p_blocks(na: int, g: int, pmax: int) -> list[tuple[int, int, int]]:
    """(first position, partitions, positions per partition) covering na."""
    out, a0 = [], 0
    while a0 < na:
        left = na - a0
        gg = g if left >= g else 1
        parts = min(pmax, left // gg)
        out.append((a0, parts, gg))
        a0 += parts * gg
    return out
