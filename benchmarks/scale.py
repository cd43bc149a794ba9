"""Scale: one sharded matmul on every NeuronCore of a system, end to end through JAX.

    python benchmarks/scale.py [--systems trn2.3xlarge trn2.48xlarge trn3-ultraserver]

For each system (a fresh process each: the trn backend's system is fixed when it starts)
a bf16 matmul [128·chips, 1024] x [1024, 512] is sharded over a (chips, cores) mesh, the
lhs's rows over chips and its columns over cores, so every device multiplies its block
and an all-reduce over the cores combines the partial sums. Prints the number of devices,
wall-clock compile and run time (the simulator's own speed: numerics for every device),
the simulated time of the call, and the collective's algorithm.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, os, sys, time
import numpy as np
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import jax_trn
devs = jax.devices("trn")
chips = max(1, len(devs) // 8)
cores = len(devs) // chips
mesh = jax.make_mesh((chips, cores), ("chip", "core"), devices=devs,
                     axis_types=(jax.sharding.AxisType.Auto,) * 2)
a = jax.device_put(np.ones((128 * chips, 1024), jnp.bfloat16), NamedSharding(mesh, P("chip", "core")))
b = jax.device_put(np.ones((1024, 512), jnp.bfloat16), NamedSharding(mesh, P("core", None)))
f = jax.jit(lambda a, b: a @ b)
t0 = time.perf_counter(); compiled = f.lower(a, b).compile(); compile_s = time.perf_counter() - t0
t0 = time.perf_counter()
with jax_trn.profile() as prof:
    out = compiled(a, b).block_until_ready()
run_s = time.perf_counter() - t0
ex = prof.executions[-1]
first = np.asarray(out.addressable_shards[0].data)
ok = bool((first == 1024).all())
print(json.dumps({"devices": len(devs), "compile_s": compile_s, "run_s": run_s,
                  "simulated_us": ex.simulated_time_s * 1e6, "kernels": len(ex.kernels),
                  "collective": ex.collectives[0].algorithm if ex.collectives else "-",
                  "correct": ok}))
"""


def run(system: str) -> dict:
    env = {**os.environ, "JAX_TRN_SYSTEM": system}
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env,
                       timeout=3600)
    if r.returncode:
        return {"error": r.stderr.strip().splitlines()[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--systems", nargs="+",
                        default=["trn2.3xlarge", "trn2.48xlarge", "trn3-ultraserver"])
    args = parser.parse_args()
    print(f"{'system':18} {'devices':>7} {'compile s':>9} {'run s':>7} {'simulated':>11} "
          f"{'collective':18} ok")
    for system in args.systems:
        row = run(system)
        if "error" in row:
            print(f"{system:18} error: {row['error']}")
            continue
        print(f"{system:18} {row['devices']:7d} {row['compile_s']:9.2f} {row['run_s']:7.1f} "
              f"{row['simulated_us']:8.1f} us {row['collective']:18} {row['correct']}")


if __name__ == "__main__":
    main()
