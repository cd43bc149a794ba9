"""What a collective algorithm builds: a plan of steps over slots (trainium-hardware.md §5).

Each rank (a device in a replica group) has a buffer of `slots` equal chunks, plus
scratch. A plan is a list of steps, built once and used for both the numerics
(numerics.py) and the timing (timing.py), so both are the algorithm's:

  Xfer         copy (or, with `reduce`, combine into the receiver: "DMA-side
               accumulation", §5.2) `length` slots from (src, sstart) to (dst, dstart),
               one row per transfer; all reads of a step happen before any write.
  LocalReduce  a rank's slots [dstart, +length) = the combination of the ranges at
               sstarts[:, k], in k order (dma_compute, §3.4; the mesh algorithms).

Ranks are global row indices (G groups x n ranks, group-major); `devs[rank]` is the
device. Level algorithms (ring, kangaring, rdh, mesh) schedule the *lines* of a
`Level` (rings of ranks that differ in one coordinate); levels.py assembles them
into reduce-scatter / all-gather plans.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["KINDS", "REDUCING", "Xfer", "LocalReduce", "Plan", "Level", "LineAlgorithm",
           "prod"]

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute")
REDUCING = ("all_reduce", "reduce_scatter")


@dataclass(frozen=True, eq=False)
class Xfer:
    """Copy (or reduce into) `length` slots from (src, sstart) to (dst, dstart), per row."""
    src: np.ndarray
    sstart: np.ndarray
    dst: np.ndarray
    dstart: np.ndarray
    length: int
    reduce: bool
    label: str


@dataclass(frozen=True, eq=False)
class LocalReduce:
    """rank's slots [dstart, +length) = sum of the ranges at sstarts[:, k], in k order."""
    rank: np.ndarray
    dstart: np.ndarray
    sstarts: np.ndarray
    length: int
    label: str


@dataclass(frozen=True, eq=False)
class Plan:
    """An algorithm's schedule for every group at once, and its buffer layout."""
    steps: list
    slots: int             # main slots per rank
    total_slots: int       # with scratch
    leaf: np.ndarray       # (G*n,) first slot of each rank's own leaf block
    leaf_span: int
    name: str              # as reported: "ring", "hierarchical(mesh,rdh)", ...


@dataclass(frozen=True, eq=False)
class Level:
    """Lines of ranks that differ in one coordinate, scheduled by one level algorithm."""
    algo: str
    lines: np.ndarray      # (L, n) global ranks, in index (j) order
    orders: np.ndarray     # (R, L, n) ring position -> j, one ring order per r


@dataclass(frozen=True)
class LineAlgorithm:
    """A level algorithm: the order(s) it walks each line in, and the steps of one
    phase (reduce-scatter with `reduce`, else all-gather) over a level's lines.

    orders(lines, topology, devs) -> (R, L, n)
    phase(level, pre, span, reduce, tag, scratch) -> [Xfer | LocalReduce]
    `scratch`: the first scratch slot, for algorithms with `uses_scratch`."""
    name: str
    orders: Callable
    phase: Callable
    uses_scratch: bool = False


def prod(xs) -> int:
    n = 1
    for x in xs:
        n *= int(x)
    return n
