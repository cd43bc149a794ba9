"""Issue 17, step 3-5: collectives over devices of several processes (data- and
tensor-parallel steps, the collectives alone, a program whose devices arrive at
different times) give the bits and the simulated timeline of the same program in one
process; a peer that diverges, fails
or hangs makes the others fail with a clear error, never hang."""
from __future__ import annotations

import functools
import pathlib

import numpy as np
import pytest

from . import launch

_DP_STEP = (pathlib.Path(__file__).parent / "dp_step.py").read_text()


@functools.lru_cache(maxsize=None)
def _run(n: int) -> tuple:
    return tuple(launch.run(_DP_STEP, n))


def _reference_losses() -> tuple[float, float]:
    """dp_step.py's second data-parallel loss and its tensor-parallel loss, in float64
    numpy (the same draws from the same generator)."""
    rng = np.random.default_rng(0)

    def draw(shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32).astype(np.float64)
    X, Y, W = draw((128, 64)), draw((128, 32)), draw((64, 32), 0.1)
    draw((256, 16)), draw((8 * 128, 256)), draw((256, 256), 0.1)      # Z, A, B
    H, O = draw((64, 128), 0.1), draw((128, 32), 0.1)
    grad = 2 * X.T @ (X @ W - Y) / Y.size
    W1 = W - 0.5 * grad
    return (float(np.mean((X @ W1 - Y) ** 2)),
            float(np.mean((np.maximum(X @ H, 0) @ O - Y) ** 2)))


def _same_as_one_process(n: int) -> None:
    (one,) = _run(1)
    dp_loss, tp_loss = _reference_losses()
    np.testing.assert_allclose(one["loss"], dp_loss, rtol=2e-2)
    np.testing.assert_allclose(one["tp_loss"], [tp_loss, tp_loss], rtol=2e-2)
    reports = _run(n)
    local_sets = []
    for p, r in enumerate(reports):
        assert r["digests"] == one["digests"], f"process {p} of {n}: other result bits"
        assert r["timing_only"] == one["timing_only"]
        assert [t["name"] for t in r["timelines"]] == [t["name"] for t in one["timelines"]]
        for t, t1 in zip(r["timelines"], one["timelines"]):
            # Every process records every collective, as the single process does.
            assert t["collectives"] == t1["collectives"], (p, t["name"])
            mine = {k[0] for k in t["kernels"]}
            assert t["kernels"] == [k for k in t1["kernels"] if k[0] in mine], (p, t["name"])
        local_sets.append({k[0] for t in r["timelines"] for k in t["kernels"]})
    # The processes' kernels are the single-process run's, split by device.
    assert set().union(*local_sets) == {k[0] for t in one["timelines"] for k in t["kernels"]}
    assert all(not a & b for i, a in enumerate(local_sets) for b in local_sets[i + 1:])
    # The uneven program's devices reach its psum at different times, and agree on it.
    (uneven,) = [t for t in one["timelines"] if t["name"] == "jit__uneven"]
    arrivals = uneven["collectives"][-1][5]
    assert len(set(arrivals)) > 1


def test_two_processes_match_one_process_bit_for_bit():
    _same_as_one_process(2)


@pytest.mark.slow
def test_four_processes_match_one_process_bit_for_bit():
    _same_as_one_process(4)


_DIVERGE = """
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
devs = {d.id: d for d in jax.devices()}
mesh = Mesh(np.array([devs[0], devs[1], devs[64], devs[65]]), ("d",))
# Process p's devices hold p + 1: the loop runs twice on process 1's, once on process 0's,
# with a psum in every trip.
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")),
                                           np.full((2, 4), PROCESS_ID + 1, np.float32))

def body(a):
    return jax.lax.fori_loop(0, a[0, 0].astype(jnp.int32), lambda i, v: jax.lax.psum(v, "d") * 0.5, a)

f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=P("d"), check_vma=False))
try:
    jax.block_until_ready(f(x))
    report({"error": None})
except Exception as exc:
    report({"error": str(exc)})
"""


def test_processes_on_different_paths_fail_at_once():
    reports = launch.run(_DIVERGE, 2, env={"JAX_TRN_PROCESS_TIMEOUT": "60"}, timeout=120)
    assert "process 1 waits in collective" in reports[0]["error"]
    assert "different paths" in reports[0]["error"]
    assert "process 0 finished the program" in reports[1]["error"]


_PAIR = """
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
devs = {d.id: d for d in jax.devices()}
mesh = Mesh(np.array([devs[0], devs[64]]), ("d",))          # one device of each process
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")),
                                           np.ones((1, 4), np.float32))
"""


_STUCK = _PAIR + """
import time
f = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "d"), mesh=mesh, in_specs=P("d"),
                          out_specs=P("d"), check_vma=False))
if PROCESS_ID == 1:
    time.sleep(4)
start = time.monotonic()
try:
    jax.block_until_ready(f(x))
    report({"error": None, "waited": time.monotonic() - start})
except Exception as exc:
    report({"error": str(exc), "waited": time.monotonic() - start})
"""


def test_a_peer_that_does_not_arrive_fails_the_others_after_the_timeout():
    reports = launch.run(_STUCK, 2, env={"JAX_TRN_PROCESS_TIMEOUT": "1.5"}, timeout=120)
    r0, r1 = reports
    assert "process 1 did not get there within 1.5 s" in r0["error"]
    assert r0["waited"] < 30
    # Process 1 arrives late, finds process 0's operands, then misses its end.
    assert r1["error"] is not None and "process 0" in r1["error"]


@pytest.mark.slow
def test_a_peer_that_died_fails_the_others_with_a_clear_error():
    """Process 1 exits before the collective: process 0 reports DEADLINE_EXCEEDED naming
    it after JAX_TRN_PROCESS_TIMEOUT; JAX's coordination service then ends process 0
    too, once its heartbeat timeout declares process 1 dead (nothing hangs)."""
    script = _STUCK.replace("    time.sleep(4)", "    os._exit(3)")
    (rc0, r0, _), (rc1, _, _) = launch.run(script, 2, env={"JAX_TRN_PROCESS_TIMEOUT": "3"},
                                           expect_ok=False, heartbeat_s=10, timeout=120)
    assert rc1 == 3
    assert r0["error"].startswith("DEADLINE_EXCEEDED: all_reduce.0: process 1 did not get")
    assert r0["waited"] < 20


_TWICE = """
import numpy as np, jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
devs = {d.id: d for d in jax.devices()}
mesh = Mesh(np.array([devs[0], devs[64]]), ("d",))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")),
                                           np.full((1, 4), PROCESS_ID + 1, np.float32))
got = []
for _ in range(2):      # two executables of one program (the cache cleared in between)
    f = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "d"), mesh=mesh, in_specs=P("d"),
                              out_specs=P("d"), check_vma=False))
    got += [np.asarray(f(x).addressable_data(0)).tolist() for _ in range(2)]
    jax.clear_caches()
report(got)
"""


def test_one_program_compiled_twice_keeps_its_calls_apart():
    for r in launch.run(_TWICE, 2):
        assert r == [[[3.0] * 4]] * 4


_CALLBACKS = """
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
devs = {d.id: d for d in jax.devices()}
ids = [0, 1, 64, 65]
mesh = Mesh(np.array([devs[i] for i in ids]), ("d",))
rows = np.arange(16, dtype=np.float32).reshape(4, 4)
mine = [k for k, i in enumerate(ids) if devs[i].process_index == PROCESS_ID]
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")),
                                           rows[mine[0]:mine[-1] + 1], rows.shape)
calls = []

def host(v):
    calls.append(float(v))
    return np.asarray(v * 3 + 1, np.float32)

@jax.jit
def f(x):
    s = jnp.sum(x)                     # a psum across the processes
    jax.debug.print("sum {s}", s=s)
    t = jax.pure_callback(host, jax.ShapeDtypeStruct((), jnp.float32), s)
    return x * t

out = f(x)
report({"out": [np.asarray(s.data).tolist() for s in out.addressable_shards],
        "calls": calls})
"""


def test_host_callbacks_made_for_devices_of_several_processes():
    (one,) = launch.run(_CALLBACKS, 1)
    two = launch.run(_CALLBACKS, 2)
    assert one["calls"] == [120.0]
    # The process of the calling device calls the host once; every device gets its result.
    assert sorted(len(r["calls"]) for r in two) == [0, 1]
    assert [row for r in two for row in r["out"]] == one["out"]


_KEYS = _PAIR + """
from jax._src.distributed import global_state
f = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "d"), mesh=mesh, in_specs=P("d"),
                          out_specs=P(), check_vma=False))
for _ in range(5):
    jax.block_until_ready(f(x))
from jax.experimental import multihost_utils
multihost_utils.sync_global_devices("calls done")
keys = sorted(k for k, _ in global_state.client.key_value_dir_get("trn:jax_trn/cc/"))
report({"keys": keys})
"""


def test_a_process_deletes_its_keys_of_the_calls_every_peer_is_past():
    """Five calls of one program: each process keeps its keys of the last two calls
    only (the coordination service would otherwise hold every call's)."""
    reports = launch.run(_KEYS, 2)
    calls: dict = {}                     # program -> its calls with keys left
    for key in reports[0]["keys"]:       # trn:jax_trn/cc/<program>/<call>/<process>/<i>
        program, call = key.split("/")[2:4]
        calls.setdefault(program, set()).add(int(call))
    assert any(max(c) == 5 for c in calls.values()), calls       # f, called 5 times
    for program, left in calls.items():
        assert left <= {max(left) - 1, max(left)}, (program, sorted(left))


def test_processes_with_different_settings_fail_at_their_first_shared_program():
    """Process 1 runs with another matmul precision: the first program spanning both
    fails in each with an error naming the setting and both values, not a hang or
    silently different bits."""
    script = _PAIR + """
try:
    jax.block_until_ready(jax.jit(lambda a: a.sum())(x))
    report({"error": None})
except Exception as exc:
    report({"error": str(exc)})
"""
    reports = launch.run(script, 2, expect_ok=False,
                         env_per_process={1: {"JAX_TRN_MATMUL_PRECISION": "highest"}})
    for rc, r, err in reports:
        assert r is not None, err[-2000:]
        assert "different jax-trn settings" in r["error"]
        assert ("matmul_precision: 'highest' in process 1, 'default' in process 0" in r["error"]
                or "matmul_precision: 'default' in process 0, 'highest' in process 1"
                in r["error"]), r["error"]
