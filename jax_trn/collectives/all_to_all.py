"""all_to_all schedules (trainium-hardware.md §5.1): block j of rank a goes to rank j.

  mesh      one step: every rank writes each peer's block directly.
  pairwise  n - 1 steps: in step s rank a sends to rank (a + s) mod n.

No size rule is published for all_to_all; the default is mesh (choice.py). Slots 0..n-1
hold a rank's input blocks, n..2n-1 its output blocks.
"""
from __future__ import annotations

import numpy as np

from .plan import Plan, Xfer

__all__ = ["plan"]


def plan(algo: str, g: int, n: int) -> Plan:
    ranks = np.arange(g * n).reshape(g, n)
    steps = []
    shifts = [np.arange(1, n)] if algo == "mesh" else [np.array([s]) for s in range(1, n)]
    for sh in shifts:
        a = np.arange(n)[:, None]
        b = (a + sh[None, :]) % n
        src = ranks[:, a.repeat(len(sh), 1)]
        dst = ranks[:, b]
        sstart = np.broadcast_to(b, src.shape)
        dstart = np.broadcast_to(n + a, src.shape)
        steps.append(Xfer(src.ravel(), np.ravel(sstart), dst.ravel(), np.ravel(dstart), 1, False,
                          f"a2a {algo} {int(sh[0])}" if len(sh) == 1 else "a2a mesh"))
    own = np.tile(np.arange(n), g)
    steps.append(Xfer(ranks.ravel(), own, ranks.ravel(), n + own, 1, False, "a2a self"))
    return Plan(steps, 2 * n, 2 * n, np.zeros(g * n, int), 1, algo)
