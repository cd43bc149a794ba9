"""Wall-clock of the simulator running numerics (not timing-only): the transformer block
fwd+bwd of benchmarks/compiler.py (d1024, S1024, bf16) and a 2048^3 bf16 GEMM, jitted on
the trn backend vs JAX's CPU backend, in one run.

    PYTHONPATH=. python benchmarks/sim_numerics.py [--rows block gemm] [--repeat N]

Prints the best wall time of `--repeat` calls after a first (compiling) call. The
simulator's tile math runs on one BLAS thread (`jax_trn.runtime.blas`, issue 14 point
1) whatever numpy's own setting is; set OPENBLAS_NUM_THREADS to compare.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _concrete(jax, args, seed: int = 0):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda s: (rng.normal(size=s.shape) * 0.02).astype(s.dtype), args)


def block(jax):
    from benchmarks.compiler import block_args
    f, args = block_args()
    return jax.jit(f), _concrete(jax, args)


def gemm(jax):
    jnp = jax.numpy
    s = jax.ShapeDtypeStruct((2048, 2048), jnp.bfloat16)
    return jax.jit(lambda a, b: a @ b), _concrete(jax, (s, s))


ROWS = {"block": block, "gemm": gemm}


def best_wall(jax, f, args, device, repeat: int) -> tuple[float, float]:
    args = jax.device_put(args, device)
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    first = time.perf_counter() - t0
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        best = min(best, time.perf_counter() - t0)
    return first, best


def main() -> None:
    import jax
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    parser.add_argument("--repeat", type=int, default=1)
    a = parser.parse_args()
    print(f"{'program':8} {'cpu s':>8} {'trn first s':>12} {'trn s':>8} {'trn/cpu':>8}")
    for name in a.rows:
        f, args = ROWS[name](jax)
        _, cpu = best_wall(jax, f, args, jax.devices("cpu")[0], a.repeat)
        first, trn = best_wall(jax, f, args, jax.devices("trn")[0], a.repeat)
        print(f"{name:8} {cpu:8.2f} {first:12.2f} {trn:8.2f} {trn / cpu:8.1f}x", flush=True)


if __name__ == "__main__":
    main()
