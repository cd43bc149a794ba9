"""all_reduce in column blocks (collectives/blocked.py) against the whole-buffer plan
(buffers.load -> numerics.execute -> buffers.unload): the same bits for every algorithm,
topology, dtype and op, with blocks narrower than a slot."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from jax_trn.collectives import blocked, buffers, numerics, run_collective
from jax_trn.collectives.api import _plan
from jax_trn.systems import SYSTEMS

TOPOS = {k: SYSTEMS[k].interconnect() for k in ("trn2.48xlarge", "trn3-ultraserver",
                                                 "trn1.32xlarge")}


def _whole(kind_groups, arrays, topo, algorithm, op):
    """The plan on every rank's whole buffer, as run_collective ran it before."""
    groups = np.asarray(kind_groups)
    g, n = groups.shape
    xs = [np.asarray(arrays[int(d)]) for d in groups.ravel()]
    x0 = xs[0]
    plan = _plan("all_reduce", groups, topo, algorithm,
                 buffers.message_bytes("all_reduce", x0.shape, x0.dtype.itemsize, n))
    blocks = np.stack(xs) if x0.ndim else np.stack(xs)[:, None]
    chunk = buffers.chunk_elems("all_reduce", x0.shape, plan, n)
    buf = buffers.load("all_reduce", blocks, plan, n, chunk)
    numerics.execute(plan, buf, op, topo.spec.dma_compute_sources)
    out = buffers.unload("all_reduce", buf, plan, blocks, g, n, chunk)
    return {int(d): out[r].reshape(x0.shape) for r, d in enumerate(groups.ravel())}


@pytest.mark.parametrize("topo", list(TOPOS))
@pytest.mark.parametrize("algorithm", [None, "ring", "rdh", "mesh", "mesh1", "hierarchical",
                                       "kangaring", "ring2d"])
@pytest.mark.parametrize("shape,dtype,op", [((3001,), np.float32, "sum"),
                                            ((7, 33), ml_dtypes.bfloat16, "sum"),
                                            ((), np.float32, "max"), ((50,), np.int32, "sum"),
                                            ((13,), np.bool_, "sum"),
                                            ((1000,), np.float32, "min")])
def test_blocks_give_the_whole_buffers_bits(topo, algorithm, shape, dtype, op, monkeypatch):
    monkeypatch.setattr(blocked, "BLOCK_BYTES", 4096)        # several blocks per slot
    rng = np.random.default_rng(7)
    n = TOPOS[topo].num_devices
    for groups in ([list(range(0, min(n, 128)))], [list(range(0, 16, 2)), list(range(1, 16, 2))],
                   [[0, 5, 9, 14]]):
        arrays = {d: (rng.standard_normal(shape) * 100).astype(dtype) for g in groups for d in g}
        if dtype == np.float32 and op == "sum":
            arrays[groups[0][1]].reshape(-1)[:2] = [np.nan, -0.0]
        try:
            got, _ = run_collective("all_reduce", arrays, groups, TOPOS[topo], algorithm, op=op)
        except ValueError:                   # the algorithm does not fit these groups
            continue
        want = _whole(groups, arrays, TOPOS[topo], algorithm, op)
        for d in arrays:
            assert got[d].shape == want[d].shape and got[d].dtype == want[d].dtype
            assert got[d].tobytes() == want[d].tobytes(), (groups, d)


def test_rows_that_differ_are_kept_per_rank():
    """A plan that leaves ranks with different bits (here forced: per-rank results of a
    hand-made buffer) is not collapsed to one array."""
    from jax_trn.collectives.plan import Plan
    plan = Plan(steps=[], slots=2, total_slots=2, leaf=np.zeros(4, int), leaf_span=1, name="none")
    xs = [np.arange(4, dtype=np.float32) + r for r in range(4)]
    outs = blocked.all_reduce(plan, xs, "sum", 16, 2, 2)
    assert [o.tolist() for o in outs] == [x.tolist() for x in xs]


@pytest.mark.parametrize("algorithm", [None, "ring", "mesh", "hierarchical"])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_a_message_of_parts_is_its_concatenation(algorithm, dtype, monkeypatch):
    """all_reduce_parts (a combined all_reduce's operands, read in place) gives the
    bits and timing of the concatenated message."""
    from jax_trn.collectives import all_reduce_parts
    monkeypatch.setattr(blocked, "BLOCK_BYTES", 4096)
    rng = np.random.default_rng(3)
    topo = TOPOS["trn2.48xlarge"]
    groups = [list(range(0, 32, 2)), list(range(1, 32, 2))]
    sizes = [1, 10, 700, 33, 2]
    parts = {d: [rng.standard_normal(k).astype(dtype) for k in sizes] for g in groups for d in g}
    got, got_t = all_reduce_parts(parts, groups, topo, algorithm)
    whole = {d: np.concatenate(p) for d, p in parts.items()}
    want, want_t = run_collective("all_reduce", whole, groups, topo, algorithm)
    assert got_t == want_t
    for d in parts:
        assert got[d].shape == want[d].shape and got[d].tobytes() == want[d].tobytes()


@pytest.mark.parametrize("sizes,chunk,c0,width", [([1, 10, 700, 33, 2], 37, 0, 5),
                                                  ([1, 10, 700, 33, 2], 37, 30, 7),
                                                  ([250], 50, 13, 1), ([3, 3, 3], 100, 0, 100),
                                                  ([64, 128, 5], 16, 4, 12)])
def test_load_places_each_part_by_its_message_offset(sizes, chunk, c0, width):
    """blocked._load's rectangular pieces put element e of the concatenated message in
    slot e // chunk, column e % chunk, for parts that start and end mid-slot."""
    rng = np.random.default_rng(5)
    flats = [[rng.standard_normal(k).astype(np.float32) for k in sizes] for _ in range(3)]
    slots = -(-sum(sizes) // chunk)
    buf = np.zeros((3, slots, width), np.float32)
    blocked._load(buf, flats, chunk, c0)
    for r, parts in enumerate(flats):
        whole = np.zeros(slots * chunk, np.float32)
        whole[:sum(sizes)] = np.concatenate(parts)
        assert buf[r].tobytes() == whole.reshape(slots, chunk)[:, c0:c0 + width].tobytes()


def test_copies_are_ids_and_results_are_shared_only_when_the_plan_says_so():
    """indirect.compile_plan: a copy step moves no data (no scratch cells in the store),
    and `shared` holds when every rank's final slots are its group's first rank's."""
    from jax_trn.collectives import indirect
    from jax_trn.collectives.plan import LocalReduce, Plan, Xfer
    two = np.array([0, 1])
    gather = [LocalReduce(two, np.array([0, 0]), np.array([[0, 2], [0, 2]]), 1, "sum"),
              Xfer(two, np.array([0, 0]), two[::-1], np.array([1, 1]), 1, False, "swap")]
    comp = indirect.compile_plan(Plan(gather, 2, 3, np.zeros(2, int), 1, "t"), 2, 1)
    assert comp.cells == 2 * 2 + 1 + 2 and not comp.shared      # rows [a0, a1], [a1, a0]
    assert comp.final.tolist() == [[5, 6], [6, 5]]


class _Swaps:
    """`blocked.Split.swap` between threads standing in for processes: round i of
    process k returns what every peer sent k in its round i."""

    def __init__(self, count):
        import threading
        self.count, self.barrier = count, threading.Barrier(count)
        self.boxes: dict = {}

    def split(self, owner_of, me):
        rounds = iter(range(1 << 30))

        def swap(sends):
            i = next(rounds)
            for k, a in enumerate(sends):
                if k != me:
                    self.boxes[i, me, k] = np.array(a)      # a copy, as bytes travel
            self.barrier.wait()
            return [None if k == me else self.boxes[i, k, me] for k in range(self.count)]
        return lambda devs: blocked.Split([owner_of[int(d)] for d in devs], me, self.count, swap)


def _split_run(kind, arrays, groups, topo, algorithm, op, owner_of, count, parts=False):
    """Every process's results of one all_reduce, split over `count` thread-processes."""
    from concurrent.futures import ThreadPoolExecutor
    from jax_trn.collectives import all_reduce_parts
    swaps = _Swaps(count)

    def one(me):
        local = {d: a for d, a in arrays.items() if owner_of[d] == me}
        if parts:
            return all_reduce_parts(local, groups, topo, algorithm, op,
                                    split=swaps.split(owner_of, me))[0]
        return run_collective(kind, local, groups, topo, algorithm, op=op,
                              split=swaps.split(owner_of, me))[0]
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


@pytest.mark.parametrize("algorithm", [None, "ring", "mesh", "hierarchical", "rdh"])
@pytest.mark.parametrize("shape,dtype,op", [((3001,), np.float32, "sum"),
                                            ((7, 33), ml_dtypes.bfloat16, "sum"),
                                            ((), np.float32, "max"), ((5,), np.int32, "sum")])
@pytest.mark.parametrize("count", [2, 3, 4])
def test_split_over_processes_gives_one_process_bits(algorithm, shape, dtype, op, count,
                                                     monkeypatch):
    """An all_reduce whose ranks are spread over processes (each reducing a share of
    the columns, `blocked.Split`) gives each process's ranks the bits one process
    computes, whatever the owners' layout, also when a share has no columns."""
    monkeypatch.setattr(blocked, "BLOCK_BYTES", 4096)
    rng = np.random.default_rng(11)
    topo = TOPOS["trn2.48xlarge"]
    for groups in ([list(range(64))], [list(range(0, 32, 2)), list(range(1, 32, 2))],
                   [[0, 5, 9, 14], [1, 2, 3, 4]]):
        devs = sorted(d for g in groups for d in g)
        owner_of = {d: min(count - 1, i * count // len(devs)) for i, d in enumerate(devs)}
        arrays = {d: (rng.standard_normal(shape) * 100).astype(dtype) for d in devs}
        try:
            want, _ = run_collective("all_reduce", arrays, groups, topo, algorithm, op=op)
        except ValueError:
            continue
        got = _split_run("all_reduce", arrays, groups, topo, algorithm, op, owner_of, count)
        for me, results in enumerate(got):
            assert sorted(results) == [d for d in devs if owner_of[d] == me]
            for d, r in results.items():
                assert r.shape == want[d].shape and r.tobytes() == want[d].tobytes()


def test_split_rows_that_differ_and_parts():
    """Split with per-rank results (a plan that leaves ranks different) and with a
    message of parts: each process gets its ranks' own rows."""
    from jax_trn.collectives.plan import Plan
    plan = Plan(steps=[], slots=2, total_slots=2, leaf=np.zeros(4, int), leaf_span=1, name="none")
    xs = [np.arange(4, dtype=np.float32) + r for r in range(4)]
    swaps = _Swaps(2)
    from concurrent.futures import ThreadPoolExecutor

    def one(me):
        mine = [x if r // 2 == me else None for r, x in enumerate(xs)]
        return blocked.all_reduce(plan, mine, "sum", 16, 2, 2,
                                  swaps.split({r: r // 2 for r in range(4)}, me)(range(4)))
    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(one, range(2)))
    for me, out in enumerate(outs):
        for r in range(4):
            assert (out[r] is None) == (r // 2 != me)
            if out[r] is not None:
                assert out[r].tolist() == xs[r].tolist()
    rng = np.random.default_rng(5)
    topo = TOPOS["trn2.48xlarge"]
    groups = [list(range(16))]
    arrays = {d: [rng.standard_normal(n).astype(np.float32) for n in (7, 300, 1)]
              for d in range(16)}
    from jax_trn.collectives import all_reduce_parts
    want, _ = all_reduce_parts(arrays, groups, topo)
    got = _split_run("all_reduce", arrays, groups, topo, None, "sum",
                     {d: d * 3 // 16 for d in range(16)}, 3, parts=True)
    for results in got:
        for d, r in results.items():
            assert r.tobytes() == want[d].tobytes()


@pytest.mark.parametrize("kind,algorithm", [("reduce_scatter", None), ("reduce_scatter", "ring"),
                                            ("reduce_scatter", "rdh"), ("reduce_scatter", "mesh"),
                                            ("reduce_scatter", "hierarchical"),
                                            ("all_to_all", None), ("all_to_all", "pairwise")])
@pytest.mark.parametrize("dtype,op", [(np.float32, "sum"), (ml_dtypes.bfloat16, "sum"),
                                      (np.float32, "max")])
@pytest.mark.parametrize("count", [2, 3])
def test_whole_buffer_kinds_split_over_processes_give_one_process_bits(kind, algorithm, dtype,
                                                                       op, count):
    """reduce_scatter and all_to_all with their ranks spread over processes (split.whole:
    each process runs the plan on a share of the buffer's columns) give each process's
    ranks the bits one process computes."""
    rng = np.random.default_rng(13)
    topo = TOPOS["trn2.48xlarge"]
    ran = 0
    for groups in ([list(range(32))], [list(range(0, 32, 2)), list(range(1, 32, 2))],
                   [[0, 5, 9, 14], [1, 2, 3, 4]]):
        n = len(groups[0])
        devs = sorted(d for g in groups for d in g)
        owner_of = {d: min(count - 1, i * count // len(devs)) for i, d in enumerate(devs)}
        arrays = {d: (rng.standard_normal((n * 3, 5)) * 100).astype(dtype) for d in devs}
        try:
            want, _ = run_collective(kind, arrays, groups, topo, algorithm, op=op)
        except ValueError:
            continue
        got = _split_run(kind, arrays, groups, topo, algorithm, op, owner_of, count)
        ran += 1
        for me, results in enumerate(got):
            assert sorted(results) == [d for d in devs if owner_of[d] == me]
            for d, r in results.items():
                assert r.shape == want[d].shape and r.tobytes() == want[d].tobytes()
    assert ran
