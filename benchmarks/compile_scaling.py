"""Compile time against program size: fills and elementwise programs should scale linearly.

    python benchmarks/compile_scaling.py [--min 24] [--max 30] [--repeat 1]

For each size 2**k (float32 elements) it compiles, exactly as JAX does for the trn
device (`jax.jit(f).lower(...).compile()`, wall clock, best of --repeat):

    zeros     jnp.zeros(2**k)                 a fill: one SBUF tile stored many times
    zeros+1   jnp.zeros(2**k) + 1             the same after constant folding
    x*2+1     x * 2 + 1 for an argument x     load, two ALU ops, store, per tile

and prints the seconds, the ratio to the size 4x smaller (linear: ~4; the semaphore
pass was quadratic: 2**28 -> 2**30 took 1.3 s -> 21.6 s for `zeros`) and the garbage
collections that ran during the compile (the plugin pauses the collector while it
compiles, `jax_trn.runtime.gc_pause`; what remains is JAX's own work around it).
Compilation runs on one of JAX's threads; nothing here depends on simulated time.
Run it from the repository root with PYTHONPATH=. to measure a work tree rather than
the installed copy.
"""
from __future__ import annotations

import argparse
import gc
import time


PROGRAMS = ("zeros", "zeros+1", "x*2+1")


def lowered(name: str, n: int):
    import jax
    import jax.numpy as jnp
    if name == "zeros":
        return jax.jit(lambda: jnp.zeros(n, jnp.float32)).lower()
    if name == "zeros+1":
        return jax.jit(lambda: jnp.zeros(n, jnp.float32) + 1).lower()
    return jax.jit(lambda a: a * 2 + 1).lower(jax.ShapeDtypeStruct((n,), jnp.float32))


class _Collections:
    """Counts the garbage collections that start while it is active."""

    def __init__(self):
        self.count = 0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.count += 1

    def __enter__(self):
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self)


def measure(name: str, n: int, repeat: int) -> tuple[float, int]:
    """(best seconds, collections during the best compile)."""
    best, collections = float("inf"), 0
    for _ in range(repeat):
        low = lowered(name, n)
        with _Collections() as seen:
            start = time.perf_counter()
            low.compile()
            elapsed = time.perf_counter() - start
        if elapsed < best:
            best, collections = elapsed, seen.count
    return best, collections


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min", type=int, default=24)
    parser.add_argument("--max", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    import jax
    device = jax.devices("trn")[0]
    with jax.default_device(device):
        measure("zeros+1", 2**10, 1)                # warm up JAX and the plugin
    print(f"{'program':<9} {'size':>6} {'seconds':>8} {'x (vs 4x smaller)':>18} {'GCs':>4}")
    for name in PROGRAMS:
        times: dict[int, float] = {}
        for k in range(args.min, args.max + 1):
            try:
                with jax.default_device(device):
                    seconds, collections = measure(name, 2**k, args.repeat)
            except Exception as e:                  # e.g. more than a device's HBM
                print(f"{name:<9} {'2**' + str(k):>6}  {str(e).splitlines()[0][:90]}")
                continue
            times[k] = seconds
            ratio = f"{seconds / times[k - 2]:.1f}" if k - 2 in times else "-"
            print(f"{name:<9} {'2**' + str(k):>6} {seconds:>8.2f} {ratio:>18} {collections:>4}",
                  flush=True)


if __name__ == "__main__":
    main()
