"""Child of test_spmd_batch.py: runs programs with collectives on a multi-chip system
twice, every device timed (`spmd_batch.ENABLED = False`) and batched (one timeline per
class of chips), and prints their fingerprints (timelines, collectives, results) as JSON.

    python -m tests.multichip.spmd_batch_child SYSTEM   (e.g. trn2.48xlarge or trn3:8)

`trn3:N` is a user-made Trn3 system of N chips behind NeuronSwitch (N/4 servers)."""
from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from workloads import dp_mlp  # noqa: E402  (the DP MLP step simspeed.py's dp1152 row runs)


def _system(name: str):
    if not name.startswith("trn3:"):
        return name
    from jax_trn.systems import CHIPS, System
    n = int(name.split(":")[1])
    return System(f"trn3-{n}", CHIPS["trn3"], n, "switch", (n // 4, 4), "test system")


def programs(jax):
    """(name, step function, args) of each program; the args are on the devices."""
    jnp = jax.numpy
    from jax.sharding import NamedSharding, PartitionSpec as P
    devs = jax.devices("trn")
    n = len(devs)
    mesh = jax.make_mesh((n,), ("d",), devices=devs)
    rep, batch = NamedSharding(mesh, P()), NamedSharding(mesh, P("d"))
    dp_step, (params, x, y) = dp_mlp(n, sizes=(32, 64, 10), per_device=4)
    rng = np.random.default_rng(1)
    yield ("dp_step", dp_step, (jax.device_put(params, rep), jax.device_put(x, batch),
                                jax.device_put(y, batch)))

    # a psum inside a scan: collectives in a loop, decisions on every device
    def scanned(a):
        def body(c, _):
            return c + jax.lax.psum(jnp.sin(c), "d") * 1e-3, None
        return jax.lax.scan(body, a, None, length=3)[0]
    f = jax.jit(jax.shard_map(scanned, mesh=mesh, in_specs=P("d"), out_specs=P("d")))
    a = jax.device_put(rng.standard_normal((n * 8, 16)).astype(np.float32), batch)
    yield ("scan_psum", f, (a,))

    # psum over groups of 2 devices (subgroups), bf16, and an all_to_all
    mesh2 = jax.make_mesh((n // 2, 2), ("a", "b"), devices=devs)

    def grouped(v):
        s = jax.lax.psum(v.astype(jnp.bfloat16), "b").astype(jnp.float32)
        return s + jax.lax.all_to_all(v, "a", 0, 0, tiled=True)
    g = jax.jit(jax.shard_map(grouped, mesh=mesh2, in_specs=P(("a", "b")),
                              out_specs=P(("a", "b"))))
    v = jax.device_put(rng.standard_normal((n * (n // 2), 4)).astype(np.float32),
                       NamedSharding(mesh2, P(("a", "b"))))
    yield ("grouped", g, (v,))

    # a while loop whose trip count differs between devices: the batched call diverges
    def uneven(v):
        def cond(c):
            return c[1] < jax.lax.axis_index("d") % 3
        def body(c):
            return c[0] * 1.5, c[1] + 1
        w = jax.lax.while_loop(cond, body, (v, 0))[0]
        return jax.lax.psum(w, "d")
    u = jax.jit(jax.shard_map(uneven, mesh=mesh, in_specs=P("d"), out_specs=P()))
    yield ("uneven_while", u, (a,))


def main(argv: list[str]) -> int:
    import jax_trn
    jax_trn.configure(system=_system(argv[1]))
    import jax
    from jax_trn.runtime import spmd_batch, spmd_vector
    from tests.sim.pinned_corpus import _results, _timeline
    out = {}
    for name, f, args in programs(jax):
        got = {}
        for batched in (False, True):
            spmd_batch.ENABLED = batched
            spmd_batch.COUNTS.clear()
            spmd_vector.COUNTS.clear()
            with jax_trn.profile() as prof:
                res = jax.block_until_ready(f(*args))
            got["batched" if batched else "full"] = {
                **_timeline(prof.executions), "results": _results(jax, res),
                "counts": dict(spmd_batch.COUNTS), "vector": dict(spmd_vector.COUNTS)}
        out[name] = got
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
