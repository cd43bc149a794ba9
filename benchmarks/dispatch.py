"""Wall-clock dispatch time of a tiny jitted add: trn (simulated) vs JAX's CPU backend.

    python benchmarks/dispatch.py [--calls N]

Prints the median and p90 wall time per call (compile excluded) and the simulated time
of one call. Wall-clock is the simulator's own speed, not a hardware figure.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def per_call_seconds(f, args, calls: int) -> np.ndarray:
    f(*args).block_until_ready()                 # compile and warm up
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        f(*args).block_until_ready()
        times.append(time.perf_counter() - t0)
    return np.array(times)


def main() -> None:
    import jax
    import jax_trn

    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    calls = parser.parse_args().calls
    add = jax.jit(lambda a, b: a + b)
    x = np.ones((8,), np.float32)
    print(f"tiny jitted add (float32[8]), {calls} calls, wall-clock per call:")
    print(f"{'backend':8} {'median':>12} {'p90':>12}")
    for name in ("cpu", "trn"):
        dev = jax.devices(name)[0]
        args = [jax.device_put(x, dev), jax.device_put(x, dev)]
        t = per_call_seconds(add, args, calls)
        print(f"{name:8} {np.median(t) * 1e6:10.1f}us {np.percentile(t, 90) * 1e6:10.1f}us")
    with jax_trn.profile() as prof:
        add(*args).block_until_ready()
    print(f"simulated time of one call on {jax_trn.get_system().name}: "
          f"{prof.executions[-1].simulated_time_s * 1e6:.2f} us")


if __name__ == "__main__":
    main()
