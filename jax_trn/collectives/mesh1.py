"""Single-step mesh all-reduce (trainium-hardware.md §5.3 [CC-INTER]): every rank
broadcasts its whole buffer to every peer and each rank combines all n of them: one
network latency instead of two (reduce-scatter + all-gather), n times the bytes.
"Single-step Mesh wins when the extra transfer time is under" the latency it saves;
choice.py decides that on the modelled times.
"""
from __future__ import annotations

import numpy as np

from .plan import LocalReduce, Plan, Xfer

__all__ = ["plan"]


def plan(g: int, n: int) -> Plan:
    """Rank a writes its whole buffer (n slots) into every peer's scratch row a, then
    every rank sums the n buffers in rank order (its own in place), as the two-step
    mesh orders its sources (mesh.py), so both give the same bits."""
    ranks = np.arange(g * n).reshape(g, n)
    a, b = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    off = a != b
    a, b = a[off], b[off]
    src, dst = ranks[:, a].ravel(), ranks[:, b].ravel()
    dstart = n + np.tile(a, g) * n
    jj = np.tile(np.arange(n), g)
    srcs = np.where(np.arange(n)[None, :] == jj[:, None], 0, n + np.arange(n)[None, :] * n)
    steps = [Xfer(src, np.zeros_like(src), dst, dstart, n, False, "L0 mesh1 broadcast"),
             LocalReduce(ranks.ravel(), np.zeros(g * n, int), srcs, n, "L0 mesh1 reduce")]
    return Plan(steps, n, n + n * n, np.zeros(g * n, int), 1, "mesh1")
