"""Tiling arithmetic and DRAM access patterns.

An `Axes` value describes how a logical index space sits in a DRAM tensor: (stride,
num) pairs in elements, outermost first, the same convention as `isa.DramAP.pattern`.
Views (transpose, broadcast, slices, dot/reduce canonical forms) are re-ordered,
offset or zero-strided `Axes` (`View`); a tile is a box of such a space
(`box_tiles`), and its DMA pattern is the box's (stride, count) pairs (`box_pattern`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

from jax_trn.hw.program import DramTensor

Axes = tuple[tuple[int, int], ...]       # (stride, num), outermost first
Box = tuple[tuple[int, ...], tuple[int, ...]]   # (starts, counts) per axis


def tiles(n: int, size: int) -> list[tuple[int, int]]:
    """Splits range(n) into (start, length) chunks of at most `size`.

    >>> tiles(300, 128)
    [(0, 128), (128, 128), (256, 44)]
    >>> tiles(0, 128)
    []
    """
    return [(s, min(size, n - s)) for s in range(0, n, size)]


@dataclass(frozen=True)
class FlatTile:
    """A [parts, free] block of a contiguous range: element `offset + p*pstride + f`."""
    offset: int
    parts: int
    pstride: int
    free: int

    @property
    def pattern(self) -> Axes:
        return ((self.pstride, self.parts), (1, self.free))


def flat_tiles(n: int, fmax: int, pmax: int) -> list[FlatTile]:
    """Covers n contiguous elements with [pmax, F<=fmax] blocks of the [pmax, n//pmax]
    view, then one [n % pmax, 1] tail (pmax: the target's partitions).

    >>> [(t.offset, t.parts, t.pstride, t.free) for t in flat_tiles(390, 2, 128)]
    [(0, 128, 3, 2), (2, 128, 3, 1), (384, 6, 1, 1)]
    >>> [(t.offset, t.parts, t.free) for t in flat_tiles(1, 2048, 128)]
    [(0, 1, 1)]
    >>> flat_tiles(0, 2048, 128)
    []
    """
    cols = n // pmax
    out = [FlatTile(f0, pmax, cols, f) for f0, f in tiles(cols, fmax)]
    if n % pmax:
        out.append(FlatTile(pmax * cols, n % pmax, 1, 1))
    return out


def row_major(shape: Sequence[int]) -> Axes:
    """The axes of a contiguous row-major tensor.

    >>> row_major((2, 3, 4))
    ((12, 2), (4, 3), (1, 4))
    """
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(zip(strides, shape))


@dataclass(frozen=True)
class View:
    """Elements of a DRAM tensor: element `offset` plus `axes` (a slice, a transposed or
    broadcast reading, ...)."""
    t: DramTensor
    axes: Axes
    offset: int = 0

    @classmethod
    def of(cls, t: DramTensor) -> "View":
        return cls(t, row_major(t.shape))


def size(axes: Axes) -> int:
    return math.prod(n for _, n in axes)


def merge_axes(*views: Axes) -> tuple[Axes, ...]:
    """Drops size-1 axes and fuses neighbours that are contiguous in every view (all
    views index the same logical space, so they have equal nums).

    >>> merge_axes(row_major((2, 3, 4)))
    (((1, 24),),)
    >>> merge_axes(((12, 2), (4, 3), (1, 4)), ((1, 2), (8, 3), (2, 4)))
    (((12, 2), (1, 12)), ((1, 2), (2, 12)))
    """
    keep = [i for i, (_, n) in enumerate(views[0]) if n != 1]
    out = [[v[i] for i in keep[:1]] for v in views]
    for i in keep[1:]:
        if all(o[-1][0] == v[i][0] * v[i][1] for o, v in zip(out, views)):
            for o, v in zip(out, views):
                o[-1] = (v[i][0], o[-1][1] * v[i][1])
        else:
            for o, v in zip(out, views):
                o.append(v[i])
    return tuple(tuple(o) for o in out)


def box_tiles(sizes: Sequence[int], cap: int) -> list[Box]:
    """Boxes covering a row-major index space, each of at most `cap` elements: whole
    trailing dims, a chunk of one dim, single indices of the dims before it.

    >>> box_tiles((10, 3, 7), 128)
    [((0, 0, 0), (6, 3, 7)), ((6, 0, 0), (4, 3, 7))]
    >>> box_tiles((2, 300), 128)[:3]
    [((0, 0), (1, 128)), ((0, 128), (1, 128)), ((0, 256), (1, 44))]
    >>> box_tiles((), 128), box_tiles((0, 5), 128), box_tiles((5, 0), 128)
    ([((), ())], [], [])
    """
    if not sizes:
        return [((), ())]
    if 0 in sizes:
        return []
    s, inner = len(sizes) - 1, 1
    while s > 0 and inner * sizes[s] <= cap:
        inner, s = inner * sizes[s], s - 1
    chunk = max(1, cap // inner)
    tail = tuple(sizes[s + 1:])
    out = []
    for outer in itertools.product(*map(range, sizes[:s])):
        for c0, c in tiles(sizes[s], chunk):
            out.append((outer + (c0,) + (0,) * len(tail), (1,) * s + (c,) + tail))
    return out


def line_tiles(sizes: Sequence[int], cap: int) -> list[Box]:
    """Boxes that chunk only the last axis (so a box is one strided run, e.g. the
    partitions of a tile), every index of the axes before it taken singly.

    >>> line_tiles((2, 300), 128)[2:4]
    [((0, 256), (1, 44)), ((1, 0), (1, 128))]
    >>> line_tiles((), 128)
    [((), ())]
    """
    if not sizes:
        return [((), ())]
    if 0 in sizes:
        return []
    return [(outer + (c0,), (1,) * len(outer) + (c,))
            for outer in itertools.product(*map(range, sizes[:-1]))
            for c0, c in tiles(sizes[-1], cap)]


def box_offset(axes: Axes, box: Box) -> int:
    return sum(st * b for (st, _), b in zip(axes, box[0]))


def box_pattern(axes: Axes, box: Box) -> Axes:
    """The (stride, count) pairs of a box, without its count-1 axes (at least one pair).

    >>> box_pattern(((12, 2), (4, 3), (1, 4)), ((1, 0, 0), (1, 3, 4)))
    ((4, 3), (1, 4))
    """
    pat = tuple((st, c) for (st, _), c in zip(axes, box[1]) if c != 1)
    return pat or ((1, 1),)


def box_size(box: Box) -> int:
    return math.prod(box[1])
