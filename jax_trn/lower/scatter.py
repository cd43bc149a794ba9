"""scatter: `.at[].set/add/mul/max/min`, embedding gradients, `jax.grad` of a gather.

The result starts as a DRAM copy of the operand; then, per tile of index vectors
(indexed.py), GpSimd computes the row indices of each update window in the result
(an update whose window is not fully inside the operand is dropped, XLA semantics:
its rows get an index past the table and the DMAs run with oob_mode="skip"; JAX's
"clip" mode clamps the indices before the scatter) and the updates come in by DMA.

The update computation is recognised from its region (`combiner`): return of the
update (set), or add / multiply / maximum / minimum (or / and on bool) of the two
arguments. Any other elementwise computation (`x.at[i].apply(f)`) runs like mul / max /
min below, its ops evaluated as tile steps on the gathered rows (`_Body`).

- set, add: one DmaScatter per tile (§6.2 `dma_copy` with a dst `vector_offset`; add
  as the DMA's read-modify-write, `dst_rmw_op=add`, computed in FP32 in the DMA engine
  and cast back to the result dtype, §3.4). Duplicate indices combine in update order
  (index-vector order, row-major over the update dims): a set keeps the last update,
  adds accumulate one after another, each sum rounded to the result dtype (bf16 sums
  round at every step, as the CPU backend's bf16 combiner does).
- integer add: the DMA adds in FP32 (§3.4; the Neuron compiler converts integer
  scatter-with-compute to FP32, §4), which rounds above 2^24 and saturates where XLA
  wraps: intscatter.py adds the update bytes exactly instead.
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

import numpy as np

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import sub
from .errors import LoweringError
from .indexed import Plan, RowIndexer, check_index_dtype, chunks, data_ap, make_plan
from .intscatter import exact_add
from .movement import copy
from .registry import LowerCtx, register_lowering
from .regions import Evaluator, Input, Region
from .tileops import Src
from .windowbody import body_steps

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
    kind = combiner(ctx.op) or "any"
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
        return exact_add(ctx, plan, x, upd, indices, work)
    rows = RowIndexer(ctx, plan, indices, drop_oob=True, work=work)
    table = plan.table(kb, out)
    n = max(ch.n for ch in work) * plan.c
    data = kb.ring(2, n, out.dtype)
    cur = kb.ring(2, n, out.dtype) if kind not in ("set", "add") else None
    engine = "vector" if ir.is_float(out.dtype) else "gpsimd"
    body = _Body(ctx, n, out.dtype) if kind == "any" else None
    for ch in work:
        idx = rows(ch)
        src = sub(data.next(), ch.pp, ch.n * plan.c)
        kb.dma(src, data_ap(kb, upd, plan, ch))
        if cur is not None:
            old = sub(cur.next(), ch.pp, ch.n * plan.c)
            kb.emit(isa.DmaGather, dst=old, src=table, indices=idx, oob_mode="skip",
                    dma_queue=kb.next_queue())
            if body is not None:
                src = body(old, src)
            else:
                kb.emit(isa.TensorTensor, dst=old, data1=old, data2=src, op=kind,
                        engine=engine)
                src = old
        kb.emit(isa.DmaScatter, dst=table, src=src, indices=idx, oob_mode="skip",
                rmw_op="add" if kind == "add" else None, dma_queue=kb.next_queue())
    rows.close()
    kb.release(data, *([cur] if cur is not None else []))
    if body is not None:
        body.close()


class _Body:
    """Any elementwise update computation (`x.at[i].apply(f)`: f(old), ignoring the
    update), evaluated on the gathered rows and the updates as tile steps (regions.py)."""

    def __init__(self, ctx: LowerCtx, free: int, dtype: str):
        steps = body_steps(ctx.op, 2, ctx)
        ret = steps.pop()
        if len(ret) != 1:
            raise LoweringError(f"{ctx.op.describe()}: an update computation of "
                                f"{len(ret)} results is not supported")
        self.kb, self.vid = ctx.kb, 2 + ret[0]
        inputs = [Input(None, ((1, free),), dtype)] * 2
        self.ev = Evaluator(ctx.kb, Region((free,), inputs, steps, []), free)

    def __call__(self, old: isa.Tile, upd: isa.Tile) -> isa.Tile:
        parts, free = old.num_partitions, old.free_size
        vals = self.ev.compute([Src.of(old), Src.of(upd)], parts, free)
        return self.ev._full(vals[self.vid], parts, free, ("scatter",)).tile

    def close(self) -> None:
        self.ev.close()
