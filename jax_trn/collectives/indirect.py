"""A plan's numerics with copies as bookkeeping: only reductions touch the data.

`numerics.execute` moves every slot a plan's copy steps move: for a hierarchical
all_reduce over 1152 ranks (§5.3) that is ~2/3 of its time, and its scratch half of the
(ranks x total_slots) buffer. Which cell holds which value after a copy does not depend
on the data, so `compile_plan` runs the plan once over cell *ids* (slot granularity):
a copy step copies ids, a reducing step (reducing Xfer, LocalReduce) names fresh cells
for its results and records which cells it combines, in order. `run` then does only
those reductions, with `numerics.combine` / `numerics.local_reduce` (the same
element-wise operations in the same order: the same bits), on a store of
(inputs + results) cells, and reads the results through the final ids.

The final ids also say, before any data is seen, whether every rank of a group ends
with its group's first rank's result (each plan gathers one reduced copy of each slot
to all): then the result is read once per group.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import numerics
from .plan import Plan, Xfer

__all__ = ["Compiled", "compile_plan", "run"]


@dataclass(frozen=True, eq=False)
class Compiled:
    """A plan as reductions over a store of cells (rows of `width` elements): cells
    [0, ranks*slots) are the inputs' main slots (rank-major), cell `zero` an all-zero
    row (scratch never written), then each op's results in op order."""
    ops: list              # (kind, source id arrays (k, m), first output cell)
    cells: int             # store rows
    zero: int
    final: np.ndarray      # (ranks, slots) cell of each rank's result slot
    shared: bool           # final rows equal within each group (given `groups`)


def compile_plan(plan: Plan, ranks: int, groups: int) -> Compiled:
    """`plan` over `ranks` rows (group-major, `groups` groups) as ids; data-independent."""
    s, t = plan.slots, plan.total_slots
    zero = ranks * s
    where = np.full((ranks, t), zero, np.int64)
    where[:, :s] = np.arange(ranks * s).reshape(ranks, s)
    ops, nxt = [], zero + 1
    for st in plan.steps:
        if isinstance(st, Xfer):
            rows, cols = st.dst[:, None], _slots(st.dstart, st.length)
            src = where[st.src[:, None], _slots(st.sstart, st.length)]
            if not st.reduce:
                where[rows, cols] = src
                continue
            ids = np.stack([where[rows, cols].reshape(-1), src.reshape(-1)])
            kind = "combine"
        else:
            rows, cols = st.rank[:, None], _slots(st.dstart, st.length)
            ids = np.stack([where[rows, _slots(st.sstarts[:, k], st.length)].reshape(-1)
                            for k in range(st.sstarts.shape[1])])
            kind = "local"
        ops.append((kind, ids, nxt))
        where[rows, cols] = (nxt + np.arange(ids.shape[1])).reshape(rows.shape[0], st.length)
        nxt += ids.shape[1]
    final = where[:, :s]
    n = ranks // groups
    by_group = final.reshape(groups, n, s)
    shared = bool((by_group == by_group[:, :1]).all())
    return Compiled(ops, nxt, zero, final, shared)


def _slots(starts, length):
    return np.asarray(starts)[:, None] + np.arange(length)[None, :]


def run(comp: Compiled, store: np.ndarray, op: str, sources: int) -> None:
    """Do `comp`'s reductions on `store` (comp.cells x width; inputs loaded, the zero
    row zeroed), in plan order, writing each op's results into its cells."""
    for kind, ids, out in comp.ops:
        parts = [np.take(store, row, axis=0) for row in ids]    # ~5x store[row]
        if kind == "combine":
            got = numerics.combine(parts[0], parts[1], op)
        else:
            got = numerics.local_reduce(parts, op, sources, store.dtype)
        store[out:out + ids.shape[1]] = got
