"""A kernel's replayed numerics on two host threads (issue 14, point 3).

`NeuronCore.replay` applies a kernel's compiled instructions (plan.py) in a recorded
order. TensorE matmuls are most of that work (a transformer block's fwd+bwd: ~6,600
FP32 [128,128]x[128,512] products, about half the wall time) and `np.matmul` releases
the GIL, so a second thread can run some of them while the calling thread runs the
rest. This module splits the order into two lanes, worked out once per (kernel,
order):

- lane 0 (the caller) runs every instruction that is not a plain matmul, in order;
- lane 1 (one worker thread shared by the process) runs the matmuls a list scheduler
  gives it (estimated costs below), in order;
- an instruction waits until the other lane has completed every earlier instruction
  (in the recorded order) whose SBUF/PSUM bytes it conflicts with: read-after-write,
  write-after-read, write-after-write, per 512-byte page of a partition's bytes
  (partitions are ignored: conservative). Each wait is one count of the other lane,
  like a semaphore (§2.1).

So every pair of conflicting instructions takes effect in the recorded order and each
instruction computes what it computes sequentially: the results are bit-identical
(tests/sim/test_lanes.py runs kernels both ways). Lane 1 holds only `NcMatmul`
(no DRAM, no random stream); the schedule is used only under RNE rounding. Kernels
with little matmul work run sequentially (`MIN_WORK_S`): the thread handoff would
cost more than it gives. Users turn lanes off with JAX_TRN_SIMULATOR_THREADS=1
(a core's `Numerics.lanes`); `ENABLED = False` turns them off process-wide (tests).

The worker runs BLAS on the thread the caller's `blas.one_thread` has limited to one
BLAS thread, so the two lanes use two cores, never more.
"""
from __future__ import annotations

import os
import queue
import threading

import numpy as np

from . import isa as _isa
from .sync import accesses

__all__ = ["ENABLED", "MIN_WORK_S", "LaneSchedule", "lane_schedule"]

ENABLED = True
MIN_WORK_S = 2e-3      # estimated lane-1 seconds below which a kernel runs sequentially
_PAGE = 9              # 512-byte pages of a partition's bytes
_ON_CHIP = ("sbuf", "psum")
_MM_FLOPS_PER_S = 1.0e11      # one core's FP32 GEMM on the tiles TensorE multiplies
_CALL_S = 6e-6                # Python cost of one replayed instruction
_BYTE_S = 2.5e-10             # numpy cost per byte an elementwise instruction touches
_BYTE_FACTOR = {_isa.DmaTranspose: 5.0}      # the interpreter's gather (measured)


def _lane1(ins) -> bool:
    """Instructions lane 1 may run: engine instructions on SBUF/PSUM tiles alone (no
    DRAM, no random stream: lane 1 runs only under RNE)."""
    return type(ins) in _LANE1


def _cost(ins, regions) -> float:
    """Estimated host seconds to replay `ins` (only the balance between lanes matters)."""
    if type(ins) is _isa.NcMatmul:
        return 2.0 * ins.rows * ins.m * ins.n / _MM_FLOPS_PER_S + _CALL_S
    nbytes = sum((r[2] - r[1]) * (r[4] - r[3]) for r in regions)
    return _CALL_S + nbytes * _BYTE_S * _BYTE_FACTOR.get(type(ins), 1.0)


class _Pages:
    """Per page of on-chip bytes and per lane: the latest (count, finish estimate) of a
    write and of a read. Counts are lane-local: instruction k of a lane is count k+1."""
    __slots__ = ("last",)

    def __init__(self):
        self.last: dict[tuple, list] = {}

    @staticmethod
    def keys(region) -> range:
        space, _, _, lo, hi = region
        return [(space, p) for p in range(lo >> _PAGE, ((hi - 1) >> _PAGE) + 1)]

    def conflicts(self, keys_read, keys_written, lane: int) -> tuple[int, float]:
        """(count, finish) of lane `lane`'s latest access conflicting with these."""
        count, finish = 0, 0.0
        for keys, written in ((keys_read, False), (keys_written, True)):
            for k in keys:
                entry = self.last.get(k)
                if entry is None:
                    continue
                for c, f in (entry[lane][0], entry[lane][1]) if written else (entry[lane][0],):
                    if c > count:
                        count, finish = c, f
        return count, finish

    def record(self, keys_read, keys_written, lane: int, count: int, finish: float):
        for keys, slot in ((keys_read, 1), (keys_written, 0)):
            for k in keys:
                entry = self.last.get(k)
                if entry is None:
                    entry = self.last[k] = [[(0, 0.0), (0, 0.0)], [(0, 0.0), (0, 0.0)]]
                entry[lane][slot] = (count, finish)


class LaneSchedule:
    """Two lanes of (closure, count of the other lane to wait for) built from a plan."""
    __slots__ = ("lanes",)

    def __init__(self, lanes: tuple[list, list]):
        self.lanes = lanes

    def run(self) -> None:
        """Apply every instruction: lane 1 on the worker thread, lane 0 here (which also
        runs lane 1's next instruction itself rather than wait, when none is in flight:
        a worker the OS does not schedule, on a loaded machine, costs no more than
        running sequentially)."""
        state = _State()
        state.errstate = np.geterr()       # the caller's (a thread's own, numpy 2)
        _worker().put((self.lanes[1], state))
        _run_lane0(self.lanes[0], self.lanes[1], state)
        if state.error is not None:
            state.finished.wait()          # no lane-1 instruction in flight any more
            raise state.error


def lane_schedule(kernel, order, plan) -> LaneSchedule | None:
    """The two-lane schedule of `plan` (closures by instruction index) in `order`, or
    None when lane 1 would get too little work to pay for the handoff."""
    if not ENABLED:
        return None
    instrs = kernel.instructions
    pages, lanes = _Pages(), ([], [])
    clock = [0.0, 0.0]              # estimated finish of each lane's latest instruction
    work = [0.0, 0.0]               # estimated busy seconds of each lane
    for index in order:
        ins = instrs[index]
        if type(ins) not in _STATIC:
            return None             # an instruction whose bytes we cannot name
        reads, writes = accesses(ins)
        cost = _cost(ins, reads + writes)
        kr = [k for r in reads if r[0] in _ON_CHIP for k in _Pages.keys(r)]
        kw = [k for r in writes if r[0] in _ON_CHIP for k in _Pages.keys(r)]
        choice = None
        for lane in ((0, 1) if _lane1(ins) else (0,)):
            need, ready = pages.conflicts(kr, kw, 1 - lane)
            finish = max(clock[lane], ready) + cost
            if choice is None or finish < choice[2]:
                choice = (lane, need, finish)
        lane, need, finish = choice
        lanes[lane].append((plan[index], need))
        clock[lane] = finish
        work[lane] += cost
        pages.record(kr, kw, lane, len(lanes[lane]), finish)
    if work[1] < MIN_WORK_S:
        return None
    return LaneSchedule(lanes)


_STATIC = frozenset(getattr(_isa, name) for name in (
    "DmaCopy", "DmaGather", "DmaScatter", "DmaTranspose", "Iota", "TensorPartitionReduce",
    "AffineSelect", "NcMatmul", "NcMatmulMx", "NcTranspose", "Activation", "TensorTensor",
    "TensorScalar", "TensorReduce", "TensorCopy", "Memset", "Select", "ScalarTensorTensor",
    "Exponential", "QuantizeMx", "TensorTensorScan", "Max8", "FindIndex8", "MatchReplace8"))
"""Instruction classes whose on-chip operands are all named fields (`sync.accesses`)."""
_LANE1 = frozenset(getattr(_isa, name) for name in (
    "NcMatmul", "NcTranspose", "Activation", "TensorTensor", "TensorScalar", "TensorReduce",
    "TensorCopy", "Select"))


# --- running ----------------------------------------------------------------------------

class _State:
    """Each lane's completed count, lane 1's next unclaimed instruction, what each lane
    waits for, and the first failure."""
    __slots__ = ("done", "next1", "want", "lock", "cond", "error", "errstate", "finished")

    def __init__(self):
        self.done = [0, 0]
        self.next1 = 0               # lane 1's instructions are claimed in order
        self.want: list = [None, None]     # per thread: (lane, count) it waits for
        self.lock = threading.Lock()
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self.errstate: dict = {}
        self.finished = threading.Event()    # the worker is done with this run

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            if self.error is None:
                self.error = exc
            self.cond.notify_all()

    def complete(self, lane: int, count: int) -> None:
        """Lane `lane` has completed `count` instructions; wake whoever waits for that.
        (A waiter sets `want` before it looks at `done`, and this looks at `want`
        after setting `done`: one of the two sees the other.)"""
        self.done[lane] = count
        for want in self.want:
            if want is not None and want[0] == lane and count >= want[1]:
                with self.cond:
                    self.cond.notify_all()
                return

    def wait(self, waiter: int, lane: int, need: int) -> bool:
        """Thread `waiter` (0: the caller, 1: the worker) waits until lane `lane`
        completed `need` instructions; False on a failure."""
        self.want[waiter] = (lane, need)
        with self.cond:
            while self.done[lane] < need and self.error is None:
                self.cond.wait(0.05)
        self.want[waiter] = None
        return self.error is None

    def claim(self, limit: int) -> int | None:
        """Lane 1's next instruction if below `limit` and none is in flight (either
        thread may run lane 1's instructions, one at a time, in order), else None (or
        -1: one is in flight)."""
        with self.lock:
            j = self.next1
            if j >= limit or self.error is not None:
                return None
            if j != self.done[1]:
                return -1
            self.next1 = j + 1
            return j


def _run_lane0(lane0: list, lane1: list, state: _State) -> None:
    try:
        for count, (step, need) in enumerate(lane0, 1):
            if state.done[1] < need and not _help(lane1, need, state):
                return
            step()
            state.complete(0, count)
        _help(lane1, len(lane1), state)
    except BaseException as e:           # noqa: BLE001 - re-raised by `run`
        state.fail(e)


def _help(lane1: list, need: int, state: _State) -> bool:
    """Until lane 1 completed `need` instructions: run its next one here when none is
    in flight (its own wait is met: it precedes ours in the order), else wait for the
    one in flight. False on a failure."""
    while state.done[1] < need:
        j = state.claim(need)
        if j is not None and j >= 0:
            lane1[j][0]()
            state.complete(1, j + 1)
        elif not state.wait(0, 1, state.done[1] + 1):
            return False
    return state.error is None


def _run_lane1(lane1: list, state: _State) -> None:
    try:
        while (j := state.claim(len(lane1))) is not None:
            if j < 0:                        # lane 0 is running one of ours
                if not state.wait(1, 1, state.done[1] + 1):
                    return
                continue
            step, need = lane1[j]
            if state.done[0] < need and not state.wait(1, 0, need):
                return
            step()
            state.complete(1, j + 1)
    except BaseException as e:           # noqa: BLE001 - re-raised by `run`
        state.fail(e)


_queue: queue.SimpleQueue | None = None
_lock = threading.Lock()


def _worker() -> queue.SimpleQueue:
    """The queue of the process's lane-1 thread (started on first use, a daemon)."""
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
        lane, state = jobs.get()
        try:
            with np.errstate(**state.errstate):
                _run_lane1(lane, state)
        finally:
            state.finished.set()
