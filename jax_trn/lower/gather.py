"""gather: jnp integer-array indexing (`x[idx]`, `x[:, idx]`), `jnp.take`,
`take_along_axis`, embedding lookups and vmapped (batching-dim) gathers.

Every window is a set of table rows (indexed.py): per tile of index vectors, GpSimd
loads and clamps the start indices to [0, dim - slice] (XLA gather semantics; JAX's
"fill" mode is a select JAX emits around the gather, "clip" and "promise_in_bounds"
are this clamp) and computes the row indices; one DmaGather (swdge, §3.4 / §6.2) brings
the rows into SBUF (oob_mode="error": clamped indices are always inside the table) and
a DmaCopy writes them to the result through its access pattern, whatever the order of
its batch and offset dims.

Cost: per tile (up to 128 partitions x 16 KiB), one DMA per index component, ~2-5
GpSimd instructions on [P, m] int32 tiles, one DmaGather (a descriptor per row: an
embedding row of 1024 f32 is one 4 KiB descriptor) and one DmaCopy out.
"""
from __future__ import annotations

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import sub
from .indexed import RowIndexer, check_index_dtype, chunks, data_ap, make_plan
from .registry import LowerCtx, register_lowering


@register_lowering("gather")
def _gather_lower(ctx: LowerCtx, x: DramTensor, indices: DramTensor, *,
                  dimension_numbers, slice_sizes, indices_are_sorted=False, **_) -> None:
    kb, out = ctx.kb, ctx.outs[0]
    if out.size == 0:
        return
    check_index_dtype(ctx, indices)
    dn = dimension_numbers
    plan = make_plan(tuple(x.shape), tuple(slice_sizes), tuple(indices.shape),
                     dn["index_vector_dim"], dn["start_index_map"],
                     dn["operand_batching_dims"], dn["start_indices_batching_dims"],
                     tuple(out.shape), dn["offset_dims"],
                     set(dn["collapsed_slice_dims"]) | set(dn["operand_batching_dims"]),
                     ir.np_dtype(x.dtype).itemsize)
    work = chunks(ctx, plan)
    rows = RowIndexer(ctx, plan, indices, drop_oob=False, work=work)
    table = plan.table(kb, x)
    ring = kb.ring(2, max(ch.n for ch in work) * plan.c, out.dtype)
    for ch in work:
        idx = rows(ch)
        dst = sub(ring.next(), ch.pp, ch.n * plan.c)
        kb.emit(isa.DmaGather, dst=dst, src=table, indices=idx, dma_queue=kb.next_queue())
        kb.dma(data_ap(kb, out, plan, ch), dst)
    rows.close()
    kb.release(ring)
