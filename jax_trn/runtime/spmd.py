"""Running one program on many devices: SPMD with collectives between kernels.

Every device of an execution interprets the same step list (`executable._StepRunner`)
on its own NeuronCore, from simulated time 0. A `Collective` step is a rendezvous: each
device's runner is a generator that stops there and hands over its arrival time; once
every device has arrived, the collective runs once for all of them on the system's
topology (`jax_trn.hw.collectives.run_collective`: the chosen algorithm's schedule gives
both the numerics, in its reduction order, and the timing over the links), its
results are written into every device's DRAM, and each device resumes at the
collective's end.

Timing. A collective starts when the last member of its replica group arrives (groups
are independent: the groups of a psum over "x" each start with their own slowest
member) and takes the algorithm's time; its devices resume at its end. It does not
overlap the kernels around it: the program's next step usually consumes its result,
and DMA engines are not shared with a concurrent kernel (the overlap the hardware
allows, §5.2, is left for later: `dma_available` stays 1).

Device ids. Replica groups and permute pairs name partition ids (SPMD: one replica,
`num_partitions` devices; `use_global_device_ids`); partition p runs on the
executable's p-th device, whose global id places it on the topology.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jax_trn import profiler
from jax_trn.hw import dtypes as _dt
from jax_trn.hw.program import Collective

KIND_OPS = {"add": "sum", "maximum": "max", "minimum": "min"}


class CollectiveError(RuntimeError):
    pass


@dataclass
class Arrival:
    """What a device's runner yields at a collective: the step and its clock."""
    step: Collective
    t: float
    context: str


def drive(runners, devices, topology) -> list[profiler.CollectiveRecord]:
    """Runs the runners' generators to completion, executing each collective when
    every device has reached it. Returns the collectives' records."""
    gens = [r.run() for r in runners]
    pending: list[Arrival | None] = [_advance(g, None) for g in gens]
    records = []
    while any(p is not None for p in pending):
        if any(p is None for p in pending):
            done = [i for i, p in enumerate(pending) if p is None]
            waiting = next(p for p in pending if p is not None)
            raise CollectiveError(
                f"devices {done} finished while others wait in {waiting.step.name}: "
                "the devices took different paths through the program's control flow")
        steps = {id(p.step) for p in pending}
        if len(steps) > 1:
            names = sorted({p.step.name for p in pending})
            raise CollectiveError(f"devices reached different collectives {names}: the "
                                  "devices took different paths through the program")
        step = pending[0].step
        ends, record = execute(step, [r.dram for r in runners], devices,
                               [p.t for p in pending], topology, pending[0].context)
        records.append(record)
        pending = [_advance(g, end) for g, end in zip(gens, ends)]
    return records


def _advance(gen, value) -> Arrival | None:
    try:
        return gen.send(value)
    except StopIteration:
        return None


def execute(step: Collective, drams: list[dict], devices, arrivals: list[float], topology,
            context: str = "") -> tuple[list[float], profiler.CollectiveRecord]:
    """Runs `step` for all devices (partition p = devices[p]); returns each device's
    end time and the record."""
    n = len(devices)
    gid = [d.id for d in devices]
    groups = [list(g) for g in step.groups] if step.groups else [list(range(n))]
    for g in groups:
        if any(not 0 <= p < n for p in g):
            raise CollectiveError(f"{step.name}: replica group {g} names partitions outside "
                                  f"0..{n - 1}")
    ends = list(arrivals)
    total_ns, nbytes, algorithm, step_times = 0.0, 0, "", []
    for src, dst in zip(step.operands, step.results):
        arrays = {gid[p]: _read(drams[p], src) for p in range(n)}
        results, timing_i = _run(step, arrays, groups, gid, topology)
        for p in range(n):
            if gid[p] in results:
                _write(drams[p], dst, results[gid[p]])
            else:                      # collective_permute: nobody sends to p
                _write(drams[p], dst, np.zeros(dst.shape, _dt.np_dtype(dst.dtype)))
        # Several operands (a psum of a tuple) run one after another.
        step_times += [(s.label, total_ns + s.start_ns, total_ns + s.end_ns, s.bytes)
                       for s in timing_i.steps]
        total_ns += timing_i.total_ns
        nbytes += int(timing_i.message_bytes)
        algorithm = algorithm or timing_i.algorithm
    members = groups if step.kind != "collective_permute" else [list(range(n))]
    start_of = {}
    for g in members:
        start = max(arrivals[p] for p in g)
        for p in g:
            start_of[p] = start
            ends[p] = start + total_ns
    start = min(start_of.values())
    record = profiler.CollectiveRecord(
            name=step.name, kind=step.kind, algorithm=algorithm,
            devices=list(gid), groups=tuple(tuple(gid[p] for p in g) for g in groups),
            start_ns=float(start), end_ns=float(max(ends)), bytes=nbytes,
            arrival_ns=tuple(arrivals), ops=tuple(step.ops), context=context,
            steps=tuple(step_times))
    return ends, record


def _run(step, arrays, groups, gid, topology):
    from jax_trn.hw.collectives import run_collective
    groups_g = [[gid[p] for p in g] for g in groups]
    kw = {}
    if step.kind in ("all_reduce", "reduce_scatter"):
        op = KIND_OPS.get(step.op)
        if op is None:
            raise CollectiveError(f"{step.name}: a {step.kind} combining with {step.op!r} is "
                                  "not supported by the collective engine (sum, max, min)")
        kw["op"] = op
    if step.kind in ("all_gather", "reduce_scatter"):
        kw["axis"] = step.dim
    if step.kind == "all_to_all":
        kw["split_axis"], kw["concat_axis"] = step.split_dim, step.concat_dim
    if step.kind == "collective_permute":
        kw["pairs"] = [(gid[s], gid[t]) for s, t in step.pairs]
    return run_collective(step.kind, arrays, groups_g, topology, **kw)


def _read(dram: dict, t) -> np.ndarray:
    return np.asarray(dram[t.name]).reshape(t.shape)


def _write(dram: dict, t, value: np.ndarray) -> None:
    out = dram[t.name]
    out[...] = np.asarray(value).astype(out.dtype).reshape(-1)
