"""Levels and how a plan is assembled from them (trainium-hardware.md §5.3).

all-reduce = reduce-scatter + all-gather, run level by level: a level is the set of
lines of ranks that differ in one coordinate (cores of a chip, chips along a torus
dimension, nodes of a cluster, or the whole group for a flat algorithm), each line
scheduled by a level algorithm (`LINES`: ring, kangaring, rdh, mesh). Reduce-scatter
runs the levels in order, each on a chunk span that shrinks by the level's size;
all-gather runs them in reverse.
"""
from __future__ import annotations

import numpy as np

from . import kangaring, mesh, rdh, ring
from .plan import REDUCING, Level, Plan, prod

__all__ = ["LINES", "grid_levels", "flat", "level_plan", "drop_single"]

LINES = {line.name: line for line in (ring.LINE, kangaring.LINE, rdh.LINE, mesh.LINE)}


def grid_levels(coords: np.ndarray, n_ranks_per_group: int, algos: list[str], topo, devs):
    """Split each group (rows of `coords`: (G, n, k) coordinates of each rank) into k
    levels. Returns the levels, each global rank's level indices (G*n, k) and the level
    sizes, or None if the group is not a full grid in these coordinates."""
    g, n, k = coords.shape
    idx = np.zeros((g, n, k), int)
    sizes = []
    for i in range(k):
        vals = np.sort(coords[..., i], axis=1)
        uniq = [np.unique(v) for v in vals]
        if any(len(u) != len(uniq[0]) for u in uniq):
            return None
        sizes.append(len(uniq[0]))
        idx[..., i] = [np.searchsorted(u, c) for u, c in zip(uniq, coords[..., i])]
    if prod(sizes) != n:
        return None
    flat_idx = idx.reshape(g, n, k)
    lin = np.zeros((g, n), int)
    for i in range(k):
        lin = lin * sizes[i] + flat_idx[..., i]
    if any(len(np.unique(r)) != n for r in lin):
        return None
    grid = np.zeros((g, n), int)                  # grid[g, lin] = global rank
    grid[np.arange(g)[:, None], lin] = np.arange(g * n).reshape(g, n)
    grid = grid.reshape([g] + sizes)
    levels = []
    for i, algo in enumerate(algos):
        lines = np.moveaxis(grid, i + 1, -1).reshape(-1, sizes[i])
        levels.append(Level(algo, lines, LINES[algo].orders(lines, topo, devs)))
    return levels, flat_idx.reshape(g * n, k), sizes


def flat(algo: str, groups: np.ndarray, topo):
    """One level: each whole group is one line of `algo`."""
    g, n = groups.shape
    return grid_levels(np.arange(n)[None, :, None].repeat(g, 0), n, [algo], topo,
                       groups.reshape(-1))


def drop_single(out):
    """`grid_levels` output without its levels of one rank per line (nothing to move),
    keeping at least one level."""
    levels, idx, sizes = out
    keep = [lv for lv in levels if lv.lines.shape[1] > 1] or levels[:1]
    if len(keep) == len(levels):
        return out
    cols = [i for i, lv in enumerate(levels) if lv.lines.shape[1] > 1] or [0]
    return keep, idx[:, cols], [sizes[i] for i in cols]


def level_plan(kind: str, levels, idx, sizes, name: str) -> Plan:
    """The plan of `kind` over `levels`: reduce-scatter level by level (reducing kinds),
    then all-gather in reverse (all_reduce, all_gather). With several rings per line
    each chunk is split in 4 parts (`p`)."""
    r_max = max(lv.orders.shape[0] for lv in levels)
    p = 4 if r_max > 1 else 1
    slots = prod(sizes) * p
    spans = [prod(sizes[i + 1:]) * p for i in range(len(sizes))]
    pres = []
    for i in range(len(sizes)):
        pre = np.zeros(idx.shape[0], int)
        for m in range(i):
            pre = pre * sizes[m] + idx[:, m]
        pres.append(pre)
    scratch = max([sizes[i] * spans[i] for i, lv in enumerate(levels)
                   if LINES[lv.algo].uses_scratch] + [0])
    steps = []
    order = range(len(levels))
    if kind in REDUCING:
        for i in order:
            steps += LINES[levels[i].algo].phase(levels[i], pres[i], spans[i], True, f"L{i}", slots)
    if kind in ("all_reduce", "all_gather"):
        for i in reversed(order):
            steps += LINES[levels[i].algo].phase(levels[i], pres[i], spans[i], False, f"L{i}", slots)
    leaf = np.zeros(idx.shape[0], int)
    for m in range(len(sizes)):
        leaf = leaf * sizes[m] + idx[:, m]
    return Plan(steps, slots, slots + scratch, leaf * p, p, name)
