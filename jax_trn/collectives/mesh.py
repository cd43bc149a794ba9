"""Mesh (trainium-hardware.md §5.3 [CC-INTRA]): direct writes. Reduce-scatter: every rank
writes each peer's chunk into the peer's scratch in one step, then each rank combines
the n chunks in rank order (a chain of dma_computes, §3.4); all-gather: every rank
writes its chunk to every peer in one step. One network latency per phase; the
NeuronSwitch case (one hop to every chip), and below 1 MB on a torus, where it
"oversubscribes links".
"""
from __future__ import annotations

import numpy as np

from .orders import snake_key
from .plan import Level, LineAlgorithm, LocalReduce, Xfer

__all__ = ["LINE", "orders", "phase"]


def orders(lines: np.ndarray, topo, devs: np.ndarray) -> np.ndarray:
    """(1, L, n): the snake order (a mesh step does not depend on it)."""
    return np.argsort(snake_key(devs[lines], topo), axis=1, kind="stable")[None]


def phase(lv: Level, pre: np.ndarray, span: int, reduce: bool, tag: str, scratch: int):
    """All-to-all writes over every line of `lv` (reduce: into scratch slot
    `scratch + a * span` of the receiver, then a LocalReduce of the n sources)."""
    n_lines, n = lv.lines.shape
    a, b = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    off = a != b
    a, b = a[off], b[off]                                   # a sends to b
    src = lv.lines[:, a]
    dst = lv.lines[:, b]
    if not reduce:
        start = (pre[src] * n + a) * span
        return [Xfer(src.ravel(), start.ravel(), dst.ravel(), start.ravel(), span, False, f"{tag} ag mesh")]
    sstart = (pre[src] * n + b) * span
    dstart = scratch + a * span + 0 * src
    ranks = lv.lines.ravel()
    jj = np.tile(np.arange(n), n_lines)
    own = (pre[ranks] * n + jj) * span
    srcs = np.where(np.arange(n)[None, :] == jj[:, None], own[:, None], scratch + np.arange(n)[None, :] * span)
    return [Xfer(src.ravel(), sstart.ravel(), dst.ravel(), dstart.ravel(), span, False, f"{tag} rs mesh"),
            LocalReduce(ranks, own, srcs, span, f"{tag} rs mesh reduce")]


LINE = LineAlgorithm("mesh", orders, phase, uses_scratch=True)
