"""A collective whose ranks belong to several processes, computed by all of them
together (issue 17): each process takes a share of the buffer's columns.

Every plan step moves or combines whole slots, the same way in every column
(numerics.py), so column c of the ranks' final buffers depends only on column c of
their initial buffers. Process k (of the call's `count`) computes columns
[bounds[k], bounds[k + 1]) for every rank: the processes first swap their own ranks'
initial buffers (each peer gets its share's columns), run the plan on their columns,
then swap the final buffers back (each peer gets its ranks' rows). Each process does
1/count of the work, with exactly the operations, in the order, one process does.

all_reduce does this in column blocks on its own (blocked.py); reduce_scatter and
all_to_all through `whole`, on the ranks' whole buffers (buffers.py).
"""
from __future__ import annotations

import numpy as np

from . import numerics
from .plan import Plan

__all__ = ["Split", "bounds", "whole"]


class Split:
    """How a collective's ranks are spread over processes: `owners[r]`, the position
    (0..count-1) of rank r's process among the call's processes, this one at `me`;
    `swap(sends)` gives each peer k its array sends[k] (None at `me`) and returns what
    each peer sent this process (None at `me`), in the same shapes as sent."""

    def __init__(self, owners, me: int, count: int, swap):
        self.owners = np.asarray(owners)
        self.me, self.count, self.swap = me, count, swap

    @classmethod
    def alone(cls, ranks: int) -> "Split":
        """Every rank in this one process (nothing to swap)."""
        return cls(np.zeros(ranks, np.int64), 0, 1, lambda sends: [None])

    def rows_of(self, k: int) -> np.ndarray:
        """The ranks of the process at position k, in rank order."""
        return np.flatnonzero(self.owners == k)


def bounds(columns: int, count: int) -> list[int]:
    """Where each process's share of `columns` starts (and the last one ends)."""
    return [columns * k // count for k in range(count + 1)]


def whole(plan: Plan, local: np.ndarray, op: str, sources: int, split: Split) -> np.ndarray:
    """The final buffers of this process's ranks (split.rows_of(split.me), in that
    order) of `plan` run on every rank's buffer, given this process's ranks' initial
    buffers `local` (their rows x total slots x chunk)."""
    me, count = split.me, split.count
    at = bounds(local.shape[2], count)
    of = [split.rows_of(k) for k in range(count)]
    got = split.swap([None if k == me else np.ascontiguousarray(local[:, :, at[k]:at[k + 1]])
                      for k in range(count)])
    c0, c1 = at[me], at[me + 1]
    buf = np.zeros((len(split.owners), local.shape[1], c1 - c0), local.dtype)
    buf[of[me]] = local[:, :, c0:c1]
    for k in range(count):
        if k != me and len(of[k]):
            buf[of[k]] = got[k]
    numerics.execute(plan, buf, op, sources)
    got = split.swap([None if k == me else buf[of[k]] for k in range(count)])
    out = np.empty_like(local)
    for k in range(count):
        out[:, :, at[k]:at[k + 1]] = buf[of[me]] if k == me else got[k]
    return out
