"""The algorithms by name: what each implements and how it builds its plan.

`ALGORITHMS` maps a name (what `algorithm=` and JAX_TRN_COLLECTIVE_ALGORITHM take,
and what the profiler reports) to an `Algorithm`. Level algorithms (ring, kangaring,
rdh, mesh) run flat over each whole group; hierarchical and ring2d split groups into
levels (hierarchical.py); mesh1, the all_to_all schedules and the permute build their
own plans.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import all_to_all, hierarchical, kangaring, mesh1, rdh
from .levels import flat, grid_levels, level_plan
from .plan import Plan

__all__ = ["Algorithm", "ALGORITHMS", "plan_for"]

_GATHER_SCATTER = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass(frozen=True)
class Algorithm:
    """`plan(kind, groups, topology, nbytes) -> Plan` for `kinds`; `groups` is a (G, n)
    array of device ids, `nbytes` the message size per rank (for per-level choices)."""
    name: str
    kinds: tuple[str, ...]
    plan: Callable[[str, np.ndarray, object, int], Plan]


def _flat(name: str):
    def plan(kind, groups, topo, nbytes):
        return level_plan(kind, *flat(name, groups, topo), name)
    return plan


def _rdh(kind, groups, topo, nbytes):
    rdh.check(groups.shape[1])
    return _flat("rdh")(kind, groups, topo, nbytes)


def _kangaring(kind, groups, topo, nbytes):
    kangaring.check(groups, topo)
    chips = topo.chip_of(groups)
    out = grid_levels(chips[..., None], groups.shape[1], ["kangaring"], topo, groups.reshape(-1))
    return level_plan(kind, *out, "kangaring")


def _split(name: str):
    def plan(kind, groups, topo, nbytes):
        out, reported = hierarchical.split(name, groups, topo, nbytes)
        return level_plan(kind, *out, reported)
    return plan


def _mesh(kind, groups, topo, nbytes):
    if kind == "all_to_all":
        return all_to_all.plan("mesh", *groups.shape)
    return _flat("mesh")(kind, groups, topo, nbytes)


def _mesh1(kind, groups, topo, nbytes):
    return mesh1.plan(*groups.shape)


def _pairwise(kind, groups, topo, nbytes):
    return all_to_all.plan("pairwise", *groups.shape)


def _direct(kind, groups, topo, nbytes):
    raise ValueError("collective_permute runs on its pairs (permute.py), not on a plan")


ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("ring", _GATHER_SCATTER, _flat("ring")),
    Algorithm("kangaring", _GATHER_SCATTER, _kangaring),
    Algorithm("ring2d", _GATHER_SCATTER, _split("ring2d")),
    Algorithm("rdh", _GATHER_SCATTER, _rdh),
    Algorithm("mesh", _GATHER_SCATTER + ("all_to_all",), _mesh),
    Algorithm("mesh1", ("all_reduce",), _mesh1),
    Algorithm("hierarchical", _GATHER_SCATTER, _split("hierarchical")),
    Algorithm("pairwise", ("all_to_all",), _pairwise),
    Algorithm("direct", ("collective_permute",), _direct),
)}


def plan_for(kind: str, groups: np.ndarray, topo, name: str, nbytes: int) -> Plan:
    """The plan of algorithm `name` for `kind` over `groups`; ValueError naming the
    algorithms of `kind` when `name` is unknown or does not implement it."""
    algo = ALGORITHMS.get(name)
    if algo is None:
        raise ValueError(f"unknown algorithm {name!r} for {kind}; choose from {_names(kind)}")
    if kind not in algo.kinds:
        raise ValueError(f"{name} is an algorithm for {', '.join(algo.kinds)}, not for "
                         f"{kind}; {kind} takes {_names(kind)}")
    return algo.plan(kind, groups, topo, nbytes)


def _names(kind: str) -> str:
    return ", ".join(n for n, a in ALGORITHMS.items() if kind in a.kinds)
