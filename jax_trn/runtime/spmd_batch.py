"""SPMD devices batched (issue 14, point 4): one timeline per class of chips.

A program with collectives runs on every device at once (`spmd.drive`). Each device's
timeline depends on the data only through its control decisions (loop predicates,
branch indices); otherwise on the kernels' static facts, on its chip's HBM (shared by
the chip's cores, §1.1, `hw.bandwidth.Hbm`), and on what its collectives give back
(`spmd.Issued`: span and DMA rate). So two chips whose devices sit on the same cores, in
the same order, run identical timelines, bit for bit, for as long as their decisions
and their collectives' spans agree.

`run` therefore times one *leader* chip per class (chips with the same core ids, in the
call's device order) in full, and runs every other device as a *follower* of the device
on the same core of its class's leader chip: numerics only, its kernels' instructions
taking effect in the leader's recorded order (`NeuronCore.replay`, the order a full run
applies them in, so results are bit-identical), its profiler records the leader's with
its own device and chip. A follower checks, at every step, that it is on its leader's
path: the same kernel starting at the same time, the same decision, the same collective
span. If one differs, the call is *diverged*: its outputs and temporaries are cleared
and it is simulated in full, every device timed (`run_full`, the reference path).
Programs with host callbacks always run in full (a diverged call would call the host
twice).

Memory. A device's temporaries are made on first use (`dram.Dram`) and dropped after
the last top-level step that names it (`_frees`): a runner frees it at the start of the
next step, so a device's kernel temporaries are gone before the next device runs, and
only what crosses a collective is alive for all devices at once. Results that only
collectives write (`shareable`) are bound as one read-only array per group where the
group's members get the same bits (an all_gather's, an all_reduce's: `spmd.execute`).
A follower's kernel whose inputs hold the first leader's bits takes its recorded
outputs instead of replaying (`spmd_memo`); a replicated result it writes is one
read-only array that the followers' output buffers adopt (`adopt`).

A follower replays on its leader's core object: every core of a generation computes in
one shared SBUF/PSUM (`Device.core_model`) with the process's one `Numerics`, so the
leader's compiled plans (`hw.plan`, views of that SBUF) are the follower's too; a plan
per kernel per class, not per device (1152 devices' plans held ~0.5 GB).

Followers' kernels wait for the next rendezvous and then replay for many followers at
once, vectorized over a leading device axis (`spmd_vector`), in programs without
data-decided control flow or on-chip loops; otherwise device by device.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from jax_trn import profiler
from jax_trn.hw import dtypes as _dt
from jax_trn.hw.program import Collective, HostCallback, Kernel, host_callbacks, walk_steps

from . import replay, spmd, spmd_vector
from .spmd_memo import Memo
from .dram import Dram
from .steps import StepRunner, _names

__all__ = ["ENABLED", "run", "run_full", "leaders", "adopt"]

# Off: every device timed in full (the reference the tests compare against).
ENABLED = True
# How calls ran: "batched", "diverged" (then run in full), "full" (nothing to share);
# "memo_hits": follower kernels whose outputs `spmd_memo` gave (their inputs matched).
COUNTS: Counter = Counter()
# Off: followers replay every kernel (no `spmd_memo`).
MEMO = True


def run(prog, devices, drams: list[dict], hbms, settings, temps: bool = True,
        exchange=None):
    """Runs `prog` on `devices` (partition p on devices[p], DRAM drams[p]) from
    simulated time 0; `hbms()` gives a fresh {chip: Hbm}. Returns (kernel records in
    device order, collective records). `exchange`: `spmd.drive`'s (devices of other
    processes take part in the collectives)."""
    lead = leaders(devices)
    if (not ENABLED or host_callbacks(prog.steps)
            or all(lead[p] == p for p in range(len(devices)))):
        COUNTS["full"] += 1
        return run_full(prog, devices, drams, hbms(), settings, exchange)
    memo = Memo(prog, _Toucher()) if MEMO else None
    try:
        got = _run_batched(prog, devices, drams, hbms(), settings, lead, memo, exchange)
        COUNTS["batched"] += 1
        return got
    except replay.Diverged:
        COUNTS["diverged"] += 1
        if memo is not None:
            memo.restore()
        _reset(prog, drams)
        if exchange is not None:
            exchange.restart()
        return run_full(prog, devices, drams, hbms(), settings, exchange)


def adopt(prog, outputs, drams) -> None:
    """Output buffers (`outputs[p]`, partition p's, in `prog.outputs` order) whose
    DRAM tensor `spmd_memo` bound to a shared read-only array take that array as their
    host data: one host copy of a replicated result, not one per device. (A call's
    own output arrays are writable; only `spmd_memo` binds read-only outputs.)"""
    for outs, dram in zip(outputs, drams):
        for buf, t in zip(outs, prog.outputs):
            got = dram.get(t.name)
            if got is not None and not got.flags.writeable and buf.data is not None:
                buf.data = got.view(buf.data.dtype)


def leaders(devices) -> list[int]:
    """For each partition, the partition whose timeline it shares: the device on the
    same core of the first chip with the same cores in the same order (itself if its
    chip is that first chip)."""
    by_chip: dict[int, list[int]] = {}
    for p, d in enumerate(devices):
        by_chip.setdefault(d.chip, []).append(p)
    first: dict[tuple, list[int]] = {}
    lead = list(range(len(devices)))
    for parts in by_chip.values():
        key = tuple(devices[p].core for p in parts)
        for p, q in zip(parts, first.setdefault(key, parts)):
            lead[p] = q
    return lead


def run_full(prog, devices, drams, hbms, settings, exchange=None):
    """Every device timed on its own core (the reference path)."""
    runners = []
    for dev, dram in zip(devices, drams):
        core = dev.core_model
        core.begin(hbms[dev.chip])
        runners.append(StepRunner(core, dram, dev.id, dev.chip, True, prog.steps,
                                  settings.max_while_iterations, chip_spec=dev.system.chip))
        runners[-1].shared = len(devices) > 1 or exchange is not None
    collectives = spmd.drive(runners, devices, devices[0].system.interconnect(),
                             algorithm=settings.collective_algorithm, share=shareable(prog),
                             exchange=exchange)
    return [r for run in runners for r in run.records], collectives


def _run_batched(prog, devices, drams, hbms, settings, lead, memo, exchange=None):
    frees = _frees(prog)
    runners: list[StepRunner] = []
    for p, (dev, dram) in enumerate(zip(devices, drams)):
        args = (dram, dev.id, dev.chip, True, prog.steps, settings.max_while_iterations)
        if lead[p] == p:
            core = dev.core_model
            core.begin(hbms[dev.chip])
            runner = _Leader(core, *args, chip_spec=dev.system.chip)
        else:
            leader = runners[lead[p]]
            runner = _Follower(leader, leader.core, *args, chip_spec=dev.system.chip)
        runner.shared, runner.frees, runner.memo = True, frees, memo
        runners.append(runner)
    order = [p for p in range(len(devices)) if lead[p] == p]
    order += [p for p in range(len(devices)) if lead[p] != p]
    settle = None
    if spmd_vector.deferrable(prog):
        followers = [runners[p] for p in order if lead[p] != p]
        for f in followers:
            f.pending = []
        settle = spmd_vector.Deferred(followers, memo, COUNTS, _Toucher()._touches).settle
    collectives = spmd.drive(runners, devices, devices[0].system.interconnect(),
                             algorithm=settings.collective_algorithm, order=order,
                             share=shareable(prog), settle=settle, exchange=exchange)
    return [r for run in runners for r in run.records], collectives


def shareable(prog) -> frozenset[str]:
    """The temporaries only collectives write (no kernel, no host callback): a group
    may share one read-only array of such a result (`spmd.execute`)."""
    toucher, results, written = _Toucher(), set(), set()
    for step in walk_steps(prog.steps):
        if isinstance(step, Collective):
            results |= {t.name for t in step.results}
        elif isinstance(step, (Kernel, HostCallback)):
            written |= toucher._touches(step)[1]
    return frozenset(results & {t.name for t in prog.temps} - written)


def _reset(prog, drams) -> None:
    """Outputs back to zeros and fresh temporaries, as a call finds them."""
    for dram in drams:
        for t in prog.outputs:
            dram[t.name][...] = 0
        if isinstance(dram, Dram):
            dram.reset()
        else:
            for t in prog.temps:
                dram[t.name] = np.zeros(t.size, _dt.np_dtype(t.dtype))


def _frees(prog) -> dict[int, tuple[str, ...]]:
    """{id of a top-level step: the temporaries to drop when it starts} (those whose
    last top-level step came before it), and id(None): those to drop at the end."""
    steps = list(prog.steps)
    temps = {t.name for t in prog.temps}
    last: dict[str, int] = {name: -1 for name in temps}
    toucher = _Toucher()
    for i, step in enumerate(steps):
        for name in toucher.touches(step) & temps:
            last[name] = i
    frees: dict[int, list[str]] = {}
    for name, i in last.items():
        at = id(steps[i + 1]) if i + 1 < len(steps) else id(None)
        frees.setdefault(at, []).append(name)
    return {k: tuple(v) for k, v in frees.items()}


class _Toucher(StepRunner):
    """StepRunner's per-step DRAM names (`_touches`), without a core."""

    def __init__(self):
        self._touch = {}

    def touches(self, step) -> frozenset:
        return self._touches(step)[0]


class _Freeing(StepRunner):
    """Drops each temporary after its last top-level step (see module doc)."""
    frees: dict = {}
    memo: Memo | None = None

    def wait_for(self, step, t: float) -> float:
        self._free(self.frees.get(id(step), ()))
        return super().wait_for(step, t)

    def run(self):
        yield from super().run()
        self._free(self.frees.get(id(None), ()))

    def _free(self, names) -> None:
        self.free_now(names)

    def free_now(self, names) -> None:
        for name in names:
            if isinstance(self.dram, Dram):
                self.dram.free(name)
            else:
                self.dram.pop(name, None)


class _Leader(_Freeing):
    """A device timed in full whose plan, records and collective spans its followers
    share."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.plan = []
        self.issued: list = []

    def issue(self, step, issued) -> None:
        if issued is not None:
            self.issued.append(issued)
        super().issue(step, issued)

    def kernel(self, kernel, t: float, context: str) -> float:
        if self.memo is None or context or not self.memo.wants(kernel):
            return super().kernel(kernel, t, context)
        return self.memo.record(kernel, self.dram, lambda: super(_Leader, self).kernel(
                kernel, t, context))


class _Expected(list):
    """A follower's plan: what it meets is checked against its leader's."""

    def __init__(self, lead_plan: list):
        super().__init__()
        self.lead, self.at = lead_plan, 0

    def take(self, kind: str):
        if self.at >= len(self.lead) or self.lead[self.at][0] != kind:
            raise replay.Diverged(f"expected a {kind} at step {self.at} of the leader's path")
        self.at += 1
        return self.lead[self.at - 1]

    def append(self, entry) -> None:
        if self.take(entry[0]) != entry:
            raise replay.Diverged(f"decision {self.at - 1} differs from the leader's")


class _Follower(_Freeing):
    """A device whose timeline is its leader's: numerics only (see module doc)."""

    def __init__(self, leader: _Leader, *args, **kw):
        super().__init__(*args, **kw)
        self.leader = leader
        self.plan = _Expected(leader.plan)
        self._issued = 0
        # A list: its kernels and frees are queued for `spmd_vector` (run for all
        # followers at the next rendezvous); None: they run as it meets them.
        self.pending: list | None = None

    def _free(self, names) -> None:
        if self.pending is not None:
            if names:
                self.pending.append(("free", names))
        else:
            self.free_now(names)

    def kernel(self, kernel, t: float, context: str) -> float:
        _, recorded, order = self.plan.take(replay.KERNEL)
        rec = self.leader.records[len(self.records)]
        if recorded is not kernel or rec.start_ns != t or rec.context != context:
            raise replay.Diverged(f"{kernel.name} left the leader's timeline")
        if self.pending is not None and not context:
            self.pending.append(("kernel", kernel, order))
        elif self.memo is not None and not context and self.memo.apply(kernel, self.dram):
            COUNTS["memo_hits"] += 1
        else:
            self.core.replay(kernel, order, self.dram)
        self.records.append(profiler.KernelRecord(
                rec.name, self.device_id, rec.start_ns, rec.end_ns, rec.busy_ns, rec.flops,
                rec.hbm_bytes, rec.ops, rec.events, chip=self.chip, core=rec.core,
                kernel=rec.kernel, context=rec.context))
        return rec.end_ns

    def issue(self, step, issued) -> None:
        """The collective's span must be the leader's; no DMA bandwidth is reserved (the
        follower's core keeps no timeline)."""
        if issued is None:
            return
        if issued != self.leader.issued[self._issued]:
            raise replay.Diverged(f"{step.name}: a span other than the leader's")
        self._issued += 1
        self.cc_free = issued.end_ns
        self.in_flight.append((*_names(step), issued.end_ns))
