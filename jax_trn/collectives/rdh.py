"""Recursive halving-doubling (trainium-hardware.md §5.3 [CC-INTRA]): reduce-scatter by
recursive halving, all-gather by recursive doubling, log2(n) steps each between hypercube
partners. Ranks sit on the hypercube by Gray code (`orders.gray_key`), so partners are
torus neighbours ("RDH treats the 2D torus as a 4D hypercube"); it needs 2^k ranks
per line.
"""
from __future__ import annotations

import numpy as np

from .orders import gray_key
from .plan import Level, LineAlgorithm, Xfer

__all__ = ["LINE", "orders", "phase", "check"]


def orders(lines: np.ndarray, topo, devs: np.ndarray) -> np.ndarray:
    """(1, L, n): hypercube position -> j."""
    return np.argsort(gray_key(devs[lines], topo), axis=1, kind="stable")[None]


def phase(lv: Level, pre: np.ndarray, span: int, reduce: bool, tag: str, scratch: int = 0):
    """Halving (reduce=True: send the d chunks of the partner's half) or doubling (send
    the d chunks gathered so far), over every line of `lv`."""
    _, n_lines, n = lv.orders.shape
    order = lv.orders[0]                       # (L, n): position -> j
    at_pos = np.take_along_axis(lv.lines, order, axis=1)      # rank at each position
    pos = np.arange(n)
    dists = [n >> (i + 1) for i in range(n.bit_length() - 1)]
    steps = []
    for d in (dists if reduce else dists[::-1]):
        q = pos ^ d
        if reduce:       # send the d chunks (positions) of the partner's half
            cpos = (pos & ~(2 * d - 1))[:, None] + (q & d)[:, None] + np.arange(d)[None, :]
        else:            # send the d chunks gathered so far
            cpos = (pos & ~(d - 1))[:, None] + np.arange(d)[None, :]
        src = np.broadcast_to(at_pos[:, :, None], (n_lines, n, d))
        dst = np.broadcast_to(at_pos[:, q][:, :, None], (n_lines, n, d))
        chunk = order[:, cpos]                                     # (L, n, d) j indices
        start = (pre[src] * n + chunk) * span
        steps.append(Xfer(src.ravel(), start.ravel(), dst.ravel(), start.ravel(), span, reduce,
                          f"{tag} {'halving' if reduce else 'doubling'} d={d}"))
    return steps


def check(n: int) -> None:
    if n & (n - 1):
        raise ValueError(f"rdh needs a power-of-two group size, got {n}")


LINE = LineAlgorithm("rdh", orders, phase)
