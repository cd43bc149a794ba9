"""dynamic_slice and dynamic_update_slice: start indices read on the device, rows moved
by indirect DMA (DmaGather).

The start indices are int32 scalars in DRAM (operands). Each is DMAed (broadcast to
all partitions) into a column of an int32 SBUF tile, clamped on GpSimd to
[0, dim - size] (XLA semantics) and folded into one linear start `base`
(sum of clamped start * stride, integer-exact on GpSimd).

The operand is viewed as a table of overlapping rows: row r starts at element r * g
and holds C contiguous elements, where C is the contiguous block the slice keeps whole
(the trailing full dims times the slice of the first partial dim, cut into equal
chunks when it is too long for SBUF) and g the gcd of the strides the start can move
by. The rows of the slice are an affine pattern over its outer dims: GpSimd `Iota`
writes that pattern into an int32 index tile (one outer dim on partitions, up to four
on the free axis, the rest unrolled), `TensorScalar` adds `base`, and one `DmaGather`
(swdge: descriptors generated on GpSimd) brings the rows into SBUF; a plain DMA writes
them out contiguously. Clamping keeps every index inside the table, so the gather runs
with oob_mode="error".

dynamic_update_slice: the hardware model has no indirect-write (scatter) DMA, so the
operand streams through SBUF and each output row gathers its update row with
oob_mode="skip" (rows outside the window get an index past the table and keep the
operand's data). A row is the trailing block the update covers whole: a window that
is partial in the last dim moves one element per descriptor.
"""
from __future__ import annotations

import math

import numpy as np

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import sub
from .layout import row_major, tiles
from .movement import copy
from .registry import LowerCtx, register_lowering

GATHER_BYTES = 32 * 1024     # SBUF bytes per partition of one gathered tile
MAX_FREE_DIMS = 4            # Iota patterns have 1-4 dims (§6.2)


def _chunk(length: int, cap: int) -> int:
    """The largest divisor of `length` that is <= cap."""
    if length <= cap:
        return length
    return next(d for d in range(cap, 0, -1) if length % d == 0)


def _row_dims(shape, sizes, cap):
    """(C, g, dims): row length C, table row step g (elements), and the slice's rows as
    (element stride, count) dims, outermost first (count > 1 only)."""
    strides = [st for st, _ in row_major(shape)]
    k = len(shape) - 1
    while k > 0 and sizes[k] == shape[k]:
        k -= 1
    length = sizes[k] * strides[k]
    c = _chunk(length, cap)
    dims = [(strides[j], sizes[j]) for j in range(k)] + [(c, length // c)]
    g = math.gcd(c, *strides[:k + 1])
    return c, g, [(s, n) for s, n in dims if n > 1], strides


def _plan(dims, n_max):
    """Split the row dims into (unrolled, partition dim or None, free dims): the longest
    suffix that fits `n_max` rows per partition on the free axis, the dim before it on
    partitions; when even the last dim is too long, it goes on partitions alone."""
    for t in range(len(dims)):
        if len(dims) - t <= MAX_FREE_DIMS and math.prod(n for _, n in dims[t:]) <= n_max:
            return dims[:max(t - 1, 0)], (dims[t - 1] if t else None), dims[t:]
    if not dims:
        return [], None, []
    return dims[:-1], dims[-1], []


def _unrolled(dims):
    """Every index tuple of the unrolled dims: (element offset, row position)."""
    out = [(0, [])]
    for s, n in dims:
        out = [(o + i * s, pos + [i]) for o, pos in out for i in range(n)]
    return out


@register_lowering("dynamic_slice")
def _dynamic_slice_lower(ctx: LowerCtx, x: DramTensor, *starts: DramTensor,
                         slice_sizes) -> None:
    kb, out = ctx.kb, ctx.outs[0]
    shape, sizes = tuple(x.shape), tuple(slice_sizes)
    if out.size == 0:
        return
    if not shape or sizes == shape:
        copy(kb, out, x)           # nothing to clamp: every start clamps to 0
        return
    item = ir.np_dtype(x.dtype).itemsize
    c, g, dims, strides = _row_dims(shape, sizes, max(1, GATHER_BYTES // item))
    n_max = max(1, (GATHER_BYTES // item) // c)

    # base = sum_j clamp(start_j, 0, dim_j - size_j) * stride_j / g on every partition.
    # A start known at compile time is clamped here and goes into the Iota offset; the
    # others are loaded in their own dtype (uint32 / int64 clamp without wrapping).
    clamped, cols = _clamped_starts(ctx, shape, sizes, starts)
    fixed, base = 0, kb.tile(1, "int32")
    first = True
    for j, (kind, v) in enumerate(clamped):
        if kind == "const":
            fixed += v * strides[j] // g
            continue
        more = {} if first else {"op1": "add", "operand1": base}
        kb.emit(isa.TensorScalar, dst=base, data=v, op0="multiply",
                operand0=strides[j] // g, engine="gpsimd", **more)
        first = False
    if first:
        kb.emit(isa.Memset, dst=base, value=0, engine="gpsimd")

    loop, pdim, free = _plan(dims, n_max)
    n = math.prod(m for _, m in free)
    # Row-count strides of the dims, for where each tile lands in the output.
    counts = [m for _, m in dims]
    rstride = [math.prod(counts[i + 1:]) for i in range(len(dims))]
    nl = len(loop)
    table = kb.ap(x, 0, ((g, (x.size - c) // g + 1), (1, c)))
    pattern = tuple((s // g, m) for s, m in free) or ((0, 1),)
    idx_ring = kb.ring(2, n, "int32")
    data_ring = kb.ring(2, n * c, out.dtype)
    for off, pos in _unrolled(loop):
        row0 = sum(i * rs for i, rs in zip(pos, rstride[:nl]))
        p_chunks = [(0, 1)] if pdim is None else tiles(pdim[1], kb.target.partitions)
        for p0, pp in p_chunks:
            pst = 0 if pdim is None else pdim[0]
            idx = sub(idx_ring.next(), pp, n)
            kb.emit(isa.Iota, dst=idx, pattern=pattern, offset=fixed + (off + p0 * pst) // g,
                    channel_multiplier=pst // g)
            kb.emit(isa.TensorScalar, dst=idx, data=idx, op0="add",
                    operand0=sub(base, pp, 1), engine="gpsimd")
            dst = sub(data_ring.next(), pp, n * c)
            kb.emit(isa.DmaGather, dst=dst, src=table, indices=idx,
                    dma_queue=kb.next_queue())
            prs = rstride[nl] if pdim is not None else n
            r = row0 + p0 * prs
            kb.dma(kb.ap(out, r * c, ((prs * c, pp), (1, n * c))), dst)
    kb.release(idx_ring, data_ring, base, cols)


BIG = 1 << 30                # added to the index of a row outside the window: skipped


def _clamped_starts(ctx, shape, sizes, starts):
    """Per dim: ("const", c) for a start known at compile time (clamped here) or a full
    window, else ("tile", [P, 1] int32 column of the clamped start loaded on device)."""
    kb, res = ctx.kb, []
    cols = kb.tile(max(1, len(shape)), "int32")
    for j, s in enumerate(starts):
        known = ctx.constant(s)
        if shape[j] == sizes[j] or known is not None:
            v = 0 if shape[j] == sizes[j] else int(np.asarray(known).reshape(-1)[0])
            res.append(("const", min(max(v, 0), shape[j] - sizes[j])))
            continue
        pmax = kb.target.partitions
        raw, col = kb.tile(1, s.dtype), sub(cols, pmax, 1, at=j)
        kb.dma(raw, kb.ap(s, 0, ((0, pmax), (1, 1))))
        kb.emit(isa.TensorScalar, dst=col, data=raw, op0="max", operand0=0, op1="min",
                operand1=shape[j] - sizes[j], engine="gpsimd")
        kb.release(raw)
        res.append(("tile", col))
    return res, cols


def _updates_operand_in_place(op: ir.Op, arg: ir.Value) -> bool:
    """The rule may write its result over operand 0 (a loop's carried buffer, a scan's
    stacked outputs, control.py): each tile of rows is loaded, patched from the update
    and stored back to the same rows, tiles disjoint. Not when `arg` is also the
    update or a start index."""
    return all(v is not arg for v in op.operands[1:])


@register_lowering("dynamic_update_slice", in_place=_updates_operand_in_place)
def _dynamic_update_slice_lower(ctx: LowerCtx, x: DramTensor, upd: DramTensor,
                                *starts: DramTensor) -> None:
    """The operand passes through SBUF row by row (a row: the trailing block the update
    covers whole); for each output row GpSimd computes the update row that lands there
    (row index o - start, per dim) or an index past the table when the row is outside
    the window, and a DmaGather with oob_mode="skip" overwrites the in-window rows."""
    kb, out = ctx.kb, ctx.outs[0]
    shape, sizes = tuple(x.shape), tuple(upd.shape)
    if out.size == 0:
        return
    if upd.size == 0 or not shape or sizes == shape:
        copy(kb, out, x if upd.size == 0 else upd)
        return
    item = ir.np_dtype(x.dtype).itemsize
    cap = max(1, GATHER_BYTES // item)
    strides = [st for st, _ in row_major(shape)]
    k = max(j for j in range(len(shape)) if sizes[j] != shape[j])
    c = _chunk(strides[k], cap)
    n_max = max(1, cap // c)
    starts_c, cols = _clamped_starts(ctx, shape, sizes, starts)
    # Dims of the output rows (units of c elements): (row stride, extent, window size,
    # start, update row stride); the chunks of a row form a last, always-full dim.
    usizes = list(sizes[:k + 1]) + [strides[k] // c]
    ustr = [math.prod(usizes[i + 1:]) for i in range(len(usizes))]
    dims = [(strides[j] // c, shape[j], sizes[j], starts_c[j], ustr[j]) for j in range(k + 1)]
    dims.append((1, strides[k] // c, strides[k] // c, ("const", 0), 1))
    dims = [d for d in dims if d[1] > 1]
    loop, pdim, free = _plan([(d[0], d[1]) for d in dims], n_max)
    nl = len(loop)
    n = math.prod(m for _, m in free)
    table = kb.ap(upd, 0, ((c, upd.size // c), (1, c)))
    t, t2, m, u = (kb.tile(n, "int32") for _ in range(4))
    data_ring = kb.ring(2, n * c, out.dtype)
    for off, pos in _unrolled(loop):
        for p0, pp in ([(0, 1)] if pdim is None else tiles(pdim[1], kb.target.partitions)):
            tt, tt2, mm, uu = (sub(a, pp, n) for a in (t, t2, m, u))
            first_m = True
            for i, (_, ext, win, (kind, cv), us) in enumerate(dims):
                # tt = o_i - start_i over the tile
                on_free = i - nl - (pdim is not None)
                pattern = tuple((1 if f == on_free else 0, fm)
                                for f, (_, fm) in enumerate(free)) or ((0, 1),)
                const = pos[i] if i < nl else (p0 if i == nl and pdim is not None else 0)
                const -= cv if kind == "const" else 0
                kb.emit(isa.Iota, dst=tt, pattern=pattern, offset=const,
                        channel_multiplier=int(i == nl and pdim is not None))
                if kind == "tile":
                    kb.emit(isa.TensorScalar, dst=tt, data=tt, op0="subtract",
                            operand0=sub(cv, pp, 1), engine="gpsimd")
                if win < ext:                       # in window: clamp(tt, 0, win-1) == tt
                    kb.emit(isa.TensorScalar, dst=tt2, data=tt, op0="max", operand0=0,
                            op1="min", operand1=win - 1, engine="gpsimd")
                    kb.emit(isa.TensorTensor, dst=tt2 if not first_m else mm, data1=tt,
                            data2=tt2, op="is_equal", engine="gpsimd")
                    if not first_m:
                        kb.emit(isa.TensorTensor, dst=mm, data1=mm, data2=tt2,
                                op="multiply", engine="gpsimd")
                    first_m = False
                if i == 0:
                    kb.emit(isa.TensorScalar, dst=uu, data=tt, op0="multiply",
                            operand0=us, engine="gpsimd")
                else:
                    kb.emit(isa.TensorScalar, dst=tt, data=tt, op0="multiply",
                            operand0=us, engine="gpsimd")
                    kb.emit(isa.TensorTensor, dst=uu, data1=uu, data2=tt, op="add",
                            engine="gpsimd")
            # idx = u + BIG * (1 - in_window)
            kb.emit(isa.TensorScalar, dst=mm, data=mm, op0="multiply", operand0=-BIG,
                    op1="add", operand1=BIG, engine="gpsimd")
            kb.emit(isa.TensorTensor, dst=uu, data1=uu, data2=mm, op="add", engine="gpsimd")
            pst = 0 if pdim is None else pdim[0]
            row0 = sum(i * s for i, (s, _) in zip(pos, loop)) + p0 * pst
            o_ap = ((pst * c if pdim is not None else n * c, pp), (1, n * c))
            dst = sub(data_ring.next(), pp, n * c)
            kb.dma(dst, kb.ap(x, row0 * c, o_ap))
            kb.emit(isa.DmaGather, dst=dst, src=table, indices=uu, oob_mode="skip",
                    dma_queue=kb.next_queue())
            kb.dma(kb.ap(out, row0 * c, o_ap), dst)
    kb.release(t, t2, m, u, data_ring, cols)
