"""all_reduce numerics in column blocks: bounded working memory at any system size.

A rank's all_reduce buffer is `plan.total_slots` slots of `chunk` elements; the input,
flattened, fills the main slots (element e in slot e // chunk, column e % chunk,
buffers.py). Every step of a plan moves or combines whole slots, the same way in every
column, and element-wise (numerics.py): column c of the result depends only on column
c of the inputs. So the plan runs on a few columns at a time, each block of columns a
(ranks x total_slots x width) buffer of at most `BLOCK_BYTES`, with exactly the
operations the whole buffer would see: the same bits, without the ranks x slots x chunk
buffer and its step copies (1.2 GB for a 528 KB all_reduce over 1152 ranks, §5.3
hierarchical mesh with scratch).

An all_reduce ends with every rank of a group holding the same result (each plan
gathers the reduced slots to all), so the result is kept once per group while its rows
agree bit for bit, and as one row per rank only from the first block where they do not.
"""
from __future__ import annotations

import numpy as np

from . import numerics
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
    width = max(1, min(chunk, BLOCK_BYTES // max(1, rows * plan.total_slots * dtype.itemsize)))
    one = np.zeros((groups, plan.slots, chunk), dtype)    # per group, while rows agree
    each: np.ndarray | None = None                          # (rows, slots, chunk) once not
    for c0 in range(0, chunk, width):
        c1 = min(chunk, c0 + width)
        buf = _load(flats, plan, chunk, c0, c1, dtype)
        numerics.execute(plan, buf, op, sources)
        got = buf[:, :plan.slots]
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


def _load(flats: list[list[np.ndarray]], plan: Plan, chunk: int, c0: int, c1: int,
          dtype) -> np.ndarray:
    """Columns [c0, c1) of every rank's buffer: the inputs' elements in the main slots,
    zeros elsewhere (as buffers.load lays them out)."""
    buf = np.zeros((len(flats), plan.total_slots, c1 - c0), dtype)
    if len(flats[0]) > 1:
        return _load_parts(buf, flats, chunk, c0, c1)
    size = flats[0][0].size
    full = size // chunk                   # slots the input fills completely
    rem = size - full * chunk              # elements in the partial slot after them
    tail = min(rem, c1) - c0               # of those, in this block's columns
    for r, (x,) in enumerate(flats):
        buf[r, :full] = x[:full * chunk].reshape(full, chunk)[:, c0:c1]
        if tail > 0:
            buf[r, full, :tail] = x[full * chunk + c0:full * chunk + c0 + tail]
    return buf


def _load_parts(buf, flats, chunk: int, c0: int, c1: int) -> np.ndarray:
    """`_load` of messages made of several flat parts: each part's elements in this
    block's columns, placed by index (the same indices for every rank)."""
    width, at, moves = c1 - c0, 0, []
    for part in flats[0]:
        e = at + np.arange(part.size)
        col = e % chunk
        keep = np.nonzero((col >= c0) & (col < c1))[0]
        moves.append(((e[keep] // chunk) * width + col[keep] - c0, keep))
        at += part.size
    for r, parts in enumerate(flats):
        row = buf[r].reshape(-1)
        for part, (dst, src) in zip(parts, moves):
            row[dst] = part[src]
    return buf


def _same_rows(got: np.ndarray) -> bool:
    """Whether every rank's block (axis 1) equals its group's first rank's (axis 0 the
    groups), bit for bit (NaNs and -0.0 too)."""
    bits = got.view(np.dtype(f"u{got.dtype.itemsize}")) if got.dtype.kind != "b" else got
    return bool((bits == bits[:, :1]).all())
