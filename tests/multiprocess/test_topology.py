"""Issue 17, step 1-2: processes own devices; the coordination service's key-value store."""
from __future__ import annotations

import pytest

from jax_trn.config import Options
from jax_trn.runtime.client import Client
from jax_trn.runtime.kvstore import KVTimeout, LocalKVStore
from jax_trn.runtime.processes import ProcessSplitError, split
from jax_trn.systems import SYSTEMS

from . import launch


@pytest.mark.parametrize("count", [2, 4])
def test_split_gives_each_process_consecutive_whole_chips(count):
    system = SYSTEMS["trn2.48xlarge"]
    owned = []
    for p in range(count):
        client = Client(Options(system=system), split(system, p, count), LocalKVStore())
        assert len(client.devices) == 128
        assert [d.id for d in client.devices] == list(range(128))
        local = client.local_devices
        assert len(local) == 128 // count
        assert all(d.process_index == p and d.addressable for d in local)
        assert {d.process_index for d in client.devices} == set(range(count))
        chips = sorted({d.chip for d in local})
        assert chips == list(range(p * 16 // count, (p + 1) * 16 // count))
        assert client.default_device_assignment(1, 2) == [local[0].id, local[1].id]
        with pytest.raises(LookupError, match="belongs to process"):
            client.local_device(next(d.id for d in client.devices if not d.addressable))
        owned += [d.id for d in local]
    assert sorted(owned) == list(range(128))


def test_split_that_does_not_divide_the_chips_is_refused():
    with pytest.raises(ProcessSplitError, match="16 chips, which 3 processes cannot share"):
        split(SYSTEMS["trn2.48xlarge"], 0, 3)
    with pytest.raises(ProcessSplitError, match="node_id=2"):
        split(SYSTEMS["trn2.48xlarge"], 2, 2)
    with pytest.raises(ProcessSplitError, match="cannot share"):
        split(SYSTEMS["trn2.3xlarge"], 0, 2)        # one chip


def test_local_store_put_get_try_get_timeout():
    kv = LocalKVStore()
    assert kv.try_get("a") is None
    kv.put("a", b"\x00x")
    assert kv.get("a", 1) == b"\x00x" and kv.try_get("a") == b"\x00x"
    with pytest.raises(KVTimeout, match="no value for key 'b'"):
        kv.get("b", 0.05)


_TOPOLOGY = """
import jax_trn
from jax_trn.runtime.client import latest_client
devs = jax.devices()
local = jax.local_devices()
kv = latest_client().kv
kv.put(f"jax_trn/test/{PROCESS_ID}", bytes([PROCESS_ID, 0, 255]))
other = kv.get(f"jax_trn/test/{1 - PROCESS_ID}", 30)
try:
    kv.get("jax_trn/test/never", 0.3)
    timeout = None
except Exception as exc:
    timeout = type(exc).__name__
# A program on process 0's devices only, called in both (as JAX's multi-controller
# code does): process 1 owns none of them, runs nothing and gets an array without local
# shards; process 0 runs it alone.
import numpy as np
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh0 = Mesh(np.array([d for d in devs if d.process_index == 0]), ("x",))
out0 = jax.jit(lambda a: a * 3, out_shardings=NamedSharding(mesh0, P()))(jnp.ones(4))
shards = [np.asarray(s.data).tolist() for s in out0.addressable_shards]
report({"count": jax.process_count(), "index": jax.process_index(),
        "global": [(d.id, d.process_index) for d in devs],
        "local": [d.id for d in local], "other": list(other),
        "missing": kv.try_get("jax_trn/test/none"), "timeout": timeout,
        "shards0": shards})
"""


def test_two_processes_see_global_and_local_devices_and_share_the_store():
    reports = launch.run(_TOPOLOGY, 2)
    for p, r in enumerate(reports):
        assert r["count"] == 2 and r["index"] == p
        assert [tuple(x) for x in r["global"]] == [(i, i // 64) for i in range(128)]
        assert r["local"] == list(range(64 * p, 64 * (p + 1)))
        assert r["other"] == [1 - p, 0, 255]
        assert r["missing"] is None and r["timeout"] == "KVTimeout"
        assert r["shards0"] == ([[3.0] * 4] * 64 if p == 0 else [])


def test_a_process_count_that_does_not_divide_the_chips_fails_clearly():
    script = """
try:
    jax.devices("trn")
    report({"error": None})
except Exception as exc:
    report({"error": str(exc)})
"""
    reports = launch.run(script, 3, system="trn2.48xlarge", env={"JAX_PLATFORMS": "trn"})
    for r in reports:
        assert "16 chips, which 3 processes cannot share" in r["error"]
