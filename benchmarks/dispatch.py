"""Wall-clock dispatch time of a tiny jitted add: trn (simulated) vs JAX's CPU backend.

    python benchmarks/dispatch.py [--calls N]

Prints the median and p90 wall time per call (compile excluded), the calling thread's
median CPU time per call (less sensitive than wall time to other processes on a shared
machine: the simulator runs a call on the calling thread), the ratio trn / CPU of
each, and the simulated time of one call. Wall-clock is the simulator's own speed, not
a hardware figure. Issue 14's target: <= 60 us and <= 12x the CPU backend.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def per_call_seconds(f, args, calls: int) -> np.ndarray:
    """Wall seconds of each of `calls` calls of `f(*args)` (benchmarks/simspeed.py)."""
    return per_call_times(f, args, calls)[0]


def per_call_times(f, args, calls: int) -> tuple[np.ndarray, np.ndarray]:
    """(wall, thread CPU) seconds of each of `calls` calls of `f(*args)`."""
    f(*args).block_until_ready()                 # compile and warm up
    for _ in range(20):
        f(*args).block_until_ready()
    wall, cpu = [], []
    for _ in range(calls):
        t0, c0 = time.perf_counter(), time.thread_time()
        f(*args).block_until_ready()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - t0)
    return np.array(wall), np.array(cpu)


def main() -> None:
    import jax
    import jax_trn

    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    calls = parser.parse_args().calls
    add = jax.jit(lambda a, b: a + b)
    x = np.ones((8,), np.float32)
    print(f"tiny jitted add (float32[8]), {calls} calls, per call:")
    print(f"{'backend':8} {'wall median':>12} {'wall p90':>12} {'CPU median':>12}")
    medians = {}
    for name in ("cpu", "trn"):
        dev = jax.devices(name)[0]
        args = [jax.device_put(x, dev), jax.device_put(x, dev)]
        wall, cpu = per_call_times(add, args, calls)
        medians[name] = (np.median(wall), np.median(cpu))
        print(f"{name:8} {np.median(wall) * 1e6:10.1f}us {np.percentile(wall, 90) * 1e6:10.1f}us "
              f"{np.median(cpu) * 1e6:10.1f}us")
    (tw, tc), (cw, cc) = medians["trn"], medians["cpu"]
    print(f"{'trn/cpu':8} {tw / cw:11.1f}x {'':>12} {tc / cc if cc else float('nan'):11.1f}x")
    with jax_trn.profile() as prof:
        add(*args).block_until_ready()
    print(f"simulated time of one call on {jax_trn.get_system().name}: "
          f"{prof.executions[-1].simulated_time_s * 1e6:.2f} us")


if __name__ == "__main__":
    main()
