"""2D ring (trainium-hardware.md §5.3, [SEED-2022]): one ring per torus dimension, or per
level of a cluster (the chips of a node, then the nodes): reduce-scatter along each
dimension in turn, all-gather back, so every ring is short and stays on its own links.
Its levels are built by hierarchical.py (cores of a chip first, when the group has
several); this module says what the chip levels are.
"""
from __future__ import annotations

__all__ = ["dim_coords"]


def dim_coords(topo, chips) -> list:
    """Per-level coordinates of chips: the torus dimensions; a cluster's chips in a node
    (snake order), then nodes; otherwise one level."""
    if topo.kind == "torus":
        cc = topo.chip_coords[chips]
        return [cc[..., d] for d in range(cc.shape[-1])]
    if topo.kind == "cluster":
        return [topo.snake_rank[chips] % (topo.num_chips // topo.nodes), topo.node_of_chip(chips)]
    return [topo.snake_rank[chips]]
