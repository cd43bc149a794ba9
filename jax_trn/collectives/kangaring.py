"""KangaRing (trainium-hardware.md §5.3): on a square 2D torus with one rank per chip,
four rings: the two edge-disjoint Hamiltonian cycles of the torus ("on 16 chips in a 2D
torus there are 2 disjoint Hamiltonian cycles", `Topology.disjoint_cycles`), each run
both ways, each ring carrying a quarter of the data. The steps are the ring's (ring.py).
"""
from __future__ import annotations

import numpy as np

from . import ring
from .plan import LineAlgorithm

__all__ = ["LINE", "orders", "check"]


def orders(lines: np.ndarray, topo, devs: np.ndarray) -> np.ndarray:
    """(4, L, n): each disjoint cycle's order of the line's chips, and its reverse."""
    chips = topo.chip_of(devs[lines])
    rings = []
    for cycle in topo.disjoint_cycles:
        pos = np.argsort(np.array(cycle))          # chip -> position on the cycle
        o = np.argsort(pos[chips], axis=1, kind="stable")
        rings += [o, o[:, ::-1]]
    return np.stack(rings)


def check(groups: np.ndarray, topo) -> None:
    """KangaRing needs one rank on every chip of a square 2D torus."""
    chips = topo.chip_of(groups)
    n = groups.shape[1]
    multi_core = len(np.unique(chips[0])) < n
    if topo.disjoint_cycles is None or multi_core or len(np.unique(chips[0])) != topo.num_chips:
        raise ValueError("kangaring needs one rank on every chip of a square 2D torus")


LINE = LineAlgorithm("kangaring", orders, ring.phase)
