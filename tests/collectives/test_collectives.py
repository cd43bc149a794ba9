"""Collectives on the topology model: numerics vs numpy, reduction order, algorithm choice,
timing (trainium-hardware.md §4, §5)."""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from jax_trn.collectives import choose_algorithm, collective_time, rdh_order, ring_order, run_collective
from jax_trn.hw.topology import Topology
from jax_trn.systems import SYSTEMS

BF16 = ml_dtypes.bfloat16
TRN2 = SYSTEMS["trn2.48xlarge"].interconnect()          # 16 chips x 8 cores, 4x4 torus
SWITCH = SYSTEMS["trn3-ultraserver"].interconnect()
CHIP_RANKS = [[c * 8 for c in range(16)]]                  # one rank on every chip
TWO_GROUPS = [list(range(16)), list(range(16, 32))]        # cores of chips 0-1 / 2-3
ODD_GROUPS = [[3, 9, 17, 40], [0, 100, 50, 7]]             # non-contiguous, across chips
MULTI = [list(range(32))]                                  # 4 chips x 8 cores


def _data(groups, shape, rng, dtype=np.int32):
    return {d: rng.integers(-50, 50, shape).astype(dtype) for g in groups for d in g}


def _reduce(xs, op):
    return {"sum": np.sum, "max": np.max, "min": np.min}[op](np.stack(xs), axis=0)


CASES = [("ring", TWO_GROUPS), ("mesh", TWO_GROUPS), ("rdh", TWO_GROUPS), ("ring", ODD_GROUPS),
         ("mesh", ODD_GROUPS), ("rdh", ODD_GROUPS), ("hierarchical", MULTI), ("ring2d", MULTI),
         ("kangaring", CHIP_RANKS), ("ring2d", CHIP_RANKS), (None, MULTI), (None, ODD_GROUPS)]


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("algo,groups", CASES)
def test_all_reduce_and_reduce_scatter_exact_on_integers(algo, groups, op):
    rng = np.random.default_rng(0)
    xs = _data(groups, (32, 3), rng)
    ar, _ = run_collective("all_reduce", xs, groups, TRN2, algorithm=algo, op=op)
    rs, _ = run_collective("reduce_scatter", xs, groups, TRN2, algorithm=algo, op=op)
    for g in groups:
        want = _reduce([xs[d] for d in g], op)
        blocks = np.split(want, len(g))
        for q, d in enumerate(g):
            assert ar[d].dtype == np.int32 and np.array_equal(ar[d], want)
            assert np.array_equal(rs[d], blocks[q])


@pytest.mark.parametrize("algo,groups", CASES)
def test_all_gather_concatenates_in_group_order(algo, groups):
    rng = np.random.default_rng(1)
    xs = _data(groups, (2, 5), rng, np.float32)
    out, _ = run_collective("all_gather", xs, groups, TRN2, algorithm=algo, axis=1)
    for g in groups:
        want = np.concatenate([xs[d] for d in g], axis=1)
        assert all(np.array_equal(out[d], want) for d in g)


def test_reduce_scatter_along_another_axis_and_odd_sizes():
    rng = np.random.default_rng(2)
    xs = _data(ODD_GROUPS, (3, 8, 5), rng)
    out, _ = run_collective("reduce_scatter", xs, ODD_GROUPS, TRN2, algorithm="ring", axis=1)
    for g in ODD_GROUPS:
        want = np.split(sum(xs[d] for d in g), 4, axis=1)
        assert all(np.array_equal(out[d], want[q]) for q, d in enumerate(g))
    with pytest.raises(ValueError, match="does not split into 4"):
        run_collective("reduce_scatter", _data(ODD_GROUPS, (6,), rng), ODD_GROUPS, TRN2)


@pytest.mark.parametrize("algo", ["mesh", "pairwise"])
@pytest.mark.parametrize("split,concat", [(0, 0), (1, 2), (2, 0)])
def test_all_to_all(algo, split, concat):
    rng = np.random.default_rng(3)
    xs = _data(ODD_GROUPS, (4, 8, 12), rng)
    out, timing = run_collective("all_to_all", xs, ODD_GROUPS, TRN2, algorithm=algo,
                                 split_axis=split, concat_axis=concat)
    for g in ODD_GROUPS:
        for i, d in enumerate(g):
            want = np.concatenate([np.split(xs[e], 4, axis=split)[i] for e in g], axis=concat)
            assert np.array_equal(out[d], want)
    assert timing.algorithm == f"all_to_all {algo}"


def test_collective_permute_ring_and_zeros_for_non_targets():
    rng = np.random.default_rng(4)
    xs = _data([[0, 8, 16, 24]], (5,), rng)
    out, timing = run_collective("collective_permute", xs, None, TRN2,
                                 pairs=[(0, 8), (8, 16), (16, 0)])
    assert np.array_equal(out[8], xs[0]) and np.array_equal(out[0], xs[16])
    assert np.array_equal(out[16], xs[8])
    assert timing.total_ns > 0


def test_float32_sum_within_the_algorithms_rounding():
    rng = np.random.default_rng(5)
    xs = {d: rng.standard_normal(64).astype(np.float32) for d in MULTI[0]}
    exact = np.sum([xs[d].astype(np.float64) for d in MULTI[0]], axis=0)
    bound = 32 * np.finfo(np.float32).eps * np.sum([np.abs(xs[d]) for d in MULTI[0]], axis=0)
    for algo in ("ring", "mesh", "rdh", "hierarchical"):
        out, _ = run_collective("all_reduce", xs, MULTI, TRN2, algorithm=algo)
        assert np.all(np.abs(out[0] - exact) <= bound), algo
        assert all(np.array_equal(out[d], out[0]) for d in MULTI[0])      # every rank agrees


def _ring_reference(xs, group, order, chunk):
    """Rank q owns chunk q. The ring runs both ways round (§5.3 [CC-INTRA]): the first half
    of the chunk goes round `order`, the second half round the reversed order. A half's
    sum starts at q's successor on its ring and goes round, rounding to bf16 after every
    addition."""
    n, out = len(group), []
    half = chunk // 2
    for q in range(n):
        for h, ring in enumerate((order, order[::-1])):
            p = ring.index(group[q])
            seq = [ring[(p + k) % n] for k in range(1, n + 1)]
            lo = q * chunk + h * half
            acc = xs[seq[0]][lo:lo + half]
            for d in seq[1:]:
                acc = (acc.astype(np.float32) + xs[d][lo:lo + half].astype(np.float32)).astype(BF16)
            out.append(acc)
    return np.concatenate(out)


def test_bf16_ring_all_reduce_rounds_in_ring_order():
    rng = np.random.default_rng(6)
    group = [5, 17, 40, 3, 99, 64, 20, 11]                 # scattered over chips: ring != group order
    xs = {d: (rng.standard_normal(8 * 16) * 10.0 ** rng.uniform(-3, 3, 8 * 16)).astype(BF16) for d in group}
    out, _ = run_collective("all_reduce", xs, [group], TRN2, algorithm="ring")
    order = ring_order(group, TRN2)
    assert order != group
    want = _ring_reference(xs, group, order, 16)
    assert out[group[0]].dtype == BF16
    assert np.array_equal(out[group[0]].view(np.uint16), want.view(np.uint16))
    naive = np.zeros(8 * 16, BF16)                         # group order, one rounding per add
    for d in group:
        naive = (naive.astype(np.float32) + xs[d].astype(np.float32)).astype(BF16)
    assert not np.array_equal(out[group[0]].view(np.uint16), naive.view(np.uint16))


def test_bf16_rdh_reduces_in_butterfly_order():
    # Recursive halving: at distance d = n/2 .. 1 every position p adds its partner p ^ d's
    # partial, rounding to bf16; position q ends with chunk q (q's rank owns it).
    rng = np.random.default_rng(7)
    group = [5, 17, 40, 3, 99, 64, 20, 11]
    xs = {d: (rng.standard_normal(8 * 4) * 10.0 ** rng.uniform(-3, 3, 8 * 4)).astype(BF16) for d in group}
    out, _ = run_collective("all_reduce", xs, [group], TRN2, algorithm="rdh")
    at = rdh_order(group, TRN2)
    part = np.stack([xs[d] for d in at])                   # (position, elements)
    for d in (4, 2, 1):
        part = (part.astype(np.float32) + part[np.arange(8) ^ d].astype(np.float32)).astype(BF16)
    want = np.concatenate([part[at.index(g)][q * 4:(q + 1) * 4] for q, g in enumerate(group)])
    assert np.array_equal(out[group[0]].view(np.uint16), want.view(np.uint16))
    ring, _ = run_collective("all_reduce", xs, [group], TRN2, algorithm="ring")
    assert not np.array_equal(ring[group[0]].view(np.uint16), want.view(np.uint16))


def test_mesh_reduces_in_fp32_then_rounds_once():
    # dma_compute sums up to 16 sources in FP32 (§3.4): 1 + 8 * 2^-9 is exact in fp32 and
    # rounds once; a ring rounding per step loses each 2^-9 against 1.0 in bf16.
    group = list(range(0, 72, 8))[:9]
    xs = {d: np.full(9, 1.0 if i == 0 else 2.0 ** -9, BF16) for i, d in enumerate(group)}
    mesh, _ = run_collective("all_reduce", xs, [group], TRN2, algorithm="mesh")
    assert float(mesh[group[0]][0]) == float(np.float32(1 + 8 * 2.0 ** -9).astype(BF16))
    assert float(mesh[group[0]][0]) != 1.0


@pytest.mark.parametrize("groups", [TWO_GROUPS, ODD_GROUPS, CHIP_RANKS])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_single_step_mesh_all_reduce(groups, op):
    rng = np.random.default_rng(3)
    xs = _data(groups, (7, 3), rng)
    out, t = run_collective("all_reduce", xs, groups, TRN2, algorithm="mesh1", op=op)
    assert t.algorithm == "all_reduce mesh1"
    assert [s.label for s in t.steps] == ["launch", "L0 mesh1 broadcast", "L0 mesh1 reduce"]
    for g in groups:
        want = _reduce([xs[d] for d in g], op)
        assert all(np.array_equal(out[d], want) for d in g)


def test_single_step_mesh_sums_in_the_two_step_mesh_order():
    # Both sum the n buffers in rank order in FP32 batches of 16 (§3.4): same bits.
    rng = np.random.default_rng(4)
    group = [[c * 8 for c in range(16)] + list(range(1, 8))]
    xs = {d: rng.standard_normal(64).astype(BF16) for d in group[0]}
    one, _ = run_collective("all_reduce", xs, group, TRN2, algorithm="mesh1")
    two, _ = run_collective("all_reduce", xs, group, TRN2, algorithm="mesh")
    assert all(np.array_equal(one[d].view(np.uint16), two[d].view(np.uint16)) for d in group[0])
    with pytest.raises(ValueError, match="mesh1 is an algorithm for all_reduce, not for reduce_scatter"):
        run_collective("reduce_scatter", xs, group, TRN2, algorithm="mesh1")


def test_single_step_mesh_only_where_it_wins():
    # §5.3 [CC-INTER]: single-step wins while its extra transfer costs less than the
    # latency it saves: small messages only.
    g = [[c * 8 for c in range(64)]]
    sw = Topology.switch("trn3", 4, 16)
    assert choose_algorithm("all_reduce", 1 << 10, g, sw) == "mesh1"
    assert choose_algorithm("all_reduce", 512 << 10, g, sw) == "mesh"
    small = {a: collective_time("all_reduce", (256,), np.float32, g, sw, a).total_ns for a in ("mesh", "mesh1")}
    big = {a: collective_time("all_reduce", (1 << 17,), np.float32, g, sw, a).total_ns for a in ("mesh", "mesh1")}
    assert small["mesh1"] < small["mesh"] and big["mesh1"] > big["mesh"]


def test_integer_sums_go_through_fp32():
    # §4 [DTYPES]: integer all-reduce is converted to FP32, exact only below 2^24.
    xs = {0: np.array([2 ** 24], np.int32), 8: np.array([1], np.int32)}
    out, _ = run_collective("all_reduce", xs, [[0, 8]], TRN2, algorithm="ring")
    assert out[0][0] == 2 ** 24


# --- algorithm choice --------------------------------------------------------------------

@pytest.mark.parametrize("nbytes,want", [(512 << 10, "mesh"), (8 << 20, "rdh"), (64 << 20, "kangaring")])
def test_choice_by_message_size_on_the_torus(nbytes, want):
    # §5.3: mesh < 1 MB, RDH 1-56 MB, KangaRing beyond.
    assert choose_algorithm("all_reduce", nbytes, CHIP_RANKS, TRN2) == want


def test_choice_on_switch_hierarchy_and_odd_sizes():
    assert choose_algorithm("all_reduce", 1 << 30, [[c * 8 for c in range(144)]], SWITCH) == "mesh"
    assert choose_algorithm("all_reduce", 1 << 30, MULTI, TRN2) == "hierarchical"
    assert choose_algorithm("all_reduce", 8 << 20, [[0, 8, 16]], TRN2) == "ring"    # RDH needs 2^k
    assert choose_algorithm("all_reduce", 1 << 30, [list(range(0, 512, 8))],
                            SYSTEMS["trn2-ultraserver"].interconnect()) == "ring2d"
    assert choose_algorithm("all_to_all", 1 << 30, CHIP_RANKS, TRN2) == "mesh"
    assert choose_algorithm("all_reduce", 1 << 30, [[0, 1, 2, 8]], TRN2) == "ring"  # uneven: flat
    # 16 MB: cores of a chip ring (>= 1 MB); the 4 chips get 2 MB each -> RDH.
    t = collective_time("all_reduce", (1 << 22,), np.float32, MULTI, TRN2)
    assert t.algorithm == "all_reduce hierarchical(ring,rdh)"


def test_override_by_argument_only(monkeypatch):
    # The algorithm is a parameter; the package never reads the environment (the
    # runtime passes JAX_TRN_COLLECTIVE_ALGORITHM down from the options).
    assert collective_time("all_reduce", (64,), np.float32, CHIP_RANKS, TRN2, "ring").algorithm == "all_reduce ring"
    monkeypatch.setenv("JAX_TRN_COLLECTIVE_ALGORITHM", "rdh")
    assert collective_time("all_reduce", (64,), np.float32, CHIP_RANKS, TRN2).algorithm == "all_reduce mesh1"
    with pytest.raises(ValueError, match="power-of-two"):
        collective_time("all_reduce", (64,), np.float32, [[0, 8, 16]], TRN2, "rdh")
    with pytest.raises(ValueError, match="unknown algorithm"):
        collective_time("all_reduce", (64,), np.float32, CHIP_RANKS, TRN2, "bogus")
    with pytest.raises(ValueError, match="pairwise is an algorithm for all_to_all"):
        collective_time("all_reduce", (64,), np.float32, CHIP_RANKS, TRN2, "pairwise")


def test_bad_groups_are_rejected():
    with pytest.raises(ValueError, match="distinct devices"):
        collective_time("all_reduce", (64,), np.float32, [[0, 0]], TRN2)
    with pytest.raises(ValueError, match="distinct devices"):
        collective_time("all_reduce", (64,), np.float32, [[0, 128]], TRN2)
    with pytest.raises(ValueError, match="unknown collective"):
        collective_time("all_sum", (64,), np.float32, [[0, 8]], TRN2)
    with pytest.raises(ValueError, match="kangaring needs"):
        collective_time("all_reduce", (64,), np.float32, MULTI, TRN2, "kangaring")


# --- timing -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
@pytest.mark.parametrize("algo", ["ring", "mesh", "rdh"])
def test_time_grows_with_size(kind, algo):
    if kind == "all_to_all":
        algo = "pairwise" if algo == "ring" else "mesh"
    times = [collective_time(kind, (16 * 4 ** k,), np.float32, CHIP_RANKS, TRN2, algo).total_ns
             for k in range(2, 9)]
    assert all(a < b for a, b in zip(times, times[1:]))


def test_steps_are_contiguous_and_bytes_are_accounted():
    t = collective_time("all_gather", (1 << 14,), np.float32, CHIP_RANKS, TRN2, "ring")
    ends = [s.end_ns for s in t.steps]
    assert all(a.end_ns == b.start_ns for a, b in itertools.pairwise(t.steps))
    assert t.total_ns == ends[-1] and len(t.steps) == 1 + 15
    # Ring all-gather both ways round: each of the 16 ring links carries 15 half chunks
    # of 64 KiB in each direction (32 directed links).
    ring_links = {k: v for k, v in t.link_bytes.items() if "dma" not in k}
    assert len(ring_links) == 32 and set(ring_links.values()) == {15 * 2 * (1 << 14)}
    assert t.group_size == 16 and t.message_bytes == 16 * 4 * (1 << 14)


def test_ring_step_is_one_hop_plus_transfer():
    spec = TRN2.spec
    nbytes = 1 << 20
    t = collective_time("all_gather", (nbytes // 4,), np.float32, CHIP_RANKS, TRN2, "ring")
    step = t.steps[1].end_ns - t.steps[1].start_ns
    # half of the chunk each way round (§5.3: rings use both directions of a link)
    assert step == pytest.approx(spec.hop_ns + nbytes / 2 / TRN2.link_bw[0])


def test_contention_slows_shared_links():
    alone = collective_time("collective_permute", (1 << 16,), np.float32, [[0, 8]], TRN2,
                            pairs=[(0, 8)]).total_ns
    # core 1 of chip 0 -> chip 2 goes chip0.+d1, chip1.+d1: it shares chip0.+d1 with 0 -> 8
    shared = collective_time("collective_permute", (1 << 16,), np.float32, [[0, 8]], TRN2,
                             pairs=[(0, 8), (1, 16)]).total_ns
    apart = collective_time("collective_permute", (1 << 16,), np.float32, [[0, 8]], TRN2,
                            pairs=[(0, 8), (16, 24)]).total_ns
    assert apart == pytest.approx(alone)
    assert shared > alone * 1.5


def test_less_dma_bandwidth_is_slower():
    full = collective_time("all_reduce", (1 << 20,), np.float32, MULTI, TRN2)
    shared = collective_time("all_reduce", (1 << 20,), np.float32, MULTI, TRN2, dma_available=0.25)
    assert shared.total_ns > full.total_ns


def test_trn3_switch_vs_torus_latency_claims():
    # [SEED-AIM201]: all-gather latency up to 6x lower, all-reduce up to 2x lower than
    # the torus. The switch traversal is derived from the first (spec.py), so the
    # all-reduce ratio is the check: the local reduce of 64 buffers does not shrink.
    sw, to = Topology.switch("trn3", 4, 16), Topology.torus("trn3", (4, 4, 4))
    g = [[c * 8 for c in range(64)]]
    a = collective_time("all_gather", (4,), np.float32, g, sw)
    b = collective_time("all_gather", (4,), np.float32, g, to)
    assert a.algorithm == b.algorithm == "all_gather mesh"
    assert b.total_ns / a.total_ns == pytest.approx(6.0, rel=0.05)
    a = collective_time("all_reduce", (256,), np.float32, g, sw)
    b = collective_time("all_reduce", (256,), np.float32, g, to)
    assert a.algorithm == b.algorithm == "all_reduce mesh1"
    assert 1.5 <= b.total_ns / a.total_ns <= 2.5


def test_ring_across_efa_nodes_is_one_directed_cycle():
    # [CC-INTER]: the inter-node ring is one directed cycle; NeuronLink rings run both ways.
    cl = Topology.cluster("trn1", nodes=2)
    g = [list(range(0, cl.num_devices, cl.cores_per_chip))]
    t = collective_time("all_gather", (1 << 10,), np.float32, g, cl, "ring")
    efa = {k for k in t.link_bytes if "efa_tx" in k}
    assert len(efa) == 2                                  # one chip per node sends over EFA
    node = collective_time("all_gather", (1 << 10,), np.float32, [g[0][:16]], cl, "ring")
    torus = {k for k in node.link_bytes if ".+d" in k or ".-d" in k}
    assert any(".+d" in k for k in torus) and any(".-d" in k for k in torus)


def test_large_all_reduce_on_trn2_torus_reaches_85_percent_of_link_bound():
    t = collective_time("all_reduce", (128 << 20,), np.float16, CHIP_RANKS, TRN2)
    assert t.algorithm == "all_reduce kangaring"
    assert t.bus_bandwidth >= 0.85 * 4 * TRN2.link_bw[0]


def test_timing_only_scales_to_1152_cores():
    t = collective_time("all_reduce", (1 << 16,), np.float32, [list(range(1152))], SWITCH)
    assert t.algorithm == "all_reduce hierarchical(mesh,mesh)" and t.group_size == 1152


@pytest.mark.slow
def test_numerics_on_all_1152_cores():
    xs = {d: np.full(1152, d % 7, np.float32) for d in range(1152)}
    out, _ = run_collective("all_reduce", xs, [list(range(1152))], SWITCH)
    assert np.all(out[1151] == sum(d % 7 for d in range(1152)))


def test_timing_only_matches_the_timing_of_a_real_run():
    rng = np.random.default_rng(8)
    for kind, shape in (("all_reduce", (64, 3)), ("all_gather", (4, 3)), ("reduce_scatter", (64, 3)),
                        ("all_to_all", (64, 3))):
        xs = _data(MULTI, shape, rng, np.float32)
        _, ran = run_collective(kind, xs, MULTI, TRN2)
        alone = collective_time(kind, shape, np.float32, MULTI, TRN2)
        assert ran == alone, kind
