"""Running one program on many devices: SPMD with collectives between kernels.

Every device of an execution interprets the same step list (`steps.StepRunner`)
on its own NeuronCore, from simulated time 0. A `Collective` step is a rendezvous: each
device's runner is a generator that stops there and hands over its arrival time; once
every device has arrived, the collective runs once for all of them on the system's
topology (`jax_trn.collectives.run_collective`: the chosen algorithm's schedule gives
both the numerics, in its reduction order, and the timing over the links), its
results are written into every device's DRAM, and each device resumes at the
collective's end.

Timing. A collective starts when the last member of its replica group arrives (groups
are independent: the groups of a psum over "x" each start with their own slowest
member), and not before each member's previous collective ended (one collective at a
time on a device's CC cores: a simplification of §5.2's "up to 4 concurrent CC
streams"). It takes the algorithm's time.

Overlap (§5.2: collectives run on the CC cores and DMA rings, so they overlap compute
but share the DMA engines). A device hands its operands over and goes on with the
following steps; it waits for the collective's end only at the first step that reads or
writes one of its results, or writes one of its operands (`_StepRunner`'s dependency
check on DRAM tensor names: a kernel's `dram` tensors and the DRAM outputs of its
instructions; a loop's or conditional's tensors and everything nested in it; another
collective's operands and results), and at the end of the program. Numerics are
unaffected: a device's runner stops at the collective (in simulation order) until it has
run for all devices, and what runs before its end in simulated time does not touch its
tensors. DMA sharing, a deterministic model:
  - If a device goes on with an independent kernel right after the collective, the
    collective runs with `dma_available = COLLECTIVE_DMA_SHARE` (16/17) of the DMA
    bandwidth for its whole duration: across queues the DMA engines go round-robin at
    packet boundaries, and collective packets are 64 KiB against compute's default 4 KiB
    (§3.4 [CC-OVERLAP]), so when both stream the collective moves 64 of every 68 KiB.
  - Each device's DMA engines carry the collective's bytes that its chip sends
    (remote writes by the sender, §5.3 [CC-INTRA]; a chip's share split over its
    participating cores) at their average rate over the collective's span: the runner
    reserves that rate on the core's DMA bandwidth timeline (`NeuronCore.dma_bw`), so the
    kernels it overlaps get what is left.
Host callbacks (`hw.program.HostCallback`) that one device makes for all (a callback on
whole arrays under automatic sharding, `step.device`) are rendezvous too: once every
device has reached it, the caller's operands go to the host, the function runs once,
and its results are copied into every device's HBM (`callbacks.shared_spans`).
Memory (issue 14, point 4). An all_gather is its group's concatenation (`_gathered`),
an all_reduce runs in column blocks of bounded size (`collectives.blocked`), a combined
all_reduce reads its operands in place (`collectives.all_reduce_parts`), and a result
no other step writes is bound once per group where its members' bits agree (`share`).
Which devices share their timeline, and run numerics only, is `spmd_batch`'s business.
Device ids. Replica groups and permute pairs name partition ids (SPMD: one replica,
`num_partitions` devices; `use_global_device_ids`); partition p runs on the
executable's p-th device, whose global id places it on the topology.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jax_trn import profiler
from jax_trn.hw import dtypes as _dt
from jax_trn.hw.program import Collective, HostCallback

from . import callbacks

KIND_OPS = {"add": "sum", "maximum": "max", "minimum": "min"}


class CollectiveError(RuntimeError):
    pass


COLLECTIVE_DMA_SHARE = 64 / (64 + 4)   # §3.4 [CC-OVERLAP]: packet round-robin, 64 vs 4 KiB


@dataclass
class Arrival:
    """What a device's runner yields at a collective: the step, its clock `t` (when it
    reached it), `ready` (when its CC cores are free: its previous collective's end) and
    whether it goes on with an independent kernel meanwhile (`overlaps`)."""
    step: Collective
    t: float
    context: str
    ready: float | None = None
    overlaps: bool = False


@dataclass(frozen=True)
class Issued:
    """What a runner gets back for its arrival: the collective's span on this device and
    the DMA rate (bytes/ns) it takes from the device's engines meanwhile."""
    start_ns: float
    end_ns: float
    dma_bytes_per_ns: float = 0.0


def drive(runners, devices, topology, *, algorithm: str | None = None,
          order: list[int] | None = None, share: frozenset[str] = frozenset(),
          settle=None, exchange=None) -> list[profiler.CollectiveRecord]:
    """Runs the runners' generators to completion, executing each collective when
    every device has reached it. Returns the collectives' records. `order`: the
    partitions in the order their runners advance to each rendezvous (default
    0..n-1; `spmd_batch` advances leaders before their followers); `share`: see
    `execute`; `settle()`, if given, is called when every device has arrived, before
    the collective reads their DRAM, and once at the end (`spmd_batch` runs its
    followers' deferred kernels then). `exchange` (`spmd_remote.Exchange`): the
    program's other devices run in other processes; `runners` and `devices` are this
    process's, and each collective runs over every device with the others' operands
    and arrivals from the exchange."""
    gens = [r.run() for r in runners]
    order = list(range(len(gens))) if order is None else order
    pending: list[Arrival | None] = [None] * len(gens)
    for i in order:
        pending[i] = _advance(gens[i], None)
    records = []
    while any(p is not None for p in pending):
        if any(p is None for p in pending):
            done = [i for i, p in enumerate(pending) if p is None]
            waiting = next(p for p in pending if p is not None)
            raise CollectiveError(
                f"devices {done} finished while others wait in {waiting.step.name}: "
                "the devices took different paths through the program's control flow")
        if settle is not None:
            settle()
        steps = {id(p.step) for p in pending}
        if len(steps) > 1:
            names = sorted({p.step.name for p in pending})
            raise CollectiveError(f"devices reached different collectives {names}: the "
                                  "devices took different paths through the program")
        step = pending[0].step
        if isinstance(step, HostCallback):
            if exchange is not None:
                spans = exchange.host_callback(step, pending, runners)
            else:
                spans = _host_callback(step, runners, [p.t for p in pending])
            for i in order:
                pending[i] = _advance(gens[i], spans[i])
            continue
        drams, everyone, arrived, split = [r.dram for r in runners], devices, pending, None
        if exchange is not None:
            split = exchange.split(step)
            arrived, drams = exchange.gather(step, pending, drams, operands=split is None)
            everyone = exchange.devices
            if split is not None:        # the other processes' DRAMs are not needed
                drams = [d if p in exchange.mine else None for p, d in enumerate(drams)]
        issued, record = execute(step, drams, everyone,
                                 [p.t for p in arrived], topology, arrived[0].context,
                                 ready=[p.t if p.ready is None else p.ready for p in arrived],
                                 overlaps=any(p.overlaps for p in arrived),
                                 algorithm=algorithm, share=share, split=split,
                                 keep=exchange.mine if exchange is not None else None)
        if exchange is not None:
            issued = [issued[p] for p in exchange.local]
        records.append(record)
        for i in order:
            pending[i] = _advance(gens[i], issued[i])
    if settle is not None:
        settle()
    if exchange is not None:
        exchange.finish()
    return records


def _host_callback(step: HostCallback, runners, arrivals: list[float]) -> list:
    """Runs a callback partition `step.device` makes for all: its operands, every
    device's results; each device's `callbacks.Span`."""
    k = step.device
    if not 0 <= k < len(runners):
        raise CollectiveError(f"{step.name} is called by partition {k}; the program runs "
                              f"on {len(runners)} devices")
    caller = runners[k]
    if caller.execute:
        callbacks.run(step, caller.dram, [r.dram for r in runners], caller.call_host)
    return callbacks.shared_spans(step, caller.chip_spec, arrivals, k)


def _advance(gen, value) -> Arrival | None:
    try:
        return gen.send(value)
    except StopIteration:
        return None


def execute(step: Collective, drams: list[dict], devices, arrivals: list[float], topology,
            context: str = "", *, ready: list[float] | None = None, overlaps: bool = False,
            algorithm: str | None = None, share: frozenset[str] = frozenset(), split=None,
            keep: frozenset[int] | None = None
            ) -> tuple[list[Issued], profiler.CollectiveRecord]:
    """Runs `step` for all devices (partition p = devices[p]); returns each device's
    span and DMA rate, and the record. `ready[p]`: when p's CC cores are free (default:
    its arrival); `overlaps`: some device computes meanwhile (see module doc);
    `algorithm`: the algorithm to force (JAX_TRN_COLLECTIVE_ALGORITHM), None to choose;
    `share`: result tensors no other step writes: where a group's members get one
    result array (an all_gather's), their DRAMs bind one read-only copy of it instead
    of a copy each (memory: one per group, not one per device). `split` (an all_reduce,
    reduce_scatter or all_to_all over devices of several processes,
    `spmd_remote.Exchange.split`): `drams` holds this process's devices' DRAMs (None
    for the others'), the processes share the work (`collectives.split`), and only this
    process's DRAMs get results. `keep`: the
    partitions whose results are wanted (this process's; default all): an all_gather
    concatenates only their groups' inputs, and no other DRAM is written."""
    n = len(devices)
    gid = [d.id for d in devices]
    ready = list(arrivals) if ready is None else [max(a, r) for a, r in zip(arrivals, ready)]
    groups = [list(g) for g in step.groups] if step.groups else [list(range(n))]
    for g in groups:
        if any(not 0 <= p < n for p in g):
            raise CollectiveError(f"{step.name}: replica group {g} names partitions outside "
                                  f"0..{n - 1}")
    dma_available = COLLECTIVE_DMA_SHARE if overlaps else 1.0
    forced, algorithm = algorithm, ""
    total_ns, nbytes, step_times = 0.0, 0, []
    sent: dict[str, float] = {}
    for srcs, dsts in messages(step):
        held = [p for p in range(n) if drams[p] is not None]
        if len(srcs) > 1:              # one flat message, its parts read in place
            arrays = {gid[p]: [np.asarray(drams[p][t.name]).reshape(-1) for t in srcs]
                      for p in held}
        else:
            arrays = {gid[p]: _read(drams[p], srcs[0]) for p in held}
        results, timing_i = _run(step, arrays, groups, gid, topology, dma_available,
                                 forced, split, None if keep is None else {gid[p] for p in keep})
        bound: dict[int, np.ndarray] = {}
        for p in held if keep is None else [p for p in held if p in keep]:
            if gid[p] in results and all(t.name in share for t in dsts):
                _bind_all(bound, drams[p], dsts, results[gid[p]])
            elif gid[p] in results:
                _write_all(drams[p], dsts, results[gid[p]])
            else:                      # collective_permute: nobody sends to p
                for dst in dsts:
                    write(drams[p], dst, np.zeros(dst.shape, _dt.np_dtype(dst.dtype)))
        # Several messages (a psum of a tuple of dtypes) run one after another.
        step_times += [(s.label, total_ns + s.start_ns, total_ns + s.end_ns, s.bytes)
                       for s in timing_i.steps]
        total_ns += timing_i.total_ns
        nbytes += int(timing_i.message_bytes)
        algorithm = algorithm or timing_i.algorithm
        for link, b in timing_i.link_bytes.items():
            if link.endswith(".dma_tx"):
                sent[link] = sent.get(link, 0.0) + b
    members = groups if step.kind != "collective_permute" else [list(range(n))]
    start_of, ends = {}, list(ready)
    for g in members:
        start = max(ready[p] for p in g)
        for p in g:
            start_of[p] = start
            ends[p] = start + total_ns
    chips = [int(topology.chip_of(d)) for d in gid]
    on_chip = {c: chips.count(c) for c in set(chips)}
    issued = []
    for p in range(n):
        if p not in start_of:
            issued.append(Issued(ready[p], ready[p]))
            continue
        b = sent.get(f"chip{chips[p]}.dma_tx", 0.0) / on_chip[chips[p]]
        issued.append(Issued(start_of[p], ends[p], b / total_ns if total_ns > 0 else 0.0))
    start = min(start_of.values())
    record = profiler.CollectiveRecord(
            name=step.name, kind=step.kind, algorithm=algorithm,
            devices=list(gid), groups=tuple(tuple(gid[p] for p in g) for g in groups),
            start_ns=float(start), end_ns=float(max(ends[p] for p in start_of)), bytes=nbytes,
            arrival_ns=tuple(arrivals), ops=tuple(step.ops), context=context,
            steps=tuple(step_times),
            spans=tuple((gid[p], float(start_of[p]), float(ends[p])) for p in sorted(start_of)))
    return issued, record


def _bind_all(bound: dict, dram: dict, dsts: list, value: np.ndarray) -> None:
    """`value` into tensors `dsts` of a DRAM (as `_write_all` splits it) as flat
    read-only arrays made once per result object (`bound`), shared by every DRAM that
    gets the same object."""
    got = bound.get(id(value))
    if got is None:
        flat, at, got = np.asarray(value).reshape(-1), 0, []
        for t in dsts:
            part = flat[at:at + t.size] if len(dsts) > 1 else flat
            part = part.astype(_dt.np_dtype(t.dtype)).reshape(-1)
            part.flags.writeable = False
            got.append(part)
            at += t.size
        bound[id(value)] = got
        bound[-id(value)] = value              # keeps `value` (and its id) alive
    for t, part in zip(dsts, got):
        dram[t.name] = part


def _run(step, arrays, groups, gid, topology, dma_available=1.0, algorithm=None, split=None,
         wanted=None):
    from jax_trn.collectives import run_collective
    groups_g = [[gid[p] for p in g] for g in groups]
    kw = {"dma_available": dma_available, "algorithm": algorithm}
    if split is not None:
        kw["split"] = split
    first = next(iter(arrays.values()))
    if step.kind == "all_gather" and np.ndim(first):
        return _gathered(arrays, groups_g, step.dim, topology, wanted=wanted, **kw)
    if step.kind in ("all_reduce", "reduce_scatter"):
        op = KIND_OPS.get(step.op)
        if op is None:
            raise CollectiveError(f"{step.name}: a {step.kind} combining with {step.op!r} is "
                                  "not supported by the collective engine (sum, max, min)")
        kw["op"] = op
    if isinstance(first, list):                    # messages(): a combined all_reduce
        from jax_trn.collectives import all_reduce_parts
        return all_reduce_parts(arrays, groups_g, topology, **kw)
    if step.kind in ("all_gather", "reduce_scatter"):
        kw["axis"] = step.dim
    if step.kind == "all_to_all":
        kw["split_axis"], kw["concat_axis"] = step.split_dim, step.concat_dim
    if step.kind == "collective_permute":
        kw["pairs"] = [(gid[s], gid[t]) for s, t in step.pairs]
    return run_collective(step.kind, arrays, groups_g, topology, **kw)


def _gathered(arrays, groups, axis: int, topology, dma_available=1.0, algorithm=None,
              wanted=None):
    """An all_gather's results and timing. It moves data without arithmetic, so every
    member's result is the concatenation of its group's inputs in group order, whatever
    the algorithm: one array per group, shared by its members (no working buffer of
    every rank's slots, which is ranks x group size x input). Its timing is the plan's,
    as `run_collective` prices it (`collective_time`: the same plan). `wanted`: the
    devices whose results are needed (None: all); other groups are not concatenated."""
    from jax_trn.collectives import collective_time
    x0 = np.asarray(arrays[groups[0][0]])
    timing = collective_time("all_gather", x0.shape, x0.dtype, groups, topology, algorithm,
                             dma_available=dma_available)
    results = {}
    for g in groups:
        if wanted is not None and not wanted.intersection(g):
            continue
        got = np.concatenate([np.asarray(arrays[d]) for d in g], axis=axis)
        results.update(dict.fromkeys(g, got))
    return results, timing


def messages(step: Collective) -> list[tuple[list, list]]:
    """(operands, results) of each message the collective sends: an all_reduce of
    several operands of one element type (hlo_passes' combine-all-reduce) goes as one
    flat message, the concatenation of its operands (one algorithm, one latency);
    anything else one message per operand."""
    pairs = list(zip(step.operands, step.results))
    if (step.kind == "all_reduce" and len(pairs) > 1
            and len({t.dtype for t in step.operands}) == 1):
        return [(list(step.operands), list(step.results))]
    return [([src], [dst]) for src, dst in pairs]


def _write_all(dram: dict, dsts: list, value: np.ndarray) -> None:
    if len(dsts) == 1:
        return write(dram, dsts[0], value)
    flat, at = np.asarray(value).reshape(-1), 0
    for t in dsts:
        write(dram, t, flat[at:at + t.size])
        at += t.size


def _read(dram: dict, t) -> np.ndarray:
    return np.asarray(dram[t.name]).reshape(t.shape)


def write(dram: dict, t, value: np.ndarray) -> None:
    """A collective's result `value` into tensor `t` of a device's DRAM."""
    out = dram[t.name]
    out[...] = np.asarray(value).astype(out.dtype).reshape(-1)
