"""SPMD devices batched (`runtime/spmd_batch.py`): a call timed once per class of chips
gives exactly what timing every device gives (timelines, collectives, results), and a
call that leaves the shared timeline is simulated in full. Runs in a fresh process on a
4-chip Trn3 system (32 devices; the suite's own backend has one chip)."""
from __future__ import annotations

import json

import pytest

from tests.conftest import run_python

CHILD = ("import sys; from tests.multichip.spmd_batch_child import main; "
         "sys.exit(main(['', 'trn3:4']))")


@pytest.fixture(scope="module")
def fingerprints() -> dict:
    r = run_python(CHILD, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["dp_step", "scan_psum", "grouped"])
def test_batched_call_is_bit_identical_to_every_device_timed(fingerprints, name):
    full, batched = fingerprints[name]["full"], fingerprints[name]["batched"]
    assert batched["counts"].pop("batched") == 1 and full["counts"] == {"full": 1}
    assert set(batched["counts"]) <= {"memo_hits"}
    for key in ("simulated_time_s", "events", "n_events", "collectives", "results"):
        assert batched[key] == full[key], key


def test_kernels_after_an_all_gather_and_an_all_reduce_run_once(fingerprints):
    """In the DP step, the loss over the gathered logits and the update of the
    replicated parameters see the same bits on every device: followers take their
    outputs from `spmd_memo` (and the results above are still bit-identical)."""
    counts = fingerprints["dp_step"]["batched"]["counts"]
    assert counts.get("memo_hits", 0) >= 10 * 24    # >= 10 kernels on 24 followers


def test_followers_replay_vectorized_over_devices(fingerprints):
    """Programs without loops or conditionals: followers' kernels wait for the next
    rendezvous and replay many devices at once (`spmd_vector`); with a loop (the scan)
    they replay one by one. Results are the bit-identical ones above."""
    for name in ("dp_step", "grouped"):
        vector = fingerprints[name]["batched"]["vector"]
        assert vector.get("batched", 0) >= 24 and not vector.get("alone"), (name, vector)
    assert fingerprints["scan_psum"]["batched"]["vector"] == {}
    assert fingerprints["dp_step"]["full"]["vector"] == {}


def test_devices_leaving_the_shared_path_are_simulated_in_full(fingerprints):
    full, batched = fingerprints["uneven_while"]["full"], fingerprints["uneven_while"]["batched"]
    batched["counts"].pop("memo_hits", None)   # kernels before the divergence
    assert batched["counts"] == {"diverged": 1}
    for key in ("simulated_time_s", "events", "collectives", "results"):
        assert batched[key] == full[key], key


def test_leaders_are_the_first_chip_with_the_same_cores_in_the_same_order():
    from types import SimpleNamespace as D
    from jax_trn.runtime.spmd_batch import leaders
    devs = [D(chip=c, core=k) for c, k in
            [(0, 0), (0, 1), (1, 0), (1, 1), (2, 1), (2, 0), (3, 0), (4, 1), (4, 0)]]
    assert leaders(devs) == [0, 1, 0, 1, 4, 5, 6, 4, 5]


def test_temporaries_are_made_on_first_use_and_gone_after_free():
    """dram.Dram: a temporary is zeros when first used, costs nothing before, and once
    freed is 'not allocated' (an error), never silently zeros again."""
    from types import SimpleNamespace as T

    import numpy as np

    from jax_trn.hw.isa import IsaError
    from jax_trn.hw.memory import _strided
    from jax_trn.runtime.dram import Dram
    prog = T(temps=[T(name="t", size=8, dtype="float32")], slot_bytes=None, temp_slot={})
    dram = Dram({"p": np.ones(4, np.float32)}, prog)
    assert "t" not in dram
    assert dram["t"].tolist() == [0.0] * 8 and "t" in dram
    dram["t"][:] = 5
    dram.free("t")
    ap = T(tensor="t")
    with pytest.raises(IsaError, match="not allocated"):
        _strided(ap, dram)
    dram.reset()
    assert dram["t"].tolist() == [0.0] * 8


def test_temporaries_sharing_a_slot_start_from_zeros_after_a_free():
    """With a buffer assignment, two temporaries of one slot are views of one array;
    after the first is freed, the second is made in a fresh zeroed slot."""
    from types import SimpleNamespace as T

    import numpy as np

    from jax_trn.runtime.dram import Dram
    temps = [T(name="a", size=4, dtype="float32", nbytes=16),
             T(name="b", size=2, dtype="int32", nbytes=8)]
    dram = Dram({}, T(temps=temps, slot_bytes=[16], temp_slot={"a": 0, "b": 0}))
    dram["a"][:] = 7
    assert np.shares_memory(dram["a"], dram["b"])      # no free: one slot, as on device
    dram.free("a")
    dram.pop("b")
    assert dram["b"].tolist() == [0, 0]


def test_a_slot_is_made_as_long_as_its_tenant_and_grows_keeping_its_bytes():
    """Dram: a slot is as long as the tenant that makes it (not its largest tenant);
    a longer tenant grows it, its bytes kept and the live tenants still views of one
    array: the bytes a full-size slot would hold."""
    from types import SimpleNamespace as T

    import numpy as np

    from jax_trn.runtime.dram import Dram
    temps = [T(name="a", size=2, dtype="float32", nbytes=8),
             T(name="b", size=8, dtype="float32", nbytes=32)]
    dram = Dram({}, T(temps=temps, slot_bytes=[32], temp_slot={"a": 0, "b": 0}))
    dram["a"][:] = 3
    assert dram.slots[0].nbytes == 8
    b = dram["b"]
    assert dram.slots[0].nbytes == 32 and np.shares_memory(dram["a"], b)
    assert b.tolist() == [3, 3, 0, 0, 0, 0, 0, 0]
    dram["a"][:] = 5
    assert b[:2].tolist() == [5, 5]


def test_a_temporary_is_freed_at_the_step_after_its_last_use():
    from types import SimpleNamespace as T
    from jax_trn.runtime import spmd_batch
    steps = [object(), object(), object()]
    uses = {id(steps[0]): {"a", "b"}, id(steps[1]): {"b"}, id(steps[2]): {"c"}}
    prog = T(steps=steps, temps=[T(name=n) for n in "abcd"])
    orig = spmd_batch._Toucher.touches
    spmd_batch._Toucher.touches = lambda self, s: frozenset(uses[id(s)])
    try:
        frees = spmd_batch._frees(prog)
    finally:
        spmd_batch._Toucher.touches = orig
    assert frees == {id(steps[0]): ("d",), id(steps[1]): ("a",), id(steps[2]): ("b",),
                     id(None): ("c",)}
