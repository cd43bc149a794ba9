"""Collectives across NeuronCores and chips: algorithms, the choice rule, numerics and
timing, on a system's links and topology (`jax_trn.hw.topology.Topology`)
(trainium-hardware.md §4, §5).

    results, timing = run_collective("all_reduce", arrays_by_device, groups, topology)
    timing = collective_time("all_gather", shape, dtype, groups, topology)   # no numerics

Kinds (§5.1): all_reduce (op sum/max/min), all_gather, reduce_scatter, all_to_all,
collective_permute, over replica `groups` (lists of device ids, all of one size).

An algorithm builds a plan (plan.py): steps over equal slots of every rank's buffer,
used for both numerics (numerics.py: reduction order, FP32 DMA-side accumulation) and
timing (timing.py: the steps over the links), so both are the algorithm's. The modules:

  table.py         ALGORITHMS: name -> what it implements and how it plans
  choice.py        the default choice (§5.3 size rule, mesh1 where it wins)
  ring.py          one ring per line, both ways round inside a NeuronLink node
  kangaring.py     4 rings on the two disjoint Hamiltonian cycles of a 2D torus
  rdh.py           recursive halving / doubling on a Gray-coded hypercube
  mesh.py          direct writes, then a local reduce
  mesh1.py         single-step mesh all-reduce
  ring2d.py        a ring per torus dimension / cluster level
  hierarchical.py  cores of a chip, then chips (and ring2d's levels)
  all_to_all.py    mesh / pairwise all_to_all
  permute.py       direct collective_permute
  levels.py        levels of lines and the plan assembled from them
  orders.py        ring / hypercube orders of devices; buffers.py: data <-> slots
  api.py           run_collective, collective_time, all_reduce_parts
  blocked.py       all_reduce numerics in column blocks (bounded working memory)
  split.py         a collective's columns shared out over processes (multi-process runs)
  indirect.py      a plan's copies as cell ids, only its reductions on data

`ALGORITHMS` (its keys) is what `algorithm=` and JAX_TRN_COLLECTIVE_ALGORITHM accept.
"""
from .api import all_reduce_parts as all_reduce_parts
from .api import collective_time as collective_time, run_collective as run_collective
from .choice import MESH_MAX_BYTES as MESH_MAX_BYTES, RDH_MAX_BYTES as RDH_MAX_BYTES
from .choice import choose_algorithm as choose_algorithm
from .orders import rdh_order as rdh_order, ring_order as ring_order
from .plan import KINDS as KINDS
from .table import ALGORITHMS as ALGORITHMS, Algorithm as Algorithm
from .timing import StepTiming as StepTiming, Timing as Timing

__all__ = ["ALGORITHMS", "Algorithm", "KINDS", "MESH_MAX_BYTES", "RDH_MAX_BYTES", "all_reduce_parts",
           "StepTiming", "Timing", "choose_algorithm", "collective_time", "rdh_order",
           "ring_order", "run_collective"]
