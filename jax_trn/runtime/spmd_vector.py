"""Followers' kernels replayed for many devices at once (issue 14, point 4).

`spmd_batch` times one leader per class of chips and replays every other device's
kernels in its leader's order (numerics only). Device by device, a data-parallel step
on 1,152 NeuronCores is ~35,000 replays of small kernels, each paying its Python per
instruction. Here a follower does not replay when it reaches a kernel: it queues the
kernel (and the temporaries it frees, in order: `spmd_batch._Follower._free`), and when every
device has arrived at the next collective, or at the end (`spmd.drive`'s `settle`),
the queues run step by step across groups of `GROUP` followers (one group's
temporaries alive at a time): a kernel whose inputs `spmd_memo`
recognises takes its recorded outputs, as before; the followers left with the same
kernel in the same order replay it together, in chunks, on a `hw.batch.BatchCore`
(one numpy call per instruction step for the whole chunk; the bits each device gets
alone, tests/sim/test_batch.py). The temporaries such a kernel writes first are made
as rows of one zeroed array (`Deferred._stacked`), so the chunk's DMAs read and write
every device's tensor through one view instead of one per device.

Only programs without data-decided control flow and without on-chip loops defer
(`deferrable`): a decision reads a follower's DRAM between kernels, and an on-chip
loop's kernels keep carries in SBUF from one kernel to the next, which a batch's
memories (fresh per kernel) do not hold. Under stochastic rounding (a random stream
keyed per instruction and core) followers replay one by one.

A chunk holds as many devices as fit `BUDGET` bytes of batched SBUF + PSUM (the byte
ranges the kernel's tiles touch, `hw.batch.span`); a kernel whose ranges are too large
for two devices replays one device at a time. The batch cores and their compiled plans
are kept across calls (`_CACHE`, by kernel and chunk size, within `CACHE_BYTES`).
"""
from __future__ import annotations

from collections import Counter, OrderedDict

import numpy as np

from jax_trn.hw import dtypes as _dt
from jax_trn.hw import plan as _plan
from jax_trn.hw.batch import BatchCore, span
from jax_trn.hw.program import Case, Loop, While, walk_steps

from .dram import Dram

__all__ = ["ENABLED", "BUDGET", "Deferred", "deferrable", "COUNTS"]

ENABLED = True
BUDGET = 32 << 20          # bytes of batched SBUF + PSUM per chunk
GROUP = 64                 # followers whose queues run together
CACHE_BYTES = 128 << 20    # batch cores kept across calls
# "batched": kernel replays run in a batch (per device), "alone": replayed one by one
COUNTS: Counter = Counter()


def deferrable(prog) -> bool:
    """Whether followers of `prog` may defer their kernels (see the module doc)."""
    return ENABLED and not any(isinstance(s, (While, Case, Loop)) for s in walk_steps(prog.steps))


class Deferred:
    """The queued work of `followers` (objects with `pending`, `dram`, `core` and
    `free_now(names)`); `memo`: the call's `spmd_memo.Memo` or None; `hits` counts its
    hits (a Counter key "memo_hits"); `touches(kernel)`: (DRAM names it names, those it
    writes)."""

    def __init__(self, followers, memo, hits: Counter, touches):
        self.followers, self.memo, self.hits, self.touches = followers, memo, hits, touches
        self.stacks: dict[tuple, tuple] = {}      # (name, member ids) -> rows made
        self.named: dict[str, list] = {}          # name -> its keys in `stacks`

    def settle(self) -> None:
        queued = [f for f in self.followers if f.pending]
        for at in range(0, len(queued), GROUP):
            self.stacks, self.named = {}, {}
            self._run(queued[at:at + GROUP])
        self.stacks, self.named = {}, {}
        for f in queued:
            f.pending.clear()

    def _run(self, queues) -> None:
        """The queues of a group of followers, step by step across them: so only their
        temporaries are alive at a time, and the next group reuses that memory."""
        longest = max(len(f.pending) for f in queues)
        for j in range(longest):
            groups: dict[tuple, tuple] = {}
            for f in queues:
                if j >= len(f.pending):
                    continue
                action = f.pending[j]
                if action[0] == "free":
                    f.free_now(action[1])
                    for name in action[1]:      # its rows' array may go once all have
                        for key in self.named.pop(name, ()):
                            self.stacks.pop(key, None)
                    continue
                _, kernel, order = action
                if self.memo is not None and self.memo.apply(kernel, f.dram):
                    self.hits["memo_hits"] += 1
                    continue
                groups.setdefault((id(kernel), id(order)), (kernel, order, []))[2].append(f)
            for kernel, order, members in groups.values():
                self._replay(kernel, order, members)

    def _replay(self, kernel, order, members) -> None:
        core = members[0].core
        size = _chunk(kernel, core.spec, len(members))
        if size < 2 or core.numerics.rounding != "rne":
            for f in members:
                f.core.replay(kernel, order, f.dram)
            COUNTS["alone"] += len(members)
            return
        for at in range(0, len(members), size):
            chunk = members[at:at + size]
            if len(chunk) == 1:
                chunk[0].core.replay(kernel, order, chunk[0].dram)
                COUNTS["alone"] += 1
                continue
            batch, steps = _CACHE.get(kernel, core, len(chunk))
            batch.drams = [f.dram for f in chunk]
            batch.stacked = self._stacked(kernel, chunk)
            try:
                for index in order:
                    steps[index]()
            finally:
                batch.drams, batch.stacked = [], {}
            COUNTS["batched"] += len(chunk)

    def _stacked(self, kernel, chunk) -> dict:
        """The DRAM tensors of `kernel` that every device of `chunk` holds as a row of
        one array (`hw.batch.BatchCore.stacked`): one array they all hold (a replicated
        result `spmd_memo` bound), rows this group made earlier, and the temporaries
        the kernel writes first, made here as rows of one zeroed array (as `Dram`
        makes them: zeros, in the temporary's slot)."""
        names, written = self.touches(kernel)
        ids = tuple(map(id, chunk))
        got = {}
        for name in names:
            arrays = [dict.get(f.dram, name) for f in chunk]
            first = arrays[0]
            if first is not None and all(a is first for a in arrays):
                if first.ndim == 1 and first.flags.c_contiguous:
                    got[name] = (first, 0, first.size)
                continue
            mine = self.stacks.get((name, ids))
            if mine is not None:
                if all(a is b for a, b in zip(arrays, mine[1])):
                    got[name] = mine[0]
                continue
            if name in written and all(a is None and _fresh(f.dram, name) for a, f in
                                       zip(arrays, chunk)):
                got[name] = self._make(name, chunk, ids)
        return got

    def _make(self, name: str, chunk, ids: tuple) -> tuple:
        t = chunk[0].dram.temps[name]
        dtype = _dt.np_dtype(t.dtype)
        rows = np.zeros((len(chunk), t.nbytes), np.uint8)
        arrays = []
        for f, row in zip(chunk, rows):
            dram = f.dram
            if dram.slot_bytes is not None:
                dram.slots[dram.temp_slot[name]] = row
            value = row.view(dtype)
            dict.__setitem__(dram, name, value)
            arrays.append(value)
        typed = rows.view(dtype)
        entry = (typed, t.nbytes, typed.shape[1])
        self.stacks[(name, ids)] = (entry, arrays)
        self.named.setdefault(name, []).append((name, ids))
        return entry


def _fresh(dram, name: str) -> bool:
    """Whether `dram` would make temporary `name` now, as zeros in an empty slot."""
    if not isinstance(dram, Dram) or name not in dram.temps or name in dram.freed:
        return False
    if dram.slot_bytes is None:
        return True
    slot = dram.temp_slot.get(name)
    return slot is not None and slot not in dram.slots


def _chunk(kernel, spec, n: int) -> int:
    per_device = spec.pmax * sum(hi - lo for ranges in _spans(kernel).values()
                                 for lo, hi in ranges)
    return min(n, BUDGET // max(per_device, 1))


_SPANS: dict[int, tuple] = {}


def _spans(kernel) -> dict:
    got = _SPANS.get(id(kernel))
    if got is None or got[0] is not kernel:
        if len(_SPANS) > 4096:
            _SPANS.clear()
        got = _SPANS[id(kernel)] = (kernel, span(kernel))
    return got[1]


class _Cache:
    """(BatchCore, compiled plan) per (kernel, generation, numerics, chunk size), least
    recently used dropped beyond `CACHE_BYTES`."""

    def __init__(self):
        self._items: OrderedDict[tuple, tuple] = OrderedDict()
        self._bytes = 0

    def get(self, kernel, core, size: int):
        key = (id(kernel), core.spec.name, id(core.numerics), size)
        got = self._items.get(key)
        if got is not None and got[0] is kernel and got[1] is core.numerics:
            self._items.move_to_end(key)
            return got[2], got[3]
        batch = BatchCore(core.spec, core.numerics, size, _spans(kernel))
        steps = _plan.kernel_plan(kernel, batch)
        nbytes = sum(m.data.nbytes for m in batch._mems.values())
        if got is not None:
            self._bytes -= got[4]
        self._items[key] = (kernel, core.numerics, batch, steps, nbytes)
        self._bytes += nbytes
        while self._bytes > CACHE_BYTES and len(self._items) > 1:
            _, old = self._items.popitem(last=False)
            self._bytes -= old[4]
        return batch, steps


_CACHE = _Cache()
