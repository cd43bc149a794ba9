"""Hierarchical (trainium-hardware.md §5.3: "intra ReduceScatter -> inter AllReduce ->
intra AllGather"): the cores of each chip first, then the chips, each level by the §5.3
size rule on the bytes it carries (choice.py); the chip level is a 2D ring (ring2d.py)
when the rule says so. `ring2d` itself is built here too: the same levels with rings
on every chip dimension.
"""
from __future__ import annotations

import numpy as np

from . import ring2d
from .choice import size_rule
from .levels import drop_single, grid_levels

__all__ = ["split"]


def split(algo: str, groups: np.ndarray, topo, nbytes: int):
    """The levels of `algo` ("hierarchical" or "ring2d") for `groups` (G, n) of device
    ids, and the name to report (e.g. "hierarchical(ring,rdh)")."""
    n = groups.shape[1]
    chips, core = topo.chip_of(groups), topo.core_of(groups)
    n_chips = len(np.unique(chips[0]))
    multi_core, multi_chip = n_chips < n, n_chips > 1
    coords, algos = [], []
    if multi_core and multi_chip:
        coords.append(core)
        algos.append(size_rule(nbytes, None, topo, onchip=True) if algo == "hierarchical" else "ring")
        nbytes = nbytes // len(np.unique(core[0]))
    chip_algo = algo if algo == "ring2d" else size_rule(
        nbytes, n_chips, topo, onchip=not multi_chip, all_chips=n_chips == topo.num_chips)
    if not multi_chip:
        coords.append(core)
        algos.append(size_rule(nbytes, n, topo, onchip=True))
    elif chip_algo == "ring2d":
        dims = ring2d.dim_coords(topo, chips)
        coords += dims
        algos += ["ring"] * len(dims)
    else:
        coords.append(topo.snake_rank[chips])
        algos.append(chip_algo)
    out = grid_levels(np.stack(coords, -1), n, algos, topo, groups.reshape(-1))
    if out is None:
        raise ValueError(f"{algo} needs groups that form a full grid of chips/cores; got {groups[0].tolist()}")
    return drop_single(out), f"{algo}({','.join(lv.algo for lv in out[0])})"
