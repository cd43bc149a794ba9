"""What gather and scatter share: the operand as a table of rows, the index vectors as
positions, and the row indices computed on GpSimd.

Both ops pair an index vector (a *position*: every index of the indices tensor except
`index_vector_dim`) with a window of the operand that starts where the vector says
(components mapped to operand dims by `start_index_map` / `scatter_dims_to_operand_dims`;
batching dims add the position's own coordinate). The *data* tensor is the gather result
or the scatter updates: its window dims walk the window, its other dims the positions.

`make_plan` cuts the window into table rows of `c` contiguous operand elements (the
longest contiguous suffix of the window that fits a tile, or a divisor of the last dim)
and the operand into a table of rows starting every `g` elements (the gcd of every
stride a window start moves by), so one DmaGather / DmaScatter descriptor moves one row
(§3.4). Position dims are merged where indices, data and table strides all agree.

`chunks` walks the work as tiles: positions of the innermost position dim on partitions
(p-major, `m` per partition when a window is a single row, so an embedding lookup moves
up to 16 KiB per partition in one instruction), the window's rows on the free axis
(outer row dims and outer position dims unrolled). `row_indices` emits, per tile:
DMA of each index component (broadcast-free, [pp, m]), clamp to [0, dim - window] on
GpSimd (XLA gather semantics), times the dim's row stride, plus the position's batching
offset (Iota), plus the window's row offsets (Iota). For scatter an index vector whose
window is not fully inside the operand drops the whole update (XLA semantics): its rows
get an index past the table (`BIG`) and the DMA runs with oob_mode="skip".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import sub
from .errors import LoweringError
from .layout import row_major
from .registry import LowerCtx

GATHER_BYTES = 16 * 1024     # SBUF bytes per partition of one data tile
MAX_PER_PARTITION = 2048     # index vectors per partition of one tile
MAX_ROW_DIMS = 4             # Iota patterns have 1-4 dims (§6.2)
MAX_CHUNKS = 8192            # tiles per op: keeps instruction counts bounded
BIG = 1 << 30                # row index of a dropped scatter update: past any table


@dataclass(frozen=True)
class Dim:
    count: int
    idx: int                 # element stride in the indices tensor (positions)
    data: int                # element stride in the data tensor
    row: int                 # table-row stride (units of g)


@dataclass(frozen=True)
class Comp:
    """One index component: where it sits in a position's vector, its clamp bound and
    the table-row stride of its operand dim."""
    offset: int              # element offset in the indices tensor
    hi: int                  # operand dim - window
    row: int


@dataclass(frozen=True)
class Plan:
    c: int                   # elements per table row
    g: int                   # elements between table row starts
    table_rows: int
    comps: tuple[Comp, ...]
    pos: tuple[Dim, ...]     # merged position dims (count > 1), outermost first
    rows: tuple[Dim, ...]    # window row dims (count > 1), outermost first
    c_data: tuple[tuple[int, int], ...]   # data (stride, count) of a row's elements
    cap: int                 # data elements per partition of one tile

    def table(self, kb, t: DramTensor) -> isa.DramAP:
        return kb.ap(t, 0, ((self.g, self.table_rows), (1, self.c)))


def _strides(shape) -> list[int]:
    return [s for s, _ in row_major(shape)] if shape else []


def _chunk(length: int, cap: int) -> int:
    """The largest divisor of `length` that is <= cap."""
    return length if length <= cap else next(d for d in range(cap, 0, -1) if length % d == 0)


def _merge(dims: list[Dim]) -> list[Dim]:
    """Drops count-1 dims and merges neighbours whose strides agree on every tensor."""
    out: list[Dim] = []
    for d in (d for d in dims if d.count > 1):
        if out and all(getattr(out[-1], f) == getattr(d, f) * d.count
                       for f in ("idx", "data", "row")):
            o = out.pop()
            d = Dim(o.count * d.count, d.idx, d.data, d.row)
        out.append(d)
    return out


def make_plan(op_shape, window, idx_shape, ivd, index_map, op_batch, idx_batch,
              data_shape, data_window, dropped, item: int) -> Plan:
    """`dropped`: operand dims with no data dim (collapsed / inserted, and batching);
    `data_window`: the data dims of the other operand dims, in order."""
    ostr, istr, dstr = _strides(op_shape), _strides(idx_shape), _strides(data_shape)
    data_of = dict(zip([d for d in range(len(op_shape)) if d not in dropped], data_window))
    big = [(ostr[d], dstr[data_of[d]], window[d]) for d in range(len(op_shape))
           if window[d] > 1]
    cap = max(1, GATHER_BYTES // item)
    row, c = [], 1
    for os_, ds, n in reversed(big):
        if os_ != c or c * n > cap:
            break
        row.insert(0, (ds, n))
        c *= n
    rest = big[:len(big) - len(row)]
    if not row and rest and rest[-1][0] == 1:      # a contiguous last dim too long: split
        os_, ds, n = rest.pop()
        c = _chunk(n, cap)
        rest.append((c, c * ds, n // c))
        row = [(ds, c)]
    kstride = istr[ivd] if ivd < len(idx_shape) else 0
    comps = [(k * kstride, op_shape[d] - window[d], ostr[d]) for k, d in enumerate(index_map)]
    g = math.gcd(c, *(os_ for os_, _, _ in rest), *(s for _, hi, s in comps if hi > 0),
                 *(ostr[d] for d in op_batch))
    bat = {j: ostr[d] // g for j, d in zip(idx_batch, op_batch)}
    ipos = [j for j in range(len(idx_shape)) if j != ivd]
    dpos = [i for i in range(len(data_shape)) if i not in data_window]
    pos = [Dim(idx_shape[j], istr[j], dstr[i], bat.get(j, 0)) for j, i in zip(ipos, dpos)]
    size = math.prod(op_shape)
    return Plan(c=c, g=g, table_rows=(size - c) // g + 1,
                comps=tuple(Comp(o, hi, s // g) for o, hi, s in comps),
                pos=tuple(_merge(pos)),
                rows=tuple(Dim(n, 0, ds, os_ // g) for os_, ds, n in rest if n > 1),
                c_data=tuple((ds, n) for ds, n in row if n > 1), cap=cap)


@dataclass(frozen=True)
class Chunk:
    """One tile of work: positions q0 .. q0 + pp*m of the innermost position dim `q`
    (p-major) at the given offsets, with the window rows `rows` on the free axis."""
    idx_off: int
    data_off: int
    row_off: int
    q: Dim
    q0: int
    pp: int
    m: int
    rows: tuple[Dim, ...]

    @property
    def n(self) -> int:                       # table rows per partition
        return self.m * math.prod(r.count for r in self.rows)


def _combos(dims):
    """(idx, data, row) offsets of every index tuple of `dims`, row-major."""
    out = [(0, 0, 0)]
    for d in dims:
        out = [(a + i * d.idx, b + i * d.data, r + i * d.row)
               for a, b, r in out for i in range(d.count)]
    return out


def _segments(length: int, m_max: int, p_max: int):
    """(q0, partitions, per partition) covering `length` positions."""
    q0, step = 0, p_max * m_max
    while length - q0 >= step:
        yield q0, p_max, m_max
        q0 += step
    rest = length - q0
    if rest >= p_max:
        yield q0, p_max, rest // p_max
        q0 += p_max * (rest // p_max)
    if length > q0:
        yield q0, length - q0, 1


def chunks(ctx: LowerCtx, plan: Plan, serial: bool = False) -> list[Chunk]:
    """The tiles of the op; `serial`: one position per tile (in position order)."""
    inner: list[Dim] = []
    for r in reversed(plan.rows):
        if len(inner) == MAX_ROW_DIMS or math.prod(d.count for d in inner) * r.count \
                * plan.c > plan.cap:
            break
        inner.insert(0, r)
    outer = plan.rows[:len(plan.rows) - len(inner)]
    q = plan.pos[-1] if plan.pos else Dim(1, 0, 0, 0)
    per_pos = math.prod(d.count for d in inner) * plan.c
    m_max = 1 if serial or inner else max(1, min(MAX_PER_PARTITION, plan.cap // per_pos))
    segs = list(_segments(q.count, m_max, 1 if serial else ctx.target.partitions))
    n = len(_combos(plan.pos[:-1])) * len(_combos(outer)) * len(segs)
    if n > MAX_CHUNKS:
        raise LoweringError(f"{ctx.op.describe()}: {n} tiles (> {MAX_CHUNKS}) for "
                            f"{len(plan.rows)} window row dims over "
                            f"{math.prod(d.count for d in plan.pos)} index vectors")
    return [Chunk(pi + ri, pd + rd, pr + rr, q, q0, pp, m, tuple(inner))
            for pi, pd, pr in _combos(plan.pos[:-1]) for ri, rd, rr in _combos(outer)
            for q0, pp, m in segs]


def data_ap(kb, t: DramTensor, plan: Plan, ch: Chunk) -> isa.DramAP:
    """The data elements of a chunk, in tile order: partitions, then positions, rows,
    row elements."""
    q = ch.q
    free = [(q.data, ch.m)] + [(r.data, r.count) for r in ch.rows] + list(plan.c_data)
    free = [f for f in free if f[1] > 1] or [(1, 1)]
    return kb.ap(t, ch.data_off + ch.q0 * q.data, ((q.data * ch.m, ch.pp), *free))


class RowIndexer:
    """Emits the row-index tile of each chunk; scratch tiles live until `close`."""

    def __init__(self, ctx: LowerCtx, plan: Plan, indices: DramTensor, drop_oob: bool,
                 work: list[Chunk]):
        self.ctx, self.plan, self.indices, self.drop = ctx, plan, indices, drop_oob
        kb = ctx.kb
        m, n = max(ch.m for ch in work), max(ch.n for ch in work)
        self.raw = kb.tile(m, indices.dtype)
        self.col, self.tmp, self.ok = (kb.tile(m, "int32") for _ in range(3))
        self.acc = kb.ring(2, m, "int32")
        self.out = kb.ring(2, n, "int32")

    def close(self) -> None:
        self.ctx.kb.release(self.raw, self.col, self.tmp, self.ok, self.acc, self.out)

    def __call__(self, ch: Chunk) -> isa.Tile:
        kb, plan, q = self.ctx.kb, self.plan, ch.q
        pp, m = ch.pp, ch.m
        raw, col, acc, tmp, ok = (sub(t, pp, m) for t in (self.raw, self.col,
                                                           self.acc.next(), self.tmp, self.ok))
        first, first_ok = True, True
        for comp in plan.comps:
            kb.dma(raw, kb.ap(self.indices, ch.idx_off + ch.q0 * q.idx + comp.offset,
                              ((q.idx * m, pp), (q.idx, m))))
            kb.emit(isa.TensorScalar, dst=col, data=raw, op0="max", operand0=0, op1="min",
                    operand1=comp.hi, engine="gpsimd")
            if self.drop:              # in bounds iff the clamp left the index alone
                kb.emit(isa.TensorTensor, dst=ok if first_ok else tmp, data1=col,
                        data2=raw, op="is_equal", engine="gpsimd")
                if not first_ok:
                    kb.emit(isa.TensorTensor, dst=ok, data1=ok, data2=tmp,
                            op="multiply", engine="gpsimd")
                first_ok = False
            if comp.row and comp.hi:
                kb.emit(isa.TensorScalar, dst=acc if first else tmp, data=col,
                        op0="multiply", operand0=comp.row, engine="gpsimd")
                if not first:
                    kb.emit(isa.TensorTensor, dst=acc, data1=acc, data2=tmp, op="add",
                            engine="gpsimd")
                first = False
        const = ch.row_off + ch.q0 * q.row
        if first or q.row or const:
            kb.emit(isa.Iota, dst=acc if first else tmp, pattern=((q.row, m),),
                    offset=const, channel_multiplier=m * q.row)
            if not first:
                kb.emit(isa.TensorTensor, dst=acc, data1=acc, data2=tmp, op="add",
                        engine="gpsimd")
        if self.drop and not first_ok:   # acc += BIG * (1 - ok)
            kb.emit(isa.TensorScalar, dst=ok, data=ok, op0="multiply", operand0=-BIG,
                    op1="add", operand1=BIG, engine="gpsimd")
            kb.emit(isa.TensorTensor, dst=acc, data1=acc, data2=ok, op="add",
                    engine="gpsimd")
        if not ch.rows:
            return acc
        out = sub(self.out.next(), pp, ch.n)
        kb.emit(isa.Iota, dst=out, pattern=tuple((r.row, r.count) for r in ch.rows))
        kb.emit(isa.TensorScalar, dst=out, data=out, op0="add", operand0=sub(acc, pp, 1),
                engine="gpsimd")
        return out


def check_index_dtype(ctx: LowerCtx, indices: DramTensor) -> None:
    if not ir.is_int(indices.dtype):
        raise LoweringError(f"{ctx.op.describe()}: indices must be integers, not "
                            f"{indices.dtype}")
