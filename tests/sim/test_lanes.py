"""Two-thread replay (hw/lanes.py) gives what sequential replay gives, bit for bit:
random kernels whose tiles overlap in every way (so that a missed conflict changes the
result), the op corpus and the pinned corpus through jit; errors and numpy's error
state reach the caller as they would sequentially."""
from __future__ import annotations

import json
import os
import threading
import time
import warnings

import ml_dtypes
import numpy as np
import pytest

from jax_trn.hw import CHIPS, Kernel, NeuronCore, Numerics, Tile, lanes
from jax_trn.hw import isa
from jax_trn.hw.operands import DramAP, IsaError

from .pinned_corpus import PINNED, comparable, fingerprint_one

BF16 = ml_dtypes.bfloat16


@pytest.fixture
def every_kernel():
    """Two threads for every kernel, however little work it has, the worker taking any
    instruction (so that DMAs and elementwise instructions run on it too)."""
    saved = lanes.MIN_WORK_S, lanes._SHARED_BYTES
    lanes.MIN_WORK_S, lanes._SHARED_BYTES = 0.0, 0
    try:
        yield
    finally:
        lanes.MIN_WORK_S, lanes._SHARED_BYTES = saved


def _sbuf(rng, parts, free, dtype):
    offset = int(rng.choice([0, 128, 256, 512, 640, 1024, 1536]))
    return Tile("sbuf", 0, parts, offset, (free,), dtype)


def _psum(rng, free=128):
    return Tile("psum", 0, 64, int(rng.choice([0, 256, 512, 1024, 2048])), (free,), "float32")


def _random_instr(rng):
    kind = rng.integers(0, 7)
    if kind <= 2:                                  # matmuls: lane 1's bread and butter
        return isa.NcMatmul(dst=_psum(rng), stationary=_sbuf(rng, 128, 64, "bfloat16"),
                            moving=_sbuf(rng, 128, 128, "bfloat16"),
                            accumulate=bool(rng.integers(0, 2)))
    if kind == 3:
        return isa.TensorCopy(dst=_sbuf(rng, 64, 128, str(rng.choice(["bfloat16", "float32"]))),
                              src=_psum(rng))
    if kind == 4:
        return isa.TensorTensor(dst=_sbuf(rng, 64, 128, "bfloat16"),
                                data1=_sbuf(rng, 64, 128, "bfloat16"), data2=_psum(rng),
                                op=str(rng.choice(["add", "multiply", "max"])))
    if kind == 5:
        return isa.Activation(dst=_sbuf(rng, 64, 64, "float32"),
                              data=_sbuf(rng, 64, 64, "bfloat16"), func="tanh")
    if rng.integers(0, 2):
        return isa.DmaCopy(dst=_sbuf(rng, 128, 64, "bfloat16"),
                           src=DramAP("x", int(rng.integers(0, 512)), ((64, 128), (1, 64)),
                                      "bfloat16"))
    return isa.DmaCopy(dst=DramAP("y", 0, ((64, 64), (1, 64)), "float32"),
                       src=_sbuf(rng, 64, 64, "float32"))


def _core(seed):
    core = NeuronCore(CHIPS["trn3"].core, numerics=Numerics())
    rng = np.random.default_rng(seed)
    core.sbuf.data[:, :4096] = rng.normal(size=(128, 2048)).astype(BF16).view(np.uint8)
    core.psum.data[:, :4096] = rng.normal(size=(128, 1024)).astype(np.float32).view(np.uint8)
    dram = {"x": rng.normal(size=64 * 128 + 1024).astype(BF16),
            "y": np.zeros(64 * 64, np.float32)}
    return core, dram


def _state(core, dram):
    return (core.sbuf.data[:, :4096].copy(), core.psum.data[:, :4096].copy(),
            core.psum.by_matmul[:, :4096].copy(), dram["y"].copy())


def _replay_both(kernel, order, seed):
    out = []
    for enabled in (False, True):
        lanes.ENABLED = enabled
        try:
            core, dram = _core(seed)
            with np.errstate(all="ignore"):
                core.replay(kernel, order, dram)
            scheduled = core.plans.lanes(kernel, order, core)
        finally:
            lanes.ENABLED = True
        out.append((_state(core, dram), scheduled))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_random_kernels_replay_alike_on_two_lanes(every_kernel, seed):
    rng = np.random.default_rng(seed)
    kernel = Kernel(f"k{seed}", [_random_instr(rng) for _ in range(120)], {})
    order = tuple(int(i) for i in rng.permutation(120))      # any recorded order
    (ref, none), (got, schedule) = _replay_both(kernel, order, seed)
    assert none is None and schedule is not None and any(schedule.shared)
    for a, b in zip(ref, got):
        np.testing.assert_array_equal(a, b)


class _Worker:
    """Stands in for the worker thread: `absent` never runs (the caller must run
    everything itself), else a thread that naps before each instruction it takes."""

    def __init__(self, absent: bool):
        self.absent = absent

    def put(self, job):
        schedule, state = job
        if self.absent:
            state.idle.set()
            return
        rng = np.random.default_rng(len(schedule.steps))

        def nap(step):
            def run():
                time.sleep(float(rng.uniform(0, 3e-4)))
                step()
            return run
        sleepy = lanes.LaneSchedule([nap(step) for step in schedule.steps], schedule.deps,
                                    schedule.shared)

        def serve():
            with np.errstate(**state.errstate):
                lanes._take_until_done(sleepy, state, sleepy.shared)
            state.idle.set()
        threading.Thread(target=serve, daemon=True).start()


@pytest.mark.parametrize("absent", [True, False], ids=["no-worker", "slow-worker"])
def test_the_caller_runs_everything_when_the_worker_lags(every_kernel, monkeypatch, absent):
    """On a loaded machine the worker may not be scheduled: the caller then takes every
    instruction itself, with the same results."""
    monkeypatch.setattr(lanes, "_worker", lambda: _Worker(absent))
    for seed in range(4):
        rng = np.random.default_rng(100 + seed)
        kernel = Kernel(f"k{seed}", [_random_instr(rng) for _ in range(120)], {})
        order = tuple(int(i) for i in rng.permutation(120))
        (ref, _), (got, schedule) = _replay_both(kernel, order, seed)
        assert schedule is not None and any(schedule.shared)
        for a, b in zip(ref, got):
            np.testing.assert_array_equal(a, b)


def _conflict(a, b) -> bool:
    """Two instructions touch a common byte (any partition, as the schedule assumes)
    and one of them writes it."""
    from jax_trn.hw.sync import accesses
    (ra, wa), (rb, wb) = accesses(a), accesses(b)

    def meet(x, y):
        return x[0] == y[0] and x[3] < y[4] and y[3] < x[4]
    return (any(meet(x, y) for x in wa for y in rb + wb)
            or any(meet(x, y) for x in ra for y in wb))


def test_every_conflict_is_a_dependency(every_kernel):
    """Each instruction waits, directly or through others, for every earlier one in the
    order it conflicts with; the worker takes only matmuls and large instructions."""
    rng = np.random.default_rng(7)
    kernel = Kernel("k", [_random_instr(rng) for _ in range(200)], {})
    order = tuple(int(i) for i in rng.permutation(200))
    core, _ = _core(0)
    schedule = core.plans.lanes(kernel, order, core)
    assert len(schedule.steps) == len(schedule.deps) == 200
    before: list[set] = []
    for pos, deps in enumerate(schedule.deps):
        assert all(d < pos for d in deps)
        before.append(set(deps).union(*(before[d] for d in deps)))
    ins = [kernel.instructions[i] for i in order]
    for j in range(200):
        for i in range(j):
            if _conflict(ins[i], ins[j]):
                assert i in before[j], (i, j)
    for pos, flag in enumerate(schedule.shared):
        if type(ins[pos]) is isa.NcMatmul:
            assert flag


def test_small_kernels_run_sequentially():
    rng = np.random.default_rng(1)
    kernel = Kernel("k", [_random_instr(rng) for _ in range(4)], {})
    core, _ = _core(0)
    assert core.plans.lanes(kernel, (0, 1, 2, 3), core) is None


def test_an_error_on_a_lane_reaches_the_caller(every_kernel):
    """An instruction failing in a replay (a DMA from a DRAM tensor the call does not
    have) raises the IsaError, whichever lane ran it; the worker serves the next replay
    afterwards."""
    core = NeuronCore(CHIPS["trn2"].core, numerics=Numerics())
    st = Tile("sbuf", 0, 128, 0, (64,), "bfloat16")
    mv = Tile("sbuf", 0, 128, 1024, (128,), "bfloat16")
    dst = Tile("psum", 0, 64, 0, (128,), "float32")
    mms = [isa.NcMatmul(dst=dst.with_(offset=o), stationary=st, moving=mv)
           for o in (2048, 4096, 6144)]
    big = Tile("sbuf", 0, 128, 4096, (1024,), "float32")          # 512 KiB: shared
    bad = isa.DmaCopy(dst=big, src=DramAP("absent", 0, ((1024, 128), (1, 1024)), "float32"))
    kernel = Kernel("bad", [*mms, bad], {})
    assert core.plans.lanes(kernel, (0, 1, 2, 3), core) is not None
    with pytest.raises(IsaError, match="not allocated"):
        core.replay(kernel, (0, 1, 2, 3), {})
    core.sbuf.data[:, :2048] = np.random.default_rng(5).integers(0, 64, (128, 2048), np.uint8)
    good = Kernel("good", mms, {})
    core.replay(good, (0, 1, 2), {})
    want = core.psum.data[:64, 2048:2560].copy()
    assert want.any()
    assert all((core.psum.data[:64, o:o + 512] == want).all() for o in (4096, 6144))


def test_one_simulator_thread_runs_every_kernel_in_order(every_kernel):
    """JAX_TRN_SIMULATOR_THREADS=1 (Numerics(lanes=False), runtime/device.py): the same
    kernel that gets two lanes by default runs sequentially, with the same bits."""
    st = Tile("sbuf", 0, 128, 0, (64,), "bfloat16")
    mv = Tile("sbuf", 0, 128, 1024, (128,), "bfloat16")
    mms = [isa.NcMatmul(dst=Tile("psum", 0, 64, o, (128,), "float32"), stationary=st,
                        moving=mv) for o in (0, 2048, 4096, 6144)]
    kernel = Kernel("mm", mms, {})
    outs = []
    for on in (True, False):
        core = NeuronCore(CHIPS["trn2"].core, numerics=Numerics(lanes=on))
        core.sbuf.data[:, :2048] = np.random.default_rng(3).integers(
            0, 64, (128, 2048), dtype=np.uint8)
        assert (core.plans.lanes(kernel, (0, 1, 2, 3), core) is None) is (not on)
        core.replay(kernel, (0, 1, 2, 3), {})
        outs.append(core.psum.data.copy())
    np.testing.assert_array_equal(*outs)


def test_a_failing_instruction_on_the_worker_releases_the_caller():
    """The caller waiting for an instruction the worker runs, which raises, stops and
    re-raises it; the worker serves the next replay afterwards."""
    ran = []

    def boom():
        raise ValueError("the worker's instruction failed")

    def slow():
        time.sleep(0.05)
        ran.append(0)
    schedule = lanes.LaneSchedule([slow, boom, lambda: ran.append(2)], [(), (), (1,)],
                                  b"\x01\x01\x00")
    with pytest.raises(ValueError, match="worker's instruction failed"):
        schedule.run()
    assert 2 not in ran
    ran.clear()
    lanes.LaneSchedule([lambda: ran.append(0), lambda: ran.append(1)], [(), (0,)],
                       b"\x01\x01").run()
    assert ran == [0, 1]


def test_the_worker_keeps_the_callers_numpy_error_state(every_kernel):
    """The worker thread computes under the caller's np.errstate (numpy 2 keeps it per
    thread): an overflow the caller ignores warns nowhere."""
    core = NeuronCore(CHIPS["trn3"].core, numerics=Numerics())
    big = np.full((128, 64), 3e38, np.float32)
    st = Tile("sbuf", 0, 128, 0, (64,), "float32")
    core.sbuf.data[:, :256] = big.view(np.uint8)
    mms = [isa.NcMatmul(dst=Tile("psum", 0, 64, o, (64,), "float32"), stationary=st,
                        moving=st) for o in (0, 2048, 4096, 6144)]
    kernel = Kernel("over", mms, {})
    schedule = core.plans.lanes(kernel, (0, 1, 2, 3), core)
    assert schedule is not None and all(schedule.shared)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="ignore"):
            core.replay(kernel, (0, 1, 2, 3), {})
    assert np.isinf(core.psum.data[:64, :256].view(np.float32)).all()


CORPUS = ["matmul", "reduce", "cast", "where"]


@pytest.mark.parametrize("name", CORPUS)
def test_op_corpus_on_two_lanes(jax, trn, every_kernel, name):
    from .test_plan import assert_same_bits_without
    assert_same_bits_without(jax, trn, name, lanes, warm=True)  # replays run on lanes


@pytest.mark.parametrize("name", ["matmul_bf16", "flax_train_step"])
def test_pinned_corpus_on_two_lanes(jax, every_kernel, name):
    assert comparable(fingerprint_one(jax, name)) == comparable(
        json.loads(PINNED.read_text())[name])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore:os.fork")
def test_a_forked_child_starts_its_own_worker():
    """The worker thread does not survive fork: a child that kept the parent's queue
    would hand lane 1 to nobody (and wait forever on an error)."""
    lanes._worker()
    pid = os.fork()
    if pid == 0:                                    # the child
        os._exit(0 if lanes._queue is None else 1)
    assert os.waitpid(pid, 0)[1] == 0


def test_an_interrupt_while_the_caller_waits_returns_after_the_workers_instruction(monkeypatch):
    """Ctrl-C while the caller waits for the worker's last instruction reaches the
    caller only once that instruction is done (no instruction of this replay may run
    after it returns), and the worker serves the next replay."""
    started = threading.Event()

    class Interrupting(threading.Condition):
        raised = False

        def wait(self, timeout=None):
            if (started.is_set() and not Interrupting.raised
                    and threading.current_thread() is threading.main_thread()):
                Interrupting.raised = True
                raise KeyboardInterrupt
            return super().wait(timeout)

    class State(lanes._State):
        def __init__(self, n, counts=None):
            super().__init__(n, counts)
            self.cond = Interrupting(threading.Lock())
    monkeypatch.setattr(lanes, "_State", State)
    ran = []

    def slow():
        started.set()
        time.sleep(0.2)
        ran.append("slow")
    schedule = lanes.LaneSchedule(
        [lambda: started.wait(2), slow, lambda: ran.append("quick")], [(), (), ()],
        b"\x00\x01\x00")                   # the worker may take only the slow one
    with pytest.raises(KeyboardInterrupt):
        schedule.run()
    assert Interrupting.raised and ran == ["quick", "slow"]
    monkeypatch.undo()
    state = lanes._State(1)
    lanes._worker().put((lanes.LaneSchedule([lambda: ran.append(1)], [()], b"\x01"), state))
    assert state.idle.wait(5) and ran[-1] == 1
