"""The algorithm table (jax_trn.collectives.ALGORITHMS): every algorithm builds working
plans for the collectives it claims, refuses the others by name, and the names are what
the options validate JAX_TRN_COLLECTIVE_ALGORITHM against."""
from __future__ import annotations

import numpy as np
import pytest

from jax_trn.collectives import ALGORITHMS, KINDS, choose_algorithm, run_collective
from jax_trn.systems import SYSTEMS

TRN2 = SYSTEMS["trn2.48xlarge"].interconnect()
CHIP_RANKS = [[c * 8 for c in range(16)]]          # one rank on each chip of the 4x4 torus
WANT = {"all_reduce": lambda xs: sum(xs), "reduce_scatter": lambda xs: sum(xs),
        "all_gather": lambda xs: np.concatenate(xs), "all_to_all": None}


def test_the_table_names_every_algorithm_the_choice_rule_can_pick():
    assert set(ALGORITHMS) == {"ring", "kangaring", "ring2d", "rdh", "mesh", "mesh1",
                               "hierarchical", "pairwise", "direct"}
    assert all(a.name == n and set(a.kinds) <= set(KINDS) for n, a in ALGORITHMS.items())
    for kind in KINDS:
        for nbytes in (1 << 10, 8 << 20, 256 << 20):
            assert kind in ALGORITHMS[choose_algorithm(kind, nbytes, CHIP_RANKS, TRN2)].kinds


@pytest.mark.parametrize("name", [n for n in ALGORITHMS if n != "direct"])
def test_each_algorithm_computes_what_it_claims(name):
    rng = np.random.default_rng(3)
    xs = {d: rng.integers(-9, 9, 64).astype(np.float32) for d in CHIP_RANKS[0]}
    for kind in ALGORITHMS[name].kinds:
        out, timing = run_collective(kind, xs, CHIP_RANKS, TRN2, algorithm=name)
        assert timing.algorithm.startswith(f"{kind} {name}") and timing.total_ns > 0
        inputs = [xs[d] for d in CHIP_RANKS[0]]
        for q, d in enumerate(CHIP_RANKS[0]):
            if kind == "all_to_all":
                want = np.concatenate([np.split(x, 16)[q] for x in inputs])
            elif kind == "reduce_scatter":
                want = np.split(sum(inputs), 16)[q]
            else:
                want = WANT[kind](inputs)
            np.testing.assert_array_equal(out[d], want)


def test_an_algorithm_refuses_a_collective_it_does_not_implement():
    xs = {d: np.ones(64, np.float32) for d in CHIP_RANKS[0]}
    with pytest.raises(ValueError, match="ring is an algorithm for all_reduce, all_gather, "
                                         "reduce_scatter, not for all_to_all; all_to_all "
                                         "takes mesh, pairwise"):
        run_collective("all_to_all", xs, CHIP_RANKS, TRN2, algorithm="ring")
    with pytest.raises(ValueError, match="unknown algorithm 'fastest'"):
        run_collective("all_gather", xs, CHIP_RANKS, TRN2, algorithm="fastest")
