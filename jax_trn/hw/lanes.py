"""A kernel's replayed numerics on two host threads (issue 14, point 3).

`NeuronCore.replay` applies a kernel's compiled instructions (plan.py) in a recorded
order. TensorE matmuls are most of that work (a transformer block's fwd+bwd: ~6,600
FP32 [128,128]x[128,512] products, about 70% of the wall time) and numpy releases the
GIL in BLAS and in its array loops, so a second thread can apply some instructions
while the calling thread applies others. This module works out once per (kernel,
order) which earlier instructions each one must wait for, and then both threads take
instructions from the same order as they become ready:

- an instruction depends on every earlier instruction (in the recorded order) whose
  bytes it conflicts with: read-after-write, write-after-read, write-after-write, per
  512-byte page of a partition's on-chip bytes (partitions are ignored: conservative)
  and per DRAM tensor the kernel writes (a tensor it only reads conflicts with
  nothing). Only the latest writer and the readers since are kept: finishing them
  implies the earlier ones finished;
- each thread takes the first instruction, in order, that is not taken and whose
  dependencies have finished (looking at most `WINDOW` instructions past the first one
  not taken), runs it, marks it finished. So the split between threads follows the
  real costs on the machine, not an estimate: a busy second core just does less. The
  worker takes only matmuls and instructions touching >= 256 KiB (`_shared`): short
  ones are mostly Python, which two threads only take turns at (the GIL), so the
  caller keeps them; while two threads replay, the GIL changes hands every 0.2 ms.

So every pair of conflicting instructions takes effect in the recorded order and each
instruction computes what it computes sequentially: the results are bit-identical
(tests/sim/test_lanes.py runs kernels both ways). Only under RNE rounding (no random
stream keyed by instruction). Kernels with little work run sequentially
(`MIN_WORK_S`): the handoff would cost more than it gives. Users turn lanes off with
JAX_TRN_SIMULATOR_THREADS=1 (a core's `Numerics.lanes`); `ENABLED = False` turns them
off process-wide (tests).

The worker runs BLAS on the thread the caller's `blas.one_thread` has limited to one
BLAS thread, so the two threads use two cores, never more.
"""
from __future__ import annotations

import os
import queue
import sys
import threading

import numpy as np

from . import isa as _isa
from .sync import accesses

__all__ = ["ENABLED", "MIN_WORK_S", "WINDOW", "LaneSchedule", "lane_schedule"]

ENABLED = True
MIN_WORK_S = 4e-3      # estimated seconds of a kernel below which it runs sequentially
WINDOW = 48            # how far past the first instruction not taken a thread looks
_PAGE = 9              # 512-byte pages of a partition's bytes
_ON_CHIP = ("sbuf", "psum")
_MM_FLOPS_PER_S = 1.0e11      # one core's FP32 GEMM on the tiles TensorE multiplies
_CALL_S = 6e-6                # Python cost of one replayed instruction
_BYTE_S = 2.5e-10             # numpy cost per byte an elementwise instruction touches
_SHARED_BYTES = 1 << 18        # the worker takes instructions touching at least this
_SWITCH_S = 2e-4              # the GIL's switch interval while two threads replay


def _cost(ins, nbytes: int) -> float:
    """Estimated host seconds to replay `ins`, which touches `nbytes` (decides only
    whether a kernel is worth two threads)."""
    if type(ins) is _isa.NcMatmul:
        return 2.0 * ins.rows * ins.m * ins.n / _MM_FLOPS_PER_S + _CALL_S
    return _CALL_S + nbytes * _BYTE_S


def _shared(ins, nbytes: int) -> bool:
    """Instructions the worker takes: those that spend most of their time in numpy
    without the GIL (BLAS; loops over >= 256 KiB). Short ones are mostly Python, which
    two threads only take turns at (measured on the block's attention kernels: a
    64 KiB threshold gives them no speed-up at all)."""
    return type(ins) is _isa.NcMatmul or nbytes >= _SHARED_BYTES


def _keys(region, written_dram: set) -> list:
    """The conflict keys of one accessed region: its on-chip pages, or its DRAM tensor
    when the kernel writes that tensor (else none)."""
    space, _, _, lo, hi = region
    if space in _ON_CHIP:
        return [(space, p) for p in range(lo >> _PAGE, ((hi - 1) >> _PAGE) + 1)]
    return [space] if space in written_dram else []


class LaneSchedule:
    """A plan's closures in the recorded order, with each one's dependencies (positions
    in that order), and the reverse: which later positions wait for each."""
    __slots__ = ("steps", "deps", "shared", "users", "counts")

    def __init__(self, steps: list, deps: list[tuple[int, ...]], shared: bytes):
        self.steps = steps
        self.deps = deps
        self.shared = shared       # 1: the worker may take it too (`_shared`)
        users: list[list[int]] = [[] for _ in deps]
        for k, need in enumerate(deps):
            for d in need:
                users[d].append(k)
        self.users = [tuple(u) for u in users]
        self.counts = [len(need) for need in deps]

    def run(self) -> None:
        """Apply every instruction, on this thread and the worker's. The GIL changes
        hands every `_SWITCH_S` meanwhile (not every 5 ms): a thread back from BLAS
        waits less for the other's Python."""
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, _SWITCH_S))
        try:
            self._run()
        finally:
            sys.setswitchinterval(switch)

    def _run(self) -> None:
        state = _State(len(self.steps), self.counts)
        state.errstate = np.geterr()       # the caller's (a thread's own, numpy 2)
        _worker().put((self, state))
        try:
            _take_until_done(self, state, None)
            with state.cond:
                state.waiting += 1
                while state.finished < len(self.steps) and state.error is None:
                    state.cond.wait(0.05)      # the worker's last instruction
                state.waiting -= 1
        except BaseException as e:       # noqa: BLE001 - e.g. Ctrl-C while waiting:
            state.fail(e)                # return only once the worker's instruction is
        if state.error is not None:      # done and it takes no more
            state.idle.wait()              # no instruction in flight any more
            raise state.error


def lane_schedule(kernel, order, plan) -> LaneSchedule | None:
    """The two-thread schedule of `plan` (closures by instruction index) in `order`, or
    None when the kernel has too little work to pay for the handoff."""
    if not ENABLED:
        return None
    instrs = kernel.instructions
    touched, shared = [], bytearray()
    written_dram: set = set()
    work = 0.0
    for index in order:
        ins = instrs[index]
        if type(ins) not in _STATIC:
            return None             # an instruction whose bytes we cannot name
        reads, writes = accesses(ins)
        nbytes = sum((r[2] - r[1]) * (r[4] - r[3]) for r in reads + writes)
        work += _cost(ins, nbytes)
        shared.append(_shared(ins, nbytes))
        written_dram.update(r[0] for r in writes if r[0] not in _ON_CHIP)
        touched.append((reads, writes))
    if work < MIN_WORK_S:
        return None
    last_write: dict = {}
    readers: dict = {}
    deps = []
    for pos, (reads, writes) in enumerate(touched):
        kw = {k for r in writes for k in _keys(r, written_dram)}
        kr = {k for r in reads for k in _keys(r, written_dram)} - kw
        need = set()
        for k in kr:
            if k in last_write:
                need.add(last_write[k])
        for k in kw:
            if k in last_write:
                need.add(last_write[k])
            need.update(readers.pop(k, ()))
            last_write[k] = pos
        for k in kr:
            readers.setdefault(k, []).append(pos)
        deps.append(tuple(sorted(need)))
    return LaneSchedule([plan[index] for index in order], deps, bytes(shared))


_STATIC = frozenset(getattr(_isa, name) for name in (
    "DmaCopy", "DmaGather", "DmaScatter", "DmaTranspose", "Iota", "TensorPartitionReduce",
    "AffineSelect", "NcMatmul", "NcMatmulMx", "NcTranspose", "Activation", "TensorTensor",
    "TensorScalar", "TensorReduce", "TensorCopy", "Memset", "Select", "ScalarTensorTensor",
    "Exponential", "QuantizeMx", "TensorTensorScan", "Max8", "FindIndex8", "MatchReplace8"))
"""Instruction classes whose operands are all named fields (`sync.accesses`)."""


# --- running ----------------------------------------------------------------------------

class _State:
    """Which instructions are taken, each one's count of unfinished dependencies, the
    first not taken, how many finished, how many threads wait, and the first failure."""
    __slots__ = ("taken", "first", "finished", "waiting", "cond", "error", "errstate",
                 "idle", "pending")

    def __init__(self, n: int, counts: list | None = None):
        self.taken = bytearray(n)
        self.pending = list(counts) if counts is not None else [0] * n  # unfinished deps
        self.first = 0               # every instruction before it is taken
        self.finished = 0
        self.waiting = 0
        self.cond = threading.Condition(threading.Lock())
        self.error: BaseException | None = None
        self.errstate: dict = {}
        self.idle = threading.Event()     # the worker is done with this run

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            if self.error is None:
                self.error = exc
            self.cond.notify_all()

    def take(self, only) -> int | None:
        """The first ready instruction not taken (marked taken), or None when every
        instruction is taken. Blocks while none is ready. Called holding `cond`."""
        taken, pending = self.taken, self.pending
        n = len(taken)
        while True:
            i = self.first
            while i < n and taken[i]:
                i += 1
            self.first = i
            if i >= n or self.error is not None:
                return None
            for k in range(i, min(n, i + WINDOW)):
                if not taken[k] and not pending[k] and (only is None or only[k]):
                    taken[k] = 1
                    return k
            self.waiting += 1
            self.cond.wait(0.05)
            self.waiting -= 1


def _take_until_done(schedule: LaneSchedule, state: _State, only) -> None:
    """Run instructions as they become ready until every one is taken (or one fails);
    `only`: a flag per instruction, those this thread may take (None: all)."""
    steps, users, cond = schedule.steps, schedule.users, state.cond
    pending, k = state.pending, None
    try:
        while True:
            with cond:                   # one hold per instruction: the last one
                if k is not None:        # finished, the next one taken
                    for u in users[k]:
                        pending[u] -= 1
                    state.finished += 1
                    if state.waiting:
                        cond.notify_all()
                k = state.take(only)
            if k is None:
                return
            steps[k]()
    except BaseException as e:           # noqa: BLE001 - re-raised by `run`
        state.fail(e)


_queue: queue.SimpleQueue | None = None
_lock = threading.Lock()


def _worker() -> queue.SimpleQueue:
    """The queue of the process's worker thread (started on first use, a daemon)."""
    global _queue
    with _lock:
        if _queue is None:
            _queue = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(_queue,), name="jax-trn-lane1",
                             daemon=True).start()
    return _queue


def _forget_worker() -> None:
    """A forked child has no worker thread: it starts its own on first use."""
    global _queue
    _queue = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_worker)


def _serve(jobs: queue.SimpleQueue) -> None:
    while True:
        schedule, state = jobs.get()
        try:
            with np.errstate(**state.errstate):
                _take_until_done(schedule, state, schedule.shared)
        finally:
            state.idle.set()
