"""Topologies as data: presets, link facts, dimension-order routes, one-hop switch (§1.3, §5)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from jax_trn.hw.spec import LINKS
from jax_trn.hw.topology import Topology, torus_route
from jax_trn.systems import SYSTEMS

KIND = {"single": "single", "torus2d": "torus", "torus3d": "torus", "switch": "switch"}


@pytest.mark.parametrize("name", list(SYSTEMS))
def test_every_preset_has_a_topology(name):
    system = SYSTEMS[name]
    topo = system.interconnect()
    assert topo.kind == KIND[system.topology]
    assert topo.num_devices == system.num_devices
    assert topo.num_chips == system.num_chips and topo.cores_per_chip == system.cores_per_chip
    assert [tuple(c) for c in topo.chip_coords] == system.chip_coords or topo.kind == "single"
    assert system.interconnect() is topo            # built once per preset


def test_link_facts():
    # §1.1/§1.3: per-chip NeuronLink figures over 4 links and both directions.
    assert SYSTEMS["trn1.32xlarge"].interconnect().link_bw[0] == 384 / 4 / 2
    assert SYSTEMS["trn2.48xlarge"].interconnect().link_bw[0] == 1024 / 4 / 2
    us = SYSTEMS["trn2-ultraserver"].interconnect()
    z, x = us.link_names.index("chip0.+d0"), us.link_names.index("chip0.+d1")
    assert us.link_bw[z] == 256 / 2 / 2 and us.link_bw[x] == 128    # Z rings: 256 GB/s per chip
    sw = SYSTEMS["trn3-ultraserver"].interconnect()
    assert sw.link_bw[sw.link_names.index("chip0.switch_tx")] == 2560 / 2
    assert LINKS["trn1"].cc_reduce_rate == 0.5 and LINKS["trn3"].cc_reduce_rate == 1.0   # §5.2
    cl = Topology.cluster("trn1", nodes=2)
    efa = cl.link_names.index("chip0.efa_tx")
    assert cl.link_bw[efa] == 800 / 8 / 16 and cl.link_lat[efa] == 15000.0              # §1.3, §5.3


def test_torus_routes_are_dimension_order_and_shortest():
    topo = SYSTEMS["trn2.48xlarge"].interconnect()
    cores = topo.cores_per_chip
    chip = {c: i for i, c in enumerate(itertools.product(range(4), range(4)))}
    assert topo.route(0, chip[1, 1] * cores) == ["chip0.dma_tx", "chip0.+d0", "chip4.+d1", "chip5.dma_rx"]
    assert topo.route(0, chip[3, 0] * cores)[1:-1] == ["chip0.-d0"]          # wrap-around, 1 hop
    assert topo.hops(0, chip[2, 2] * cores) == 4                             # the torus diameter
    assert topo.hops(0, chip[2, 3] * cores) == 3
    assert topo.latency_ns(0, chip[2, 2] * cores) == 4 * 1500.0              # §5.3: ~1-2 us a hop
    for a, b in itertools.product(range(16), repeat=2):
        dist = sum(min((p - q) % 4, (q - p) % 4) for p, q in zip(divmod(a, 4), divmod(b, 4)))
        assert topo.hops(a * cores, b * cores) == dist


def test_torus_route_ties_go_positive():
    assert [(d, s) for _, d, s in torus_route((0, 0), (2, 0), (4, 4))] == [(0, 1), (0, 1)]


def test_3d_torus_diameter_is_6():
    topo = SYSTEMS["trn2-ultraserver"].interconnect()
    hops = topo.chip_hops
    assert hops.max() == 6 and (hops == 1).sum() == 64 * 6


def test_switch_is_one_hop_between_every_pair_of_chips():
    topo = SYSTEMS["trn3-ultraserver"].interconnect()
    assert (topo.chip_hops == 1 - np.eye(144, dtype=int)).all()
    assert topo.route(8 * 5, 8 * 140) == ["chip5.dma_tx", "chip5.switch_tx", "chip140.switch_rx", "chip140.dma_rx"]
    assert topo.latency_ns(8 * 5, 8 * 140) == LINKS["trn3"].switch_hop_ns


def test_cores_of_one_chip_talk_through_its_dma():
    topo = SYSTEMS["trn2.3xlarge"].interconnect()
    assert topo.route(1, 6) == ["chip0.dma_tx", "chip0.dma_rx"]
    assert topo.hops(1, 6) == 0 and topo.latency_ns(1, 6) == 1300.0            # one DMA fixed cost


def test_cluster_routes_torus_inside_a_node_efa_between():
    topo = Topology.cluster("trn1", nodes=4)
    assert topo.num_chips == 64 and topo.num_devices == 128
    assert topo.route(2 * 17, 2 * 18)[1:-1] == ["chip17.+d1"]                 # node 1's torus
    assert topo.route(0, 2 * 40)[1:-1] == ["chip0.efa_tx", "chip40.efa_rx"]
    assert topo.latency_ns(0, 2 * 40) == 15000.0


def _is_cycle(topo, chips):
    ring = list(chips) + [chips[0]]
    return sorted(chips) == list(range(topo.num_chips)) and all(
        topo.hops(a * topo.cores_per_chip, b * topo.cores_per_chip) == 1 for a, b in itertools.pairwise(ring))


@pytest.mark.parametrize("name", ["trn2.48xlarge", "trn2-ultraserver"])
def test_snake_order_is_a_hamiltonian_cycle(name):
    topo = SYSTEMS[name].interconnect()
    assert _is_cycle(topo, list(np.argsort(topo.snake_rank)))


def test_gray_order_makes_hypercube_neighbours_torus_neighbours():
    topo = SYSTEMS["trn2.48xlarge"].interconnect()
    chip_at = np.argsort(topo.gray_rank)
    for p in range(16):
        for bit in (1, 2, 4, 8):
            assert topo.hops(chip_at[p] * 8, chip_at[p ^ bit] * 8) == 1


def test_two_edge_disjoint_hamiltonian_cycles_on_the_4x4_torus():
    topo = SYSTEMS["trn2.48xlarge"].interconnect()
    a, b = topo.disjoint_cycles
    assert _is_cycle(topo, a) and _is_cycle(topo, b)

    def edges(c):
        return {frozenset(e) for e in zip(c, c[1:] + c[:1])}
    assert not edges(a) & edges(b)
    assert SYSTEMS["trn2-ultraserver"].interconnect().disjoint_cycles is None
