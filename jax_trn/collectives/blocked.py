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
from .split import Split, bounds as _bounds

__all__ = ["BLOCK_BYTES", "Split", "all_reduce"]

BLOCK_BYTES = 64 * 2 ** 20


def all_reduce(plan: Plan, xs: list, op: str, sources: int, chunk: int,
               groups: int, split=None) -> list[np.ndarray]:
    """Each rank's all_reduce result (ranks group-major, in `xs` order; a group's
    ranks share one array while their results agree); `chunk`: elements per slot
    (`buffers.chunk_elems`); `groups`: how many groups the ranks form. A rank's input
    is an array, or a list of flat arrays whose concatenation is the message (a
    combined all_reduce's operands, read in place: no concatenated copy); its result
    then is flat. `split` (a `Split`): the ranks belong to several processes; `xs`
    holds this process's ranks' inputs (None for the others'), and the result only
    their results (None for the others)."""
    mine = [r for r, x in enumerate(xs) if x is not None]
    x0 = xs[mine[0]]
    parts = isinstance(x0, (list, tuple))
    flats = [(list(x) if parts else [np.asarray(x).reshape(-1)]) if x is not None else None
             for x in xs]
    rows, size = len(xs), sum(f.size for f in flats[mine[0]])
    shape = (size,) if parts else np.shape(x0)
    comp = indirect.compile_plan(plan, rows, groups)
    return _reduce(comp, plan, flats, op, sources, chunk, groups,
                   Split.alone(rows) if split is None else split, size, shape)


def _reduce(comp, plan: Plan, flats: list, op: str, sources: int, chunk: int, groups: int,
            split: Split, size: int, shape) -> list:
    """`all_reduce`'s work, with the columns shared out over processes (module doc):
    process k reduces columns [bounds[k], bounds[k + 1]) for every rank (one process:
    all of them)."""
    rows, k_me, count = len(flats), split.me, split.count
    dtype = next(f for f in flats if f is not None)[0].dtype
    n = rows // groups
    bounds = _bounds(chunk, count)
    of = [split.rows_of(k) for k in range(count)]
    mine = of[k_me]
    local = [flats[r] for r in mine]
    sends = [None] * count
    for k in range(count):
        if k != k_me:
            sends[k] = np.zeros((len(mine), plan.slots, bounds[k + 1] - bounds[k]), dtype)
            if sends[k].size:
                _load(sends[k], local, chunk, bounds[k])
    got = split.swap(sends)
    c0, c1 = bounds[k_me], bounds[k_me + 1]
    width = max(1, min(max(1, c1 - c0), BLOCK_BYTES // max(1, comp.cells * dtype.itemsize)))
    one = np.zeros((groups, plan.slots, c1 - c0), dtype)
    each: np.ndarray | None = None
    for b0 in range(c0, c1, width):
        b1 = min(c1, b0 + width)
        store = np.zeros((comp.cells, b1 - b0), dtype)
        inputs = store[:rows * plan.slots].reshape(rows, plan.slots, b1 - b0)
        _load(inputs, local, chunk, b0, mine)
        for k in range(count):
            if k != k_me and len(of[k]):
                inputs[of[k]] = got[k][:, :, b0 - c0:b1 - c0]
        indirect.run(comp, store, op, sources)
        if each is None and comp.shared:
            one[:, :, b0 - c0:b1 - c0] = np.take(store, comp.final[::n], axis=0)
            continue
        result = np.take(store, comp.final, axis=0)
        if each is None and _same_rows(result.reshape((groups, n) + result.shape[1:])):
            one[:, :, b0 - c0:b1 - c0] = result[::n]
            continue
        if each is None:
            each = np.repeat(one, n, axis=0)
        each[:, :, b0 - c0:b1 - c0] = result
    # The results: peer k gets this share's columns of its ranks' rows, or (an extra
    # leading axis) the groups' rows while this share's ranks agree within each group.
    sends = [None] * count
    for k in range(count):
        if k != k_me:
            sends[k] = one[None] if each is None else each[of[k]]
    got = split.swap(sends)
    got[k_me] = one[None] if each is None else each if count == 1 else each[mine]
    out: list = [None] * rows
    if all(g.ndim == 4 for g in got):
        full = np.concatenate([g[0] for g in got], axis=2)
        shared = [g.reshape(-1)[:size].reshape(shape) for g in full]
        for r in mine:
            out[r] = shared[r // n]
        return out
    if count == 1:
        full = got[0]
    else:
        full = np.zeros((len(mine), plan.slots, chunk), dtype)
        for k, g in enumerate(got):
            full[:, :, bounds[k]:bounds[k + 1]] = g[0][mine // n] if g.ndim == 4 else g
    for i, r in enumerate(mine):
        out[r] = full[i].reshape(-1)[:size].reshape(shape)
    return out


def _load(buf: np.ndarray, flats: list[list[np.ndarray]], chunk: int, c0: int,
          rows=None) -> None:
    """Columns [c0, c0 + buf.shape[2]) of every rank's main slots into `buf` (ranks x
    slots x width, zeroed): element e of the message (its parts concatenated) is in
    slot e // chunk, column e % chunk (buffers.load's layout). Each part's elements in
    these columns are a few rectangular pieces, the same for every rank. `rows`: the
    row of `buf` each of `flats` goes to (default: the i-th)."""
    moves, at = [], 0
    for part in flats[0]:
        moves.append(_pieces(at, part.size, chunk, c0, c0 + buf.shape[2]))
        at += part.size
    c1 = c0 + buf.shape[2]
    for r, prts in zip(range(len(flats)) if rows is None else rows, flats):
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
