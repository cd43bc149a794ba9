"""Running a collective: numerics and timing, or timing alone.

    results, timing = run_collective("all_reduce", arrays_by_device, groups, topology)
    timing = collective_time("all_gather", shape, dtype, groups, topology)   # no numerics

The algorithm is `algorithm=` (a name of `ALGORITHMS`) or, by default, the choice rule
(choice.py). Both functions build the same plan, so a timing-only run times exactly what
a real run does.
"""
from __future__ import annotations

import numpy as np

from jax_trn.hw.topology import Topology

from . import blocked, buffers, numerics, permute
from .choice import choose_algorithm
from .plan import KINDS, Plan
from .split import whole
from .table import plan_for
from .timing import Timing
from .timing import timing as _timing

__all__ = ["run_collective", "collective_time", "all_reduce_parts", "SPLITS"]

# The kinds whose work processes share (split.py); the others every process runs whole.
SPLITS = ("all_reduce", "reduce_scatter", "all_to_all")


# Plans and timings depend on the shapes and devices only, and a program runs the same
# collectives at every step: both are kept (bounded), keyed by their arguments (the
# topology object itself, so its id cannot be reused while an entry lives).
_PLANS: dict = {}
_TIMINGS: dict = {}
_KEEP = 256


def _plan(kind, groups, topo, algorithm, nbytes) -> Plan:
    groups = np.asarray(groups)
    key = (kind, groups.shape, groups.tobytes(), topo, algorithm, nbytes)
    got = _PLANS.get(key)
    if got is None:
        name = algorithm or choose_algorithm(kind, nbytes, groups, topo)
        got = plan_for(kind, groups, topo, name, nbytes)
        if len(_PLANS) >= _KEEP:
            _PLANS.clear()
        _PLANS[key] = got
    return got


def timing(plan: Plan, topo, devs, chunk_bytes, dma_available, kind, nbytes, n) -> Timing:
    """`timing.timing`, kept per plan and arguments (it reads no data)."""
    devs = np.asarray(devs)
    key = (plan, topo, devs.tobytes(), chunk_bytes, dma_available, kind, nbytes, n)
    got = _TIMINGS.get(key)
    if got is None:
        got = _timing(plan, topo, devs, chunk_bytes, dma_available, kind, nbytes, n)
        if len(_TIMINGS) >= _KEEP:
            _TIMINGS.clear()
        _TIMINGS[key] = got
    return got


def _validate(kind, groups, topo, op) -> np.ndarray:
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


def collective_time(kind, shape, dtype, groups, topology: Topology, algorithm=None, *,
                    pairs=None, dma_available: float = 1.0) -> Timing:
    """Timing only (no numerics): `shape` is one rank's input."""
    groups = _validate(kind, groups, topology, "sum")
    itemsize = np.dtype(dtype).itemsize
    n = groups.shape[1]
    nbytes = buffers.message_bytes(kind, shape, itemsize, n)
    if kind == "collective_permute":
        return permute.permute_timing(pairs, shape, itemsize, topology, dma_available)
    plan = _plan(kind, groups, topology, algorithm, nbytes)
    chunk = buffers.chunk_elems(kind, shape, plan, n)
    return timing(plan, topology, groups.ravel(), chunk * itemsize, dma_available, kind, nbytes, n)


def all_reduce_parts(parts_by_device, groups, topology: Topology, algorithm=None, op="sum", *,
                     dma_available: float = 1.0, split=None):
    """`run_collective("all_reduce", ...)` of messages given as lists of flat arrays of
    one dtype (dict device -> parts; the message is their concatenation, read in place:
    a combined all_reduce's operands); results are flat. Same plan, bits and timing as
    the concatenated message. `split`: see `run_collective`."""
    groups = _validate("all_reduce", groups, topology, op)
    g, n = groups.shape
    devs = groups.ravel()
    xs = [list(parts_by_device[int(d)]) if split is None or int(d) in parts_by_device
          else None for d in devs]
    first = next(x for x in xs if x is not None)
    x0, size = first[0], sum(p.size for p in first)
    nbytes = buffers.message_bytes("all_reduce", (size,), x0.dtype.itemsize, n)
    plan = _plan("all_reduce", groups, topology, algorithm, nbytes)
    chunk = buffers.chunk_elems("all_reduce", (size,), plan, n)
    outs = blocked.all_reduce(plan, xs, op, topology.spec.dma_compute_sources, chunk, g,
                              split(devs) if split is not None else None)
    return ({int(d): outs[r] for r, d in enumerate(devs) if outs[r] is not None},
            timing(plan, topology, devs, chunk * x0.dtype.itemsize, dma_available, "all_reduce",
                   nbytes, n))


def run_collective(kind, arrays_by_device, groups, topology: Topology, algorithm=None, op="sum", *,
                   axis: int = 0, pairs=None, dma_available: float = 1.0, split_axis: int = 0,
                   concat_axis: int = 0, split=None):
    """Run collective `kind` on `arrays_by_device` (dict device -> array, or a sequence
    indexed by device id) over `groups` (lists of device ids, all of one size, as XLA
    emits them; any devices, not necessarily contiguous). Returns ({device: result},
    Timing).

    all_reduce / reduce_scatter combine with `op` (sum, max, min); all_gather
    concatenates along `axis`; reduce_scatter splits `axis` into n blocks; all_to_all
    splits `split_axis` and concatenates along `concat_axis`; collective_permute takes
    `pairs` of (source device, target device) and gives zeros to devices that receive
    nothing (XLA semantics). `algorithm`: a name of `ALGORITHMS`, None for the choice
    rule. `dma_available`: see timing.py. `split` (a collective whose devices belong to
    several processes; all_reduce, reduce_scatter, all_to_all): a function of the ranks'
    device ids giving a `split.Split`; `arrays_by_device` then holds this process's
    devices only, and so do the results."""
    if split is not None and kind not in SPLITS:
        raise ValueError(f"a {kind} does not split across processes ({', '.join(SPLITS)} do)")
    if kind == "collective_permute":
        groups = [sorted({d for p in pairs for d in p})]
    groups = _validate(kind, groups, topology, op)
    g, n = groups.shape
    devs = groups.ravel()
    xs = [None if split is not None and int(d) not in arrays_by_device
          else np.asarray(arrays_by_device[int(d)]) for d in devs]
    x0 = next(x for x in xs if x is not None)
    if any(x is not None and (x.shape != x0.shape or x.dtype != x0.dtype) for x in xs):
        raise ValueError("all arrays of a collective must have one shape and dtype")
    if kind == "collective_permute":
        return permute.run(pairs, arrays_by_device, topology, dma_available, x0)
    nbytes = buffers.message_bytes(kind, x0.shape, x0.dtype.itemsize, n)
    plan = _plan(kind, groups, topology, algorithm, nbytes)
    if kind == "all_reduce":               # in column blocks (blocked.py): same bits
        chunk = buffers.chunk_elems(kind, x0.shape, plan, n)
        outs = blocked.all_reduce(plan, xs, op, topology.spec.dma_compute_sources, chunk, g,
                                  split(devs) if split is not None else None)
        return ({int(d): outs[r] for r, d in enumerate(devs) if outs[r] is not None},
                timing(plan, topology, devs, chunk * x0.dtype.itemsize, dma_available, kind,
                       nbytes, n))
    move = {"all_gather": axis, "reduce_scatter": axis, "all_to_all": split_axis}.get(kind, 0)
    held = [x for x in xs if x is not None]
    blocks = np.stack([np.moveaxis(x, move, 0) for x in held]) if x0.ndim else np.stack(held)[:, None]
    if kind in ("reduce_scatter", "all_to_all") and blocks.shape[1] % n:
        raise ValueError(f"{kind}: axis of size {blocks.shape[1]} does not split into {n} blocks")
    chunk = buffers.chunk_elems(kind, x0.shape, plan, n)
    sources = topology.spec.dma_compute_sources
    if split is None:
        mine = range(len(devs))
        buf = buffers.load(kind, blocks, plan, n, chunk)
        numerics.execute(plan, buf, op, sources)
    else:                            # this process's ranks only; the columns shared out
        parts = split(devs)
        mine = parts.rows_of(parts.me)
        buf = whole(plan, buffers.load(kind, blocks, plan, n, chunk, mine), op, sources, parts)
    out = buffers.unload(kind, buf, plan, blocks, g, n, chunk, None if split is None else mine)
    results = {int(devs[r]): buffers.restore(kind, out[i], x0, n, axis, split_axis, concat_axis)
               for i, r in enumerate(mine)}
    result_timing = timing(plan, topology, devs, chunk * x0.dtype.itemsize, dma_available, kind,
                           nbytes, n)
    return results, result_timing
