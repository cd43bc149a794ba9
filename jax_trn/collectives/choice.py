"""Which algorithm a collective uses by default: the whole choice rule (§5.3
[CC-INTRA][CC-INTER]).

  collective_permute  direct.
  all_to_all          mesh (no size rule is published; pairwise on request).
  groups spanning several chips with the same number of cores on each
                      hierarchical: cores of a chip, then chips, each level by the size
                      rule on the bytes it carries (hierarchical.py).
  a cluster group spanning nodes, >= 1 MB
                      ring2d (a ring in each node, then across nodes).
  otherwise, the size rule (`size_rule`): on NeuronSwitch always mesh (one hop to
  every chip); else mesh < 1 MB, RDH < 56 MB (2^k ranks), then KangaRing where the
  group is one rank on every chip of a square 2D torus, ring2d where it covers a
  multi-dimensional torus or a cluster, else ring.
  A flat all-reduce that would mesh runs as the single-step mesh (mesh1) where that is
  faster on the topology: "Single-step Mesh wins when the extra transfer time is under"
  the latency it saves ([CC-INTER]). Decided on the modelled times of both plans and
  remembered per topology, group and size (in practice: small messages).

The message size is the larger of a rank's input and output buffers. These thresholds
are the Neuron runtime's policy, not hardware numbers (hence here, not in hw/spec.py).
"""
from __future__ import annotations

import weakref

import numpy as np

from jax_trn.hw.topology import Topology

from . import mesh1
from .levels import flat, level_plan
from .timing import timing

__all__ = ["MESH_MAX_BYTES", "RDH_MAX_BYTES", "MESH1_MAX_RANKS", "size_rule",
           "choose_algorithm"]

MESH_MAX_BYTES = 1 << 20        # §5.3 [CC-INTRA]: mesh below 1 MB
RDH_MAX_BYTES = 56 << 20        # §5.3 [CC-INTRA]: RDH 1-56 MB, KangaRing/ring beyond
MESH1_MAX_RANKS = 256           # mesh1 holds n whole buffers per rank; larger groups mesh


def size_rule(nbytes, n, topo, onchip=False, all_chips=False) -> str:
    """§5.3: mesh < 1 MB, RDH 1-56 MB (2^k ranks), KangaRing / ring beyond; the switch
    always meshes (one hop to every chip). `n`: ranks of the level (None: unknown);
    `onchip`: the level is the cores of one chip; `all_chips`: it holds every chip."""
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
    algo = size_rule(nbytes, len(groups[0]), topology, onchip=n_chips == 1,
                     all_chips=n_chips == topology.num_chips == len(groups[0]))
    if kind == "all_reduce" and algo == "mesh" and _single_step_wins(groups, topology, nbytes):
        return "mesh1"
    return algo


def _single_step_wins(groups, topo: Topology, nbytes: int) -> bool:
    """Whether the single-step mesh all-reduce (one latency, n x the bytes) beats the
    two-step one (reduce-scatter + all-gather mesh) for `nbytes` per rank on `topo`, on
    the modelled times of both; remembered per topology, groups and size."""
    n = groups.shape[1]
    if n < 2 or n > MESH1_MAX_RANKS:
        return False
    known = _MESH1_WINS.setdefault(topo, {})
    key = (groups.shape, groups.tobytes(), nbytes)
    if key not in known:
        plans = {"mesh": level_plan("all_reduce", *flat("mesh", groups, topo), "mesh"),
                 "mesh1": mesh1.plan(*groups.shape)}
        t = {a: timing(p, topo, groups.ravel(), -(-nbytes // n), 1.0, "all_reduce", nbytes,
                       n).total_ns for a, p in plans.items()}
        known[key] = t["mesh1"] < t["mesh"]
    return known[key]


_MESH1_WINS: "weakref.WeakKeyDictionary[Topology, dict]" = weakref.WeakKeyDictionary()
