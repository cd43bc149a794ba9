"""The simulator's own speed (wall clock) on the programs users run, against JAX's CPU
backend measured in the same run (issue 14, "speed").

    python benchmarks/simspeed.py [--rows dispatch block lm gru dp1152 estimate compile]

Every row prints the wall time on trn (the simulator: numerics and timeline of every
instruction), on the CPU backend where there is one to compare with, their ratio, and
the target. Wall time is the simulator's speed, not a hardware figure; simulated times
are deterministic and pinned by the tests, these are not (a loaded machine is slower).

    dispatch   a tiny jitted add (float32[8]): median per call over 200 calls
    block      benchmarks/compiler.py's transformer block fwd+bwd (d1024, S1024, bf16)
    lm         a flax linen LM training step, 2 layers, d128, 30k vocab, 4x256 tokens
    gru        an equinox GRUCell in lax.scan, 64 steps, batch 32, adam step
    dp1152     a data-parallel MLP training step on all 1152 NeuronCores of a Trn3
               UltraServer (own process): wall and CPU time of one step, peak memory
    estimate   jax_trn.estimate of a d1024 transformer layer step, data parallel over
               1152 NeuronCores (own process): wall and peak memory
    compile    compile of `jnp.zeros(2**30) + 1` (as JAX compiles it for trn)

A step's time is its steady state, as a training loop sees it: on each backend it runs
twice before it is timed (on trn the first call compiles the program and times its
timeline, the second works out the replay's two-thread schedules: one-time costs, like
compiling; `--warmup`), then its time is the mean of `--repeat` calls (default 4).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from text_table import print_table  # noqa: E402
ROWS = ("dispatch", "block", "lm", "gru", "dp1152", "estimate", "compile")


@dataclass
class Row:
    measure: str
    trn_s: float | None
    cpu_s: float | None
    target: str
    met: bool | None
    extra: str = ""

    def cells(self) -> list[str]:
        ratio = (f"{self.trn_s / self.cpu_s:.1f}x" if self.trn_s is not None and self.cpu_s
                 else "-")
        verdict = {True: "met", False: "NOT met", None: "-"}[self.met]
        return [self.measure, _fmt(self.trn_s), _fmt(self.cpu_s), ratio, self.target,
                verdict, self.extra]


def _fmt(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e6:.0f} us" if s < 1e-3 else f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


WARMUP = 2


def timed_step(jax, step, args, device, repeat: int) -> float:
    """Mean wall seconds of `step(*args)` on `device`, after `WARMUP` calls (the first
    compiles it). A step returning new state (params, opt, ...) is fed its own outputs,
    as a training loop does."""
    args = jax.device_put(args, device)
    out = jax.block_until_ready(step(*args))
    for _ in range(WARMUP - 1):
        out = jax.block_until_ready(step(*_feed(args, out)))
    start = time.perf_counter()
    for _ in range(repeat):
        out = jax.block_until_ready(step(*_feed(args, out)))
    return (time.perf_counter() - start) / repeat


def _feed(args, out):
    """The next call's arguments: a step returning (params, opt, loss) gets its new
    params and optimizer state back, with the same data."""
    if isinstance(out, tuple) and len(out) == 3 and len(args) >= 3:
        return (out[0], out[1], *args[2:])
    return args


def row_dispatch(jax, repeat: int) -> Row:
    import numpy as np
    from dispatch import per_call_seconds
    add = jax.jit(lambda a, b: a + b)
    x = np.ones((8,), np.float32)
    t = {}
    for name in ("cpu", "trn"):
        dev = jax.devices(name)[0]
        t[name] = float(np.median(per_call_seconds(add, [jax.device_put(x, dev)] * 2, 200)))
    met = t["trn"] <= 60e-6 and t["trn"] <= 12 * t["cpu"]
    return Row("tiny jit dispatch (median)", t["trn"], t["cpu"], "<= 12x and <= 60 us", met)


def _versus(jax, label: str, build, target: float, repeat: int) -> Row:
    step, args = build()
    t = {name: timed_step(jax, step, args, jax.devices(name)[0], repeat)
         for name in ("cpu", "trn")}
    return Row(label, t["trn"], t["cpu"], f"<= {target:g}x", t["trn"] <= target * t["cpu"])


def row_block(jax, repeat: int) -> Row:
    from workloads import block
    return _versus(jax, "transformer block fwd+bwd d1024", block, 1.5, repeat)


def row_lm(jax, repeat: int) -> Row:
    from workloads import flax_lm
    return _versus(jax, "flax LM step, 2 layers d128", flax_lm, 10, repeat)


def row_gru(jax, repeat: int) -> Row:
    from workloads import equinox_gru
    return _versus(jax, "equinox GRU in scan, 64 steps", equinox_gru, 30, repeat)


DP_CHILD = r"""
import json, resource, sys, time
import jax
from jax.sharding import NamedSharding, PartitionSpec as P
sys.path.insert(0, sys.argv[1])
from workloads import dp_mlp
devs = jax.devices("trn")
mesh = jax.make_mesh((len(devs),), ("data",), devices=devs)
step, (params, x, y) = dp_mlp(len(devs))        # ~132K parameters, as issue 14 measured
rep, batch = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
params, x, y = jax.device_put(params, rep), jax.device_put(x, batch), jax.device_put(y, batch)
params, loss = jax.block_until_ready(step(params, x, y))       # compile + first step
start, cpu = time.perf_counter(), time.process_time()
params, loss = jax.block_until_ready(step(params, x, y))
wall, cpu = time.perf_counter() - start, time.process_time() - cpu
# VmHWM, not ru_maxrss: Linux carries the parent's high-water mark across exec
peak = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) * 1024
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_bytes": peak, "devices": len(devs),
                  "loss": float(loss)}))
"""

ESTIMATE_CHILD = r"""
import json, resource, sys, time
import jax, jax.numpy as jnp
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P, AxisType
import jax_trn
sys.path.insert(0, sys.argv[1])
from compiler import block_args, transformer_block
n = 1152
mesh = AbstractMesh((n,), ("data",), axis_types=(AxisType.Explicit,))
f, (params, x) = block_args(1024, 1024)
rep = NamedSharding(mesh, P())
params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep), params)
xs = jax.ShapeDtypeStruct((n, 1024, 1024), x.dtype, sharding=NamedSharding(mesh, P("data")))

def step(p, xs):
    def loss(p):
        return jax.vmap(lambda x: transformer_block(p, x))(xs).astype(jnp.float32).mean()
    l, g = jax.value_and_grad(loss)(p)
    return jax.tree.map(lambda a, b: a - (0.01 * b).astype(a.dtype), p, g), l

if not hasattr(jax_trn, "estimate"):
    print(json.dumps({"error": "jax_trn.estimate does not exist yet"})); sys.exit()
start = time.perf_counter()
ex = jax_trn.estimate(step, params, xs, system="trn3-ultraserver")
wall = time.perf_counter() - start
# VmHWM, not ru_maxrss: Linux carries the parent's high-water mark across exec
peak = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) * 1024
print(json.dumps({"wall_s": wall, "peak_bytes": peak, "simulated_s": ex.simulated_time_s}))
"""


def _child(code: str, system: str | None, *argv: str) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if system:
        env["JAX_TRN_SYSTEM"] = system
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                         env=env, cwd=ROOT, check=False)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode or not lines:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1][:150]}
    return json.loads(lines[-1])


def row_dp1152(jax, repeat: int) -> Row:
    got = _child(DP_CHILD, "trn3-ultraserver", HERE)
    label = "DP MLP step on 1152 NeuronCores"
    if "error" in got:
        return Row(label, None, None, "<= 8 s, <= 2 GiB", False, got["error"])
    gib = got["peak_bytes"] / 2 ** 30
    return Row(label, got["wall_s"], None, "<= 8 s, <= 2 GiB",
               got["wall_s"] <= 8 and gib <= 2,
               f"peak {gib:.2f} GiB, CPU {got['cpu_s']:.2f} s (wall counts the machine's load)")


def row_estimate(jax, repeat: int) -> Row:
    got = _child(ESTIMATE_CHILD, None, HERE)
    label = "estimate: d1024 layer step, 1152 cores"
    if "error" in got:
        return Row(label, None, None, "<= 20 s", False, got["error"])
    gib = got["peak_bytes"] / 2 ** 30
    return Row(label, got["wall_s"], None, "<= 20 s", got["wall_s"] <= 20,
               f"peak {gib:.2f} GiB, simulated {got['simulated_s'] * 1e3:.2f} ms")


def row_compile(jax, repeat: int) -> Row:
    import jax.numpy as jnp
    times = {}
    for name in ("cpu", "trn"):
        with jax.default_device(jax.devices(name)[0]):
            f = jax.jit(lambda: jnp.zeros(2 ** 30, jnp.float32) + 1)   # a fresh function
            start = time.perf_counter()
            f.lower().compile()
            times[name] = time.perf_counter() - start
    return Row("compile jnp.zeros(2**30) + 1", times["trn"], times["cpu"], "<= 2 s",
               times["trn"] <= 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=WARMUP,
                        help="calls before a step is timed (the first compiles it)")
    args = parser.parse_args()
    globals()["WARMUP"] = max(1, args.warmup)
    import jax
    import jax_trn  # noqa: F401  (the trn platform)
    rows = []
    for name in args.rows:
        rows.append(globals()[f"row_{name}"](jax, args.repeat))
        print(f"  measured {name}", file=sys.stderr, flush=True)
    header = ["measure", "trn wall", "CPU wall", "trn/CPU", "target", "verdict", ""]
    print_table(f"simulator speed on this machine ({os.cpu_count()} cores), "
                f"system {jax_trn.get_system().name}", [header] + [r.cells() for r in rows])


if __name__ == "__main__":
    main()
