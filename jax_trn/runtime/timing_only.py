"""Timing-only runs of an SPMD program on any number of devices, in the memory of one.

Every device of an SPMD program runs the same step list; what differs between them is
their data and where they sit on the topology. A timing-only run simulates ONE device
(partition 0, the representative) and prices each collective for the whole program
with the collective engine's timing-only path (`collectives.collective_time`: the same
plan, links and contention as a real run over all replica groups, no numerics). So its
wall time and memory are those of one device's program, whatever the system's size.

What it assumes, and so cannot know:
  - every device reaches each collective at the same time as the representative (no
    skew: SPMD devices run identical kernels; cores sharing a chip's HBM are priced as
    sharing it, `Hbm(sharers=...)`);
  - values: host-driven loops and conditionals are decided on the representative's
    numerics, run on all-zero arguments (exact for trip counts that do not depend on
    the data); a data-dependent trip count cannot be known here. Loops on chip
    (`hw.program.Loop`: fori_loop and scan with static bounds) have a static trip
    count and need no numerics; collectives then give each device what a collective of identical inputs
    gives (a sum over a group of g is g times the operand, a gather g copies, ...), and
    host callbacks call nothing (their results are zeros);
  - a program without host-driven loops or conditionals computes no numerics at all.
"""
from __future__ import annotations

import contextlib
import threading
from collections import Counter

import numpy as np

from jax_trn import profiler
from jax_trn.config import Options
from jax_trn.hw import dtypes as _dt
from jax_trn.hw.program import Collective, HostCallback

from . import spmd
from .dram import bind_dram
from .execution import make_execution
from .steps import StepRunner


_lock = threading.Lock()
_depth = 0


@contextlib.contextmanager
def calls():
    """While the block runs, every call of a compiled program on a trn device in this
    process is timing-only (`jax_trn.timing_only()`): timed as `run` times it and
    recorded by `jax_trn.profile()`, its outputs arrays without values (reading one
    raises `TimingOnlyValue`; they may be passed to further timing-only calls)."""
    global _depth
    with _lock:
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1


def active() -> bool:
    return _depth > 0


def run(name: str, prog, options: Options, device_ids: list[int]) -> profiler.Execution:
    """The simulated timing of one call of `prog`, partition p on `device_ids[p]`, from
    the representative (partition 0) alone: an Execution whose kernels are partition
    0's and whose collectives are the whole program's."""
    from jax_trn.hw.bandwidth import Hbm
    from jax_trn.hw.core import NeuronCore
    from .device import core_numerics
    system, chip = options.system, options.system.chip
    ids = list(device_ids)
    chip0 = ids[0] // system.cores_per_chip
    sharers = Counter(d // system.cores_per_chip for d in ids)[chip0]
    core = NeuronCore(chip.core, core_id=ids[0] % system.cores_per_chip,
                      numerics=core_numerics(options))
    core.begin(Hbm(chip.hbm_bytes_per_ns, f"hbm.chip{chip0}", sharers if sharers > 1 else None))
    execute = bool(prog.control_flow)
    dram = {}
    if execute:
        zeros = [np.zeros(t.size, _dt.np_dtype(t.dtype)) for t in prog.params]
        outs = [np.zeros(t.size, _dt.np_dtype(t.dtype)) for t in prog.outputs]
        dram = bind_dram(prog, zeros, outs, partition=0)
    runner = StepRunner(core, dram, ids[0], chip0, execute, prog.steps,
                        options.max_while_iterations, chip_spec=chip, call_host=False)
    topology = system.interconnect()
    records = []
    gen = runner.run()
    reply = None
    while True:
        try:
            arrival = gen.send(reply)
        except StopIteration:
            break
        if isinstance(arrival.step, HostCallback):       # not reached: runner.shared is False
            raise AssertionError("a shared host callback in a timing-only run")
        reply, record = _collective(arrival, ids, topology, dram if execute else None,
                                    options.collective_algorithm)
        records.append(record)
    return make_execution(name, prog, system, ids[:1], runner.records, records)


def _collective(arrival, ids, topology, dram, algorithm):
    """The representative's span of the collective `arrival.step` (every device arrives
    when it does) and its record; with `dram`, the results an identical-input
    collective gives it."""
    from jax_trn.collectives import collective_time
    step: Collective = arrival.step
    n = len(ids)
    groups = [list(g) for g in step.groups] if step.groups else [list(range(n))]
    gid_groups = [[ids[p] for p in g] for g in groups]
    dma_available = spmd.COLLECTIVE_DMA_SHARE if arrival.overlaps else 1.0
    pairs = [(ids[s], ids[t]) for s, t in step.pairs]
    total_ns, nbytes, algo, sent, steps = 0.0, 0, "", 0.0, []
    chip0 = int(topology.chip_of(ids[0]))
    for srcs, dsts in spmd.messages(step):
        shape = tuple(srcs[0].shape) if len(srcs) == 1 else (sum(t.size for t in srcs),)
        dtype = _dt.np_dtype(srcs[0].dtype)
        if step.kind == "collective_permute":
            t = collective_time(step.kind, shape, dtype, [sorted({d for p in pairs for d in p})],
                                topology, algorithm, pairs=pairs, dma_available=dma_available)
        else:
            t = collective_time(step.kind, shape, dtype, gid_groups, topology, algorithm,
                                dma_available=dma_available)
        steps += [(s.label, total_ns + s.start_ns, total_ns + s.end_ns, s.bytes)
                  for s in t.steps]
        total_ns += t.total_ns
        nbytes += int(t.message_bytes)
        algo = algo or t.algorithm
        sent += t.link_bytes.get(f"chip{chip0}.dma_tx", 0.0)
        if dram is not None:
            for src, dst in zip(srcs, dsts):
                x = np.asarray(dram[src.name]).reshape(src.shape)
                spmd.write(dram, dst, symmetric_result(step, x, groups))
    start = max(arrival.t, arrival.ready if arrival.ready is not None else arrival.t)
    on_chip = sum(1 for d in ids if int(topology.chip_of(d)) == chip0)
    if step.kind == "collective_permute" and not any(t == 0 for _, t in step.pairs) \
            and not any(s == 0 for s, _ in step.pairs):
        issued = spmd.Issued(start, start)           # partition 0 takes no part
    else:
        rate = sent / on_chip / total_ns if total_ns > 0 else 0.0
        issued = spmd.Issued(start, start + total_ns, rate)
    record = profiler.CollectiveRecord(
        name=step.name, kind=step.kind, algorithm=algo, devices=list(ids),
        groups=tuple(tuple(g) for g in gid_groups), start_ns=float(start),
        end_ns=float(start + total_ns), bytes=nbytes, arrival_ns=(float(arrival.t),) * n,
        ops=tuple(step.ops), context=arrival.context, steps=tuple(steps),
        spans=((ids[0], float(start), float(start + total_ns)),))
    return issued, record


def symmetric_result(step: Collective, x: np.ndarray, groups) -> np.ndarray:
    """Partition 0's result of `step` when every device's operand is `x`."""
    group = next(g for g in groups if 0 in g) if step.kind != "collective_permute" else [0]
    g, rank = len(group), group.index(0)
    if step.kind == "all_reduce":
        return x * x.dtype.type(g) if step.op == "add" else x
    if step.kind == "all_gather":
        return np.concatenate([x] * g, axis=step.dim)
    if step.kind == "reduce_scatter":
        y = x * x.dtype.type(g) if step.op == "add" else x
        return np.split(y, g, axis=step.dim)[rank]
    if step.kind == "all_to_all":
        return np.concatenate([np.split(x, g, axis=step.split_dim)[rank]] * g,
                              axis=step.concat_dim)
    if step.kind == "collective_permute":
        return x if any(t == 0 for _, t in step.pairs) else np.zeros_like(x)
    raise ValueError(f"{step.name}: unknown collective kind {step.kind!r}")
