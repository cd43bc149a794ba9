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
  VectorE ops, one scatter; plus the plane tables' fill (n x the table).
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


def _exact_add(ctx: LowerCtx, plan: Plan, x: DramTensor, upd: DramTensor,
               indices: DramTensor, work: list[Chunk]) -> None:
    """out = x + the updates, exact and wrapping (see the module docstring): per batch
    of positions, zeroed byte planes, the bytes DMA-added into them, then every touched
    row recomputed from the batch's base (x, or a copy of out after earlier batches)."""
    out, n = ctx.outs[0], ir.np_dtype(ctx.outs[0].dtype).itemsize
    planes = [ctx.temp(tuple(out.shape), "int32") for _ in range(n)]
    for b, batch in enumerate(_position_batches(work, PLANE_UPDATES)):
        base = x
        if b:
            base = ctx.temp(tuple(out.shape), out.dtype)
            copy(ctx.kb, base, out)
        for t in planes:
            fill(ctx.kb, t, 0)
        ctx.next_kernel("bytes")
        _add_bytes(ctx, plan, upd, indices, batch, planes)
        ctx.next_kernel("combine")
        _combine_rows(ctx, plan, base, indices, batch, planes)
        ctx.next_kernel("scatter")


def _add_bytes(ctx: LowerCtx, plan: Plan, upd: DramTensor, indices: DramTensor, work,
               planes: list[DramTensor]) -> None:
    """Byte p of every update DMA-added into plane p (FP32 adds of integers <= 2^24)."""
    kb = ctx.kb
    rows = RowIndexer(ctx, plan, indices, drop_oob=True, work=work)
    n = max(ch.n for ch in work) * plan.c
    data, digit = kb.ring(2, n, upd.dtype), kb.ring(len(planes) + 1, n, "int32")
    for ch in work:
        idx = rows(ch)
        src = sub(data.next(), ch.pp, ch.n * plan.c)
        kb.dma(src, data_ap(kb, upd, plan, ch))
        for p, t in enumerate(planes):
            d = sub(digit.next(), ch.pp, ch.n * plan.c)
            kb.emit(isa.TensorScalar, dst=d, data=src, op0="shift_right_logical",
                    operand0=8 * p, op1="bitwise_and", operand1=255, engine="gpsimd")
            kb.emit(isa.DmaScatter, dst=plan.table(kb, t), src=d, indices=idx,
                    oob_mode="skip", rmw_op="add", dma_queue=kb.next_queue())
    rows.close()
    kb.release(data, digit)


def _combine_rows(ctx: LowerCtx, plan: Plan, base: DramTensor, indices: DramTensor, work,
                  planes: list[DramTensor]) -> None:
    """Every touched row: base + sum_p plane_p << 8p (Horner from the top byte), in the
    accumulator type, wrapped to the result type and scattered over the row."""
    kb, out = ctx.kb, ctx.outs[0]
    acc_dt = "int64" if len(planes) == 8 else "int32"
    rows = RowIndexer(ctx, plan, indices, drop_oob=True, work=work)
    n = max(ch.n for ch in work) * plan.c
    old, got = kb.ring(2, n, out.dtype), kb.ring(3, n, "int32")
    accs, res = kb.ring(2, n, acc_dt), kb.ring(2, n, out.dtype)
    for ch in work:
        idx, size = rows(ch), ch.n * plan.c
        acc = sub(accs.next(), ch.pp, size)
        for p in reversed(range(len(planes))):
            g = sub(got.next(), ch.pp, size)
            kb.emit(isa.DmaGather, dst=g, src=plan.table(kb, planes[p]), indices=idx,
                    oob_mode="skip", dma_queue=kb.next_queue())
            if p == len(planes) - 1:
                kb.emit(isa.TensorCopy, dst=acc, src=g, engine="gpsimd")
                continue
            kb.emit(isa.TensorScalar, dst=acc, data=acc, op0="shift_left", operand0=8,
                    engine="vector")
            kb.emit(isa.TensorTensor, dst=acc, data1=acc, data2=g, op="add", engine="gpsimd")
        cur = sub(old.next(), ch.pp, size)
        kb.emit(isa.DmaGather, dst=cur, src=plan.table(kb, base), indices=idx,
                oob_mode="skip", dma_queue=kb.next_queue())
        dst = acc if acc_dt == out.dtype else sub(res.next(), ch.pp, size)
        kb.emit(isa.TensorTensor, dst=dst, data1=acc, data2=cur, op="add", engine="gpsimd")
        kb.emit(isa.DmaScatter, dst=plan.table(kb, out), src=dst, indices=idx,
                oob_mode="skip", dma_queue=kb.next_queue())
    rows.close()
    kb.release(old, got, accs, res)


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
