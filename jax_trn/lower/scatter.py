"""scatter: `.at[].set/add/mul/max/min`, embedding gradients, `jax.grad` of a gather.

The result starts as a DRAM copy of the operand; then, per tile of index vectors
(indexed.py), GpSimd computes the row indices of each update window in the result
(an update whose window is not fully inside the operand is dropped, XLA semantics:
its rows get an index past the table and the DMAs run with oob_mode="skip"; JAX's
"clip" mode clamps the indices before the scatter) and the updates come in by DMA.

The update computation is recognised from its region (`combiner`): return of the
update (set), or add / multiply / maximum / minimum (or / and on bool) of the two
arguments. Anything else is a LoweringError naming the op.

- set, add: one DmaScatter per tile (§6.2 `dma_copy` with a dst `vector_offset`; add
  as the DMA's read-modify-write, `dst_rmw_op=add`, computed in FP32 in the DMA engine
  and cast back to the result dtype, §3.4). Duplicate indices combine in update order
  (index-vector order, row-major over the update dims): a set keeps the last update,
  adds accumulate one after another, each sum rounded to the result dtype (bf16 sums
  round at every step, as the CPU backend's bf16 combiner does).
- integer add: the DMA adds in FP32 (§3.4; the Neuron compiler converts integer
  scatter-with-compute to FP32, §4), which rounds above 2^24 and saturates where XLA
  wraps, so the updates go in as bytes (`_exact_add`): byte p of every update,
  (u >> 8p) & 255 on GpSimd, is DMA-added into an int32 plane table P_p (zeroed
  first), exact while an element takes at most 2^24 / 255 = 65793 updates -- the
  positions go in batches of at most that many. Then per tile, the touched rows of x
  and of every plane are gathered and GpSimd computes x + sum_p P_p << 8p (shifts on
  VectorE, bitvec ops, §6.2), wrapping in the result type, and the rows are
  scattered back: an element updated twice gets the same final value twice. Costs
  per tile: n DMA-adds and n + 1 gathers for n = bytes of the type, 2n GpSimd and
  VectorE ops, one scatter; plus the plane tables' fill (n x the table). A table
  no larger than DENSE_RATIO x the updated elements (bincount, segment sums) is
  recomputed whole in contiguous blocks instead of gathered row by row.
- mul, max, min: no DMA compute for them, so a read-modify-write on the engines: a
  DmaGather of the current rows, TensorTensor (VectorE for floats, GpSimd natively for
  integers), a DmaScatter back. Two updates of the same row in one tile would read the
  same old value, so the tiles hold one index vector each unless the indices are unique
  (`unique_indices`, or compile-time constant indices that are distinct): ~10
  instructions per index vector (4 DMAs, 5 GpSimd, 1 VectorE), capped at MAX_CHUNKS
  tiles (indexed.py); with unique indices, a tile of up to 128 x 16 KiB costs about
  the same.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import sub
from .errors import LoweringError
from .indexed import (Chunk, Plan, RowIndexer, _segments, check_index_dtype, chunks, data_ap,
                      make_plan)
from .layout import flat_tiles
from .movement import copy, fill
from .registry import LowerCtx, register_lowering

_COMBINERS = {"add": "add", "multiply": "multiply", "maximum": "max", "minimum": "min",
              "or": "max", "and": "min"}


def combiner(op: ir.Op) -> str | None:
    """"set", "add", "multiply", "max" or "min" for a recognised update region."""
    if len(op.regions) != 1 or len(op.regions[0].blocks) != 1:
        return None
    block = op.regions[0].block
    if len(block.args) != 2:
        return None
    a, b = (v.name for v in block.args)
    ret = block.terminator
    if ret.kind not in ("return", "func.return") or len(ret.operands) != 1:
        return None
    v = ret.operands[0].name
    if v == b and len(block.ops) == 1:
        return "set"
    body = [o for o in block.ops if o is not ret]
    if len(body) != 1 or body[0].results[0].name != v:
        return None
    o = body[0]
    kind = _COMBINERS.get(o.kind)
    if kind is None or sorted(x.name for x in o.operands) != sorted((a, b)):
        return None
    if o.kind in ("or", "and") and o.results[0].dtype != "bool":
        return None
    return kind


def _unique(ctx: LowerCtx, plan: Plan, indices: DramTensor, window, index_map,
            unique_indices: bool) -> bool:
    """True when no two index vectors can update the same row."""
    if unique_indices:
        return True
    known = ctx.constant(indices)
    if known is None or any(window[d] > 1 for d in index_map):
        return False
    dn = ctx.op.attrs["scatter_dimension_numbers"]
    ivd = dn["index_vector_dim"]
    vecs = np.asarray(known)
    vecs = np.moveaxis(vecs, ivd, -1) if ivd < vecs.ndim else vecs[..., None]
    vecs = vecs.reshape(-1, vecs.shape[-1])
    return len({tuple(r) for r in vecs.tolist()}) == len(vecs) and not dn["input_batching_dims"]


@register_lowering("scatter")
def _scatter_lower(ctx: LowerCtx, x: DramTensor, indices: DramTensor, *rest: DramTensor,
                   scatter_dimension_numbers, unique_indices=False, indices_are_sorted=False,
                   **_) -> None:
    kb, out = ctx.kb, ctx.outs[0]
    if len(rest) != 1 or len(ctx.outs) != 1:
        raise LoweringError(f"{ctx.op.describe()}: scatter of {len(ctx.outs)} operands "
                            f"together is not supported (one operand, one update)")
    upd = rest[0]
    kind = combiner(ctx.op)
    if kind is None:
        raise LoweringError(f"{ctx.op.describe()}: the update computation is not one of "
                            f"set / add / multiply / maximum / minimum of its arguments")
    check_index_dtype(ctx, indices)
    if out.size == 0:
        return
    copy(kb, out, x)
    if upd.size == 0:
        return
    dn = scatter_dimension_numbers
    shape = tuple(x.shape)
    window = [1] * len(shape)
    dropped = set(dn["inserted_window_dims"]) | set(dn["input_batching_dims"])
    kept = [d for d in range(len(shape)) if d not in dropped]
    for d, u in zip(kept, dn["update_window_dims"]):
        window[d] = upd.shape[u]
    plan = make_plan(shape, tuple(window), tuple(indices.shape), dn["index_vector_dim"],
                     dn["scatter_dims_to_operand_dims"], dn["input_batching_dims"],
                     dn["scatter_indices_batching_dims"], tuple(upd.shape),
                     dn["update_window_dims"], dropped, ir.np_dtype(x.dtype).itemsize)
    serial = kind not in ("set", "add") and not _unique(
        ctx, plan, indices, window, dn["scatter_dims_to_operand_dims"], unique_indices)
    work = chunks(ctx, plan, serial=serial)
    if kind == "add" and ir.is_int(out.dtype) and out.dtype != "bool":
        return _exact_add(ctx, plan, x, upd, indices, work)
    rows = RowIndexer(ctx, plan, indices, drop_oob=True, work=work)
    table = plan.table(kb, out)
    n = max(ch.n for ch in work) * plan.c
    data = kb.ring(2, n, out.dtype)
    cur = kb.ring(2, n, out.dtype) if kind not in ("set", "add") else None
    engine = "vector" if ir.is_float(out.dtype) else "gpsimd"
    for ch in work:
        idx = rows(ch)
        src = sub(data.next(), ch.pp, ch.n * plan.c)
        kb.dma(src, data_ap(kb, upd, plan, ch))
        if cur is not None:
            old = sub(cur.next(), ch.pp, ch.n * plan.c)
            kb.emit(isa.DmaGather, dst=old, src=table, indices=idx, oob_mode="skip",
                    dma_queue=kb.next_queue())
            kb.emit(isa.TensorTensor, dst=old, data1=old, data2=src, op=kind, engine=engine)
            src = old
        kb.emit(isa.DmaScatter, dst=table, src=src, indices=idx, oob_mode="skip",
                rmw_op="add" if kind == "add" else None, dma_queue=kb.next_queue())
    rows.close()
    kb.release(data, *([cur] if cur is not None else []))


# --- exact integer add ----------------------------------------------------------------------

PLANE_UPDATES = (1 << 24) // 255   # updates of one element whose byte sums stay exact
DENSE_RATIO = 8         # recompute the whole table when it is at most this many times
#                         the updated elements: a gathered row costs a DMA descriptor
#                         (§3.4), a contiguous block ~1/100 of one per element
DENSE_FREE = 2048       # elements per partition of one such block


def _exact_add(ctx: LowerCtx, plan: Plan, x: DramTensor, upd: DramTensor,
               indices: DramTensor, work: list[Chunk]) -> None:
    """out = x + the updates, exact and wrapping (see the module docstring): per batch
    of positions, zeroed byte planes, the bytes DMA-added into them, then every touched
    row recomputed from the batch's base (x, or a copy of out after earlier batches)."""
    out = ctx.outs[0]
    planes = {p: ctx.temp(tuple(out.shape), "int32") for p in _bytes_used(ctx, upd)}
    for b, batch in enumerate(_position_batches(work, PLANE_UPDATES)):
        base = x
        if b:
            base = ctx.temp(tuple(out.shape), out.dtype)
            copy(ctx.kb, base, out)
        for t in planes.values():
            fill(ctx.kb, t, 0)
        ctx.next_kernel("bytes")
        _add_bytes(ctx, plan, upd, indices, batch, planes)
        ctx.next_kernel("combine")
        updated = sum(ch.pp * ch.n for ch in batch) * plan.c
        if out.size <= DENSE_RATIO * updated:
            _combine_dense(ctx, base, planes)
        else:
            _combine_rows(ctx, plan, base, indices, batch, planes)
        ctx.next_kernel("scatter")


def _add_bytes(ctx: LowerCtx, plan: Plan, upd: DramTensor, indices: DramTensor, work,
               planes: dict[int, DramTensor]) -> None:
    """Byte p of every update DMA-added into plane p (FP32 adds of integers <= 2^24)."""
    kb = ctx.kb
    rows = RowIndexer(ctx, plan, indices, drop_oob=True, work=work)
    n = max(ch.n for ch in work) * plan.c
    data, digit = kb.ring(2, n, upd.dtype), kb.ring(len(planes) + 1, n, "int32")
    for ch in work:
        idx = rows(ch)
        src = sub(data.next(), ch.pp, ch.n * plan.c)
        kb.dma(src, data_ap(kb, upd, plan, ch))
        for p, t in planes.items():
            d = sub(digit.next(), ch.pp, ch.n * plan.c)
            kb.emit(isa.TensorScalar, dst=d, data=src, op0="shift_right_logical",
                    operand0=8 * p, op1="bitwise_and", operand1=255, engine="gpsimd")
            kb.emit(isa.DmaScatter, dst=plan.table(kb, t), src=d, indices=idx,
                    oob_mode="skip", rmw_op="add", dma_queue=kb.next_queue())
    rows.close()
    kb.release(data, digit)


def _combine_rows(ctx: LowerCtx, plan: Plan, base: DramTensor, indices: DramTensor, work,
                  planes: dict[int, DramTensor]) -> None:
    """Every touched row: base + the planes' sum (`_sum_planes`), scattered back."""
    kb, out = ctx.kb, ctx.outs[0]
    rows = RowIndexer(ctx, plan, indices, drop_oob=True, work=work)
    n = max(ch.n for ch in work) * plan.c
    bufs = _Bufs(kb, n, out.dtype)
    for ch in work:
        idx, size = rows(ch), ch.n * plan.c

        def gather(t: DramTensor, dst: isa.Tile) -> None:
            kb.emit(isa.DmaGather, dst=dst, src=plan.table(kb, t), indices=idx,
                    oob_mode="skip", dma_queue=kb.next_queue())
        res = _sum_planes(kb, bufs, ch.pp, size, planes, base, gather)
        kb.emit(isa.DmaScatter, dst=plan.table(kb, out), src=res, indices=idx,
                oob_mode="skip", dma_queue=kb.next_queue())
    rows.close()
    bufs.release()


def _combine_dense(ctx: LowerCtx, base: DramTensor, planes: dict[int, DramTensor]) -> None:
    """out = base + the planes' sum over the whole table, in contiguous blocks: for a
    table smaller than the updates (bincount), cheaper than a gather per update."""
    kb, out = ctx.kb, ctx.outs[0]
    blocks = flat_tiles(out.size, DENSE_FREE, kb.target.partitions)
    bufs = _Bufs(kb, max(b.free for b in blocks), out.dtype)
    for b in blocks:
        def load(t: DramTensor, dst: isa.Tile, b=b) -> None:
            kb.dma(dst, kb.ap(t, b.offset, b.pattern))
        res = _sum_planes(kb, bufs, b.parts, b.free, planes, base, load)
        kb.dma(kb.ap(out, b.offset, b.pattern), res)
    bufs.release()


def _shift(kb, t: isa.Tile, nbytes: int) -> None:
    kb.emit(isa.TensorScalar, dst=t, data=t, op0="shift_left", operand0=8 * nbytes,
            engine="vector")


def _bytes_used(ctx: LowerCtx, upd: DramTensor) -> list[int]:
    """The update bytes that can be nonzero: all of them, unless the updates are a
    known constant (bincount's ones: byte 0 only)."""
    n = ir.np_dtype(upd.dtype).itemsize
    known = ctx.constant(upd)
    if known is None:
        return list(range(n))
    bits = np.bitwise_or.reduce(np.asarray(known).astype(upd.dtype).reshape(-1)
                                .view(f"u{n}"), initial=0)
    return [p for p in range(n) if (int(bits) >> (8 * p)) & 255] or [0]


class _Bufs:
    """The tiles of `_sum_planes`: base rows (result dtype), planes (int32), sums."""

    def __init__(self, kb, n: int, dtype: str):
        self.kb, self.dtype = kb, dtype
        self.acc_dtype = "int64" if ir.np_dtype(dtype).itemsize == 8 else "int32"
        self.old, self.got = kb.ring(2, n, dtype), kb.ring(3, n, "int32")
        self.accs, self.res = kb.ring(2, n, self.acc_dtype), kb.ring(2, n, dtype)

    def release(self) -> None:
        self.kb.release(self.old, self.got, self.accs, self.res)


def _sum_planes(kb, bufs: _Bufs, parts: int, size: int, planes: dict, base, load
                ) -> isa.Tile:
    """base + sum_p plane_p << 8p for [parts, size] elements (`load(tensor, tile)` reads
    them): Horner from the top byte, shifts on VectorE (bitvec, §6.2), adds on GpSimd
    (§2.5), wrapping in the accumulator type, then in the result type."""
    acc, level = sub(bufs.accs.next(), parts, size), None
    for p in sorted(planes, reverse=True):
        g = sub(bufs.got.next(), parts, size)
        load(planes[p], g)
        if level is None:
            kb.emit(isa.TensorCopy, dst=acc, src=g, engine="gpsimd")
        else:
            _shift(kb, acc, level - p)
            kb.emit(isa.TensorTensor, dst=acc, data1=acc, data2=g, op="add",
                    engine="gpsimd")
        level = p
    if level:
        _shift(kb, acc, level)
    cur = sub(bufs.old.next(), parts, size)
    load(base, cur)
    dst = acc if bufs.acc_dtype == bufs.dtype else sub(bufs.res.next(), parts, size)
    kb.emit(isa.TensorTensor, dst=dst, data1=acc, data2=cur, op="add", engine="gpsimd")
    return dst


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
