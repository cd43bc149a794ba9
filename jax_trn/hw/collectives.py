"""Collectives on a `Topology`: schedules, numerics and timing (trainium-hardware.md §4, §5).

    results, timing = run_collective("all_reduce", arrays_by_device, groups, topology)
    timing = collective_time("all_gather", shape, dtype, groups, topology)   # no numerics

Kinds (§5.1): all_reduce (op sum/max/min), all_gather, reduce_scatter, all_to_all,
collective_permute, over replica `groups` (lists of device ids, all of one size, as XLA
emits them; any devices, not necessarily contiguous).

**Schedules.** An algorithm is a list of steps, built once and used for both numerics and
timing, so the numbers are the algorithm's. Each rank has a buffer of `slots` equal chunks.
A `Xfer` step moves slot ranges between ranks (all reads happen before any write); a
reducing `Xfer` combines into the receiver's slots ("DMA-side accumulation", §5.2). A
`LocalReduce` step sums several of a rank's slots into one (the mesh algorithm).

**Algorithms** (§5.3 [CC-INTRA][CC-INTER]). all-reduce = reduce-scatter + all-gather, run
level by level (a level = lines of ranks that differ in one coordinate):
  ring        one ring through the group, in the topology's snake order (the "flat ring").
              Inside a NeuronLink node it runs both ways round at once (two rings, each
              half the data, opposite directions of every link: [CC-INTRA] "multiple cycles
              with mutually exclusive wires in parallel for full wire bandwidth"); a ring
              that crosses EFA nodes is one directed cycle ([CC-INTER]).
  kangaring   on a square 2D torus, one rank per chip: 4 rings, the two edge-disjoint
              Hamiltonian cycles each way, each carrying a quarter of the data (§5.3).
  ring2d      one ring per torus dimension / per level of a cluster (chips of a node, then
              nodes): the "2D ring" of [SEED-2022].
  rdh         recursive halving (reduce-scatter) and doubling (all-gather); ranks placed
              on the hypercube by Gray code so partners are torus neighbours (§5.3:
              "RDH treats the 2D torus as a 4D hypercube"); needs 2^k ranks per line.
  mesh        direct writes: every rank writes each peer's chunk in one step, then a
              local reduce (the NeuronSwitch case; "oversubscribes links" on a torus).
  mesh1       all-reduce only: the "single-step mesh": every rank broadcasts its whole
              buffer to every peer and each reduces all of them (one network latency
              instead of two, n times the bytes).
  hierarchical  cores of a chip first, then chips (§5.3 "intra ReduceScatter -> inter
              AllReduce -> intra AllGather"), each level by the size rule below.
all_to_all: "mesh" (one step) or "pairwise" (n-1 shifted exchanges). collective_permute:
"direct", any (source, target) pairs (§5.1 says the runtime only supports circular
permutes of adjacent ranks; we do not enforce that).
Default choice (§5.3): groups spanning several chips with several cores each ->
hierarchical; per level by message size: NeuronSwitch -> mesh; < 1 MB mesh, < 56 MB rdh
(2^k ranks), else kangaring where there are disjoint cycles, else ring2d when the group
covers a multi-dimensional torus or a cluster, else ring. A flat all-reduce that would
mesh runs as mesh1 when that is faster on the topology ([CC-INTER]: "Single-step Mesh
wins when the extra transfer time is under" one hop latency), which in practice means
small messages. all_to_all: mesh (no size rule
is published; pairwise on request). The message size is the larger of a rank's input and
output buffers.
Override with `algorithm=` or `JAX_TRN_COLLECTIVE_ALGORITHM`.

**Numerics.** Element dtype storage between steps; each reducing transfer computes
cast(fp32(own) + fp32(incoming)) -- the CC engine's DMA-side accumulation goes through
FP32 like every DMA compute (§3.4 [NKI-ISA], §4) and writes the element type back, so
bf16 sums round once per step in the algorithm's order. `LocalReduce` sums up to 16
sources in FP32 before rounding (dma_compute, §3.4), chaining batches of 16. max/min are
exact. Integer sums go through FP32 too (§4 [DTYPES]: integer all-reduce / reduce-scatter
are converted to FP32 by the compiler), exact below 2^24. Computed with numpy, vectorized
over all ranks of all groups.

**Timing** (deterministic). The collective pays one fixed cost (`LinkSpec.onchip_ns`, the
trigger-to-DMA start of §5.2/§3.4), then steps run one after another, all groups together.
A `LocalReduce` is a chain of dma_computes (16 sources each, the running partial one of
them): each pays the DMA fixed cost, plus the bytes at the reduce rate.
A step's transfers are aggregated per device pair (a flow). Contention is a per-link
serialization model: every flow on a link shares it for the whole step, so link l drains
after load[l] / bw[l]; a flow ends at route latency + max over its links of that drain time;
the step ends with its last flow (steps are bulk-synchronous across groups). A reducing transfer costs 1 / cc_reduce_rate on the
receiving chip's DMA (pre-v4 accumulation runs at 50% of DMA rate, §5.2 [NKI-ARCH3]).
`dma_available` (0..1] scales every chip's DMA bandwidth: the hook for collectives that
share DMA engines with compute (§5.2); the SPMD runtime passes 16/17 when the devices
compute beside the collective (packet round-robin, see jax_trn/runtime/spmd.py).
"""
from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, field

import numpy as np

from . import numerics as _num
from .topology import Topology

__all__ = [
    "ALGORITHMS",
    "KINDS",
    "MESH_MAX_BYTES",
    "RDH_MAX_BYTES",
    "StepTiming",
    "Timing",
    "choose_algorithm",
    "collective_time",
    "rdh_order",
    "ring_order",
    "run_collective",
]

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute")
ALGORITHMS = ("ring", "kangaring", "ring2d", "rdh", "mesh", "mesh1", "hierarchical", "pairwise",
              "direct")
MESH_MAX_BYTES = 1 << 20        # §5.3 [CC-INTRA]: mesh below 1 MB
RDH_MAX_BYTES = 56 << 20        # §5.3 [CC-INTRA]: RDH 1-56 MB, KangaRing/ring beyond
MESH1_MAX_RANKS = 256           # mesh1 holds n whole buffers per rank; larger groups mesh
ENV = "JAX_TRN_COLLECTIVE_ALGORITHM"
_REDUCING = ("all_reduce", "reduce_scatter")


# --- steps ------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Xfer:
    """Copy (or reduce into) `length` slots from (src, sstart) to (dst, dstart), per row."""
    src: np.ndarray
    sstart: np.ndarray
    dst: np.ndarray
    dstart: np.ndarray
    length: int
    reduce: bool
    label: str


@dataclass(frozen=True, eq=False)
class LocalReduce:
    """rank's slots [dstart, +length) = sum of the ranges at sstarts[:, k], in k order."""
    rank: np.ndarray
    dstart: np.ndarray
    sstarts: np.ndarray
    length: int
    label: str


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


# --- levels: rings of ranks that differ in one coordinate ----------------------------

@dataclass(frozen=True, eq=False)
class _Level:
    algo: str
    lines: np.ndarray      # (L, n) global ranks, in index (j) order
    orders: np.ndarray     # (R, L, n) ring position -> j


def ring_order(devices, topology: Topology) -> list[int]:
    """The order in which `ring` visits `devices`: the chips' snake order, cores of a
    chip consecutively."""
    devices = np.asarray(devices)
    key = topology.snake_rank[topology.chip_of(devices)] * topology.cores_per_chip + topology.core_of(devices)
    return [int(d) for d in devices[np.argsort(key, kind="stable")]]


def rdh_order(devices, topology: Topology) -> list[int]:
    """The hypercube positions `rdh` gives `devices` (position p = list index): chips by
    Gray-decoded torus coordinates, cores of a chip in the low bits."""
    devices = np.asarray(devices)
    key = topology.gray_rank[topology.chip_of(devices)] * topology.cores_per_chip + topology.core_of(devices)
    return [int(d) for d in devices[np.argsort(key, kind="stable")]]


def _grid_levels(coords: np.ndarray, n_ranks_per_group: int, algos: list[str], topo, devs):
    """Split each group (rows of `coords`: (G, n, k) coordinates of each rank) into k
    levels. Returns the levels and each global rank's level indices (G*n, k), or None
    if the group is not a full grid in these coordinates."""
    g, n, k = coords.shape
    idx = np.zeros((g, n, k), int)
    sizes = []
    for i in range(k):
        vals = np.sort(coords[..., i], axis=1)
        uniq = [np.unique(v) for v in vals]
        if any(len(u) != len(uniq[0]) for u in uniq):
            return None
        sizes.append(len(uniq[0]))
        idx[..., i] = [np.searchsorted(u, c) for u, c in zip(uniq, coords[..., i])]
    if _prod(sizes) != n:
        return None
    flat = idx.reshape(g, n, k)
    lin = np.zeros((g, n), int)
    for i in range(k):
        lin = lin * sizes[i] + flat[..., i]
    if any(len(np.unique(r)) != n for r in lin):
        return None
    grid = np.zeros((g, n), int)                  # grid[g, lin] = global rank
    grid[np.arange(g)[:, None], lin] = np.arange(g * n).reshape(g, n)
    grid = grid.reshape([g] + sizes)
    levels = []
    for i, algo in enumerate(algos):
        lines = np.moveaxis(grid, i + 1, -1).reshape(-1, sizes[i])
        levels.append(_Level(algo, lines, _orders(algo, lines, topo, devs)))
    return levels, flat.reshape(g * n, k), sizes


def _orders(algo: str, lines: np.ndarray, topo: Topology, devs: np.ndarray) -> np.ndarray:
    """Ring orders (R, L, n) of each line's ranks for `algo`."""
    d = devs[lines]
    chips = topo.chip_of(d)
    core = topo.core_of(d)
    if algo == "rdh":
        key = topo.gray_rank[chips] * topo.cores_per_chip + core
    else:
        key = topo.snake_rank[chips] * topo.cores_per_chip + core
    order = np.argsort(key, axis=1, kind="stable")
    nodes = topo.node_of_chip(chips)
    if algo == "ring" and (nodes == nodes[:, :1]).all():
        # NeuronLink rings run both ways round, each carrying half the data: [CC-INTRA]
        # "we run multiple cycles with mutually exclusive wires in parallel for full wire
        # bandwidth" (link utilisation "Full", §5.3); a link's two directions are separate
        # wires (the per-chip figures are "bidirectional", §1.3 [TRN3-INST]). Rings that
        # cross EFA nodes stay one directed cycle ([CC-INTER] describes one).
        return np.stack([order, order[:, ::-1]])
    if algo == "kangaring":
        cycles = topo.disjoint_cycles
        pos = [np.argsort(np.array(c)) for c in cycles]       # chip -> cycle position
        rings = []
        for p in pos:
            o = np.argsort(p[chips], axis=1, kind="stable")
            rings += [o, o[:, ::-1]]
        return np.stack(rings)
    return order[None]


def _levels_for(kind, algo, groups, topo, nbytes):
    """The levels of `algo` for `groups` (G, n) of device ids, and the name to report."""
    g, n = groups.shape
    devs = groups.reshape(-1)
    chips = topo.chip_of(groups)
    core = topo.core_of(groups)
    multi_core = len(np.unique(chips[0])) < n
    multi_chip = len(np.unique(chips[0])) > 1

    def flat(a):
        return _grid_levels(np.arange(n)[None, :, None].repeat(g, 0), n, [a], topo, devs)

    if algo in ("ring", "mesh", "rdh"):
        if algo == "rdh" and n & (n - 1):
            raise ValueError(f"rdh needs a power-of-two group size, got {n}")
        return flat(algo), algo
    if algo == "kangaring":
        if topo.disjoint_cycles is None or multi_core or len(np.unique(chips[0])) != topo.num_chips:
            raise ValueError("kangaring needs one rank on every chip of a square 2D torus")
        return _grid_levels(chips[..., None], n, ["kangaring"], topo, devs), algo
    if algo in ("hierarchical", "ring2d"):
        coords, algos = [], []
        if multi_core and multi_chip:
            coords.append(core)
            algos.append(_size_rule(nbytes, None, topo, onchip=True) if algo == "hierarchical" else "ring")
            nbytes = nbytes // len(np.unique(core[0]))
        n_chips = len(np.unique(chips[0]))
        chip_algo = algo if algo == "ring2d" else _size_rule(
            nbytes, n_chips, topo, onchip=not multi_chip, all_chips=n_chips == topo.num_chips)
        if not multi_chip:
            coords.append(core)
            algos.append(_size_rule(nbytes, n, topo, onchip=True))
        elif chip_algo == "ring2d":
            dims = _dim_coords(topo, chips)
            coords += dims
            algos += ["ring"] * len(dims)
        else:
            coords.append(topo.snake_rank[chips])
            algos.append(chip_algo)
        out = _grid_levels(np.stack(coords, -1), n, algos, topo, devs)
        if out is None:
            raise ValueError(f"{algo} needs groups that form a full grid of chips/cores; got {groups[0].tolist()}")
        keep = [lv for lv in out[0] if lv.lines.shape[1] > 1] or out[0][:1]
        name = f"{algo}({','.join(lv.algo for lv in out[0])})"
        return (out if len(keep) == len(out[0]) else _drop_levels(out, keep)), name
    raise ValueError(f"unknown algorithm {algo!r} for {kind}; choose from {ALGORITHMS}")


def _dim_coords(topo, chips) -> list:
    """Per-level coordinates of chips for ring2d: torus dimensions; a cluster's chips in
    a node (snake order), then nodes; otherwise one level."""
    if topo.kind == "torus":
        cc = topo.chip_coords[chips]
        return [cc[..., d] for d in range(cc.shape[-1])]
    if topo.kind == "cluster":
        return [topo.snake_rank[chips] % (topo.num_chips // topo.nodes), topo.node_of_chip(chips)]
    return [topo.snake_rank[chips]]


def _drop_levels(out, keep):
    levels, idx, sizes = out
    cols = [i for i, lv in enumerate(levels) if lv.lines.shape[1] > 1] or [0]
    return keep, idx[:, cols], [sizes[i] for i in cols]


def _size_rule(nbytes, n, topo, onchip=False, all_chips=False) -> str:
    """§5.3: mesh < 1 MB, RDH 1-56 MB (2^k ranks), KangaRing / ring beyond; the switch
    always meshes (one hop to every chip)."""
    if topo.kind == "switch" and not onchip:
        return "mesh"
    if nbytes < MESH_MAX_BYTES:
        return "mesh"
    if nbytes < RDH_MAX_BYTES and n and not n & (n - 1):
        return "rdh"
    if not onchip and all_chips and topo.disjoint_cycles is not None:
        return "kangaring"
    if not onchip and all_chips and (len(topo.dims) > 1 or topo.kind == "cluster"):
        return "ring2d"
    return "ring"


def choose_algorithm(kind: str, nbytes: int, groups, topology: Topology) -> str:
    """The default algorithm for a collective of `nbytes` per rank (see module doc)."""
    groups = np.asarray(groups)
    if kind == "collective_permute":
        return "direct"
    if kind == "all_to_all":
        return "mesh"
    chips = topology.chip_of(groups[0])
    n_chips = len(np.unique(chips))
    per_chip = np.unique(np.unique(chips, return_counts=True)[1])
    if 1 < n_chips < len(groups[0]) and len(per_chip) == 1:
        return "hierarchical"               # the same number of cores on every chip
    if topology.kind == "cluster" and len(np.unique(topology.node_of_chip(chips))) > 1 \
            and nbytes >= MESH_MAX_BYTES:
        return "ring2d"
    algo = _size_rule(nbytes, len(groups[0]), topology, onchip=n_chips == 1,
                      all_chips=n_chips == topology.num_chips == len(groups[0]))
    if kind == "all_reduce" and algo == "mesh" and _single_step_wins(groups, topology, nbytes):
        return "mesh1"
    return algo


def _single_step_wins(groups, topo: Topology, nbytes: int) -> bool:
    """Whether the single-step mesh all-reduce (one latency, n x the bytes) beats the
    two-step one (reduce-scatter + all-gather mesh) for `nbytes` per rank on `topo`:
    §5.3 [CC-INTER] "Single-step Mesh wins when the extra transfer time is under" the
    latency it saves. Decided on the modelled times of both."""
    n = groups.shape[1]
    if n < 2 or n > MESH1_MAX_RANKS:
        return False
    known = _MESH1_WINS.setdefault(topo, {})
    key = (groups.shape, groups.tobytes(), nbytes)
    if key not in known:
        t = {a: _timing(_plan("all_reduce", groups, topo, a, nbytes)[0], topo, groups.ravel(),
                        -(-nbytes // n), 1.0, "all_reduce", nbytes, n).total_ns
             for a in ("mesh", "mesh1")}
        known[key] = t["mesh1"] < t["mesh"]
    return known[key]


_MESH1_WINS: "weakref.WeakKeyDictionary[Topology, dict]" = weakref.WeakKeyDictionary()


# --- schedules ------------------------------------------------------------------------

def _ring_phase(lv: _Level, pre: np.ndarray, span: int, reduce: bool, tag: str):
    """Ring reduce-scatter (reduce=True) or all-gather over every line of `lv`."""
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


def _rdh_phase(lv: _Level, pre, span, reduce, tag):
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


def _mesh_phase(lv: _Level, pre, span, reduce, tag, scratch: int):
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


def _phase(lv, pre, span, reduce, tag, scratch):
    if lv.algo in ("ring", "kangaring"):
        return _ring_phase(lv, pre, span, reduce, tag)
    if lv.algo == "rdh":
        return _rdh_phase(lv, pre, span, reduce, tag)
    return _mesh_phase(lv, pre, span, reduce, tag, scratch)


@dataclass(frozen=True, eq=False)
class _Plan:
    steps: list
    slots: int             # main slots per rank
    total_slots: int       # with scratch
    leaf: np.ndarray       # (G*n,) first slot of each rank's own leaf block
    leaf_span: int
    name: str


def _level_plan(kind, levels, idx, sizes, name) -> _Plan:
    r_max = max(lv.orders.shape[0] for lv in levels)
    p = 4 if r_max > 1 else 1
    slots = _prod(sizes) * p
    spans = [_prod(sizes[i + 1:]) * p for i in range(len(sizes))]
    pres = []
    for i in range(len(sizes)):
        pre = np.zeros(idx.shape[0], int)
        for m in range(i):
            pre = pre * sizes[m] + idx[:, m]
        pres.append(pre)
    scratch = max([sizes[i] * spans[i] for i, lv in enumerate(levels) if lv.algo == "mesh"] + [0])
    steps = []
    order = range(len(levels))
    if kind in _REDUCING:
        for i in order:
            steps += _phase(levels[i], pres[i], spans[i], True, f"L{i}", slots)
    if kind in ("all_reduce", "all_gather"):
        for i in reversed(order):
            steps += _phase(levels[i], pres[i], spans[i], False, f"L{i}", slots)
    leaf = np.zeros(idx.shape[0], int)
    for m in range(len(sizes)):
        leaf = leaf * sizes[m] + idx[:, m]
    return _Plan(steps, slots, slots + scratch, leaf * p, p, name)


def _mesh1_plan(g, n) -> _Plan:
    """Single-step mesh all-reduce: rank a writes its whole buffer (n slots) into every
    peer's scratch row a, then every rank sums the n buffers in rank order (its own in
    place), as `_mesh_phase` orders its sources."""
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
    return _Plan(steps, n, n + n * n, np.zeros(g * n, int), 1, "mesh1")


def _a2a_plan(algo, g, n) -> _Plan:
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
    return _Plan(steps, 2 * n, 2 * n, np.zeros(g * n, int), 1, algo)


# --- numerics -----------------------------------------------------------------------

def _combine(a, b, op):
    if op == "max":
        return np.maximum(a, b)
    if op == "min":
        return np.minimum(a, b)
    if a.dtype.kind == "b":
        return a | b
    return _num.cast(_num.to_fp32(a) + _num.to_fp32(b), a.dtype)


def _slots(starts, length):
    return np.asarray(starts)[:, None] + np.arange(length)[None, :]


def _execute(plan: _Plan, buf: np.ndarray, op: str, sources: int) -> np.ndarray:
    for st in plan.steps:
        if isinstance(st, Xfer):
            vals = buf[st.src[:, None], _slots(st.sstart, st.length)]
            rows, cols = st.dst[:, None], _slots(st.dstart, st.length)
            buf[rows, cols] = _combine(buf[rows, cols], vals, op) if st.reduce else vals
        else:
            buf[st.rank[:, None], _slots(st.dstart, st.length)] = _local_reduce(buf, st, op, sources)
    return buf


def _local_reduce(buf, st, op, sources):
    """Sum (or max/min) the sources in k order: FP32 over batches of `sources`
    (dma_compute, §3.4), the running partial rounded to the element type between
    batches and counted as one of the next batch's sources."""
    rows = st.rank[:, None]
    parts = [buf[rows, _slots(st.sstarts[:, k], st.length)] for k in range(st.sstarts.shape[1])]
    if op in ("max", "min") or buf.dtype.kind == "b":
        acc = parts[0]
        for x in parts[1:]:
            acc = _combine(acc, x, op)
        return acc
    acc, k = None, 0
    while k < len(parts):
        batch = parts[k:k + (sources if acc is None else sources - 1)]
        k += len(batch)
        s = _num.to_fp32(acc) if acc is not None else np.zeros(batch[0].shape, np.float32)
        for x in batch:
            s = s + _num.to_fp32(x)
        acc = _num.cast(s, buf.dtype)
    return acc


# --- timing -----------------------------------------------------------------------------

def _reduce_batches(sources: int, per_dma: int) -> int:
    """dma_computes a local reduce of `sources` ranges takes: the first sums `per_dma`,
    each later one the running partial and `per_dma - 1` more (as `_local_reduce`).

    >>> _reduce_batches(2, 16), _reduce_batches(16, 16), _reduce_batches(17, 16), _reduce_batches(64, 16)
    (1, 1, 2, 5)
    """
    return 1 + max(0, -(-(sources - per_dma) // (per_dma - 1)))


def _step_time(st, topo: Topology, devs, chunk_bytes, dma_available, link_total):
    spec = topo.spec
    if isinstance(st, LocalReduce):
        chips = topo.chip_of(devs[st.rank])
        per_chip = np.bincount(chips, minlength=topo.num_chips) * st.sstarts.shape[1] * st.length * chunk_bytes
        rate = spec.chip_dma_bytes_per_ns * dma_available * spec.cc_reduce_rate
        # One dma_compute per batch of sources, chained (each adds the running partial,
        # as `_local_reduce` computes it): each pays the DMA fixed cost, §3.4.
        return spec.onchip_ns * _reduce_batches(st.sstarts.shape[1], spec.dma_compute_sources) \
            + per_chip.max() / rate, 0.0
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
    cap[topo._dma_tx:topo._dma_tx + 2 * topo.num_chips] *= dma_available
    drain = np.where(valid, (load / cap)[np.maximum(links, 0)], 0.0).max(axis=1)
    return float((lat + drain).max()), float(fbytes.sum())


def _timing(plan, topo, devs, chunk_bytes, dma_available, kind, nbytes, n) -> Timing:
    t = topo.spec.onchip_ns
    steps = [StepTiming("launch", 0.0, t, 0.0)]
    link_total = np.zeros(len(topo.link_bw))
    for st in plan.steps:
        dt, b = _step_time(st, topo, devs, chunk_bytes, dma_available, link_total)
        steps.append(StepTiming(st.label, t, t + dt, b))
        t += dt
    used = {topo.link_names[i]: float(link_total[i]) for i in np.flatnonzero(link_total)}
    return Timing(f"{kind} {plan.name}", t, tuple(steps), used, nbytes, n)


# --- API --------------------------------------------------------------------------------

def _plan(kind, groups, topo, algorithm, nbytes):
    g, n = groups.shape
    algo = algorithm or os.environ.get(ENV) or choose_algorithm(kind, nbytes, groups, topo)
    if kind == "collective_permute":
        return None, "direct"
    if kind == "all_to_all":
        if algo not in ("mesh", "pairwise"):
            raise ValueError(f"all_to_all algorithm must be mesh or pairwise, got {algo!r}")
        return _a2a_plan(algo, g, n), algo
    if algo == "mesh1":
        if kind != "all_reduce":
            raise ValueError(f"mesh1 (single-step mesh) is an all_reduce algorithm, not {kind}")
        return _mesh1_plan(g, n), algo
    levels, name = _levels_for(kind, algo, groups, topo, nbytes)
    lv, idx, sizes = levels
    return _level_plan(kind, lv, idx, sizes, name), name


def _check(kind, groups, topo, op):
    if kind not in KINDS:
        raise ValueError(f"unknown collective {kind!r}; choose from {KINDS}")
    if op not in ("sum", "max", "min"):
        raise ValueError(f"unknown reduction {op!r}")
    groups = np.asarray(groups, dtype=np.int64)
    if groups.ndim != 2:
        raise ValueError("groups must be a list of equal-size lists of device ids")
    flat = groups.ravel()
    if len(np.unique(flat)) != len(flat) or flat.min() < 0 or flat.max() >= topo.num_devices:
        raise ValueError(f"groups must name distinct devices of {topo.name} "
                         f"(0..{topo.num_devices - 1}); got {groups.tolist()}")
    return groups


def _message_bytes(kind, shape, itemsize, n):
    size = int(np.prod(shape)) * itemsize
    return size * n if kind == "all_gather" else size


def collective_time(kind, shape, dtype, groups, topology: Topology, algorithm=None, *,
                    pairs=None, dma_available: float = 1.0) -> Timing:
    """Timing only (no numerics): `shape` is one rank's input."""
    groups = _check(kind, groups, topology, "sum")
    itemsize = np.dtype(dtype).itemsize
    n = groups.shape[1]
    nbytes = _message_bytes(kind, shape, itemsize, n)
    if kind == "collective_permute":
        return _permute_timing(pairs, shape, itemsize, topology, dma_available)
    plan, _ = _plan(kind, groups, topology, algorithm, nbytes)
    chunk = _chunk_elems(kind, shape, plan, n)
    return _timing(plan, topology, groups.ravel(), chunk * itemsize, dma_available, kind, nbytes, n)


def _chunk_elems(kind, shape, plan, n):
    size = int(np.prod(shape))
    if kind == "all_reduce":
        return -(-size // plan.slots)
    if kind == "all_to_all":
        return -(-size // n)
    block = size // n if kind == "reduce_scatter" else size
    return -(-block // plan.leaf_span)


def run_collective(kind, arrays_by_device, groups, topology: Topology, algorithm=None, op="sum", *,
                   axis: int = 0, pairs=None, dma_available: float = 1.0, split_axis: int = 0,
                   concat_axis: int = 0):
    """Run collective `kind` on `arrays_by_device` (dict device -> array, or a sequence
    indexed by device id) over `groups`. Returns ({device: result}, Timing).

    all_gather concatenates along `axis`; reduce_scatter splits `axis` into n blocks;
    all_to_all splits `split_axis` and concatenates along `concat_axis`;
    collective_permute takes `pairs` of (source device, target device) and gives zeros
    to devices that receive nothing (XLA semantics). `algorithm`: see module doc."""
    if kind == "collective_permute":
        groups = [sorted({d for p in pairs for d in p})]
    groups = _check(kind, groups, topology, op)
    g, n = groups.shape
    devs = groups.ravel()
    xs = [np.asarray(arrays_by_device[int(d)]) for d in devs]
    x0 = xs[0]
    if any(x.shape != x0.shape or x.dtype != x0.dtype for x in xs):
        raise ValueError("all arrays of a collective must have one shape and dtype")
    if kind == "collective_permute":
        return _permute(pairs, arrays_by_device, topology, dma_available, x0)
    nbytes = _message_bytes(kind, x0.shape, x0.dtype.itemsize, n)
    plan, _ = _plan(kind, groups, topology, algorithm, nbytes)
    move = {"all_gather": axis, "reduce_scatter": axis, "all_to_all": split_axis}.get(kind, 0)
    blocks = np.stack([np.moveaxis(x, move, 0) for x in xs]) if x0.ndim else np.stack(xs)[:, None]
    if kind in ("reduce_scatter", "all_to_all") and blocks.shape[1] % n:
        raise ValueError(f"{kind}: axis of size {blocks.shape[1]} does not split into {n} blocks")
    chunk = _chunk_elems(kind, x0.shape, plan, n)
    buf = _load(kind, blocks, plan, n, chunk)
    _execute(plan, buf, op, topology.spec.dma_compute_sources)
    out = _unload(kind, buf, plan, blocks, g, n, chunk)
    results = {int(d): _restore(kind, out[r], x0, n, axis, split_axis, concat_axis)
               for r, d in enumerate(devs)}
    timing = _timing(plan, topology, devs, chunk * x0.dtype.itemsize, dma_available, kind, nbytes, n)
    return results, timing


def _restore(kind, y, x0, n, axis, split_axis, concat_axis):
    """One rank's result back in the caller's layout."""
    if not x0.ndim:
        return y.reshape(())
    if kind in ("all_gather", "reduce_scatter"):
        return np.moveaxis(y, 0, axis)
    if kind == "all_to_all":
        return _a2a_result(y.reshape((n, y.shape[0] // n) + y.shape[1:]), split_axis, concat_axis, n)
    return y


def _load(kind, blocks, plan, n, chunk):
    rows = blocks.shape[0]
    if kind == "all_reduce":                          # main slots first, scratch after
        flat = blocks.reshape(rows, -1)
        buf = np.zeros((rows, plan.total_slots * chunk), blocks.dtype)
        buf[:, :flat.shape[1]] = flat
        return buf.reshape(rows, plan.total_slots, chunk)
    buf = np.zeros((rows, plan.total_slots, chunk), blocks.dtype)
    if kind == "all_to_all":
        per = blocks.reshape(rows, n, -1)
        buf[:, :n, :per.shape[2]] = per
        return buf
    per = blocks.reshape(rows, n, -1) if kind == "reduce_scatter" else blocks.reshape(rows, 1, -1)
    span = plan.leaf_span
    leaf = plan.leaf.reshape(-1, n)                   # (G, n): leaf slot of each group position
    for q in range(per.shape[1]):
        pad = np.zeros((rows, span * chunk), blocks.dtype)
        pad[:, :per.shape[2]] = per[:, q]
        if kind == "reduce_scatter":                  # block q -> leaf of group position q
            cols = np.repeat(leaf[:, q], n)
        else:                                         # own block -> own leaf
            cols = plan.leaf
        buf[np.arange(rows)[:, None], cols[:, None] + np.arange(span)[None, :]] = pad.reshape(rows, span, chunk)
    return buf


def _unload(kind, buf, plan, blocks, g, n, chunk):
    rows = buf.shape[0]
    if kind == "all_reduce":
        size = int(np.prod(blocks.shape[1:]))
        return buf[:, :plan.slots].reshape(rows, -1)[:, :size].reshape(blocks.shape)
    if kind == "all_to_all":
        per = int(np.prod(blocks.shape[1:])) // n
        return buf[:, n:2 * n, :per].reshape(blocks.shape)
    span = plan.leaf_span
    size = int(np.prod(blocks.shape[1:]))
    if kind == "reduce_scatter":
        per = size // n
        cols = plan.leaf[:, None] + np.arange(span)[None, :]
        got = buf[np.arange(rows)[:, None], cols].reshape(rows, -1)[:, :per]
        return got.reshape((rows, blocks.shape[1] // n) + blocks.shape[2:])
    leaf = plan.leaf.reshape(g, n)
    outs = []
    for q in range(n):
        cols = np.repeat(leaf[:, q], n)[:, None] + np.arange(span)[None, :]
        outs.append(buf[np.arange(rows)[:, None], cols].reshape(rows, -1)[:, :size].reshape(blocks.shape))
    return np.concatenate(outs, axis=1)


def _a2a_result(y, split_axis, concat_axis, n):
    """y: (n, *moved_block) with the split axis first; back to XLA's all_to_all layout."""
    blocks = [np.moveaxis(b, 0, split_axis) for b in y]
    return np.concatenate(blocks, axis=concat_axis)


def _permute(pairs, arrays_by_device, topo, dma_available, x0):
    pairs = [(int(a), int(b)) for a, b in pairs]
    if len({b for _, b in pairs}) != len(pairs):
        raise ValueError("collective_permute: a device may receive from one source only")
    results = {}
    for a, b in pairs:
        results[b] = np.array(arrays_by_device[a], copy=True)
    for d in {d for p in pairs for d in p}:
        results.setdefault(d, np.zeros_like(x0))
    return results, _permute_timing(pairs, x0.shape, x0.dtype.itemsize, topo, dma_available)


def _permute_timing(pairs, shape, itemsize, topo, dma_available):
    pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
    nbytes = int(np.prod(shape)) * itemsize
    st = Xfer(np.arange(len(pairs)), np.zeros(len(pairs), int), np.arange(len(pairs), 2 * len(pairs)),
              np.zeros(len(pairs), int), 1, False, "permute")
    plan = _Plan([st], 1, 1, np.zeros(1, int), 1, "direct")
    devs = np.concatenate([pairs[:, 0], pairs[:, 1]])
    return _timing(plan, topo, devs, nbytes, dma_available, "collective_permute", nbytes, len(pairs))


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= int(x)
    return n
