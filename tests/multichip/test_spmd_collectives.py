"""The SPMD runtime's own collective paths (`runtime/spmd.py`) against the algorithms'
plans (`collectives.run_collective`): same bits, same timing."""
from __future__ import annotations

from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from jax_trn.collectives import run_collective
from jax_trn.runtime import spmd
from jax_trn.systems import SYSTEMS

TRN2 = SYSTEMS["trn2.48xlarge"].interconnect()
SWITCH = SYSTEMS["trn3-ultraserver"].interconnect()


@pytest.mark.parametrize("topology,groups", [
    (TRN2, [list(range(0, 128, 3))[:40]]),
    (TRN2, [[0, 9, 17, 33], [1, 2, 64, 100]]),
    (SWITCH, [list(range(0, 1152, 9))]),
])
@pytest.mark.parametrize("algorithm", [None, "ring", "rdh", "mesh", "hierarchical"])
@pytest.mark.parametrize("shape,axis,dtype", [((3, 5), 0, np.float32), ((2, 7, 3), 1, ml_dtypes.bfloat16),
                                              ((6,), 0, np.int32)])
def test_all_gather_is_the_plans_concatenation(topology, groups, algorithm, shape, axis, dtype):
    rng = np.random.default_rng(len(groups[0]))
    arrays = {d: rng.standard_normal(shape).astype(dtype) for g in groups for d in g}
    try:
        want, want_t = run_collective("all_gather", arrays, groups, topology, algorithm, axis=axis)
    except ValueError:                       # the algorithm does not fit these groups
        pytest.skip("algorithm not applicable")
    # partition p is device p (gid = range), so the groups are partitions too
    got, got_t = spmd._run(SimpleNamespace(kind="all_gather", dim=axis), arrays, groups,
                           list(range(1152)), topology, algorithm=algorithm)
    for d in arrays:
        assert got[d].dtype == want[d].dtype and got[d].shape == want[d].shape
        assert got[d].tobytes() == want[d].tobytes()
    assert got_t == want_t
    assert all(got[g[0]] is got[d] for g in groups for d in g)      # one array per group
