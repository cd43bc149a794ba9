"""collective_permute, "direct" (trainium-hardware.md §5.1): every (source, target) pair
is one direct write, all at once. Devices that receive nothing get zeros (XLA
semantics). §5.1 says the runtime only supports circular permutes of adjacent ranks;
any pairs are accepted here.
"""
from __future__ import annotations

import numpy as np

from .plan import Plan, Xfer
from .timing import Timing, timing

__all__ = ["run", "permute_timing"]


def run(pairs, arrays_by_device, topo, dma_available, x0):
    """({device: result}, Timing) of the permute of `arrays_by_device` over `pairs`."""
    pairs = [(int(a), int(b)) for a, b in pairs]
    if len({b for _, b in pairs}) != len(pairs):
        raise ValueError("collective_permute: a device may receive from one source only")
    results = {}
    for a, b in pairs:
        results[b] = np.array(arrays_by_device[a], copy=True)
    for d in {d for p in pairs for d in p}:
        results.setdefault(d, np.zeros_like(x0))
    return results, permute_timing(pairs, x0.shape, x0.dtype.itemsize, topo, dma_available)


def permute_timing(pairs, shape, itemsize, topo, dma_available) -> Timing:
    """One step: rank i (the i-th source) writes its whole buffer to rank len(pairs) + i."""
    pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
    nbytes = int(np.prod(shape)) * itemsize
    st = Xfer(np.arange(len(pairs)), np.zeros(len(pairs), int), np.arange(len(pairs), 2 * len(pairs)),
              np.zeros(len(pairs), int), 1, False, "permute")
    plan = Plan([st], 1, 1, np.zeros(1, int), 1, "direct")
    devs = np.concatenate([pairs[:, 0], pairs[:, 1]])
    return timing(plan, topo, devs, nbytes, dma_available, "collective_permute", nbytes, len(pairs))
