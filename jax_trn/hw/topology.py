"""Multichip topologies as data: devices, directed links, routes (trainium-hardware.md §1.3, §5).

A `Topology` is a set of chips, `cores_per_chip` NeuronCores each (device id = chip *
cores + core, like `jax_trn.systems`), and a table of *directed* links, each with a
bandwidth (B/ns) and a latency per traversal (ns). Four shapes:

  single   one chip; cores talk through the chip's DMA (§3.4).
  torus    chips on a 2D/3D torus, one link per direction per dimension (§1.3: Trn1/Trn2
           16-chip servers are 4x4 2D tori, 4 links per chip; the Trn2 UltraServer joins
           4 servers by Z rings into a 4x4x4 3D torus). Routes: dimension order (dim 0
           first), the shorter way round each ring, ties going +.
  switch   NeuronSwitch-v1 (§1.3 Trn3 UltraServer): every chip has one port into the
           switch fabric (one direction = chip NeuronLink / 2); servers of 4 chips share a
           first-level switch, second-level switches join the servers. Every chip pair is
           one hop (the talks' "every sled to every other in one hop" [SEED-AIM3335]); the
           fabric itself is taken as non-blocking (no published figure, §11).
  cluster  `nodes` servers, each a torus as above, joined by EFA (§1.3): one EFA port per
           chip, ~15 us per hop (§5.3 [CC-INTER]), a non-blocking network between nodes.

Every chip also has a DMA port pair (`dma_tx`, `dma_rx`, the chip's DMA bandwidth, §1.1):
all collective traffic leaving or entering a chip crosses them, core-to-core traffic on
one chip crosses both and pays one DMA fixed cost (§3.4/§9; the on-chip network is not
documented, §11).

`routes(src, dst)` is vectorized over device pairs: a padded (F, H) array of link ids
(-1 = none) and the latency of each route (sum of its links' latencies).

Every constructor takes the chip (a `ChipSpec`, or a preset's name "trn1" / "trn2" /
"trn3"): its cores per chip and its `LinkSpec` give the devices, bandwidths and
latencies, so a user-made chip is as good as a preset. `for_system` builds a
`jax_trn.systems.System`'s topology from the system itself (its chip, shape and dims).
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

import numpy as np

from .spec import CHIPS, ChipSpec, LinkSpec

__all__ = ["Topology", "gray", "torus_route"]


def gray(i: int) -> int:
    return i ^ (i >> 1)


def torus_route(a: tuple[int, ...], b: tuple[int, ...], dims: tuple[int, ...]):
    """Dimension-order route on a torus: a list of (coords, dim, +1/-1) hops from a to b."""
    cur, hops = list(a), []
    for d, n in enumerate(dims):
        fwd = (b[d] - cur[d]) % n
        step = 1 if fwd <= n - fwd else -1
        for _ in range(fwd if step == 1 else n - fwd):
            hops.append((tuple(cur), d, step))
            cur[d] = (cur[d] + step) % n
    return hops


@dataclass(frozen=True, eq=False)
class Topology:
    name: str
    generation: str
    kind: str                              # "single" | "torus" | "switch" | "cluster"
    num_chips: int
    cores_per_chip: int
    dims: tuple[int, ...]                  # torus/node dims; switch: (servers, chips)
    nodes: int                             # cluster: servers joined by EFA; else 1
    link_names: tuple[str, ...]
    link_bw: np.ndarray                    # B/ns per directed link
    link_lat: np.ndarray                   # ns per traversal
    spec: LinkSpec = field(repr=False)
    _chip_links: np.ndarray = field(repr=False)   # (C, C, H) chip-to-chip link ids
    _chip_lat: np.ndarray = field(repr=False)     # (C, C) ns

    # --- construction --------------------------------------------------------------

    @classmethod
    def single(cls, chip: ChipSpec | str) -> Topology:
        return cls._build("single", _chip(chip), (1,), chips=1, nodes=1, dim_bw=())

    @classmethod
    def torus(cls, chip: ChipSpec | str, dims: tuple[int, ...], dim_bw=None, name=None) -> Topology:
        """A torus of `dims`; `dim_bw[d]` = B/ns of one direction of one dim-d link
        (default: the chip's NeuronLink figure split over 2 * len(dims) links, 2 ways)."""
        chip = _chip(chip)
        if dim_bw is None:
            dim_bw = (chip.links.link_bytes_per_ns(links=2 * len(dims)),) * len(dims)
        return cls._build("torus", chip, tuple(dims), chips=_prod(dims), nodes=1,
                          dim_bw=tuple(dim_bw), name=name)

    @classmethod
    def switch(cls, chip: ChipSpec | str, servers: int, chips_per_server: int, name=None) -> Topology:
        return cls._build("switch", _chip(chip), (servers, chips_per_server),
                          chips=servers * chips_per_server, nodes=1, dim_bw=(), name=name)

    @classmethod
    def cluster(cls, chip: ChipSpec | str, nodes: int, node_dims=(4, 4), name=None) -> Topology:
        chip = _chip(chip)
        dim_bw = (chip.links.link_bytes_per_ns(links=2 * len(node_dims)),) * len(node_dims)
        return cls._build("cluster", chip, tuple(node_dims), chips=nodes * _prod(node_dims),
                          nodes=nodes, dim_bw=dim_bw, name=name)

    @classmethod
    def for_system(cls, system) -> Topology:
        """The topology a `jax_trn.systems.System` describes: its chip, its shape
        ("single" | "torus2d" | "torus3d" | "switch") and dims. A torus uses every
        NeuronLink port of a chip in a server (§1.1: 4 links per chip); in a 3D torus
        dimension 0 is the Z rings across servers at the chip's Z bandwidth (§1.3)."""
        chip, links = system.chip, system.chip.links
        if system.topology == "single":
            return cls.single(chip)
        if system.topology == "switch":
            return cls.switch(chip, *system.dims, name=system.name)
        if system.topology == "torus3d":       # §1.3: X/Y in a server, Z rings across servers
            xy = links.link_bytes_per_ns()
            z = links.link_bytes_per_ns(links.z_bytes_per_ns, links=2)
            return cls.torus(chip, system.dims, dim_bw=(z, xy, xy), name=system.name)
        return cls.torus(chip, system.dims, dim_bw=(links.link_bytes_per_ns(),) * len(system.dims),
                         name=system.name)

    @classmethod
    def _build(cls, kind, chip: ChipSpec, dims, chips, nodes, dim_bw, name=None):
        spec, cores = chip.links, chip.cores
        names, bw, lat = [], [], []

        def add(n, b, l):
            names.append(n), bw.append(b), lat.append(l)
        per_node = _prod(dims) if kind in ("torus", "cluster") else 0
        for node, i in itertools.product(range(nodes), range(per_node)):
            c = node * per_node + i
            for d, sgn in itertools.product(range(len(dims)), "+-"):
                add(f"chip{c}.{sgn}d{d}", dim_bw[d], spec.hop_ns)
        for c in range(chips):
            add(f"chip{c}.dma_tx", spec.chip_dma_bytes_per_ns, 0.0)
        for c in range(chips):
            add(f"chip{c}.dma_rx", spec.chip_dma_bytes_per_ns, 0.0)
        port = {"switch": (spec.neuronlink_bytes_per_ns / 2, spec.switch_hop_ns),
                "cluster": (spec.efa_bytes_per_ns, spec.efa_hop_ns)}.get(kind)
        if port:
            tag = "switch" if kind == "switch" else "efa"
            for c in range(chips):
                add(f"chip{c}.{tag}_tx", port[0], port[1])
            for c in range(chips):
                add(f"chip{c}.{tag}_rx", port[0], 0.0)
        lat = np.array(lat)
        links = _CHIP_ROUTES[kind](dims, chips, nodes)
        clat = np.where(links >= 0, lat[np.maximum(links, 0)], 0.0).sum(-1)
        return cls(name or f"{chip.name}-{kind}{'x'.join(map(str, dims))}", chip.name, kind,
                   chips, cores, dims, nodes, tuple(names), np.array(bw, float), lat, spec,
                   links, clat)

    # --- devices -------------------------------------------------------------------

    @property
    def num_devices(self) -> int:
        return self.num_chips * self.cores_per_chip

    def chip_of(self, dev):
        return np.asarray(dev) // self.cores_per_chip

    def core_of(self, dev):
        return np.asarray(dev) % self.cores_per_chip

    def node_of_chip(self, chip):
        return np.asarray(chip) // (self.num_chips // self.nodes)

    @functools.cached_property
    def chip_coords(self) -> np.ndarray:
        """(C, D) coordinates of each chip within its node (torus dims / (server, chip))."""
        per = list(itertools.product(*(range(d) for d in self.dims)))
        per_node = self.num_chips // self.nodes
        return np.array([per[c % per_node] for c in range(self.num_chips)])

    def _link_base(self, name: str) -> int:
        return self.link_names.index(name)

    # --- routes --------------------------------------------------------------------

    def routes(self, src, dst) -> tuple[np.ndarray, np.ndarray]:
        """Links (F, H; -1 padded) and latency (F,) ns of the route of each device pair."""
        src, dst = np.asarray(src), np.asarray(dst)
        ca, cb = self.chip_of(src), self.chip_of(dst)
        tx = self._dma_tx + ca
        rx = self._dma_tx + self.num_chips + cb
        links = np.concatenate([tx[:, None], self._chip_links[ca, cb], rx[:, None]], axis=1)
        lat = self._chip_lat[ca, cb] + np.where(ca == cb, self.spec.onchip_ns, 0.0)
        return links, lat

    @functools.cached_property
    def _dma_tx(self) -> int:
        return self._link_base("chip0.dma_tx")

    @functools.cached_property
    def dma_ports(self) -> slice:
        """The ids of every chip's DMA port links: all dma_tx, then all dma_rx."""
        return slice(self._dma_tx, self._dma_tx + 2 * self.num_chips)

    def route(self, src: int, dst: int) -> list[str]:
        """Link names from device `src` to device `dst`."""
        links, _ = self.routes([src], [dst])
        return [self.link_names[i] for i in links[0] if i >= 0]

    @functools.cached_property
    def chip_hops(self) -> np.ndarray:
        """(C, C) hops between chips: torus links, switch traversals (a tx/rx port pair
        is one hop) or EFA hops; links with a latency count, receive ports do not."""
        links = self._chip_links
        return ((links >= 0) & (self.link_lat[np.maximum(links, 0)] > 0)).sum(-1)

    def hops(self, src: int, dst: int) -> int:
        """Chip-to-chip hops from device `src` to device `dst` (0 on one chip)."""
        return int(self.chip_hops[int(self.chip_of(src)), int(self.chip_of(dst))])

    def latency_ns(self, src: int, dst: int) -> float:
        return float(self.routes([src], [dst])[1][0])

    # --- orders for ring and hypercube algorithms ------------------------------------

    @functools.cached_property
    def snake_rank(self) -> np.ndarray:
        """Each chip's position on a boustrophedon walk of its node (a Hamiltonian cycle
        of a torus with an even first dimension), nodes one after another."""
        pos = np.zeros(self.num_chips, int)
        per_node = self.num_chips // self.nodes
        for c in range(self.num_chips):
            co, key = self.chip_coords[c], 0
            for d in range(len(self.dims)):       # last dim fastest, reversed on odd prefix
                v = co[d]
                if d and sum(co[:d]) % 2:
                    v = self.dims[d] - 1 - v
                key = key * self.dims[d] + v
            pos[c] = self.node_of_chip(c) * per_node + key
        return pos

    @functools.cached_property
    def gray_rank(self) -> np.ndarray:
        """Each chip's hypercube position: per dimension the inverse Gray code of its
        coordinate, so hypercube neighbours are torus neighbours (§5.3: RDH treats a 4x4
        torus as a 4D hypercube) when every dimension is a power of two."""
        inv = {d: {gray(i): i for i in range(d)} for d in self.dims}
        pos = np.zeros(self.num_chips, int)
        per_node = self.num_chips // self.nodes
        for c in range(self.num_chips):
            key = 0
            for d, v in zip(self.dims, self.chip_coords[c]):
                key = key * d + inv[d].get(int(v), int(v))
            pos[c] = self.node_of_chip(c) * per_node + key
        return pos

    @functools.cached_property
    def disjoint_cycles(self) -> list[list[int]] | None:
        """Two edge-disjoint Hamiltonian cycles of a square 2D torus node (§5.3: "on 16
        chips in a 2D torus there are 2 disjoint Hamiltonian cycles", used by
        KangaRing), as chip lists; None for other shapes. Cycle A steps +x except where
        (x + y) % k == k - 1, where it steps +y; cycle B swaps the two."""
        if self.kind != "torus" or len(self.dims) != 2 or self.dims[0] != self.dims[1] or self.dims[0] < 3:
            return None
        k = self.dims[0]
        out = []
        for first in (0, 1):
            x = y = 0
            cyc = []
            for _ in range(k * k):
                cyc.append(x * k + y)
                turn = (x + y) % k == k - 1
                if (first == 0) != turn:
                    x = (x + 1) % k
                else:
                    y = (y + 1) % k
            out.append(cyc)
        return out


def _chip(chip: ChipSpec | str) -> ChipSpec:
    """A chip spec, or a preset chip by its name ("trn1" / "trn2" / "trn3")."""
    return CHIPS[chip] if isinstance(chip, str) else chip


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def _pad(lists, chips) -> np.ndarray:
    h = max([len(r) for r in lists] + [0])
    out = -np.ones((chips * chips, max(h, 1)), np.int64)
    for i, r in enumerate(lists):
        out[i, :len(r)] = r
    return out.reshape(chips, chips, -1)


def _torus_table(dims):
    coords = list(itertools.product(*(range(d) for d in dims)))
    index = {c: i for i, c in enumerate(coords)}
    nd = len(dims)

    def link(c, d, s):
        return index[c] * 2 * nd + 2 * d + (0 if s == 1 else 1)
    return [[link(c, d, s) for c, d, s in torus_route(a, b, dims)]
            for a in coords for b in coords]


def _single_routes(dims, chips, nodes):
    return -np.ones((chips, chips, 1), np.int64)


def _torus_routes(dims, chips, nodes):
    return _pad(_torus_table(dims), chips)


def _switch_routes(dims, chips, nodes):
    base = chips * 2                       # after dma_tx / dma_rx
    a, b = np.meshgrid(np.arange(chips), np.arange(chips), indexing="ij")
    out = np.stack([base + a, base + chips + b], axis=-1)
    out[a == b] = -1
    return out


def _cluster_routes(dims, chips, nodes):
    per = _prod(dims)
    intra = _pad(_torus_table(dims), per)                 # (per, per, H)
    links_per_node = per * 2 * len(dims)
    h = max(intra.shape[-1], 2)
    out = -np.ones((chips, chips, h), np.int64)
    efa = links_per_node * nodes + 2 * chips
    a, b = np.meshgrid(np.arange(chips), np.arange(chips), indexing="ij")
    same = (a // per) == (b // per)
    local = intra[a % per, b % per]
    local = np.where(local >= 0, local + (a // per)[..., None] * links_per_node, -1)
    out[..., :intra.shape[-1]] = np.where(same[..., None], local, -1)
    out[~same, 0] = (efa + a)[~same]
    out[~same, 1] = (efa + chips + b)[~same]
    return out


_CHIP_ROUTES = {"single": _single_routes, "torus": _torus_routes,
                "switch": _switch_routes, "cluster": _cluster_routes}
