"""How long a plan takes on a topology's links (trainium-hardware.md §3.4, §5.2, §5.3).
Deterministic: pure arithmetic on the plan and the topology.

The collective pays one fixed cost (`LinkSpec.onchip_ns`, the trigger-to-DMA start of
§5.2/§3.4), then its steps run one after another, all groups together (steps are
bulk-synchronous across groups).

- Xfer: the step's transfers are aggregated per device pair (a flow). Contention is a
  per-link serialization model: every flow on a link shares it for the whole step, so
  link l drains after load[l] / bw[l]; a flow ends at its route's latency plus the
  longest drain over its links; the step ends with its last flow. A reducing transfer
  costs 1 / cc_reduce_rate on the receiving chip's DMA (pre-v4 accumulation runs at 50%
  of DMA rate, §5.2 [NKI-ARCH3]).
- LocalReduce: a chain of dma_computes (`dma_compute_sources` sources each, the running
  partial one of them, §3.4): each pays the DMA fixed cost, plus the bytes at the
  reduce rate of the busiest chip's DMA.

`dma_available` (0..1] scales every chip's DMA bandwidth: the hook for collectives that
share DMA engines with compute (§5.2); the SPMD runtime passes 16/17 when the devices
compute beside the collective (packet round-robin, jax_trn/runtime/spmd.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jax_trn.hw.topology import Topology

from .plan import LocalReduce, Plan

__all__ = ["StepTiming", "Timing", "timing"]


@dataclass(frozen=True)
class StepTiming:
    label: str
    start_ns: float
    end_ns: float
    bytes: float            # bytes moved by the step (all flows)


@dataclass(frozen=True)
class Timing:
    algorithm: str
    total_ns: float
    steps: tuple[StepTiming, ...]
    link_bytes: dict = field(repr=False)     # link name -> bytes carried
    message_bytes: int = 0                   # per rank, as used for the choice
    group_size: int = 0

    @property
    def bus_bandwidth(self) -> float:
        """NCCL-style bus bandwidth (B/ns): all-reduce 2(n-1)/n * S / t, gather/scatter
        (n-1)/n * S / t."""
        n, s = self.group_size, self.message_bytes
        factor = 2 * (n - 1) / n if self.algorithm.startswith("all_reduce") else (n - 1) / n
        return factor * s / self.total_ns


def reduce_batches(sources: int, per_dma: int) -> int:
    """dma_computes a local reduce of `sources` ranges takes: the first sums `per_dma`,
    each later one the running partial and `per_dma - 1` more (as numerics.py does).

    >>> reduce_batches(2, 16), reduce_batches(16, 16), reduce_batches(17, 16), reduce_batches(64, 16)
    (1, 1, 2, 5)
    """
    return 1 + max(0, -(-(sources - per_dma) // (per_dma - 1)))


def _local_reduce_time(st: LocalReduce, topo: Topology, devs, chunk_bytes, dma_available):
    spec = topo.spec
    chips = topo.chip_of(devs[st.rank])
    per_chip = np.bincount(chips, minlength=topo.num_chips) * st.sstarts.shape[1] * st.length * chunk_bytes
    rate = spec.chip_dma_bytes_per_ns * dma_available * spec.cc_reduce_rate
    # One dma_compute per batch of sources, chained (each adds the running partial,
    # as numerics.py computes it): each pays the DMA fixed cost, §3.4.
    return spec.onchip_ns * reduce_batches(st.sstarts.shape[1], spec.dma_compute_sources) \
        + per_chip.max() / rate, 0.0


def _step_time(st, topo: Topology, devs, chunk_bytes, dma_available, link_total):
    """(duration ns, bytes moved) of one step; adds its bytes per link to `link_total`."""
    if isinstance(st, LocalReduce):
        return _local_reduce_time(st, topo, devs, chunk_bytes, dma_available)
    spec = topo.spec
    sd, dd = devs[st.src], devs[st.dst]
    keep = sd != dd
    if not keep.any():
        return 0.0, 0.0
    n_dev = topo.num_devices
    key, inv = np.unique(sd[keep].astype(np.int64) * n_dev + dd[keep], return_inverse=True)
    fbytes = np.bincount(inv, minlength=len(key)) * float(st.length * chunk_bytes)
    links, lat = topo.routes(key // n_dev, key % n_dev)
    weight = np.broadcast_to(fbytes[:, None], links.shape).copy()
    if st.reduce:                              # DMA-side accumulation on the receiving chip
        weight[:, -1] /= spec.cc_reduce_rate
    valid = links >= 0
    load = np.bincount(links[valid], weights=weight[valid], minlength=len(topo.link_bw))
    link_total += np.bincount(links[valid], weights=np.broadcast_to(fbytes[:, None], links.shape)[valid],
                              minlength=len(topo.link_bw))
    cap = topo.link_bw.copy()
    cap[topo.dma_ports] *= dma_available
    drain = np.where(valid, (load / cap)[np.maximum(links, 0)], 0.0).max(axis=1)
    return float((lat + drain).max()), float(fbytes.sum())


def timing(plan: Plan, topo: Topology, devs, chunk_bytes, dma_available, kind, nbytes, n) -> Timing:
    """The timing of `plan` for devices `devs` (by rank) moving chunks of `chunk_bytes`."""
    t = topo.spec.onchip_ns
    steps = [StepTiming("launch", 0.0, t, 0.0)]
    link_total = np.zeros(len(topo.link_bw))
    for st in plan.steps:
        dt, b = _step_time(st, topo, devs, chunk_bytes, dma_available, link_total)
        steps.append(StepTiming(st.label, t, t + dt, b))
        t += dt
    used = {topo.link_names[i]: float(link_total[i]) for i in np.flatnonzero(link_total)}
    return Timing(f"{kind} {plan.name}", t, tuple(steps), used, nbytes, n)
