"""all_reduce numerics in column blocks: bounded working memory at any system size.

A rank's all_reduce buffer is `plan.total_slots` slots of `chunk` elements; the input,
flattened, fills the main slots (element e in slot e // chunk, column e % chunk,
buffers.py). Every step of a plan moves or combines whole slots, the same way in every
column, and element-wise (numerics.py): column c of the result depends only on column
c of the inputs. So the plan runs on a few columns at a time, each block of columns a
store of at most `BLOCK_BYTES`, with exactly the operations the whole buffer would see:
the same bits, without the ranks x slots x chunk buffer and its step copies (1.2 GB for
a 528 KB all_reduce over 1152 ranks, §5.3 hierarchical mesh with scratch). Copy steps
only rename cells (indirect.py): a block's store holds the inputs and the reductions'
results, no scratch.

An all_reduce ends with every rank of a group holding the same result (each plan
gathers the reduced slots to all), so the result is kept once per group when the plan
says so (indirect.Compiled.shared) or its rows agree bit for bit, and as one row per
rank only from the first block where they do not.
"""
from __future__ import annotations

import numpy as np

from . import indirect
from .plan import Plan

__all__ = ["BLOCK_BYTES", "all_reduce"]

BLOCK_BYTES = 64 * 2 ** 20


def all_reduce(plan: Plan, xs: list, op: str, sources: int, chunk: int,
               groups: int) -> list[np.ndarray]:
    """Each rank's all_reduce result (ranks group-major, in `xs` order; a group's
    ranks share one array while their results agree); `chunk`: elements per slot
    (`buffers.chunk_elems`); `groups`: how many groups the ranks form. A rank's input
    is an array, or a list of flat arrays whose concatenation is the message (a
    combined all_reduce's operands, read in place: no concatenated copy); its result
    then is flat."""
    parts = isinstance(xs[0], (list, tuple))
    flats = [list(x) if parts else [np.asarray(x).reshape(-1)] for x in xs]
    rows, dtype = len(xs), flats[0][0].dtype
    size = sum(f.size for f in flats[0])
    shape = (size,) if parts else np.shape(xs[0])
    n = rows // groups
    comp = indirect.compile_plan(plan, rows, groups)
    width = max(1, min(chunk, BLOCK_BYTES // max(1, comp.cells * dtype.itemsize)))
    one = np.zeros((groups, plan.slots, chunk), dtype)    # per group, while rows agree
    each: np.ndarray | None = None                          # (rows, slots, chunk) once not
    for c0 in range(0, chunk, width):
        c1 = min(chunk, c0 + width)
        store = np.zeros((comp.cells, c1 - c0), dtype)
        _load(store[:rows * plan.slots].reshape(rows, plan.slots, c1 - c0), flats, chunk, c0)
        indirect.run(comp, store, op, sources)
        if each is None and comp.shared:
            one[:, :, c0:c1] = np.take(store, comp.final[::n], axis=0)
            continue
        got = np.take(store, comp.final, axis=0)
        if each is None and _same_rows(got.reshape((groups, n) + got.shape[1:])):
            one[:, :, c0:c1] = got[::n]
            continue
        if each is None:
            each = np.repeat(one, n, axis=0)
        each[:, :, c0:c1] = got
    if each is None:
        shared = [g.reshape(-1)[:size].reshape(shape) for g in one]
        return [shared[r // n] for r in range(rows)]
    return [row.reshape(-1)[:size].reshape(shape) for row in each]


def _load(buf: np.ndarray, flats: list[list[np.ndarray]], chunk: int, c0: int) -> None:
    """Columns [c0, c0 + buf.shape[2]) of every rank's main slots into `buf` (ranks x
    slots x width, zeroed): element e of the message (its parts concatenated) is in
    slot e // chunk, column e % chunk (buffers.load's layout). Each part's elements in
    these columns are a few rectangular pieces, the same for every rank."""
    moves, at = [], 0
    for part in flats[0]:
        moves.append(_pieces(at, part.size, chunk, c0, c0 + buf.shape[2]))
        at += part.size
    c1 = c0 + buf.shape[2]
    for r, prts in enumerate(flats):
        row = buf[r]
        for part, pieces in zip(prts, moves):
            for whole, lo, hi, q0, q1, k0, k1 in pieces:
                row[q0:q1, k0:k1] = (part[lo:hi].reshape(q1 - q0, chunk)[:, c0:c1] if whole
                                     else part[lo:hi])


def _pieces(at: int, size: int, chunk: int, c0: int, c1: int) -> list[tuple]:
    """Where the elements of a part at message offset `at` that fall in columns
    [c0, c1) go: (whole, lo, hi, q0, q1, k0, k1) pieces, part[lo:hi] into slots
    [q0, q1) x block columns [k0, k1); a `whole` piece is the part's whole slots
    [q0, q1), of which columns [c0, c1) are taken."""
    end, out = at + size, []
    first, last = -(-at // chunk), end // chunk          # whole slots [first, last)
    if first < last:
        out.append((True, first * chunk - at, last * chunk - at, first, last, 0, c1 - c0))
    for q in sorted(q for q in {at // chunk, last} if not first <= q < last):   # partial
        lo, hi = max(at, q * chunk + c0), min(end, q * chunk + c1)
        if lo < hi:
            out.append((False, lo - at, hi - at, q, q + 1, lo - q * chunk - c0,
                        hi - q * chunk - c0))
    return out


def _same_rows(got: np.ndarray) -> bool:
    """Whether every rank's block (axis 1) equals its group's first rank's (axis 0 the
    groups), bit for bit (NaNs and -0.0 too)."""
    bits = got.view(np.dtype(f"u{got.dtype.itemsize}")) if got.dtype.kind != "b" else got
    return bool((bits == bits[:, :1]).all())
