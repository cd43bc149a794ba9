"""The orders in which algorithms visit ranks (trainium-hardware.md §5.3).

Rings follow the topology's snake order of chips (a Hamiltonian walk of a torus
node, `Topology.snake_rank`), cores of a chip consecutively; recursive halving-doubling
places ranks on the hypercube by Gray-decoded torus coordinates (`Topology.gray_rank`),
so hypercube partners are torus neighbours.
"""
from __future__ import annotations

import numpy as np

from jax_trn.hw.topology import Topology

__all__ = ["snake_key", "gray_key", "ring_order", "rdh_order"]


def snake_key(devices, topology: Topology) -> np.ndarray:
    """Each device's ring position key: its chip's snake rank, then its core."""
    devices = np.asarray(devices)
    return (topology.snake_rank[topology.chip_of(devices)] * topology.cores_per_chip
            + topology.core_of(devices))


def gray_key(devices, topology: Topology) -> np.ndarray:
    """Each device's hypercube position key: its chip's Gray rank, cores in the low bits."""
    devices = np.asarray(devices)
    return (topology.gray_rank[topology.chip_of(devices)] * topology.cores_per_chip
            + topology.core_of(devices))


def ring_order(devices, topology: Topology) -> list[int]:
    """The order in which `ring` visits `devices`: the chips' snake order, cores of a
    chip consecutively."""
    devices = np.asarray(devices)
    return [int(d) for d in devices[np.argsort(snake_key(devices, topology), kind="stable")]]


def rdh_order(devices, topology: Topology) -> list[int]:
    """The hypercube positions `rdh` gives `devices` (position p = list index): chips by
    Gray-decoded torus coordinates, cores of a chip in the low bits."""
    devices = np.asarray(devices)
    return [int(d) for d in devices[np.argsort(gray_key(devices, topology), kind="stable")]]
