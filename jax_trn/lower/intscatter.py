"""Exact integer scatter-add (`x.at[idx].add(v)`, bincount, segment sums): two's-complement
sums that wrap like XLA, with duplicate indices.

The DMA engines' read-modify-write adds in FP32 (§3.4; the Neuron compiler converts
integer scatter-with-compute to FP32, §4): exact only while every sum stays within 2^24,
and the cast back saturates where XLA wraps. So the updates go in as bytes:

1. byte planes: byte p of every update, (u >> 8p) & 255 (one GpSimd tensor_scalar each,
   §2.5), is DMA-added (FP32, exact) into plane p of a zeroed int32 table; the planes
   of up to four bytes are interleaved element by element in one table (a row of c
   elements is then one descriptor of 4c values, §3.4; the tile's per-byte views keep a
   16-byte innermost stride, §3.1). A plane sum is exact while an element takes at most
   2^24 / 255 = 65793 updates: the positions (index vectors) go in batches of at most
   that many, each batch starting from the result of the last.
2. combine: out = base + sum_p plane_p << 8p on every touched row (gathers of base and
   the planes, Horner from the top byte: shifts on VectorE, bitvec ops, §6.2; adds on
   GpSimd; wrapping in int32 / int64, then to the result type), scattered back -- an
   element updated twice gets the same final value twice. A table of at most
   DENSE_RATIO x the updated elements (bincount) is recomputed whole in contiguous
   blocks instead. Updates that are a known constant add only their nonzero bytes.

Costs per tile of positions (int32): 4 GpSimd ops and one DMA-add scatter; then two
gathers, 3 VectorE shifts, 4 GpSimd adds and one scatter; plus the planes' fill (4 x the
table) per batch. 1.3-3x the FP32 read-modify-write it replaces (which was wrong).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import sub
from .indexed import Chunk, Plan, RowIndexer, _segments, data_ap
from .layout import flat_tiles
from .movement import copy, fill
from .registry import LowerCtx

PLANE_UPDATES = (1 << 24) // 255   # updates of one element whose byte sums stay exact
GROUP = 4               # byte planes interleaved in one table (16-byte strides, §3.1)
DENSE_RATIO = 8         # recompute the whole table when it is at most this many times
#                         the updated elements: a gathered row costs a DMA descriptor
#                         (§3.4), a contiguous block ~1/100 of one per element
DENSE_FREE = 2048       # elements per partition of one such block


@dataclass(frozen=True)
class Planes:
    """Byte planes `nums` of every table element, interleaved: element e, plane q at
    e * len(nums) + q of the int32 tensor `t`."""
    t: DramTensor
    nums: tuple[int, ...]

    def table(self, kb, plan: Plan) -> isa.DramAP:
        k = len(self.nums)
        return kb.ap(self.t, 0, ((plan.g * k, plan.table_rows), (1, plan.c * k)))


def _view(tile: isa.Tile, q: int, k: int, size: int) -> isa.Tile:
    """Plane q of a [P, size * k] interleaved tile as [P, size]."""
    if k == 1:
        return tile
    return tile.with_(free=(size,), strides=(k,), offset=tile.offset + 4 * q)


def exact_add(ctx: LowerCtx, plan: Plan, x: DramTensor, upd: DramTensor,
              indices: DramTensor, work: list[Chunk]) -> None:
    """out = x + the updates (see the module docstring), the result already holding a
    copy of x (scatter.py)."""
    out = ctx.outs[0]
    nums = _bytes_used(ctx, upd)
    groups = [Planes(ctx.temp((out.size * len(g),), "int32"), g)
              for g in (tuple(nums[i:i + GROUP]) for i in range(0, len(nums), GROUP))]
    for b, batch in enumerate(_position_batches(work, PLANE_UPDATES)):
        base = x
        if b:
            base = ctx.temp(tuple(out.shape), out.dtype)
            copy(ctx.next_kernel("scatter"), base, out)
        for g in groups:
            fill(ctx.kb, g.t, 0)
        ctx.next_kernel("bytes")
        _add_bytes(ctx, plan, upd, indices, batch, groups)
        ctx.next_kernel("combine")
        updated = sum(ch.pp * ch.n for ch in batch) * plan.c
        if out.size <= DENSE_RATIO * updated:
            _combine_dense(ctx, base, groups)
        else:
            _combine_rows(ctx, plan, base, indices, batch, groups)


def _add_bytes(ctx: LowerCtx, plan: Plan, upd: DramTensor, indices: DramTensor, work,
               groups: list[Planes]) -> None:
    """Every update's bytes DMA-added into their planes (FP32 adds of integers <= 2^24)."""
    kb = ctx.kb
    rows = RowIndexer(ctx, plan, indices, drop_oob=True, work=work)
    n = max(ch.n for ch in work) * plan.c
    data, digits = kb.ring(2, n, upd.dtype), kb.ring(2, n * GROUP, "int32")
    for ch in work:
        idx, size = rows(ch), ch.n * plan.c
        src = sub(data.next(), ch.pp, size)
        kb.dma(src, data_ap(kb, upd, plan, ch))
        for g in groups:
            d = sub(digits.next(), ch.pp, size * len(g.nums))
            for q, p in enumerate(g.nums):
                kb.emit(isa.TensorScalar, dst=_view(d, q, len(g.nums), size), data=src,
                        op0="shift_right_logical", operand0=8 * p, op1="bitwise_and",
                        operand1=255, engine="gpsimd")
            kb.emit(isa.DmaScatter, dst=g.table(kb, plan), src=d, indices=idx,
                    oob_mode="skip", rmw_op="add", dma_queue=kb.next_queue())
    rows.close()
    kb.release(data, digits)


def _combine_rows(ctx: LowerCtx, plan: Plan, base: DramTensor, indices: DramTensor, work,
                  groups: list[Planes]) -> None:
    """Every touched row: base + the planes' sum (`_sum_planes`), scattered back."""
    kb, out = ctx.kb, ctx.outs[0]
    rows = RowIndexer(ctx, plan, indices, drop_oob=True, work=work)
    bufs = _Bufs(kb, max(ch.n for ch in work) * plan.c, out.dtype, groups)
    for ch in work:
        idx, size = rows(ch), ch.n * plan.c

        def gather(src: isa.DramAP, dst: isa.Tile) -> None:
            kb.emit(isa.DmaGather, dst=dst, src=src, indices=idx, oob_mode="skip",
                    dma_queue=kb.next_queue())
        loads = [(g.table(kb, plan), g) for g in groups]
        res = _sum_planes(kb, bufs, ch.pp, size, loads, plan.table(kb, base), gather)
        kb.emit(isa.DmaScatter, dst=plan.table(kb, out), src=res, indices=idx,
                oob_mode="skip", dma_queue=kb.next_queue())
    rows.close()
    bufs.release()


def _combine_dense(ctx: LowerCtx, base: DramTensor, groups: list[Planes]) -> None:
    """out = base + the planes' sum over the whole table, in contiguous blocks."""
    kb, out = ctx.kb, ctx.outs[0]
    blocks = flat_tiles(out.size, DENSE_FREE, kb.target.partitions)
    bufs = _Bufs(kb, max(b.free for b in blocks), out.dtype, groups)
    for b in blocks:
        loads = [(kb.ap(g.t, b.offset * len(g.nums), ((b.pstride * len(g.nums), b.parts),
                                                      (1, b.free * len(g.nums)))), g)
                 for g in groups]
        res = _sum_planes(kb, bufs, b.parts, b.free, loads, kb.ap(base, b.offset, b.pattern),
                          lambda src, dst: kb.dma(dst, src))
        kb.dma(kb.ap(out, b.offset, b.pattern), res)
    bufs.release()


class _Bufs:
    """The tiles of `_sum_planes`: base rows (result dtype), planes (int32), sums."""

    def __init__(self, kb, n: int, dtype: str, groups: list[Planes]):
        self.kb, self.dtype = kb, dtype
        self.acc_dtype = "int64" if ir.np_dtype(dtype).itemsize == 8 else "int32"
        width = max(len(g.nums) for g in groups)
        self.old, self.got = kb.ring(2, n, dtype), kb.ring(len(groups) + 1, n * width, "int32")
        self.accs, self.res = kb.ring(2, n, self.acc_dtype), kb.ring(2, n, dtype)

    def release(self) -> None:
        self.kb.release(self.old, self.got, self.accs, self.res)


def _sum_planes(kb, bufs: _Bufs, parts: int, size: int, loads, base_src, load
                ) -> isa.Tile:
    """base + sum_p plane_p << 8p for [parts, size] elements, `load(src, tile)` reading
    each group of planes and the base: Horner from the top byte, shifts on VectorE
    (bitvec, §6.2), adds on GpSimd (§2.5), wrapping in the accumulator type, then in the
    result type."""
    planes = {}
    for src, g in loads:
        tile = sub(bufs.got.next(), parts, size * len(g.nums))
        load(src, tile)
        planes.update({p: _view(tile, q, len(g.nums), size) for q, p in enumerate(g.nums)})
    acc, level = sub(bufs.accs.next(), parts, size), None
    for p in sorted(planes, reverse=True):
        if level is None:
            kb.emit(isa.TensorCopy, dst=acc, src=planes[p], engine="gpsimd")
        else:
            _shift(kb, acc, level - p)
            kb.emit(isa.TensorTensor, dst=acc, data1=acc, data2=planes[p], op="add",
                    engine="gpsimd")
        level = p
    if level:
        _shift(kb, acc, level)
    cur = sub(bufs.old.next(), parts, size)
    load(base_src, cur)
    dst = acc if bufs.acc_dtype == bufs.dtype else sub(bufs.res.next(), parts, size)
    kb.emit(isa.TensorTensor, dst=dst, data1=acc, data2=cur, op="add", engine="gpsimd")
    return dst


def _shift(kb, t: isa.Tile, nbytes: int) -> None:
    kb.emit(isa.TensorScalar, dst=t, data=t, op0="shift_left", operand0=8 * nbytes,
            engine="vector")


def _bytes_used(ctx: LowerCtx, upd: DramTensor) -> list[int]:
    """The update bytes that can be nonzero: all of them, unless the updates are a
    known constant (x.at[i].add(3): byte 0 only)."""
    n = ir.np_dtype(upd.dtype).itemsize
    known = ctx.constant(upd)
    if known is None:
        return list(range(n))
    bits = np.bitwise_or.reduce(np.asarray(known).astype(upd.dtype).reshape(-1)
                                .view(f"u{n}"), initial=0)
    return [p for p in range(n) if (int(bits) >> (8 * p)) & 255] or [0]


def _position_batches(work: list[Chunk], limit: int) -> list[list[Chunk]]:
    """The chunks in batches of at most `limit` positions (index vectors), chunks cut
    where one holds more: an element takes at most one update per position."""
    batches: list[list[Chunk]] = [[]]
    count = 0
    for ch in work:
        for piece in _pieces(ch, limit):
            size = piece.pp * piece.m
            if count + size > limit and batches[-1]:
                batches.append([])
                count = 0
            batches[-1].append(piece)
            count += size
    return batches


def _pieces(ch: Chunk, limit: int) -> list[Chunk]:
    """`ch` cut into chunks of at most `limit` positions (consecutive positions, each
    piece p-major on at most the same partitions, as `indexed._segments` cuts them)."""
    if ch.pp * ch.m <= limit:
        return [ch]
    return [dataclasses.replace(ch, q0=ch.q0 + q0, pp=pp, m=m)
            for q0, pp, m in _segments(ch.pp * ch.m, max(1, limit // ch.pp), ch.pp)]
