"""One simulated system across 1, 2 and 4 processes (issue 17): wall time per step.

    python benchmarks/multiprocess.py [--processes 1 2 4] [--system trn3-ultraserver]

Runs simspeed.py's dp1152 workload (a data-parallel MLP training step, ~132K
parameters, 8 rows per device, on every NeuronCore of the system) in N processes started
with `jax.distributed.initialize` on this machine, each owning 1/N of the chips. Prints
the machine's core count, the wall time of a steady-state step (the median of
`--steps` timed steps, of the slowest process; the first call compiles and is not
timed), the speed-up over one process, the bytes each process published through the
coordination service for the step's collectives, and
checks that every process got the single-process loss bit for bit and the same
simulated step time. Wall time is the simulator's speed on a possibly loaded machine,
not a hardware figure.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from text_table import print_table  # noqa: E402

CHILD = r"""
import json, sys, time
import numpy as np
pid, n, port, here = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
STEPS = int(sys.argv[5])
import jax
if n > 1:
    jax.distributed.initialize(f"localhost:{port}", n, pid, initialization_timeout=120)
from jax.sharding import NamedSharding, PartitionSpec as P
import jax_trn
from jax_trn.runtime import spmd_remote
sys.path.insert(0, here)
from workloads import dp_mlp
devs = jax.devices("trn")
mesh = jax.make_mesh((len(devs),), ("data",), devices=devs)
step, (params, x, y) = dp_mlp(len(devs))
rep, batch = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
rows = slice(pid * len(x) // n, (pid + 1) * len(x) // n)
params = jax.tree.map(lambda a: jax.make_array_from_process_local_data(rep, a), params)
x = jax.make_array_from_process_local_data(batch, x[rows])
y = jax.make_array_from_process_local_data(batch, y[rows])
params, loss = jax.block_until_ready(step(params, x, y))       # compile + first step
sent = spmd_remote.STATS["bytes_put"]
walls, cpu = [], time.process_time()
for _ in range(STEPS):
    start = time.perf_counter()
    with jax_trn.profile() as prof:
        params, loss = jax.block_until_ready(step(params, x, y))
    walls.append(time.perf_counter() - start)
wall, cpu = sorted(walls)[len(walls) // 2], (time.process_time() - cpu) / STEPS
peak = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) * 1024
loss = np.asarray(loss.addressable_data(0))
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_bytes": peak,
                  "loss_bits": loss.tobytes().hex(),
                  "sent_bytes": (spmd_remote.STATS["bytes_put"] - sent) // STEPS,
                  "simulated_s": max(c.end_ns for c in prof.executions[-1].collectives) * 1e-9
                  if prof.executions[-1].collectives else None}))
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run(n: int, system: str, steps: int = 3) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "JAX_PLATFORMS": "trn,cpu", "JAX_TRN_SYSTEM": system}
    port = _port()
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(i), str(n), str(port), HERE,
                               str(steps)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=ROOT) for i in range(n)]
    got = []
    for p in procs:
        out, err = p.communicate()
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        got.append(json.loads(lines[-1]) if p.returncode == 0 and lines else
                   {"error": (err.strip().splitlines() or ["failed"])[-1][:200]})
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--system", default="trn3-ultraserver")
    ap.add_argument("--steps", type=int, default=3, help="timed steps (the median is shown)")
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores; system {args.system}")
    rows, base, ref = [], None, None
    for n in args.processes:
        start = time.perf_counter()
        got = run(n, args.system, args.steps)
        total = time.perf_counter() - start
        bad = [g["error"] for g in got if "error" in g]
        if bad:
            rows.append([str(n), "-", "-", "-", "-", "-", bad[0]])
            continue
        wall = max(g["wall_s"] for g in got)
        base = base if base is not None else (wall if n == 1 else None)
        ref = ref or got[0]
        same = all(g["loss_bits"] == ref["loss_bits"] and g["simulated_s"] == ref["simulated_s"]
                   for g in got)
        rows.append([str(n), f"{wall:.2f} s", f"{base / wall:.2f}x" if base else "-",
                     f"{max(g['peak_bytes'] for g in got) / 2**30:.2f} GiB",
                     f"{max(g['sent_bytes'] for g in got) / 2**20:.1f} MiB",
                     "yes" if same else "NO",
                     f"run {total:.0f} s (start-up, compile, {args.steps + 1} steps)"])
    print_table(f"DP MLP step on every NeuronCore of {args.system}, 1..N processes",
                [["processes", "wall per step", "speed-up", "peak per process",
                  "published per process", "same loss & sim time", "note"]] + rows)


if __name__ == "__main__":
    main()
