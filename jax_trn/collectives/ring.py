"""Ring (trainium-hardware.md §5.3 [CC-INTRA][CC-INTER]): reduce-scatter then all-gather
around a ring through each line of ranks, in the topology's snake order (the "flat
ring" when the line is the whole group).

Inside a NeuronLink node the ring runs both ways round at once: two rings, each carrying
half the data, on opposite directions of every link ([CC-INTRA] "we run multiple cycles
with mutually exclusive wires in parallel for full wire bandwidth", link utilisation
"Full"; a link's two directions are separate wires, the per-chip figures being
"bidirectional", §1.3 [TRN3-INST]). A ring that crosses EFA nodes stays one directed
cycle ([CC-INTER] describes one). n - 1 steps per phase, each moving one chunk per rank
to its ring successor.
"""
from __future__ import annotations

import numpy as np

from .orders import snake_key
from .plan import Level, LineAlgorithm, Xfer

__all__ = ["LINE", "orders", "phase"]


def orders(lines: np.ndarray, topo, devs: np.ndarray) -> np.ndarray:
    """(R, L, n): the snake order of each line, and its reverse when the line stays in
    one NeuronLink node."""
    d = devs[lines]
    order = np.argsort(snake_key(d, topo), axis=1, kind="stable")
    nodes = topo.node_of_chip(topo.chip_of(d))
    if (nodes == nodes[:, :1]).all():
        return np.stack([order, order[:, ::-1]])
    return order[None]


def phase(lv: Level, pre: np.ndarray, span: int, reduce: bool, tag: str, scratch: int = 0):
    """Ring reduce-scatter (reduce=True) or all-gather over every line of `lv`; ring r
    of R carries part r of each chunk."""
    r_count, n_lines, n = lv.orders.shape
    part = span // r_count
    pos = np.arange(n)
    steps = []
    for s in range(n - 1):
        src_pos = pos
        owner_pos = (pos - s - 1) % n if reduce else (pos - s) % n
        o = lv.orders
        src_j = o[:, :, src_pos]
        dst_j = o[:, :, (src_pos + 1) % n]
        chunk = o[:, :, owner_pos]
        lines = np.broadcast_to(lv.lines[None], (r_count, n_lines, n))
        li = np.arange(n_lines)[None, :, None]
        src = lines[np.arange(r_count)[:, None, None], li, src_j]
        dst = lines[np.arange(r_count)[:, None, None], li, dst_j]
        start = (pre[src] * n + chunk) * span + np.arange(r_count)[:, None, None] * part
        steps.append(Xfer(src.ravel(), start.ravel(), dst.ravel(), start.ravel(), part, reduce,
                          f"{tag} {'rs' if reduce else 'ag'} {s + 1}/{n - 1}"))
    return steps


LINE = LineAlgorithm("ring", orders, phase)
